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
    /// The extra `redis-server` arguments every node got, for nodes added later.
    args: Vec<String>,
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

        let cluster = RedisCluster {
            nodes,
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        cluster.wait_formed();
        cluster
    }

    /// Every running node: state ok, all slots assigned, every running node known; every replica
    /// linked to its master. (CLUSTER SLOTS lists a replica only once gossip carries a non-zero
    /// replication offset, up to 10 s later; clients that write only to masters do not need to
    /// wait for that.)
    pub fn wait_formed(&self) {
        let total = self.running().count().to_string();
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

/// Growing and shrinking the Cluster as an operator does, with `redis-cli --cluster`.
impl RedisCluster {
    /// Starts a fresh, empty cluster node (same arguments as the others) and joins it as a master
    /// without slots (`redis-cli --cluster add-node`); returns its index once every node knows
    /// it. Give it slots with [`reshard`](Self::reshard).
    pub fn add_master(&mut self) -> usize {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let node = RedisServer::start_cluster_node(NODE_TIMEOUT_MS, &args);
        let existing = self.running().next().expect("a running node").addr();
        cluster_cli(&["add-node", &node.addr(), &existing]);
        self.nodes.push(node);
        self.wait_formed();
        self.nodes.len() - 1
    }

    /// Moves `slots` slots to node `to` from the nodes `from` (`redis-cli --cluster reshard`:
    /// per slot SETSLOT IMPORTING/MIGRATING, MIGRATE of its keys in batches, SETSLOT NODE), then
    /// waits until every running node reports the same slot map. Clients see MOVED, ASK and
    /// TRYAGAIN while it runs.
    pub fn reshard(&self, from: &[usize], to: usize, slots: usize) {
        let from: Vec<String> = from.iter().map(|&i| self.node_id(i)).collect();
        cluster_cli(&[
            "reshard",
            &self.nodes[to].addr(),
            "--cluster-from",
            &from.join(","),
            "--cluster-to",
            &self.node_id(to),
            "--cluster-slots",
            &slots.to_string(),
            "--cluster-yes",
        ]);
        self.wait_agreed();
    }

    /// Empties master `index`: `redis-cli --cluster rebalance` with weight 0 for it spreads its
    /// slots and their keys over the other masters. Then waits until every node agrees.
    pub fn drain_master(&self, index: usize) {
        let id = self.node_id(index);
        cluster_cli(&[
            "rebalance",
            &self.other_than(index),
            "--cluster-weight",
            &format!("{id}=0"),
        ]);
        self.wait_agreed();
        assert_eq!(
            self.slots_of(index),
            0,
            "{} still serves slots after the rebalance",
            self.nodes[index].addr()
        );
    }

    /// Removes the (slotless) node `index` from the Cluster (`redis-cli --cluster del-node`: the
    /// others forget it, and it shuts down), and waits until the rest agree again.
    pub fn remove_node(&mut self, index: usize) {
        let id = self.node_id(index);
        cluster_cli(&["del-node", &self.other_than(index), &id]);
        self.nodes[index].kill();
        self.wait_formed();
        self.wait_agreed();
    }

    /// The address of a running node other than `index`.
    fn other_than(&self, index: usize) -> String {
        let port = self.nodes[index].port();
        self.running()
            .find(|node| node.port() != port)
            .expect("another running node")
            .addr()
    }

    /// `CLUSTER MYID` of node `index`.
    pub fn node_id(&self, index: usize) -> String {
        self.nodes[index].cmd(&["CLUSTER", "MYID"])
    }

    /// How many slots node `index` serves, according to that node.
    pub fn slots_of(&self, index: usize) -> u64 {
        let port = self.nodes[index].port();
        slot_ranges(&self.nodes[index])
            .into_iter()
            .filter(|(_, _, _, master)| *master == port)
            .map(|(start, end, _, _)| end - start + 1)
            .sum()
    }

    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|node| node.is_running())
    }

    /// Waits until every running node reports the same slot → master map, covering every slot.
    fn wait_agreed(&self) {
        let first = self.running().next().expect("a running node");
        wait_until("every node agrees on the slot map", FORM_DEADLINE, || {
            let mut reference = masters_by_slot(first);
            reference.sort_unstable();
            let covered: u64 = reference.iter().map(|(s, e, _)| e - s + 1).sum();
            covered == SLOTS
                && self.running().all(|node| {
                    let mut map = masters_by_slot(node);
                    map.sort_unstable();
                    map == reference
                })
        });
    }
}

/// `redis-cli --cluster <args>`; panics with its output when it fails.
fn cluster_cli(args: &[&str]) {
    let output = Command::new(binary("redis-cli"))
        .arg("--cluster")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run redis-cli --cluster");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    // redis-cli reports some failures ("[ERR] ...") with a zero exit status.
    assert!(
        output.status.success() && !text.contains("[ERR]"),
        "redis-cli --cluster {args:?} failed:\n{text}"
    );
}

/// `CLUSTER SLOTS` of `node` as (first slot, last slot, master port).
fn masters_by_slot(node: &RedisServer) -> Vec<(u64, u64, u16)> {
    slot_ranges(node)
        .into_iter()
        .map(|(start, end, _, master)| (start, end, master))
        .collect()
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
