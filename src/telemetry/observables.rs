//! The observable instruments: the atomics and sources [`super::metrics::Metrics`] writes,
//! and every counter and gauge read from them at collection time (no work on the request path).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use super::rules::{Counter, RuleMetrics};
use crate::backend::breaker::BreakerState;
use crate::config::ConfigStore;
use crate::limiter::lease::LeaseStore;
use crate::limiter::{SlotEvent, SlotStats};
use crate::quota::{EndReason, Ignored, QuotaStats};
use crate::resilience::local::Replicas;
use crate::rls::validate::Problem;
use crate::security::listener::{ConnectionStats, Refusal};

/// How a `ShouldRateLimit` call ended (the `outcome` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    OverLimit,
    InvalidArgument,
    Unavailable,
    ResourceExhausted,
    /// Any other gRPC error.
    Error,
}

impl Outcome {
    const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::OverLimit,
        Outcome::InvalidArgument,
        Outcome::Unavailable,
        Outcome::ResourceExhausted,
        Outcome::Error,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::OverLimit => "over_limit",
            Outcome::InvalidArgument => "invalid_argument",
            Outcome::Unavailable => "unavailable",
            Outcome::ResourceExhausted => "resource_exhausted",
            Outcome::Error => "error",
        }
    }

    pub fn of_status(status: &tonic::Status) -> Outcome {
        match status.code() {
            tonic::Code::InvalidArgument => Outcome::InvalidArgument,
            tonic::Code::Unavailable => Outcome::Unavailable,
            tonic::Code::ResourceExhausted => Outcome::ResourceExhausted,
            _ => Outcome::Error,
        }
    }

    pub(super) const fn index(self) -> usize {
        self as usize
    }
}

/// One endpoint's breaker, as a registered source reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerReading {
    /// `host:port` of the Redis endpoint (or another stable name for it).
    pub endpoint: String,
    pub state: BreakerState,
}

pub(super) type BreakerSource = Box<dyn Fn() -> Vec<BreakerReading> + Send + Sync>;
pub(super) type GaugeSource = Box<dyn Fn() -> u64 + Send + Sync>;

/// The atomics and sources the observable instruments read.
pub(super) struct Shared {
    pub(super) rules: RuleMetrics,
    pub(super) outcomes: [AtomicU64; 6],
    pub(super) unknown_domain: AtomicU64,
    pub(super) problems: [AtomicU64; Problem::ALL.len()],
    pub(super) redis_errors: [AtomicU64; 5],
    pub(super) redis_keys_repaired: AtomicU64,
    pub(super) config: Arc<ConfigStore>,
    pub(super) memory_buckets: Mutex<Option<GaugeSource>>,
    pub(super) memory_refused: Mutex<Option<GaugeSource>>,
    pub(super) breakers: Mutex<Vec<BreakerSource>>,
    pub(super) redis_timeout: Option<Duration>,
    pub(super) leases: Mutex<Option<Arc<LeaseStore>>>,
    pub(super) connections: Mutex<Option<Arc<ConnectionStats>>>,
    pub(super) quota: Mutex<Option<Arc<QuotaStats>>>,
    pub(super) replicas: Mutex<Option<Arc<Replicas>>>,
    pub(super) slots: Mutex<Option<Weak<SlotStats>>>,
}

impl Shared {
    /// Nothing counted yet and no source registered.
    pub(super) fn new(
        rules: RuleMetrics,
        config: Arc<ConfigStore>,
        redis_timeout: Option<Duration>,
    ) -> Shared {
        Shared {
            rules,
            outcomes: Default::default(),
            unknown_domain: AtomicU64::new(0),
            problems: Default::default(),
            redis_errors: Default::default(),
            redis_keys_repaired: AtomicU64::new(0),
            config,
            memory_buckets: Mutex::new(None),
            memory_refused: Mutex::new(None),
            breakers: Mutex::new(Vec::new()),
            redis_timeout,
            leases: Mutex::new(None),
            connections: Mutex::new(None),
            quota: Mutex::new(None),
            replicas: Mutex::new(None),
            slots: Mutex::new(None),
        }
    }
}

