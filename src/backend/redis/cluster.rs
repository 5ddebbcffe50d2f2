//! Redis Cluster: one script call per distinct slot of a request, issued concurrently, each
//! through the circuit breaker of the node that owns the slot.
//!
//! The cluster connection routes by itself (and follows MOVED/ASK) but does not say where a
//! slot goes, so sluice keeps its own slot → master view from `CLUSTER SLOTS`, only to pick the
//! breaker: fetched at start, and again (in the background, one fetch at a time) after any
//! failed or skipped call, at most every [`REFRESH_AFTER_ERROR`], and at least every
//! [`REFRESH_INTERVAL`] while calls flow (which also catches slot migrations, whose MOVED
//! replies the connection absorbs). When a master dies and its replica is promoted, the slot
//! moves to the new master's (closed) breaker at the next fetch and the dead node's breaker is
//! forgotten. A stale view only misattributes an outcome; routing stays the connection's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo, SingleNodeRoutingInfo,
};
use redis::{Cmd, Value};

use super::{
    PROBE_KEY, RedisOptions, bounded, classify, collect, guarded, heartbeat, invalid_url, script,
};
use crate::algorithm::Verdict;
use crate::backend::{BackendError, Hit};
use crate::clock::SharedClock;
use crate::key::slot;
use crate::resilience::breaker::{BreakerSet, Endpoint};

/// Redirects (MOVED/ASK) and TRYAGAIN are retried inside the cluster connection; these bound
/// how often and how long it waits, since a check has only its command timeout to spend.
const RETRIES: u32 = 4;
const MIN_RETRY_WAIT_MS: u64 = 2;
const MAX_RETRY_WAIT_MS: u64 = 100;

/// The slot view is fetched again at least this often while calls flow.
const REFRESH_INTERVAL: Duration = Duration::from_secs(5);
/// After a failure, the view is fetched again, but at most this often.
const REFRESH_AFTER_ERROR: Duration = Duration::from_millis(100);
/// Attempts of one fetch (each on a node the connection picks at random; one may be the dead one).
const FETCH_ATTEMPTS: usize = 3;
/// Breaker of slots no master serves in the current view (a cluster with uncovered slots).
const UNMAPPED: &str = "cluster:unmapped-slots";
const SLOTS: usize = 16_384;

/// Which master owns each slot, with the masters' breakers.
struct SlotView {
    /// Index into `masters` per slot; `None`: not served.
    owner: Vec<Option<u16>>,
    masters: Vec<Master>,
    /// Present only when some slot is not served.
    unmapped: Option<Endpoint>,
}

struct Master {
    endpoint: Endpoint,
    /// A key in a slot this master owns, for the probe.
    probe_key: String,
}

impl SlotView {
    fn endpoint(&self, slot: u16) -> &Endpoint {
        match self.owner.get(usize::from(slot)).copied().flatten() {
            Some(master) => &self.masters[usize::from(master)].endpoint,
            None => self
                .unmapped
                .as_ref()
                .expect("a view with unserved slots has their breaker"),
        }
    }
}

pub(super) struct ClusterLink {
    conn: ClusterConnection,
    breakers: Arc<BreakerSet>,
    view: ArcSwap<SlotView>,
    clock: SharedClock,
    connect_timeout: Duration,
    /// ms (on `clock`) of the last fetch attempt.
    fetched_at_ms: AtomicU64,
    /// A fetch is running.
    fetching: AtomicBool,
}

