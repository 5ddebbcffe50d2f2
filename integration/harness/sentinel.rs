//! A master, one replica and three Sentinels (quorum 2), with timeouts small enough that a
//! failover completes within seconds.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use crate::{RedisServer, free_port, wait_until};

pub const MASTER_NAME: &str = "sluice-master";
const SENTINELS: usize = 3;
const QUORUM: usize = 2;
const DOWN_AFTER_MS: u64 = 500;
const FAILOVER_TIMEOUT_MS: u64 = 2_000;
const READY_DEADLINE: Duration = Duration::from_secs(30);

pub struct RedisSentinel {
    /// The two data nodes; which one is master changes with failovers.
    nodes: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl RedisSentinel {
    pub fn start() -> RedisSentinel {
        let master = RedisServer::start();
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
        wait_until("replica in sync", READY_DEADLINE, || {
            replica
                .info("replication")
                .get("master_link_status")
                .map(String::as_str)
                == Some("up")
        });

        // Sentinels are told about each other and the replica up front (known-sentinel,
        // known-replica), so no test waits for their hello/INFO discovery rounds.
        let ports: Vec<u16> = (0..SENTINELS).map(|_| free_port(false)).collect();
        let ids: Vec<String> = (0..SENTINELS)
            .map(|_| format!("{:040x}", rand::random::<u128>()))
            .collect();
        let sentinels = (0..SENTINELS)
            .map(|me| {
                let (master_port, replica_port) = (master.port(), replica.port());
                let (ports, ids) = (&ports, &ids);
                RedisServer::start_sentinel_on(ports[me], move |dir: &Path| {
                    let mut conf = format!(
                        "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/redis.log\n\
                         sentinel myid {id}\n\
                         sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {QUORUM}\n\
                         sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                         sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
                         sentinel parallel-syncs {MASTER_NAME} 1\n\
                         sentinel known-replica {MASTER_NAME} 127.0.0.1 {replica_port}\n",
                        port = ports[me],
                        dir = dir.display(),
                        id = ids[me],
                    );
                    for other in (0..SENTINELS).filter(|&other| other != me) {
                        conf.push_str(&format!(
                            "sentinel known-sentinel {MASTER_NAME} 127.0.0.1 {} {}\n",
                            ports[other], ids[other]
                        ));
                    }
                    conf
                })
            })
            .collect();

        let setup = RedisSentinel {
            nodes: vec![master, replica],
            sentinels,
        };
        for sentinel in &setup.sentinels {
            wait_until(
                &format!("sentinel {} ready", sentinel.addr()),
                READY_DEADLINE,
                || {
                    let state = sentinel_master(sentinel);
                    let field = |name: &str| state.get(name).map(String::as_str);
                    field("flags") == Some("master")
                        && field("num-slaves") == Some("1")
                        && field("num-other-sentinels") == Some("2")
                },
            );
        }
        setup
    }

    pub fn master_name(&self) -> &'static str {
        MASTER_NAME
    }

    /// URLs of the sentinels, for a Sentinel-mode client.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    pub fn sentinel_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.sentinels[index]
    }

    /// Master and replica, in start order (index 0 started as master).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// Port of the master according to the first running sentinel.
    pub fn master_port(&self) -> u16 {
        let sentinel = self
            .sentinels
            .iter()
            .find(|s| s.is_running())
            .expect("a running sentinel");
        let (_host, port): (String, u16) =
            sentinel.cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
        port
    }

    /// The data node that is master according to the sentinels.
    pub fn master(&self) -> &RedisServer {
        let port = self.master_port();
        self.nodes
            .iter()
            .find(|node| node.port() == port)
            .expect("master is one of ours")
    }
}

/// `SENTINEL MASTER <name>` as a field map.
fn sentinel_master(sentinel: &RedisServer) -> HashMap<String, String> {
    sentinel.cmd(&["SENTINEL", "MASTER", MASTER_NAME])
}
