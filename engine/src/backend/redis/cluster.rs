//! Redis Cluster: one script call per distinct slot of a request, issued concurrently, each to
//! the master that owns the slot, through that master's circuit breaker.
//!
//! sluice routes by itself rather than through redis-rs's cluster connection: that connection
//! stops serving *every* node while it rebuilds its slot map after one node failed, so a dead
//! master would stall requests to the healthy ones, which is exactly what a breaker per node
//! must prevent. Here each master has its own connection ([`ConnectionManager`], which
//! reconnects by itself), and the slot → master view comes from `CLUSTER SLOTS`: fetched at
//! start, and again in the background (one fetch at a time) after a MOVED reply or any failed or
//! skipped call, at most every [`REFRESH_AFTER_ERROR`], and at least every [`REFRESH_INTERVAL`]
//! while calls flow. A fetch asks the masters whose breakers are closed first, then the seeds.
//!
//! Refusals (see [`Refusal`]), each retried inside the call's one deadline (`--redis-timeout`,
//! which bounds all round trips of a call): MOVED (a slot migrated, or a replica was promoted) is
//! followed to the named node and the view fetched again; ASK (a slot mid-migration whose keys
//! already left) sends `ASKING` + `EVAL` to the named node; TRYAGAIN (the call's keys are split
//! between the two nodes of a half-moved slot) is retried from the slot's owner after a short,
//! growing pause, until that slot's migration completes. Everything else fails the call (the
//! failure policy answers). When a master dies and its replica is promoted, the next fetch maps
//! the slots to the new master (a fresh, closed breaker) and forgets the dead node's breaker and
//! connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, ServerErrorKind, Value};

use super::call::{Call, PROBE_KEY, bounded, classify, collect, invalid_url};
use super::heartbeat;
use super::options::RedisOptions;
use super::script;
use crate::algorithm::Verdict;
use crate::backend::breaker::{BreakerSet, Endpoint};
use crate::backend::{BackendError, Hit};
use crate::clock::SharedClock;
use crate::key::slot;

/// The slot view is fetched again at least this often while calls flow (slot migrations).
const REFRESH_INTERVAL: Duration = Duration::from_secs(5);
/// After a failure or a MOVED, the view is fetched again, but at most this often.
const REFRESH_AFTER_ERROR: Duration = Duration::from_millis(100);
/// Reconnects of one node's connection before it reports the node down; the next call starts
/// another round, so a node removed from the view leaves no reconnect loop behind.
const NODE_RECONNECT_ATTEMPTS: usize = 6;
const NODE_RECONNECT_MIN_DELAY: Duration = Duration::from_millis(10);
const NODE_RECONNECT_MAX_DELAY: Duration = Duration::from_millis(500);
/// Redirects (MOVED, ASK) followed in a row before the call fails: a slot is at most one
/// migration away from its owner, so more hops mean the nodes disagree until the view settles.
const MAX_REDIRECTS: usize = 5;
/// First pause after a TRYAGAIN, doubled after each one up to [`TRYAGAIN_MAX_PAUSE`]: a slot
/// holds a handful of buckets, which `MIGRATE` moves in a few ms.
const TRYAGAIN_FIRST_PAUSE: Duration = Duration::from_millis(1);
const TRYAGAIN_MAX_PAUSE: Duration = Duration::from_millis(8);
/// Breaker of slots no master serves in the current view.
const UNMAPPED: &str = "cluster:unmapped-slots";
const SLOTS: usize = 16_384;

/// One node's connection.
struct Node {
    addr: String,
    conn: ConnectionManager,
}

/// Which master owns each slot, with the masters' breakers.
struct SlotView {
    /// Index into `masters` per slot; `None`: not served.
    owner: Vec<Option<u16>>,
    masters: Vec<Master>,
    /// Present only when some slot is not served.
    unmapped: Option<Endpoint>,
}

struct Master {
    node: Arc<Node>,
    endpoint: Endpoint,
    /// A key in a slot this master owns, for the probe.
    probe_key: String,
}

impl SlotView {
    fn route(&self, slot: u16) -> (Option<&Arc<Node>>, &Endpoint) {
        match self.owner[usize::from(slot)] {
            Some(master) => {
                let m = &self.masters[usize::from(master)];
                (Some(&m.node), &m.endpoint)
            }
            None => (
                None,
                self.unmapped
                    .as_ref()
                    .expect("a view with unserved slots has their breaker"),
            ),
        }
    }
}