impl ClusterLink {
    pub(super) async fn connect(
        opts: &RedisOptions,
        breakers: Arc<BreakerSet>,
        clock: SharedClock,
    ) -> Result<Arc<ClusterLink>, BackendError> {
        let mut nodes = Vec::with_capacity(opts.urls.len());
        for (index, url) in opts.urls.iter().enumerate() {
            let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .map_err(|err| invalid_url(index, &err))?;
            nodes.push(info);
        }
        let client = ClusterClientBuilder::new(nodes)
            .connection_timeout(opts.connect_timeout)
            .retries(RETRIES)
            .min_retry_wait(MIN_RETRY_WAIT_MS)
            .max_retry_wait(MAX_RETRY_WAIT_MS)
            .build()
            .map_err(|err| BackendError::Unavailable(format!("Redis Cluster client: {err}")))?;
        let mut conn = bounded(opts.connect_timeout, async {
            client.get_async_connection().await.map_err(classify)
        })
        .await?;

        // Every master caches the script, so the first EVALSHA of each slot is one round trip.
        let reply = bounded(opts.connect_timeout, async {
            conn.route_command(
                script::load_command(),
                RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                )),
            )
            .await
            .map_err(classify)
        })
        .await?;
        script::check_loaded(&reply)?;

        let view = fetch_view(&conn, &breakers, opts.connect_timeout).await?;
        Ok(Arc::new(ClusterLink {
            conn,
            fetched_at_ms: AtomicU64::new(clock.now_ms()),
            view: ArcSwap::from_pointee(view),
            breakers,
            clock,
            connect_timeout: opts.connect_timeout,
            fetching: AtomicBool::new(false),
        }))
    }

    /// Decides `hits`, grouped by slot, each group through its master's breaker and within
    /// `timeout`; outcomes come back in hit order.
    pub(super) async fn check_each(
        self: &Arc<Self>,
        hits: &[Hit],
        now_ms: Option<u64>,
        timeout: Duration,
    ) -> Vec<Result<Verdict, BackendError>> {
        let view = self.view.load_full();
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (index, hit) in hits.iter().enumerate() {
            let slot = slot(&hit.key);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, members)) => members.push(index),
                None => groups.push((slot, vec![index])),
            }
        }
        let calls = groups.iter().map(|(slot, members)| {
            let mut conn = self.conn.clone();
            let endpoint = view.endpoint(*slot);
            guarded(endpoint, timeout, async move {
                let group = members.iter().map(|&index| &hits[index]);
                let reply = script::run(&mut conn, group, members.len(), now_ms)
                    .await
                    .map_err(classify)?;
                collect(&reply, members.len())
            })
        });
        let replies = futures::future::join_all(calls).await;

        let failed = replies.iter().any(Result::is_err);
        self.maybe_refresh(failed);
        let mut outcomes: Vec<Option<Result<Verdict, BackendError>>> = vec![None; hits.len()];
        for ((_, members), reply) in groups.iter().zip(replies) {
            match reply {
                Ok(verdicts) => {
                    for (&index, verdict) in members.iter().zip(verdicts) {
                        outcomes[index] = Some(Ok(verdict));
                    }
                }
                Err(error) => {
                    for &index in members {
                        outcomes[index] = Some(Err(error.clone()));
                    }
                }
            }
        }
        outcomes
            .into_iter()
            .map(|o| o.expect("every hit is in one group"))
            .collect()
    }

    /// One probe key per master of the current view.
    pub(super) fn probe_keys(&self) -> Vec<String> {
        let view = self.view.load();
        if view.masters.is_empty() {
            return vec![PROBE_KEY.to_string()];
        }
        view.masters.iter().map(|m| m.probe_key.clone()).collect()
    }

    /// The heartbeat, routed by its key (not subject to the breakers).
    pub(super) async fn heartbeat(&self, cmd: &Cmd, timeout: Duration) -> Result<u64, BackendError> {
        let mut conn = self.conn.clone();
        bounded(timeout, heartbeat::run(&mut conn, cmd)).await
    }

    /// Starts a background fetch of the slot view when it is due.
    fn maybe_refresh(self: &Arc<Self>, failed: bool) {
        let now = self.clock.now_ms();
        let last = self.fetched_at_ms.load(Ordering::Acquire);
        let every = if failed {
            REFRESH_AFTER_ERROR
        } else {
            REFRESH_INTERVAL
        };
        if now < last.saturating_add(every.as_millis() as u64) {
            return;
        }
        if self.fetching.swap(true, Ordering::AcqRel) {
            return;
        }
        self.fetched_at_ms.store(now, Ordering::Release);
        let link = Arc::clone(self);
        tokio::spawn(async move {
            match fetch_view(&link.conn, &link.breakers, link.connect_timeout).await {
                Ok(view) => link.view.store(Arc::new(view)),
                Err(err) => tracing::debug!(error = %err, "fetching the Redis Cluster slot map failed"),
            }
            link.fetching.store(false, Ordering::Release);
        });
    }
}

