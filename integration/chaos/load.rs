//! What the chaos tests measure with: the load ([`Load`]) and its samples, the breaker watch
//! ([`BreakerWatch`]) and the figures printed and asserted on ([`Figures`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::resilience::breaker::BreakerState;
use sluice_harness::rls::{OK, OVER_LIMIT, header};
use sluice_harness::sluice::Sluice;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use super::{DEADLINE, HUNG, MARGIN, PACE, now};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Outcome {
    Ok,
    OverLimit,
    Unavailable,
    Other,
    Hung,
}

#[derive(Clone, Debug)]
pub(super) struct Sample {
    /// Which worker group (replica or key) sent it.
    pub(super) group: usize,
    pub(super) sent: Instant,
    pub(super) latency: Duration,
    pub(super) outcome: Outcome,
    /// `x-ratelimit-degraded`, if present.
    pub(super) degraded: Option<String>,
    /// An error message mentioned NOSCRIPT.
    pub(super) noscript: bool,
}

impl Sample {
    pub(super) fn exact(&self) -> bool {
        matches!(self.outcome, Outcome::Ok | Outcome::OverLimit) && self.degraded.is_none()
    }
}

/// Workers calling sluice until stopped.
pub(super) struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<Vec<Sample>>>,
}

impl Load {
    /// `groups[i]`: a client and the request its workers send; `workers` per group.
    pub(super) fn start(
        groups: Vec<(RateLimitServiceClient<Channel>, RateLimitRequest)>,
        workers: usize,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for (group, (client, req)) in groups.into_iter().enumerate() {
            for _ in 0..workers {
                let (mut client, req, stop) = (client.clone(), req.clone(), stop.clone());
                handles.push(tokio::spawn(async move {
                    let mut samples = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let sent = now();
                        let call =
                            tokio::time::timeout(HUNG, client.should_rate_limit(req.clone()));
                        let result = call.await;
                        let latency = sent.elapsed();
                        let (outcome, degraded, noscript) = match result {
                            Err(_) => (Outcome::Hung, None, false),
                            Ok(Ok(r)) => {
                                let r = r.into_inner();
                                let degraded = header(&r, "x-ratelimit-degraded").map(String::from);
                                let outcome = match r.overall_code {
                                    OK => Outcome::Ok,
                                    OVER_LIMIT => Outcome::OverLimit,
                                    _ => Outcome::Other,
                                };
                                (outcome, degraded, false)
                            }
                            Ok(Err(status)) => {
                                let noscript = status.message().contains("NOSCRIPT");
                                let outcome = if status.code() == tonic::Code::Unavailable {
                                    Outcome::Unavailable
                                } else {
                                    eprintln!("unexpected status: {status:?}");
                                    Outcome::Other
                                };
                                (outcome, None, noscript)
                            }
                        };
                        samples.push(Sample {
                            group,
                            sent,
                            latency,
                            outcome,
                            degraded,
                            noscript,
                        });
                        tokio::time::sleep(PACE).await;
                    }
                    samples
                }));
            }
        }
        Load {
            stop,
            workers: handles,
        }
    }

    pub(super) async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for w in self.workers {
            all.extend(w.await.expect("load worker"));
        }
        all.sort_by_key(|s| s.sent);
        all
    }
}

/// Watches breaker states every few ms: when the first one left Closed, and when all were
/// Closed again after that.
pub(super) struct BreakerWatch {
    opened: Arc<std::sync::Mutex<Option<Instant>>>,
    closed: Arc<std::sync::Mutex<Option<Instant>>>,
    /// Every endpoint whose breaker was seen other than closed.
    ever_open: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    stop: Arc<AtomicBool>,
}

