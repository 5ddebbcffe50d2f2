//! What the run cost outside the generator's own clock: CPU seconds and RSS of named processes
//! (from /proc) and Redis command counts (`INFO commandstats`) and CPU (`INFO cpu`).

use std::collections::BTreeMap;

use serde::Serialize;

/// Linux reports utime/stime in USER_HZ ticks, which is 100 on every architecture Linux exports
/// to user space.
const USER_HZ: f64 = 100.0;

/// A process to account for: a label and a pid (`self` is the generator).
#[derive(Clone, Debug)]
pub struct NamedPid {
    pub name: String,
    pub pid: u32,
}

impl std::str::FromStr for NamedPid {
    type Err = String;

    /// `name=pid`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, pid) = s
            .split_once('=')
            .ok_or_else(|| format!("`{s}`: expected name=pid"))?;
        let pid = pid
            .parse()
            .map_err(|_| format!("`{s}`: `{pid}` is not a pid"))?;
        Ok(NamedPid {
            name: name.to_string(),
            pid,
        })
    }
}

/// CPU seconds (user + system, all threads) a process has used so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of stat(5), utime 14 and stime 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// Resident set size in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU readings of every named process at one instant.
pub struct CpuSnapshot(Vec<(String, u32, Option<f64>)>);

impl CpuSnapshot {
    pub fn take(pids: &[NamedPid]) -> CpuSnapshot {
        let mut all = vec![("generator".to_string(), std::process::id())];
        all.extend(pids.iter().map(|p| (p.name.clone(), p.pid)));
        CpuSnapshot(
            all.into_iter()
                .map(|(name, pid)| (name, pid, cpu_seconds(pid)))
                .collect(),
        )
    }

    /// CPU seconds used per process since `earlier`, and the share of one core over `wall` s.
    pub fn since(&self, earlier: &CpuSnapshot, wall: f64) -> BTreeMap<String, CpuUse> {
        self.0
            .iter()
            .zip(&earlier.0)
            .filter_map(|((name, pid, now), (_, _, then))| {
                let seconds = now.zip(*then).map(|(a, b)| a - b)?;
                Some((
                    name.clone(),
                    CpuUse {
                        pid: *pid,
                        seconds,
                        cores: if wall > 0.0 { seconds / wall } else { 0.0 },
                        us_per_request: None,
                        rss_bytes: rss_bytes(*pid),
                    },
                ))
            })
            .collect()
    }
}

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct CpuUse {
    pub pid: u32,
    pub seconds: f64,
    /// Average cores busy (seconds / wall time).
    pub cores: f64,
    /// CPU microseconds per completed call: the cost of a call, much less sensitive than
    /// throughput to other work on a shared machine. Filled in by the load run.
    #[serde(default)]
    pub us_per_request: Option<f64>,
    pub rss_bytes: Option<u64>,
}

/// Calls per command and Redis's own CPU seconds at one instant.
#[derive(Clone, Debug, Default)]
pub struct RedisSnapshot {
    calls: BTreeMap<String, u64>,
    cpu_seconds: f64,
}

/// What Redis did between two snapshots.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct RedisUse {
    /// Every command Redis executed, including those a script runs (HMGET, HSET, PEXPIRE, TIME),
    /// per completed request. The generator's own INFO calls are left out.
    pub commands_per_request: f64,
    /// Top-level script calls (EVALSHA, EVAL, FCALL) per completed request: round trips.
    pub script_calls_per_request: f64,
    pub per_command: BTreeMap<String, u64>,
    pub cpu_seconds: f64,
}

pub struct RedisProbe {
    conn: redis::aio::MultiplexedConnection,
}

impl RedisProbe {
    pub async fn connect(url: &str) -> Result<RedisProbe, String> {
        let client = redis::Client::open(url).map_err(|e| format!("redis url: {e}"))?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("redis connect: {e}"))?;
        Ok(RedisProbe { conn })
    }

    async fn info(&mut self, section: &str) -> Result<String, String> {
        redis::cmd("INFO")
            .arg(section)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| format!("INFO {section}: {e}"))
    }

    pub async fn snapshot(&mut self) -> Result<RedisSnapshot, String> {
        let stats = self.info("commandstats").await?;
        let cpu = self.info("cpu").await?;
        Ok(RedisSnapshot {
            calls: parse_commandstats(&stats),
            cpu_seconds: info_field(&cpu, "used_cpu_user").unwrap_or(0.0)
                + info_field(&cpu, "used_cpu_sys").unwrap_or(0.0),
        })
    }

    pub async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Result<T, String> {
        cmd.query_async(&mut self.conn)
            .await
            .map_err(|e| format!("redis: {e}"))
    }
}

impl RedisSnapshot {
    pub fn since(&self, earlier: &RedisSnapshot, requests: u64) -> RedisUse {
        let per_command: BTreeMap<String, u64> = self
            .calls
            .iter()
            .filter(|(cmd, _)| !cmd.starts_with("info"))
            .map(|(cmd, &n)| {
                (
                    cmd.clone(),
                    n - earlier.calls.get(cmd).copied().unwrap_or(0),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        let total: u64 = per_command.values().sum();
        let scripts: u64 = per_command
            .iter()
            .filter(|(cmd, _)| {
                matches!(
                    cmd.as_str(),
                    "evalsha" | "eval" | "fcall" | "evalsha_ro" | "eval_ro" | "fcall_ro"
                )
            })
            .map(|(_, n)| n)
            .sum();
        let per = |n: u64| {
            if requests == 0 {
                0.0
            } else {
                n as f64 / requests as f64
            }
        };
        RedisUse {
            commands_per_request: per(total),
            script_calls_per_request: per(scripts),
            per_command,
            cpu_seconds: self.cpu_seconds - earlier.cpu_seconds,
        }
    }
}

/// `cmdstat_evalsha:calls=12,usec=...` → {"evalsha": 12}; subcommands (`cmdstat_script|load`) keep
/// their `|` name.
pub fn parse_commandstats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

pub fn info_field(text: &str, field: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_and_cpu_parse() {
        let text = "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=50,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\ncmdstat_script|load:calls=1,usec=9\r\ncmdstat_info:calls=3,usec=1\r\n";
        let calls = parse_commandstats(text);
        assert_eq!(calls["evalsha"], 10);
        assert_eq!(calls["script|load"], 1);
        let before = RedisSnapshot {
            calls: BTreeMap::from([("evalsha".into(), 4), ("info".into(), 1)]),
            cpu_seconds: 1.0,
        };
        let after = RedisSnapshot {
            calls,
            cpu_seconds: 1.5,
        };
        let used = after.since(&before, 3);
        assert_eq!(used.script_calls_per_request, 2.0);
        assert!((used.commands_per_request - 7.0 / 3.0).abs() < 1e-9);
        assert!(!used.per_command.contains_key("info"));
        assert_eq!(
            info_field("used_cpu_sys:1.25\r\nused_cpu_user:2\r\n", "used_cpu_sys"),
            Some(1.25)
        );
    }

    #[test]
    fn own_cpu_and_rss_are_readable() {
        let me = std::process::id();
        assert!(cpu_seconds(me).is_some());
        assert!(rss_bytes(me).unwrap() > 0);
        assert!("sluice=12".parse::<NamedPid>().is_ok());
        assert!("sluice".parse::<NamedPid>().is_err());
    }
}