pub(super) const REDIS_ERROR_KINDS: [&str; 5] = [
    "timeout",
    "unavailable",
    "protocol",
    "circuit_open",
    "overloaded",
];

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where an observable's reader reports its points: a value and its attributes.
type Points<'a, T> = &'a mut dyn FnMut(T, &[KeyValue]);

/// The instrument kind of an observable, with the function that reads its points at collection
/// time.
#[derive(Clone, Copy)]
enum Reading {
    Counter(fn(&Shared, Points<'_, u64>)),
    Gauge(fn(&Shared, Points<'_, u64>)),
    GaugeF64(fn(&Shared, Points<'_, f64>)),
}

/// One observable instrument (no unit: the exports carry none).
struct Observable {
    name: &'static str,
    description: &'static str,
    reading: Reading,
}

/// Every observable but the per-rule counters ([`Counter::ALL`]).
const OBSERVABLES: &[Observable] = &[
    Observable {
        name: "ratelimit_service_total_requests",
        description: "ShouldRateLimit calls, by outcome (ok, over_limit, or the gRPC error)",
        reading: Reading::Counter(|s, points| {
            for outcome in Outcome::ALL {
                points(
                    s.outcomes[outcome.index()].load(Ordering::Relaxed),
                    &[
                        KeyValue::new("grpc_method", "ShouldRateLimit"),
                        KeyValue::new("outcome", outcome.as_str()),
                    ],
                );
            }
        }),
    },
    Observable {
        name: "ratelimit_service_should_rate_limit_error",
        description: "ShouldRateLimit calls that failed: redis_error (backend unavailable and the failure policy is error), service_error (invalid request)",
        reading: Reading::Counter(|s, points| {
            let n = |o: Outcome| s.outcomes[o.index()].load(Ordering::Relaxed);
            points(
                n(Outcome::Unavailable) + n(Outcome::ResourceExhausted),
                &[KeyValue::new("err_type", "redis_error")],
            );
            points(
                n(Outcome::InvalidArgument) + n(Outcome::Error),
                &[KeyValue::new("err_type", "service_error")],
            );
        }),
    },
    Observable {
        name: "ratelimit_service_config_load_success",
        description: "Config sets activated (the initial load included)",
        reading: Reading::Counter(|s, points| points(s.config.load_counts().0, &[])),
    },
    Observable {
        name: "ratelimit_service_config_load_error",
        description: "Config sets rejected (the last good config stayed active)",
        reading: Reading::Counter(|s, points| points(s.config.load_counts().1, &[])),
    },
    Observable {
        name: "sluice_config_last_load_failed",
        description: "1 while the most recent config set was rejected (until a good one is activated)",
        reading: Reading::Gauge(|s, points| {
            points(u64::from(s.config.last_rejected().is_some()), &[]);
        }),
    },
    Observable {
        name: "sluice_config_info",
        description: "The active config: digest (the version replicas can be compared by), domains and rules",
        reading: Reading::Gauge(|s, points| {
            let active = s.config.active().load();
            points(
                1,
                &[
                    KeyValue::new("digest", active.digest().to_owned()),
                    KeyValue::new("domains", active.domains().count() as i64),
                    KeyValue::new("rules", active.rule_count() as i64),
                ],
            );
        }),
    },
    Observable {
        name: "sluice_request_problems_total",
        description: "Requests Envoy can send that were not decided as sent, by problem: refused past a bound its route config reaches (message_bytes, descriptors, entries, key_bytes: INVALID_ARGUMENT, which Envoy lets through by default) or decided without their limit override (override_unit)",
        reading: Reading::Counter(|s, points| {
            for problem in Problem::ALL {
                points(
                    s.problems[problem.index()].load(Ordering::Relaxed),
                    &[KeyValue::new("problem", problem.as_str())],
                );
            }
        }),
    },
    Observable {
        name: "sluice_unknown_domain_total",
        description: "ShouldRateLimit calls for a domain the config does not have (answered OK)",
        reading: Reading::Counter(|s, points| {
            points(s.unknown_domain.load(Ordering::Relaxed), &[]);
        }),
    },
    Observable {
        name: "sluice_degraded_decisions_total",
        description: "Descriptors decided by a failure policy because the backend could not answer",
        reading: Reading::Counter(|s, points| s.rules.each_degraded(points)),
    },
    Observable {
        name: "sluice_in_flight_slots_total",
        description: "In-flight caps' slots by event: taken, released (a holder's release freed its slot), released_nothing (a release that freed nothing: a refused request's, or a slot max_hold had expired); taken - released over a span counts the slots max_hold freed",
        reading: Reading::Counter(|s, points| read_holders(s, &SlotEvent::IN_FLIGHT, points)),
    },
    Observable {
        name: "sluice_reservations_total",
        description: "Reservations (`reserve`) by event: reserved (a request's maximum taken up front), settled (its stream-done call gave back the unused part or charged the overrun); reserved - settled over a span counts the reservations that lapsed unsettled after max_hold",
        reading: Reading::Counter(|s, points| read_holders(s, &SlotEvent::RESERVATION, points)),
    },
    Observable {
        name: "sluice_lease_local_total",
        description: "Hits of rules with `lease` paid from a local lease, with no backend call",
        reading: Reading::Counter(|s, points| read_leases(s, LeaseStore::local_total, points)),
    },
    Observable {
        name: "sluice_lease_refill_total",
        description: "Backend calls that refilled a lease (a lease take that was granted)",
        reading: Reading::Counter(|s, points| read_leases(s, LeaseStore::refill_total, points)),
    },
    Observable {
        name: "sluice_lease_returned_tokens_total",
        description: "Leased tokens handed back to the backend: expired, or at shutdown",
        reading: Reading::Counter(|s, points| read_leases(s, LeaseStore::returned_total, points)),
    },
    Observable {
        name: "sluice_redis_errors_total",
        description: "Redis decisions that failed, by kind",
        reading: Reading::Counter(|s, points| {
            if s.redis_timeout.is_none() {
                return;
            }
            for (i, kind) in REDIS_ERROR_KINDS.iter().enumerate() {
                points(
                    s.redis_errors[i].load(Ordering::Relaxed),
                    &[KeyValue::new("kind", *kind)],
                );
            }
        }),
    },
    Observable {
        name: "sluice_redis_keys_repaired_total",
        description: "Redis keys found holding another type than sluice writes there (a bucket, the probe's, the heartbeat's set): deleted and started afresh, never counted as a Redis failure",
        reading: Reading::Counter(|s, points| {
            if s.redis_timeout.is_some() {
                points(s.redis_keys_repaired.load(Ordering::Relaxed), &[]);
            }
        }),
    },
    Observable {
        name: "sluice_redis_timeout_seconds",
        description: "Deadline of one Redis decision (--redis-timeout)",
        reading: Reading::GaugeF64(|s, points| {
            if let Some(timeout) = s.redis_timeout {
                points(timeout.as_secs_f64(), &[]);
            }
        }),
    },
    Observable {
        name: "sluice_memory_buckets",
        description: "Buckets the memory backend holds",
        reading: Reading::Gauge(|s, points| {
            if let Some(source) = lock(&s.memory_buckets).as_ref() {
                points(source(), &[]);
            }
        }),
    },
    Observable {
        name: "sluice_replicas",
        description: "Replicas the `local` failure policy divides each limit by: --replicas when set, else the live replicas last counted through the Redis heartbeat (kept while Redis is away)",
        reading: Reading::Gauge(|s, points| {
            if let Some(replicas) = lock(&s.replicas).as_ref() {
                points(replicas.current(), &[]);
            }
        }),
    },
    Observable {
        name: "sluice_connections_open",
        description: "Open gRPC connections, pending TLS handshakes included (bounded by --max-connections)",
        reading: Reading::Gauge(|s, points| {
            if let Some(stats) = lock(&s.connections).as_ref() {
                points(stats.open(), &[]);
            }
        }),
    },
    Observable {
        name: "sluice_connections_rejected_total",
        description: "gRPC connections closed before carrying an RPC: cap (--max-connections reached at accept), handshake_timeout (TLS, the HTTP/2 preface or its SETTINGS not in within the deadline)",
        reading: Reading::Counter(|s, points| {
            if let Some(stats) = lock(&s.connections).as_ref() {
                for reason in Refusal::ALL {
                    points(
                        stats.refused(reason),
                        &[KeyValue::new("reason", reason.as_str())],
                    );
                }
            }
        }),
    },
    Observable {
        name: "sluice_rlqs_streams_open",
        description: "Open RLQS streams (StreamRateLimitQuotas), one per data plane and domain, counted from the moment they are accepted (before their first report)",
        reading: Reading::Gauge(|s, points| read_quota(s, QuotaStats::streams, points)),
    },
    Observable {
        name: "sluice_rlqs_buckets_subscribed",
        description: "RLQS bucket ids subscribed on this replica's open streams",
        reading: Reading::Gauge(|s, points| read_quota(s, QuotaStats::subscriptions, points)),
    },
    Observable {
        name: "sluice_rlqs_assignments_sent_total",
        description: "RLQS bucket actions handed to a stream's transport, by kind: allow_all, deny_all, token_bucket (each push re-sends a data plane's current one, and standing ones are re-sent before they expire), abandon",
        reading: Reading::Counter(|s, points| {
            if let Some(stats) = lock(&s.quota).as_ref() {
                for kind in QuotaStats::ACTION_KINDS {
                    points(stats.sent(kind), &[KeyValue::new("kind", kind)]);
                }
            }
        }),
    },
    Observable {
        name: "sluice_rlqs_assignments_superseded_total",
        description: "RLQS bucket actions replaced by a newer one for the same bucket before the data plane read them (a slow reader gets every bucket's newest action, never a queue)",
        reading: Reading::Counter(|s, points| read_quota(s, QuotaStats::superseded, points)),
    },
    Observable {
        name: "sluice_rlqs_stream_ends_total",
        description: "RLQS streams ended, by reason: half_closed (the last report answered, OK), cancelled (the data plane reset it or went away), too_large (a report over --max-message-bytes, RESOURCE_EXHAUSTED), invalid_report (no or another domain, an empty stream, INVALID_ARGUMENT), no_first_report (--rlqs-first-report-timeout, DEADLINE_EXCEEDED), stopping (UNAVAILABLE)",
        reading: Reading::Counter(|s, points| {
            if let Some(stats) = lock(&s.quota).as_ref() {
                for reason in EndReason::ALL {
                    points(
                        stats.ended(reason),
                        &[KeyValue::new("reason", reason.as_str())],
                    );
                }
            }
        }),
    },
    Observable {
        name: "sluice_rlqs_reported_requests_total",
        description: "Requests the data planes reported, by result (allowed, denied)",
        reading: Reading::Counter(|s, points| {
            if let Some(stats) = lock(&s.quota).as_ref() {
                points(
                    stats.reported_allowed(),
                    &[KeyValue::new("result", "allowed")],
                );
                points(
                    stats.reported_denied(),
                    &[KeyValue::new("result", "denied")],
                );
            }
        }),
    },
    Observable {
        name: "sluice_rlqs_grant_slack_total",
        description: "Requests the data planes reported admitting beyond what was prepaid for them (in flight with a report, a failure policy's assignment, a data plane not enforcing), past one bucket capacity of debt",
        reading: Reading::Counter(|s, points| read_quota(s, QuotaStats::slack, points)),
    },
    Observable {
        name: "sluice_rlqs_reports_ignored_total",
        description: "RLQS bucket reports ignored, by reason: too_many_buckets (--rlqs-max-buckets-per-stream), too_many_subscriptions (--rlqs-max-subscriptions), invalid_bucket (empty, too many entries, empty or oversized key or value), absurd_count",
        reading: Reading::Counter(|s, points| {
            if let Some(stats) = lock(&s.quota).as_ref() {
                for reason in Ignored::ALL {
                    points(
                        stats.ignored(reason),
                        &[KeyValue::new("reason", reason.as_str())],
                    );
                }
            }
        }),
    },
    Observable {
        name: "sluice_memory_buckets_refused_total",
        description: "New buckets the memory backend had no room for (--memory-max-buckets or the rule's --memory-max-buckets-per-rule reached, every bucket still counting): their hits were answered by the rule's failure policy",
        reading: Reading::Counter(|s, points| {
            if let Some(source) = lock(&s.memory_refused).as_ref() {
                points(source(), &[]);
            }
        }),
    },
    Observable {
        name: "sluice_redis_breaker_state",
        description: "Circuit breaker per Redis endpoint: 1 for its current state, 0 for the others",
        reading: Reading::Gauge(|s, points| {
            for source in lock(&s.breakers).iter() {
                for reading in source() {
                    for state in BreakerState::ALL {
                        points(
                            u64::from(reading.state == state),
                            &[
                                KeyValue::new("endpoint", reading.endpoint.clone()),
                                KeyValue::new("state", state.as_str()),
                            ],
                        );
                    }
                }
            }
        }),
    },
];

/// A `sluice_rlqs_*` value, once the RLQS side is observed.
fn read_quota(s: &Shared, read: fn(&QuotaStats) -> u64, points: Points<'_, u64>) {
    if let Some(stats) = lock(&s.quota).as_ref() {
        points(read(stats), &[]);
    }
}

/// A `sluice_lease_*` counter, once the limiter's lease store is observed.
fn read_leases(s: &Shared, read: fn(&LeaseStore) -> u64, points: Points<'_, u64>) {
    if let Some(store) = lock(&s.leases).as_ref() {
        points(read(store), &[]);
    }
}

/// Every counter and gauge, read from `shared` at collection time.
pub(super) fn register_observables(meter: &Meter, shared: &Arc<Shared>) {
    for counter in Counter::ALL {
        let s = shared.clone();
        meter
            .u64_observable_counter(counter.metric_name())
            .with_description(counter.description())
            .with_callback(move |observer| {
                s.rules
                    .each(counter, &mut |value, attrs| observer.observe(value, attrs));
            })
            .build();
    }
    for observable in OBSERVABLES {
        let s = shared.clone();
        let (name, description) = (observable.name, observable.description);
        match observable.reading {
            Reading::Counter(read) => {
                meter
                    .u64_observable_counter(name)
                    .with_description(description)
                    .with_callback(move |o| read(&s, &mut |v, attrs| o.observe(v, attrs)))
                    .build();
            }
            Reading::Gauge(read) => {
                meter
                    .u64_observable_gauge(name)
                    .with_description(description)
                    .with_callback(move |o| read(&s, &mut |v, attrs| o.observe(v, attrs)))
                    .build();
            }
            Reading::GaugeF64(read) => {
                meter
                    .f64_observable_gauge(name)
                    .with_description(description)
                    .with_callback(move |o| read(&s, &mut |v, attrs| o.observe(v, attrs)))
                    .build();
            }
        }
    }
}

/// The points of the holder events in `events` (one metric's family) from the limiter's
/// [`SlotStats`], labelled `domain`, `key` and `event`.
fn read_holders(s: &Shared, events: &[SlotEvent], points: &mut dyn FnMut(u64, &[KeyValue])) {
    let Some(stats) = lock(&s.slots).as_ref().and_then(Weak::upgrade) else {
        return;
    };
    stats.points(&mut |value, domain, key, event| {
        if events.contains(&event) {
            let labels = [
                KeyValue::new("domain", domain.to_owned()),
                KeyValue::new("key", key.to_owned()),
                KeyValue::new("event", event.as_str()),
            ];
            points(value, &labels);
        }
    });
}
