//! The embedded in-memory backend: sharded buckets, idle eviction, a bound on live buckets.
//!
//! OWNER: algorithm/memory helper.