pub(super) struct ClusterLink {
    /// The first seed's settings (TLS, credentials), used for every node.
    template: ConnectionInfo,
    seeds: Vec<String>,
    /// Connections by `host:port`: the current masters (and, briefly, seeds and redirect targets).
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    view: ArcSwap<SlotView>,
    breakers: Arc<BreakerSet>,
    clock: SharedClock,
    connect_timeout: Duration,
    /// ms (on `clock`) of the last fetch attempt.
    fetched_at_ms: AtomicU64,
    /// A fetch is running.
    fetching: AtomicBool,
}

impl ClusterLink {
    /// Reads the slot map from the first seed that answers and loads the script on every master.
    pub(super) async fn connect(
        opts: &RedisOptions,
        breakers: Arc<BreakerSet>,
        clock: SharedClock,
    ) -> Result<Arc<ClusterLink>, BackendError> {
        let mut seeds = Vec::with_capacity(opts.urls.len());
        let mut template = None;
        for (index, url) in opts.urls.iter().enumerate() {
            let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .map_err(|err| invalid_url(index, &err))?;
            seeds.push(info.addr().to_string());
            template.get_or_insert(info);
        }
        let template = template.expect("at least one URL");
        let link = Arc::new(ClusterLink {
            template,
            seeds,
            nodes: Mutex::new(HashMap::new()),
            view: ArcSwap::from_pointee(SlotView {
                owner: vec![None; SLOTS],
                masters: Vec::new(),
                unmapped: None,
            }),
            fetched_at_ms: AtomicU64::new(clock.now_ms()),
            breakers,
            clock,
            connect_timeout: opts.connect_timeout,
            fetching: AtomicBool::new(false),
        });
        let view = link.fetch_view().await?;
        // Every master caches the script, so the first EVALSHA of each slot is one round trip.
        let loads = view.masters.iter().map(|m| {
            let mut conn = m.node.conn.clone();
            bounded(opts.connect_timeout, async move {
                let reply = script::load_command()
                    .query_async::<Value>(&mut conn)
                    .await
                    .map_err(classify)?;
                script::check_loaded(&reply)
            })
        });
        futures::future::try_join_all(loads).await?;
        link.install(view);
        Ok(link)
    }

