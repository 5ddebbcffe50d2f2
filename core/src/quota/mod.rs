//! Rate Limit Quota Service (RLQS) arithmetic: the same rules, enforced inside the data planes.
//!
//! With RLQS each Envoy enforces a bucket's limit locally with an assignment sluice pushes, and
//! reports what it admitted and denied. The shared bucket stays the single truth: a replica's
//! [`Pool`] takes from it, ahead of time, what its data planes may admit before their next push
//! ([`pool`] states the contract and the bound), splits the rule's rate among them by the demand
//! they report, and gives back what they did not use. [`strategy`] is the data plane's side: the
//! token buckets Envoy can express.
//!
//! A `BucketId` is an unordered map; [`crate::config::Domain::place`] orders it into the
//! descriptor it stands for, so one rule governs an RLS descriptor and an RLQS bucket alike.

pub mod pool;
pub mod strategy;

#[cfg(test)]
mod small_rules;
#[cfg(test)]
mod tests;

pub use pool::{Answer, Ask, MemberId, Pool, PoolOptions, Reported};
pub use strategy::{Strategy, TokenBucket};