/// Asks a node for `CLUSTER SLOTS` and builds the view; breakers of masters no longer in it are
/// forgotten, those still in it keep their state.
async fn fetch_view(
    conn: &ClusterConnection,
    breakers: &BreakerSet,
    timeout: Duration,
) -> Result<SlotView, BackendError> {
    let mut last_error = BackendError::Unavailable("no CLUSTER SLOTS attempt".into());
    for _ in 0..FETCH_ATTEMPTS {
        let mut conn = conn.clone();
        let reply = bounded(timeout, async {
            conn.route_command(
                {
                    let mut cmd = redis::cmd("CLUSTER");
                    cmd.arg("SLOTS");
                    cmd
                },
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .map_err(classify)
        })
        .await;
        match reply.and_then(|reply| parse_slots(&reply)) {
            Ok(ranges) if !ranges.is_empty() => return Ok(build_view(&ranges, breakers)),
            Ok(_) => last_error = BackendError::Protocol("CLUSTER SLOTS is empty".into()),
            Err(err) => last_error = err,
        }
    }
    Err(last_error)
}

fn build_view(ranges: &[(u16, u16, String)], breakers: &BreakerSet) -> SlotView {
    let mut names: Vec<&str> = ranges.iter().map(|(_, _, addr)| addr.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut owner = vec![None; SLOTS];
    for (start, end, addr) in ranges {
        let index = names.binary_search(&addr.as_str()).expect("listed") as u16;
        for slot in *start..=(*end).min(SLOTS as u16 - 1) {
            owner[usize::from(slot)] = Some(index);
        }
    }
    let masters = names
        .iter()
        .enumerate()
        .map(|(index, name)| Master {
            endpoint: breakers.endpoint(name),
            probe_key: probe_key_for(&owner, index as u16),
        })
        .collect();
    let uncovered = owner.iter().any(Option::is_none);
    breakers.retain(|name| (uncovered && name == UNMAPPED) || names.binary_search(&name).is_ok());
    SlotView {
        owner,
        masters,
        unmapped: uncovered.then(|| breakers.endpoint(UNMAPPED)),
    }
}

/// `sluice:probe{n}` for the smallest `n` whose slot `master` owns (a master owns at least one
/// slot, so a few tries per 16384 / owned slots find one).
fn probe_key_for(owner: &[Option<u16>], master: u16) -> String {
    (0u32..)
        .map(|n| format!("{PROBE_KEY}{{{n}}}"))
        .find(|key| owner[usize::from(slot(key))] == Some(master))
        .expect("a master owns a slot")
}

/// `CLUSTER SLOTS` as (first slot, last slot, master `host:port`).
fn parse_slots(reply: &Value) -> Result<Vec<(u16, u16, String)>, BackendError> {
    let bad = |what: &str| BackendError::Protocol(format!("CLUSTER SLOTS: {what}"));
    let Value::Array(ranges) = reply else {
        return Err(bad("not an array"));
    };
    let int = |value: &Value| match value {
        Value::Int(n) if (0..SLOTS as i64).contains(n) => Ok(*n as u16),
        _ => Err(bad("slot is not an integer in range")),
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(items) = range else {
                return Err(bad("range is not an array"));
            };
            let [start, end, master, ..] = items.as_slice() else {
                return Err(bad("range without a master"));
            };
            let Value::Array(node) = master else {
                return Err(bad("master is not an array"));
            };
            let host = match node.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => return Err(bad("master host")),
            };
            let port = match node.get(1) {
                Some(Value::Int(p)) => *p,
                _ => return Err(bad("master port")),
            };
            let (start, end) = (int(start)?, int(end)?);
            if start > end {
                return Err(bad("range ends before it starts"));
            }
            Ok((start, end, format!("{host}:{port}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::resilience::breaker::BreakerSettings;

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
            // A replica; not part of the view.
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port + 100),
            ]),
        ])
    }

    #[test]
    fn view_maps_every_slot_to_its_master_and_probe_keys_land_there() {
        let reply = Value::Array(vec![
            range(0, 5460, "127.0.0.1", 7000),
            range(5461, 10922, "127.0.0.1", 7001),
            range(10923, 16383, "127.0.0.1", 7002),
        ]);
        let ranges = parse_slots(&reply).unwrap();
        assert_eq!(ranges[1], (5461, 10922, "127.0.0.1:7001".to_string()));
        let breakers = BreakerSet::new(
            BreakerSettings::default(),
            Arc::new(ManualClock::new(1)),
        );
        breakers.endpoint("127.0.0.1:6999");
        let view = build_view(&ranges, &breakers);
        assert_eq!(view.endpoint(0).name(), "127.0.0.1:7000");
        assert_eq!(view.endpoint(10922).name(), "127.0.0.1:7001");
        assert_eq!(view.endpoint(16383).name(), "127.0.0.1:7002");
        for master in &view.masters {
            assert_eq!(view.endpoint(slot(&master.probe_key)).name(), master.endpoint.name());
        }
        // The node no longer in the view is forgotten.
        let names: Vec<String> = breakers.states().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]);
    }

    #[test]
    fn uncovered_slots_use_their_own_breaker_and_bad_replies_are_errors() {
        let reply = Value::Array(vec![range(0, 100, "10.0.0.1", 7000)]);
        let breakers = BreakerSet::new(
            BreakerSettings::default(),
            Arc::new(ManualClock::new(1)),
        );
        let view = build_view(&parse_slots(&reply).unwrap(), &breakers);
        assert_eq!(view.endpoint(101).name(), UNMAPPED);
        assert!(parse_slots(&Value::Nil).is_err());
        assert!(breakers.states().iter().any(|(n, _)| n == UNMAPPED));
        assert!(parse_slots(&Value::Nil).is_err());
        assert!(parse_slots(&Value::Array(vec![Value::Array(vec![Value::Int(0)])])).is_err());
        assert!(parse_slots(&Value::Array(vec![range(9, 3, "h", 1)])).is_err());
    }
}
