//! envoyproxy/ratelimit's config features through the real gRPC path on the memory backend:
//! a blocking `requests_per_unit: 0` rule and request override, `replaces`, and the per-rule
//! series named as the reference names its stats (`detailed_metric`, `value_to_metric`,
//! `share_threshold`), request by request from its `test/config/config_test.go`.
//!
//! By theme: `blocking` (`requests_per_unit: 0`, a limit override of 0, `replaces`), `series`
//! (the per-rule series and their names), `metadata` (`--response-dynamic-metadata`), `quota`
//! (`quota_mode`, per descriptor and global).

mod blocking;
mod metadata;
mod quota;
mod series;
