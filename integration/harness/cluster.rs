//! A Redis Cluster of real processes, created with `redis-cli --cluster create`.

use std::process::Command;
use std::time::Duration;

use crate::{RedisServer, binary, wait_until};

/// Small, so failover tests are quick (Redis's default is 15 s).
const NODE_TIMEOUT_MS: u64 = 500;
const FORM_DEADLINE: Duration = Duration::from_secs(30);
const SLOTS: u64 = 16_384;

pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `masters` masters (at least 3) with `replicas_per_master` replicas each; returns once the
    /// cluster is formed (see [`wait_formed`](Self::wait_formed)).
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        Self::start_with(masters, replicas_per_master, &[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments for every node (e.g.
    /// `["--cluster-require-full-coverage", "no"]`, so the healthy masters keep serving their
    /// slots while one master is down).
    pub fn start_with(masters: usize, replicas_per_master: usize, args: &[&str]) -> RedisCluster {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 masters"
        );
        let total = masters * (1 + replicas_per_master);
        let nodes: Vec<RedisServer> = (0..total)
            .map(|_| RedisServer::start_cluster_node(NODE_TIMEOUT_MS, args))
            .collect();

        let mut create = Command::new(binary("redis-cli"));
        create.args(["--cluster", "create"]);
        for node in &nodes {
            create.arg(node.addr());
        }
        create
            .args([
                "--cluster-replicas",
                &replicas_per_master.to_string(),
                "--cluster-yes",
            ])
            .stdin(std::process::Stdio::null());
        let output = create.output().expect("run redis-cli --cluster create");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );

        let cluster = RedisCluster { nodes };
        cluster.wait_formed();
        cluster
    }

    /// Every node: state ok, all slots assigned, every node known; every replica linked to its
    /// master. (CLUSTER SLOTS lists a replica only once gossip carries a non-zero replication
    /// offset, up to 10 s later; clients that write only to masters do not need to wait for that.)
    pub fn wait_formed(&self) {
        let total = self.nodes.len().to_string();
        for node in self.nodes.iter().filter(|node| node.is_running()) {
            wait_until(
                &format!("cluster formed on {}", node.addr()),
                FORM_DEADLINE,
                || {
                    let info = crate::parse_info(&node.cmd::<String>(&["CLUSTER", "INFO"]));
                    let field = |name: &str| info.get(name).map(String::as_str);
                    let replication = node.info("replication");
                    let linked = replication.get("role").map(String::as_str) == Some("master")
                        || replication.get("master_link_status").map(String::as_str) == Some("up");
                    field("cluster_state") == Some("ok")
                        && field("cluster_slots_ok") == Some(&SLOTS.to_string())
                        && field("cluster_known_nodes") == Some(total.as_str())
                        && linked
                },
            );
        }
    }

    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// Seed URLs for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The running nodes that are masters now.
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|node| node.is_running())
            .filter(|node| {
                node.info("replication").get("role").map(String::as_str) == Some("master")
            })
            .collect()
    }

    /// `CLUSTER KEYSLOT key`, asked of the cluster itself.
    pub fn keyslot(&self, key: &str) -> u16 {
        self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key])
    }

    /// The master serving `key`'s slot now.
    pub fn master_for(&self, key: &str) -> &RedisServer {
        self.master_for_slot(self.keyslot(key))
    }

    /// The master serving `slot` now, according to the first running node.
    pub fn master_for_slot(&self, slot: u16) -> &RedisServer {
        let any = self
            .nodes
            .iter()
            .find(|node| node.is_running())
            .expect("a running node");
        let port = slot_owner(any, slot);
        self.nodes
            .iter()
            .find(|node| node.port() == port)
            .expect("master is a node of ours")
    }

    /// Moves `slot` and its keys to master `to` (CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE,
    /// SETSLOT NODE on every master), then waits until every node agrees. Clients holding the
    /// old map get MOVED.
    pub fn move_slot(&self, slot: u16, to: &RedisServer) {
        let from = self.master_for_slot(slot);
        if from.port() == to.port() {
            return;
        }
        let slot_arg = slot.to_string();
        let from_id: String = from.cmd(&["CLUSTER", "MYID"]);
        let to_id: String = to.cmd(&["CLUSTER", "MYID"]);
        let _: String = to.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id]);
        let _: String = from.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id]);
        loop {
            let keys: Vec<String> = from.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"]);
            if keys.is_empty() {
                break;
            }
            let port = to.port().to_string();
            let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            migrate.extend(keys.iter().map(String::as_str));
            let _: String = from.cmd(&migrate);
        }
        for master in self.masters() {
            let _: String = master.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id]);
        }
        for node in self.nodes.iter().filter(|node| node.is_running()) {
            wait_until(
                &format!("slot {slot} moved, seen by {}", node.addr()),
                FORM_DEADLINE,
                || slot_owner(node, slot) == to.port(),
            );
        }
    }
}

/// Port of the master serving `slot` according to `node`.
fn slot_owner(node: &RedisServer, slot: u16) -> u16 {
    let slot = u64::from(slot);
    slot_ranges(node)
        .into_iter()
        .find(|(start, end, _, _)| (*start..=*end).contains(&slot))
        .map(|(_, _, _, master_port)| master_port)
        .expect("slot is served")
}

/// `CLUSTER SLOTS` as (first slot, last slot, number of nodes serving it, master port).
fn slot_ranges(node: &RedisServer) -> Vec<(u64, u64, usize, u16)> {
    let reply: redis::Value = node.cmd(&["CLUSTER", "SLOTS"]);
    let redis::Value::Array(ranges) = reply else {
        panic!("CLUSTER SLOTS: unexpected {reply:?}");
    };
    ranges
        .into_iter()
        .map(|range| {
            let redis::Value::Array(items) = range else {
                panic!("CLUSTER SLOTS range: {range:?}")
            };
            let int = |value: &redis::Value| match value {
                redis::Value::Int(n) => *n as u64,
                other => panic!("CLUSTER SLOTS: expected an integer, got {other:?}"),
            };
            let master_port = match &items[2] {
                redis::Value::Array(master) => int(&master[1]) as u16,
                other => panic!("CLUSTER SLOTS node: {other:?}"),
            };
            (int(&items[0]), int(&items[1]), items.len() - 2, master_port)
        })
        .collect()
}
