//! The compiled descriptor tree of one domain: request entries → the rule they reach.
//!
//! OWNER: config helper.
