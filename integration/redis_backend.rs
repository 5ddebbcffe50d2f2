//! placeholder
mod harness;