    /// Decides `hits`, grouped by slot, each group on its master through that master's breaker
    /// and within the call's one deadline; outcomes come back in hit order.
    pub(super) async fn check_each(
        self: &Arc<Self>,
        hits: &[Hit],
        args: script::CallArgs,
        call: Call<'_>,
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
            let (node, endpoint) = view.route(*slot);
            let group: Vec<&Hit> = members.iter().map(|&index| &hits[index]).collect();
            call.guarded(endpoint, group.len(), Some(*slot), async move {
                let Some(node) = node else {
                    return Err(BackendError::Unavailable(format!(
                        "no Redis Cluster master serves slot {slot}"
                    )));
                };
                let reply = self.run(node, *slot, &group, args).await?;
                collect(&reply, group.iter().map(|h| h.key.as_str()), call.observer)
            })
        });
        let replies = futures::future::join_all(calls).await;
        self.maybe_refresh(replies.iter().any(Result::is_err));

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

    /// The script on `node` (the owner of `slot` in the view), following the refusals Redis
    /// answers while slots move, until it runs or the caller's deadline drops this future.
    async fn run(
        self: &Arc<Self>,
        node: &Arc<Node>,
        slot: u16,
        group: &[&Hit],
        args: script::CallArgs,
    ) -> Result<Value, BackendError> {
        let hits = group.iter().copied();
        let mut target = Arc::clone(node);
        let mut asking = false;
        let mut redirects = 0;
        let mut pause = TRYAGAIN_FIRST_PAUSE;
        loop {
            let mut conn = target.conn.clone();
            let result = if asking {
                script::run_asking(&mut conn, hits.clone(), group.len(), args).await
            } else {
                script::run(&mut conn, hits.clone(), group.len(), args).await
            };
            let err = match result {
                Ok(reply) => return Ok(reply),
                Err(err) => err,
            };
            // Every refusal below is Redis declining the call before the script runs (it routes
            // by the declared keys first), so no bucket was touched and the retry cannot count
            // one twice. A call that may have run (a timeout, a dropped connection) is never
            // retried here.
            let Some(refusal) = Refusal::of(&err) else {
                return Err(classify(err));
            };
            match refusal {
                Refusal::Moved(to) => {
                    // The view is stale: follow now, correct the view in the background.
                    self.fetched_at_ms.store(0, Ordering::Release);
                    self.maybe_refresh(true);
                    redirects += 1;
                    asking = false;
                    target = match to {
                        Some(addr) => self.node(addr),
                        // A pipelined reply carries no address: ask the owner again.
                        None => self.owner_of(slot).unwrap_or_else(|| Arc::clone(node)),
                    };
                }
                Refusal::Ask(to) => {
                    redirects += 1;
                    asking = true;
                    target = self.node(to);
                }
                Refusal::TryAgain => {
                    // Start over at the owner: by then the slot may have finished moving (MOVED)
                    // or all its keys may have left (ASK).
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(TRYAGAIN_MAX_PAUSE);
                    redirects = 0;
                    asking = false;
                    target = self.owner_of(slot).unwrap_or_else(|| Arc::clone(node));
                }
            }
            if redirects > MAX_REDIRECTS {
                return Err(classify(err));
            }
        }
    }

    /// The master that owns `slot` in the current view.
    fn owner_of(&self, slot: u16) -> Option<Arc<Node>> {
        self.view.load().route(slot).0.cloned()
    }

    /// The connection of the master that owns `key`'s slot in the current view (admin calls,
    /// not subject to its breaker).
    pub(super) fn owner_connection(&self, key: &str) -> Result<ConnectionManager, BackendError> {
        self.owner_of(slot(key))
            .map(|node| node.conn.clone())
            .ok_or_else(|| {
                BackendError::Unavailable(format!(
                    "no Redis Cluster master serves slot {}",
                    slot(key)
                ))
            })
    }

    /// One probe key per master of the current view.
    pub(super) fn probe_keys(&self) -> Vec<String> {
        let view = self.view.load();
        if view.masters.is_empty() {
            return vec![PROBE_KEY.to_string()];
        }
        view.masters.iter().map(|m| m.probe_key.clone()).collect()
    }

    /// The heartbeat on the master of its key's slot (not subject to the breakers).
    pub(super) async fn heartbeat(
        &self,
        key: &str,
        cmd: &Cmd,
        timeout: Duration,
    ) -> Result<heartbeat::Beat, BackendError> {
        let view = self.view.load_full();
        let (Some(node), _) = view.route(slot(key)) else {
            return Err(BackendError::Unavailable(
                "no master serves the heartbeat slot".into(),
            ));
        };
        let mut conn = node.conn.clone();
        bounded(timeout, heartbeat::run(&mut conn, cmd)).await
    }

    /// The connection to `addr`, created on first use.
    fn node(&self, addr: &str) -> Arc<Node> {
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(node) = nodes.get(addr) {
            return node.clone();
        }
        let node = Arc::new(Node {
            addr: addr.to_string(),
            conn: connection(&self.template, addr, self.connect_timeout),
        });
        nodes.insert(addr.to_string(), node.clone());
        node
    }

    /// Starts a background fetch of the slot view when one is due.
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
            match link.fetch_view().await {
                Ok(view) => link.install(view),
                Err(err) => {
                    tracing::debug!(error = %err, "fetching the Redis Cluster slot map failed")
                }
            }
            link.fetching.store(false, Ordering::Release);
        });
    }

    /// `CLUSTER SLOTS` from the first node that answers: masters with closed breakers first,
    /// then the other masters, then the seeds.
    async fn fetch_view(&self) -> Result<SlotView, BackendError> {
        let current = self.view.load_full();
        let mut candidates: Vec<(bool, String)> = current
            .masters
            .iter()
            .map(|m| (!m.endpoint.is_closed(), m.node.addr.clone()))
            .collect();
        candidates.sort();
        let mut order: Vec<String> = candidates.into_iter().map(|(_, addr)| addr).collect();
        for seed in &self.seeds {
            if !order.contains(seed) {
                order.push(seed.clone());
            }
        }
        let mut last_error = BackendError::Unavailable("no Redis Cluster node to ask".into());
        for addr in order {
            let node = self.node(&addr);
            let mut conn = node.conn.clone();
            let reply = bounded(self.connect_timeout, async {
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut conn)
                    .await
                    .map_err(classify)
            })
            .await;
            let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
            match reply.and_then(|reply| parse_slots(&reply, host)) {
                Ok(ranges) if !ranges.is_empty() => return Ok(self.build_view(&ranges)),
                Ok(_) => last_error = BackendError::Protocol("CLUSTER SLOTS is empty".into()),
                Err(err) => last_error = err,
            }
        }
        Err(last_error)
    }

    fn build_view(&self, ranges: &[(u16, u16, String)]) -> SlotView {
        let (owner, names) = slot_owners(ranges);
        let masters = names
            .iter()
            .enumerate()
            .map(|(index, name)| Master {
                node: self.node(name),
                endpoint: self.breakers.endpoint(name),
                probe_key: probe_key_for(&owner, index as u16),
            })
            .collect();
        let uncovered = owner.iter().any(Option::is_none);
        SlotView {
            unmapped: uncovered.then(|| self.breakers.endpoint(UNMAPPED)),
            owner,
            masters,
        }
    }

    /// Makes `view` current; forgets the connections and breakers of nodes no longer in it, and
    /// warms the connections of new masters (which also caches the script there).
    fn install(&self, view: SlotView) {
        let names: Vec<&str> = view.masters.iter().map(|m| m.node.addr.as_str()).collect();
        let uncovered = view.unmapped.is_some();
        self.breakers
            .retain(|name| (uncovered && name == UNMAPPED) || names.contains(&name));
        let mut fresh = Vec::new();
        {
            let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
            nodes.retain(|addr, _| names.contains(&addr.as_str()));
            let old = self.view.load();
            for m in &view.masters {
                if !old.masters.iter().any(|o| o.node.addr == m.node.addr) {
                    fresh.push(m.node.clone());
                }
            }
        }
        self.view.store(Arc::new(view));
        let timeout = self.connect_timeout;
        for node in fresh {
            tokio::spawn(async move {
                let mut conn = node.conn.clone();
                let _ = bounded(timeout, async {
                    script::load_command()
                        .query_async::<Value>(&mut conn)
                        .await
                        .map_err(classify)
                })
                .await;
            });
        }
    }
}

