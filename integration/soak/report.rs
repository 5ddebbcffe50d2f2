//! What a soak showed: the accuracy per rule, the figures per fault, the resource series (printed,
//! written as CSV, plotted on request) and the invariants asserted on them.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use super::load::{CallError, Outcome, Sample};
use super::{Fault, FaultKind, GRACE, KEY_SPAN, Plan, REPLICAS, RULES, Resources, Row};

/// The worst key of one rule over one span.
#[derive(Clone, Copy, Debug)]
struct Worst {
    rule: usize,
    value: u32,
    admitted: u64,
    bound: f64,
}

impl Worst {
    fn ratio(&self) -> f64 {
        self.admitted as f64 / self.bound
    }
}

/// Per rule, every key's Redis-decided admissions among samples sent from `from` on, against
/// the rule's bound over that span with `resets` bucket losses: the worst key, and the hottest
/// three values' figures.
fn accuracy(samples: &[Sample], from: u32, resets: u32) -> (f64, Vec<Worst>, Vec<Worst>) {
    let spanned: Vec<&Sample> = samples.iter().filter(|s| s.sent >= from).collect();
    let last = spanned.iter().map(|s| s.replied).max().unwrap_or(from);
    let span_s = f64::from(last - from) / 1e3;
    let mut admitted: Vec<HashMap<u32, u64>> = vec![HashMap::new(); RULES.len()];
    for s in spanned.iter().filter(|s| s.admitted_by_redis()) {
        for rule in s.rules() {
            *admitted[rule].entry(s.value).or_default() += 1;
        }
    }
    let mut worst = Vec::new();
    let mut hottest = Vec::new();
    for (rule, counts) in admitted.iter().enumerate() {
        let bound = RULES[rule].bound(span_s, resets);
        let of = |value: u32| Worst {
            rule,
            value,
            admitted: counts.get(&value).copied().unwrap_or(0),
            bound,
        };
        let top = counts.iter().max_by_key(|(_, n)| **n).map(|(v, _)| *v);
        worst.push(of(top.unwrap_or(0)));
        hottest.extend((0..3).map(of));
    }
    (span_s, worst, hottest)
}

/// What a soak showed.
pub(super) struct Report<'a> {
    plan: &'a Plan,
    samples: &'a [Sample],
    errors: &'a [CallError],
    faults: &'a [Fault],
    rows: &'a [Row],
    end: u32,
}