impl BreakerWatch {
    pub(super) fn start(sluice: &Sluice) -> BreakerWatch {
        let set = sluice.running().breakers.clone().expect("a Redis backend");
        let watch = BreakerWatch {
            opened: Default::default(),
            closed: Default::default(),
            ever_open: Default::default(),
            stop: Default::default(),
        };
        let (opened, closed, ever_open, stop) = (
            watch.opened.clone(),
            watch.closed.clone(),
            watch.ever_open.clone(),
            watch.stop.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let states = set.states();
                let open = states.iter().any(|(_, s)| *s != BreakerState::Closed);
                for (name, _) in states.iter().filter(|(_, s)| *s != BreakerState::Closed) {
                    ever_open.lock().unwrap().insert(name.clone());
                }
                let at = now();
                {
                    let mut o = opened.lock().unwrap();
                    if open && o.is_none() {
                        *o = Some(at);
                    }
                    if !open && o.is_some() {
                        closed.lock().unwrap().get_or_insert(at);
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        watch
    }

    pub(super) fn opened(&self) -> Option<Instant> {
        *self.opened.lock().unwrap()
    }

    pub(super) fn closed(&self) -> Option<Instant> {
        *self.closed.lock().unwrap()
    }

    pub(super) fn ever_open(&self, endpoint: &str) -> bool {
        self.ever_open.lock().unwrap().contains(endpoint)
    }
}

impl Drop for BreakerWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a test saw, printed in one block.
pub(super) struct Figures<'a> {
    pub(super) name: &'a str,
    pub(super) samples: &'a [Sample],
    pub(super) fault: (Instant, Instant),
}

impl Figures<'_> {
    /// Samples sent while Redis was failed.
    pub(super) fn during(&self) -> impl Iterator<Item = &Sample> {
        self.samples
            .iter()
            .filter(|s| s.sent >= self.fault.0 && s.sent < self.fault.1)
    }

    fn latency(&self) -> (Duration, Duration) {
        let mut l: Vec<Duration> = self.during().map(|s| s.latency).collect();
        l.sort();
        let max = l.last().copied().unwrap_or_default();
        let p99 = l
            .get((l.len() * 99 / 100).min(l.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default();
        (max, p99)
    }

    /// When the first exact (non-degraded) answer to a call sent after Redis was back arrived,
    /// from the given groups. Calls sent after that are all exact again (checked by the tests).
    pub(super) fn recovered(&self, groups: &[usize]) -> Option<Instant> {
        self.samples
            .iter()
            .filter(|s| s.sent >= self.fault.1 && groups.contains(&s.group))
            .filter(|s| s.exact())
            .map(|s| s.sent + s.latency)
            .min()
    }

    /// Per group: exact answers resumed, and calls sent `settle` after the first one were exact
    /// again (a failover is not one clean instant: the promoted node may still drop a
    /// connection, costing one more cooldown). A few may not be: on a shared 2-core machine a
    /// healthy call now and then misses the deadline by itself (a single miss does not open a
    /// breaker), so relapses that ran into the deadline are allowed up to 5 %, any other kind
    /// (a skipped call, a refused connection) only up to 1 %. Returns the slowest group's
    /// recovery, counted from when Redis was back.
    pub(super) fn assert_recovered(&self, groups: usize, settle: Duration) -> Duration {
        let mut slowest = Duration::ZERO;
        for group in 0..groups {
            let at = self
                .recovered(&[group])
                .unwrap_or_else(|| panic!("{}: group {group} never recovered", self.name));
            let after: Vec<&Sample> = self
                .samples
                .iter()
                .filter(|s| s.group == group && s.sent >= at + settle)
                .collect();
            let relapses: Vec<&&Sample> = after.iter().filter(|s| !s.exact()).collect();
            let slow = relapses.iter().filter(|s| s.latency >= DEADLINE).count();
            let other = relapses.len() - slow;
            assert!(
                other * 100 <= after.len() && slow * 20 <= after.len(),
                "{}: {} of {} decisions degraded after recovery ({slow} at the deadline), \
                 first {:?}",
                self.name,
                relapses.len(),
                after.len(),
                relapses.first()
            );
            slowest = slowest.max(at.saturating_duration_since(self.fault.1));
        }
        slowest
    }

    pub(super) fn print(
        &self,
        breaker_opened: Option<Instant>,
        recovered: Option<Instant>,
        extra: &str,
    ) {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for s in self.during() {
            let label = match &s.degraded {
                Some(policy) => format!("{:?}/degraded:{policy}", s.outcome),
                None => format!("{:?}", s.outcome),
            };
            *counts.entry(label).or_default() += 1;
        }
        let (max, p99) = self.latency();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "CHAOS {name}: fault {fault:.0} ms, {n} decisions during it {counts:?}; latency max {max:.1} ms p99 {p99:.1} ms; \
             breaker open after {open}; recovered {rec} after Redis was back; {total} decisions in all{extra}",
            name = self.name,
            fault = ms(self.fault.1 - self.fault.0),
            n = self.during().count(),
            max = ms(max),
            p99 = ms(p99),
            open = breaker_opened
                .map(|t| format!("{:.0} ms", ms(t.saturating_duration_since(self.fault.0))))
                .unwrap_or_else(|| "never".into()),
            rec = recovered
                .map(|t| format!("{:.0} ms", ms(t.saturating_duration_since(self.fault.1))))
                .unwrap_or_else(|| "never".into()),
            total = self.samples.len(),
        );
    }

    /// The contract bounds every fault shares.
    pub(super) fn assert_bounded(&self) {
        let (max, _) = self.latency();
        assert!(
            max <= DEADLINE + MARGIN,
            "{}: a decision during the fault took {max:?} (deadline {DEADLINE:?} + {MARGIN:?})",
            self.name
        );
        let hung = self
            .samples
            .iter()
            .filter(|s| s.outcome == Outcome::Hung)
            .count();
        let other = self
            .samples
            .iter()
            .filter(|s| s.outcome == Outcome::Other)
            .count();
        let noscript = self.samples.iter().filter(|s| s.noscript).count();
        assert_eq!(
            (hung, other, noscript),
            (0, 0, 0),
            "{}: hung, unexpected, NOSCRIPT",
            self.name
        );
        assert!(
            self.during().count() > 20,
            "{}: load must run during the fault",
            self.name
        );
    }
}
