//! Counts read by the `sluice_rlqs_*` metrics, and the reasons they are counted by.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Action;
use sluice_core::quota::Strategy;

/// Why a report (or one bucket of it) was not taken into account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// The stream already has `--rlqs-max-buckets-per-stream` buckets.
    TooManyBuckets,
    /// More entries than `--rlqs-max-bucket-entries`, or an empty key or value.
    InvalidBucket,
    /// A count no data plane could have reached in one reporting interval.
    AbsurdCount,
    /// The replica already has `--rlqs-max-subscriptions` subscriptions.
    TooManySubscriptions,
}

impl Ignored {
    pub const ALL: [Ignored; 4] = [
        Ignored::TooManyBuckets,
        Ignored::InvalidBucket,
        Ignored::AbsurdCount,
        Ignored::TooManySubscriptions,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Ignored::TooManyBuckets => "too_many_buckets",
            Ignored::InvalidBucket => "invalid_bucket",
            Ignored::AbsurdCount => "absurd_count",
            Ignored::TooManySubscriptions => "too_many_subscriptions",
        }
    }
}

/// Why a stream ended. Every end is logged once and counted by this reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The data plane half-closed its reports; the last one was answered first (status OK).
    HalfClosed,
    /// The data plane reset the stream or went away; nobody receives a status.
    Cancelled,
    /// A report over the message bound (RESOURCE_EXHAUSTED).
    TooLarge,
    /// A report that breaks the protocol: no domain, another domain, an empty stream
    /// (INVALID_ARGUMENT).
    InvalidReport,
    /// No first report within `--rlqs-first-report-timeout` (DEADLINE_EXCEEDED).
    NoFirstReport,
    /// The server is stopping (UNAVAILABLE: reconnect to another replica).
    Stopping,
}

impl EndReason {
    pub const ALL: [EndReason; 6] = [
        EndReason::HalfClosed,
        EndReason::Cancelled,
        EndReason::TooLarge,
        EndReason::InvalidReport,
        EndReason::NoFirstReport,
        EndReason::Stopping,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            EndReason::HalfClosed => "half_closed",
            EndReason::Cancelled => "cancelled",
            EndReason::TooLarge => "too_large",
            EndReason::InvalidReport => "invalid_report",
            EndReason::NoFirstReport => "no_first_report",
            EndReason::Stopping => "stopping",
        }
    }
}

/// Counts read by the `sluice_rlqs_*` metrics. Counters saturate at `u64::MAX` rather than
/// wrap: a reported count may be up to 2^40 per bucket and message.
#[derive(Debug, Default)]
pub struct QuotaStats {
    streams: AtomicU64,
    subscriptions: AtomicU64,
    /// allow_all, deny_all, token_bucket, abandon: handed to the stream's transport.
    sent: [AtomicU64; 4],
    /// Replaced by a newer action for the same bucket before the data plane read it.
    superseded: AtomicU64,
    reported_allowed: AtomicU64,
    reported_denied: AtomicU64,
    slack: AtomicU64,
    ignored: [AtomicU64; 4],
    ends: [AtomicU64; 6],
}

/// Adds `n` to `counter`, stopping at `u64::MAX`.
fn saturating_add(counter: &AtomicU64, n: u64) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_add(n))
    });
}

impl QuotaStats {
    pub const ACTION_KINDS: [&'static str; 4] =
        ["allow_all", "deny_all", "token_bucket", "abandon"];

    /// Streams accepted and not yet ended, whether or not they sent a first report.
    pub fn streams(&self) -> u64 {
        self.streams.load(Ordering::Relaxed)
    }
    pub fn subscriptions(&self) -> u64 {
        self.subscriptions.load(Ordering::Relaxed)
    }
    /// Assignments of `kind` (one of [`QuotaStats::ACTION_KINDS`]) handed to a stream's
    /// transport.
    pub fn sent(&self, kind: &str) -> u64 {
        Self::ACTION_KINDS
            .iter()
            .position(|k| *k == kind)
            .map_or(0, |i| self.sent[i].load(Ordering::Relaxed))
    }
    /// Actions replaced by a newer one for the same bucket before the data plane read them.
    pub fn superseded(&self) -> u64 {
        self.superseded.load(Ordering::Relaxed)
    }
    pub fn reported_allowed(&self) -> u64 {
        self.reported_allowed.load(Ordering::Relaxed)
    }
    pub fn reported_denied(&self) -> u64 {
        self.reported_denied.load(Ordering::Relaxed)
    }
    /// Tokens admitted beyond what was prepaid or could be charged.
    pub fn slack(&self) -> u64 {
        self.slack.load(Ordering::Relaxed)
    }
    pub fn ignored(&self, reason: Ignored) -> u64 {
        self.ignored[reason as usize].load(Ordering::Relaxed)
    }
    /// Streams that ended for `reason`.
    pub fn ended(&self, reason: EndReason) -> u64 {
        self.ends[reason as usize].load(Ordering::Relaxed)
    }

    pub(crate) fn count_sent(&self, action: &Action) {
        let i = match action {
            Action::Assign { strategy, .. } => match strategy {
                Strategy::AllowAll => 0,
                Strategy::DenyAll => 1,
                Strategy::TokenBucket(_) => 2,
            },
            Action::Abandon { .. } => 3,
        };
        saturating_add(&self.sent[i], 1);
    }

    pub(crate) fn count_superseded(&self) {
        saturating_add(&self.superseded, 1);
    }

    pub(crate) fn count_reported(&self, allowed: u64, denied: u64) {
        saturating_add(&self.reported_allowed, allowed);
        saturating_add(&self.reported_denied, denied);
    }

    pub(crate) fn count_slack(&self, tokens: u64) {
        saturating_add(&self.slack, tokens);
    }

    pub(crate) fn count_ignored(&self, reason: Ignored) {
        saturating_add(&self.ignored[reason as usize], 1);
    }

    pub(crate) fn count_end(&self, reason: EndReason) {
        saturating_add(&self.ends[reason as usize], 1);
    }

    pub(crate) fn stream_opened(&self) {
        self.streams.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stream_closed(&self) {
        self.streams.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn subscribed(&self, n: u64) {
        self.subscriptions.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn unsubscribed(&self, n: u64) {
        self.subscriptions.fetch_sub(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 13,000 messages of 1,400 usages of 2^40 each overflow a u64: the counter stops at the top.
    #[test]
    fn reported_counts_saturate_instead_of_wrapping() {
        let stats = QuotaStats::default();
        for _ in 0..13_000 {
            stats.count_reported(1_400 << 40, 1_400 << 40);
        }
        assert_eq!(stats.reported_allowed(), u64::MAX);
        assert_eq!(stats.reported_denied(), u64::MAX);
    }
}
