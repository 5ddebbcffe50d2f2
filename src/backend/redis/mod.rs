//! The Redis backend: one atomic Lua script call per request (per slot in Cluster mode).
//!
//! OWNER: redis helper.