impl<'a> Report<'a> {
    pub(super) fn new(
        plan: &'a Plan,
        samples: &'a [Sample],
        errors: &'a [CallError],
        faults: &'a [Fault],
        rows: &'a [Row],
        end: u32,
    ) -> Report<'a> {
        Report {
            plan,
            samples,
            errors,
            faults,
            rows,
            end,
        }
    }

    fn windows(&self) -> Vec<(u32, u32)> {
        self.faults.iter().filter_map(Fault::window).collect()
    }

    fn in_window(&self, sent: u32, replied: u32) -> bool {
        self.windows()
            .iter()
            .any(|(from, to)| sent <= *to && replied >= *from)
    }

    fn outside(&self) -> impl Iterator<Item = &Sample> {
        let windows = self.windows();
        self.samples
            .iter()
            .filter(move |s| !windows.iter().any(|(f, t)| s.sent <= *t && s.replied >= *f))
    }

    fn restarts(&self) -> u32 {
        self.faults
            .iter()
            .filter(|f| f.kind == FaultKind::RedisRestart)
            .count() as u32
    }

    /// Where the quiet tail starts: the end of the last Redis fault's window.
    fn quiet_from(&self) -> u32 {
        self.windows().iter().map(|(_, to)| *to).max().unwrap_or(0)
    }

    /// The first row at or past the warm-up.
    fn base(&self) -> &Row {
        let warm = self.plan.warm_up.as_millis() as u32;
        self.rows
            .iter()
            .find(|r| r.at >= warm)
            .expect("a sample past the warm-up")
    }

    /// Redis keys the calls sent in the `KEY_SPAN` before `at` may have written.
    fn touched_keys(&self, at: u32) -> usize {
        let from = at.saturating_sub(KEY_SPAN.as_millis() as u32);
        let lo = self.samples.partition_point(|s| s.sent < from);
        let hi = self.samples.partition_point(|s| s.sent <= at);
        let mut keys: HashSet<(usize, u32)> = HashSet::new();
        for s in &self.samples[lo..hi] {
            for rule in s.rules() {
                keys.insert((rule, s.value));
            }
        }
        keys.iter()
            .map(|(rule, _)| RULES[*rule].keys_per_value)
            .sum()
    }

    /// Per fault: calls overlapping it, degraded, failed, and the last degraded or failed
    /// answer after Redis was back (ms after `back`).
    fn fault_figures(&self, fault: &Fault) -> (usize, usize, usize, Option<u32>) {
        let to = fault.window().map_or(fault.back, |(_, to)| to);
        let during: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.sent <= to && s.replied >= fault.start)
            .collect();
        let bad = |s: &&&Sample| s.degraded || s.outcome == Outcome::Failed;
        let recovered = during
            .iter()
            .filter(bad)
            .map(|s| s.replied.saturating_sub(fault.back))
            .max();
        (
            during.len(),
            during.iter().filter(|s| s.degraded).count(),
            during
                .iter()
                .filter(|s| s.outcome == Outcome::Failed)
                .count(),
            recovered,
        )
    }

    pub(super) fn print(&self, config_notes: &[String]) {
        let name = &self.plan.name;
        self.print_series();
        self.print_faults();
        for note in config_notes {
            println!("SOAK {name} {note}");
        }
        self.print_totals();
        self.print_resources();
    }

    /// The resource series, at most about 60 rows (the CSV has them all).
    fn print_series(&self) {
        let name = &self.plan.name;
        println!(
            "SOAK {name} series (RSS MiB / open fds / threads / sluice_replicas per replica; \
             Redis DBSIZE; keys touched in the {} s before):",
            KEY_SPAN.as_secs()
        );
        println!(
            "{:>7} {:>9} {:>24} {:>24} {:>8} {:>8}",
            "t s", "requests", "sluice 0", "sluice 1", "keys", "touched"
        );
        // At most about 60 rows printed; the CSV has them all.
        let every = self.rows.len().div_ceil(60).max(1);
        for (i, row) in self.rows.iter().enumerate() {
            if i % every != 0 && i + 1 != self.rows.len() {
                continue;
            }
            let cell = |r: &Resources| {
                format!(
                    "{:.1} / {} / {} / {}",
                    r.rss_kib as f64 / 1024.0,
                    r.fds,
                    r.threads,
                    r.replicas
                )
            };
            println!(
                "{:>7.1} {:>9} {:>24} {:>24} {:>8} {:>8}",
                f64::from(row.at) / 1e3,
                row.requests,
                cell(&row.sluice[0]),
                cell(&row.sluice[1]),
                row.redis_keys,
                self.touched_keys(row.at)
            );
        }
    }

    /// Each fault: the calls overlapping its window, degraded, failed, and how soon after Redis
    /// was back the last degraded answer came.
    fn print_faults(&self) {
        let name = &self.plan.name;
        for fault in self.faults {
            let (calls, degraded, failed, recovered) = self.fault_figures(fault);
            println!(
                "SOAK {name} fault at {:.1} s: {} ({:.1} s until back{}): {calls} calls overlapping \
                 its window, {degraded} degraded, {failed} failed{}",
                f64::from(fault.start) / 1e3,
                fault.kind.name(),
                f64::from(fault.back - fault.start) / 1e3,
                if fault.kind.hits_redis() {
                    format!(" + {} s grace", GRACE.as_secs())
                } else {
                    String::new()
                },
                match (fault.kind.hits_redis(), recovered) {
                    (true, Some(ms)) => format!(
                        "; last degraded or failed answer {:.2} s after Redis was back",
                        f64::from(ms) / 1e3
                    ),
                    (true, None) => "; none after Redis was back".into(),
                    _ => String::new(),
                }
            );
        }
    }

    /// Requests, degraded and failed answers (inside and outside fault windows), accuracy.
    fn print_totals(&self) {
        let name = &self.plan.name;
        let outside: Vec<&Sample> = self.outside().collect();
        let (whole_span, whole, _) = accuracy(self.samples, 0, self.restarts());
        let (quiet_span, quiet, hottest) = accuracy(self.samples, self.quiet_from(), 0);
        let worst_of = |w: &[Worst]| {
            w.iter()
                .map(|w| {
                    format!(
                        "{} k{} {}/{:.1} = {:.3}",
                        RULES[w.rule].key,
                        w.value,
                        w.admitted,
                        w.bound,
                        w.ratio()
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "SOAK {name}: {:.1} s, {} requests ({:.0}/s), {} degraded ({} outside fault windows, \
             of {} calls there), {} failed ({} outside)",
            f64::from(self.end) / 1e3,
            self.samples.len(),
            self.samples.len() as f64 / (f64::from(self.end) / 1e3),
            self.samples.iter().filter(|s| s.degraded).count(),
            outside.iter().filter(|s| s.degraded).count(),
            outside.len(),
            self.samples
                .iter()
                .filter(|s| s.outcome == Outcome::Failed)
                .count(),
            outside
                .iter()
                .filter(|s| s.outcome == Outcome::Failed)
                .count(),
        );
        println!(
            "SOAK {name} accuracy, worst key per rule (Redis-decided admitted / bound): whole \
             run {whole_span:.1} s with {} restart(s): {}; quiet tail {quiet_span:.1} s: {}; \
             hottest keys in the tail: {}",
            self.restarts(),
            worst_of(&whole),
            worst_of(&quiet),
            worst_of(&hottest),
        );
    }

    /// Each replica's memory, fds and threads from after warm-up to the end; errors outside
    /// fault windows.
    fn print_resources(&self) {
        let name = &self.plan.name;
        let (base, last) = (self.base(), self.rows.last().expect("rows"));
        for i in 0..REPLICAS {
            let peak = self
                .rows
                .iter()
                .map(|r| r.sluice[i].rss_kib)
                .max()
                .unwrap_or(0);
            println!(
                "SOAK {name} sluice {i}: RSS {:.1} MiB at {:.0} s (post-warm-up) → {:.1} MiB at \
                 the end (peak {:.1}); fds {} → {}; threads {} → {}",
                base.sluice[i].rss_kib as f64 / 1024.0,
                f64::from(base.at) / 1e3,
                last.sluice[i].rss_kib as f64 / 1024.0,
                peak as f64 / 1024.0,
                base.sluice[i].fds,
                last.sluice[i].fds,
                base.sluice[i].threads,
                last.sluice[i].threads,
            );
        }
        let shown: Vec<String> = self
            .errors
            .iter()
            .filter(|(sent, replied, _)| !self.in_window(*sent, *replied))
            .take(10)
            .map(|(sent, _, e)| format!("{:.2} s: {e}", f64::from(*sent) / 1e3))
            .collect();
        if !shown.is_empty() {
            println!("SOAK {name} errors outside fault windows: {shown:#?}");
        }
    }

    pub(super) fn assert_invariants(&self) {
        let name = &self.plan.name;
        let outside: Vec<&Sample> = self.outside().collect();
        let failed_outside = outside
            .iter()
            .filter(|s| s.outcome == Outcome::Failed)
            .count();
        assert_eq!(
            failed_outside, 0,
            "{name}: calls failed outside fault windows"
        );
        let degraded_outside = outside.iter().filter(|s| s.degraded).count();
        // A busy shared machine misses a deadline now and then by itself.
        assert!(
            degraded_outside * 100 <= outside.len(),
            "{name}: {degraded_outside} of {} decisions degraded outside fault windows",
            outside.len()
        );
        for fault in self.faults.iter().filter(|f| f.kind.hits_redis()) {
            let (calls, degraded, failed, _) = self.fault_figures(fault);
            assert!(
                degraded + failed > 0,
                "{name}: the {} at {} ms went unnoticed in {calls} calls",
                fault.kind.name(),
                fault.start
            );
        }
        for (span, from, resets) in [
            ("whole run", 0, self.restarts()),
            ("quiet tail", self.quiet_from(), 0),
        ] {
            let (span_s, worst, _) = accuracy(self.samples, from, resets);
            for w in worst {
                assert!(
                    w.admitted as f64 <= w.bound,
                    "{name}, {span} ({span_s:.1} s): {} k{} admitted {} > bound {:.1}",
                    RULES[w.rule].key,
                    w.value,
                    w.admitted,
                    w.bound
                );
            }
        }
        for (rule, r) in RULES.iter().enumerate() {
            assert!(
                self.samples.iter().any(|s| s.outcome == Outcome::OverLimit
                    && !s.degraded
                    && s.rules().any(|x| x == rule)),
                "{name}: no key of `{}` was pushed past its limit",
                r.key
            );
        }
        let (base, last) = (self.base(), self.rows.last().expect("rows"));
        for i in 0..REPLICAS {
            let (b, e) = (base.sluice[i], last.sluice[i]);
            assert!(
                e.rss_kib as f64 <= 1.5 * b.rss_kib as f64 + 8.0 * 1024.0,
                "{name}: sluice {i}'s RSS grew from {} KiB to {} KiB",
                b.rss_kib,
                e.rss_kib
            );
            assert!(
                e.fds as f64 <= 1.5 * b.fds as f64 + 16.0,
                "{name}: sluice {i}'s open fds grew from {} to {}",
                b.fds,
                e.fds
            );
        }
        for row in self.rows.iter().filter(|r| r.at >= base.at) {
            let touched = self.touched_keys(row.at);
            assert!(
                row.redis_keys as f64 <= 1.5 * touched as f64 + 100.0,
                "{name}: Redis held {} keys at {} ms, more than the {touched} the last {} s \
                 touched explain (keys must expire)",
                row.redis_keys,
                row.at,
                KEY_SPAN.as_secs()
            );
        }
    }
}

/// Writes the series as CSV beside the test's temp files, and plots it for the long variant
/// when a Python with matplotlib is at hand.
pub(super) fn write_series(plan: &Plan, rows: &[Row], faults: &[Fault]) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let csv = dir.join(format!("soak-{}.csv", plan.name));
    let mut out = File::create(&csv).expect("create the series CSV");
    let mut header = String::from("t_s,requests");
    for i in 0..REPLICAS {
        header += &format!(",rss{i}_kib,fds{i},threads{i},replicas{i}");
    }
    writeln!(out, "{header},redis_keys").unwrap();
    for row in rows {
        let mut line = format!("{:.1},{}", f64::from(row.at) / 1e3, row.requests);
        for r in &row.sluice {
            line += &format!(",{},{},{},{}", r.rss_kib, r.fds, r.threads, r.replicas);
        }
        writeln!(out, "{line},{}", row.redis_keys).unwrap();
    }
    println!("SOAK {} series written to {}", plan.name, csv.display());
    if !plan.plot {
        return;
    }
    let png = csv.with_extension("png");
    let python = std::env::var("SLUICE_SOAK_PYTHON").unwrap_or_else(|_| "python3".into());
    let marks: Vec<String> = faults
        .iter()
        .map(|f| format!("{:.1}:{}", f64::from(f.start) / 1e3, f.kind.name()))
        .collect();
    let plotted = Command::new(&python)
        .args(["-c", PLOT])
        .arg(&csv)
        .arg(&png)
        .args(&marks)
        .output();
    match plotted {
        Ok(out) if out.status.success() => {
            println!("SOAK {} plot written to {}", plan.name, png.display());
        }
        Ok(out) => println!(
            "SOAK {} not plotted ({python} with matplotlib needed; set SLUICE_SOAK_PYTHON): {}",
            plan.name,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ),
        Err(e) => println!("SOAK {} not plotted: {python}: {e}", plan.name),
    }
}

/// Plots the series CSV (argv 1) to a PNG (argv 2), with the faults (argv 3…, `t:kind`) marked.
const PLOT: &str = r#"
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open(sys.argv[1])))
t = [float(r["t_s"]) for r in rows]
replicas = sorted({k[3:-4] for k in rows[0] if k.startswith("rss")})
fig, ax = plt.subplots(4, 1, sharex=True, figsize=(10, 11))
for i in replicas:
    ax[0].plot(t, [int(r["rss%s_kib" % i]) / 1024 for r in rows], label="sluice %s" % i)
    ax[1].plot(t, [int(r["fds%s" % i]) for r in rows], label="sluice %s" % i)
ax[2].plot(t, [int(r["redis_keys"]) for r in rows], label="Redis DBSIZE")
rate = [0.0] + [(int(b["requests"]) - int(a["requests"])) / max(float(b["t_s"]) - float(a["t_s"]), 1e-9)
                for a, b in zip(rows, rows[1:])]
ax[3].plot(t, rate, label="requests/s")
for a, label in zip(ax, ["RSS (MiB)", "open fds", "Redis keys", "requests/s"]):
    a.set_ylabel(label)
    a.set_ylim(bottom=0)
    a.legend(loc="lower right")
    for mark in sys.argv[3:]:
        at, kind = mark.split(":", 1)
        a.axvline(float(at), color="grey", linestyle=":", linewidth=1)
for mark in sys.argv[3:]:
    at, kind = mark.split(":", 1)
    ax[0].annotate(kind, (float(at), 0), rotation=90, fontsize=7, va="bottom")
ax[3].set_xlabel("seconds")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=90)
"#;