/// A reply by which Redis declined to run a call, and what to do about it. Redis decides where
/// a command may run from its declared keys before executing it: a script answered with one of
/// these never ran, so repeating the call elsewhere or later is safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal<'a> {
    /// `MOVED <slot> <addr>`: the slot lives on `addr` now (the view is stale). `None`: the
    /// address was not given (a pipelined reply keeps only the error's kind).
    Moved(Option<&'a str>),
    /// `ASK <slot> <addr>`: the slot is migrating to `addr` and the keys have left; run the call
    /// there once, after `ASKING`.
    Ask(&'a str),
    /// `TRYAGAIN`: some keys of the call have migrated and some have not; retry when the slot
    /// has finished moving.
    TryAgain,
}

impl<'a> Refusal<'a> {
    fn of(err: &'a RedisError) -> Option<Refusal<'a>> {
        match err.kind() {
            ErrorKind::Server(ServerErrorKind::Moved) => {
                Some(Refusal::Moved(err.redirect_node().map(|(addr, _)| addr)))
            }
            // An ASK without its address cannot be followed: the call fails.
            ErrorKind::Server(ServerErrorKind::Ask) => {
                err.redirect_node().map(|(addr, _)| Refusal::Ask(addr))
            }
            ErrorKind::Server(ServerErrorKind::TryAgain) => Some(Refusal::TryAgain),
            _ => None,
        }
    }
}

/// A lazily connecting, self-repairing connection to `addr` with `template`'s TLS and credentials.
fn connection(
    template: &ConnectionInfo,
    addr: &str,
    connect_timeout: Duration,
) -> ConnectionManager {
    let (host, port) = addr
        .rsplit_once(':')
        .and_then(|(h, p)| p.parse::<u16>().ok().map(|p| (h, p)))
        .unwrap_or((addr, 6379));
    let node_addr = match template.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.to_string(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host.to_string(), port),
    };
    let info = template.clone().set_addr(node_addr);
    let client = redis::Client::open(info).expect("a TCP address is always valid");
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        // The caller bounds every call itself (command_timeout).
        .set_response_timeout(None)
        .set_min_delay(NODE_RECONNECT_MIN_DELAY)
        .set_max_delay(NODE_RECONNECT_MAX_DELAY)
        .set_number_of_retries(NODE_RECONNECT_ATTEMPTS);
    ConnectionManager::new_lazy_with_config(client, config)
        .expect("no push sender or resubscription is configured")
}

/// Slot → index into the sorted, distinct master names.
fn slot_owners(ranges: &[(u16, u16, String)]) -> (Vec<Option<u16>>, Vec<String>) {
    let mut names: Vec<String> = ranges.iter().map(|(_, _, addr)| addr.clone()).collect();
    names.sort_unstable();
    names.dedup();
    let mut owner = vec![None; SLOTS];
    for (start, end, addr) in ranges {
        let index = names.binary_search(addr).expect("listed") as u16;
        for slot in *start..=*end {
            owner[usize::from(slot)] = Some(index);
        }
    }
    (owner, names)
}

/// `sluice:probe{n}` for the smallest `n` whose slot `master` owns (a master owns at least one
/// slot, so a few tries per 16384 / owned slots find one).
fn probe_key_for(owner: &[Option<u16>], master: u16) -> String {
    (0u32..)
        .map(|n| format!("{PROBE_KEY}{{{n}}}"))
        .find(|key| owner[usize::from(slot(key))] == Some(master))
        .expect("a master owns a slot")
}

/// `CLUSTER SLOTS` as (first slot, last slot, master `host:port`). An empty host means the
/// node that was asked (`asked_host`), as Redis documents.
fn parse_slots(reply: &Value, asked_host: &str) -> Result<Vec<(u16, u16, String)>, BackendError> {
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
            let host = if host.is_empty() || host == "?" {
                asked_host.to_string()
            } else {
                host
            };
            let port = match node.get(1) {
                Some(Value::Int(p)) if (1..=i64::from(u16::MAX)).contains(p) => *p,
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
    fn every_slot_maps_to_its_master_and_probe_keys_land_there() {
        let reply = Value::Array(vec![
            range(0, 5460, "127.0.0.1", 7000),
            range(5461, 10922, "127.0.0.1", 7001),
            range(10923, 16383, "", 7002),
        ]);
        let ranges = parse_slots(&reply, "10.0.0.9").unwrap();
        assert_eq!(ranges[1], (5461, 10922, "127.0.0.1:7001".to_string()));
        assert_eq!(ranges[2].2, "10.0.0.9:7002", "empty host: the node asked");
        let (owner, names) = slot_owners(&ranges);
        assert_eq!(names, ["10.0.0.9:7002", "127.0.0.1:7000", "127.0.0.1:7001"]);
        assert_eq!(owner[0], Some(1));
        assert_eq!(owner[10922], Some(2));
        assert_eq!(owner[16383], Some(0));
        assert!(owner.iter().all(Option::is_some));
        for master in 0..3 {
            let key = probe_key_for(&owner, master);
            assert_eq!(owner[usize::from(slot(&key))], Some(master), "{key}");
        }
    }

    /// A Redis error reply as redis-rs hands it over from the wire.
    fn reply_error(line: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(Value::ServerError(err)) => RedisError::from(err),
            Ok(other) => panic!("{line:?} parsed as {other:?}"),
            Err(err) => err,
        }
    }

    #[test]
    fn refusals_before_execution_are_told_apart_from_failures() {
        let moved = reply_error("MOVED 3999 127.0.0.1:6381");
        assert_eq!(
            Refusal::of(&moved),
            Some(Refusal::Moved(Some("127.0.0.1:6381")))
        );
        let ask = reply_error("ASK 3999 10.0.0.2:7002");
        assert_eq!(Refusal::of(&ask), Some(Refusal::Ask("10.0.0.2:7002")));
        let again = reply_error("TRYAGAIN Multiple keys request during rehashing of slot");
        assert_eq!(Refusal::of(&again), Some(Refusal::TryAgain));
        // As a pipeline (ASKING + EVAL) reports it: the kind without the address.
        let bare = RedisError::from((ErrorKind::Server(ServerErrorKind::Moved), "moved"));
        assert_eq!(Refusal::of(&bare), Some(Refusal::Moved(None)));
        let bare_ask = RedisError::from((ErrorKind::Server(ServerErrorKind::Ask), "ask"));
        assert_eq!(
            Refusal::of(&bare_ask),
            None,
            "an ASK without a node cannot be followed"
        );

        // Not refusals: the script may have run (or Redis cannot serve at all), so no retry.
        for line in [
            "CLUSTERDOWN The cluster is down",
            "ERR Error running script (call to f_x): @user_script:1: boom",
            "NOSCRIPT No matching script",
            "CROSSSLOT Keys in request don't hash to the same slot",
            "READONLY You can't write against a read only replica.",
            "BUSY Redis is busy running a script",
        ] {
            assert_eq!(Refusal::of(&reply_error(line)), None, "{line}");
        }
        let dropped = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(
            Refusal::of(&dropped),
            None,
            "a dropped reply may follow a run"
        );
    }

    #[test]
    fn uncovered_slots_stay_unowned_and_bad_replies_are_errors() {
        let ranges =
            parse_slots(&Value::Array(vec![range(0, 100, "10.0.0.1", 7000)]), "h").unwrap();
        let (owner, _) = slot_owners(&ranges);
        assert_eq!(owner[101], None);
        assert!(parse_slots(&Value::Nil, "h").is_err());
        assert!(parse_slots(&Value::Array(vec![Value::Array(vec![Value::Int(0)])]), "h").is_err());
        assert!(parse_slots(&Value::Array(vec![range(9, 3, "h", 1)]), "h").is_err());
        assert!(parse_slots(&Value::Array(vec![range(0, 3, "h", 0)]), "h").is_err());
    }
}
