//! The pool against a stepped model of the shared bucket and of Envoy data planes: whatever the
//! demand, the data planes never admit a token the pool did not take first.

use super::*;
use crate::algorithm::BucketParams;
use crate::rule::FailureMode;

const OPTIONS: PoolOptions = PoolOptions {
    ttl_ms: 600,
    burst_ms: 200,
    horizon_ms: PUSH_MS,
};
const PUSH_MS: u64 = 200;

/// The shared bucket: a token bucket of `capacity` refilled at `rate` per ms.
pub(super) struct Shared {
    tokens: f64,
    capacity: f64,
    rate_per_ms: f64,
    at: u64,
}

impl Shared {
    pub(super) fn new(params: BucketParams) -> Self {
        Shared {
            tokens: params.capacity as f64,
            capacity: params.capacity as f64,
            rate_per_ms: params.requests_per_unit as f64 / params.unit_ms as f64,
            at: 0,
        }
    }

    fn refill(&mut self, now: u64) {
        self.tokens = (self.tokens + (now - self.at) as f64 * self.rate_per_ms).min(self.capacity);
        self.at = now;
    }

    /// A lease take: up to `n` whole tokens, as many as there are.
    pub(super) fn take(&mut self, now: u64, n: u64) -> u64 {
        self.refill(now);
        let got = (self.tokens.floor() as u64).min(n);
        self.tokens -= got as f64;
        got
    }

    pub(super) fn give(&mut self, now: u64, n: u64) {
        self.refill(now);
        self.tokens = (self.tokens + n as f64).min(self.capacity);
    }
}

/// One data plane enforcing its assignment as Envoy's filter does: a new token bucket starts
/// full, the same one re-sent keeps its tokens, an expired or missing assignment denies.
pub(super) struct DataPlane {
    id: MemberId,
    /// How long an assignment lasts.
    pub(super) ttl_ms: u64,
    strategy: Option<Strategy>,
    tokens: f64,
    at: u64,
    expires: u64,
    /// Requests offered per ms.
    offered_per_ms: f64,
    offered: f64,
    pub(super) allowed: u64,
    pub(super) denied: u64,
    pub(super) admitted_total: u64,
}

impl DataPlane {
    pub(super) fn new(id: MemberId, offered_per_s: f64) -> Self {
        DataPlane {
            id,
            ttl_ms: OPTIONS.ttl_ms,
            strategy: None,
            tokens: 0.0,
            at: 0,
            expires: 0,
            offered_per_ms: offered_per_s / 1000.0,
            offered: 0.0,
            allowed: 0,
            denied: 0,
            admitted_total: 0,
        }
    }

    pub(super) fn assign(&mut self, now: u64, strategy: Strategy) {
        let keep = self.strategy == Some(strategy) && now < self.expires;
        if !keep {
            self.tokens = strategy.burst();
        }
        self.strategy = Some(strategy);
        self.at = now;
        self.expires = now + self.ttl_ms;
    }

    pub(super) fn step(&mut self, now: u64) {
        if let Some(Strategy::TokenBucket(b)) = self.strategy {
            let until = now.min(self.expires).max(self.at);
            self.tokens = (self.tokens + (until - self.at) as f64 * b.rate_per_ms())
                .min(f64::from(b.max_tokens));
        }
        self.at = now;
        self.offered += self.offered_per_ms;
        while self.offered >= 1.0 {
            self.offered -= 1.0;
            let admit = now < self.expires
                && match self.strategy {
                    Some(Strategy::AllowAll) => true,
                    Some(Strategy::TokenBucket(_)) if self.tokens >= 1.0 => {
                        self.tokens -= 1.0;
                        true
                    }
                    _ => false,
                };
            if admit {
                self.allowed += 1;
                self.admitted_total += 1;
            } else {
                self.denied += 1;
            }
        }
    }
}

/// One push: the pool plans, the shared bucket answers, the data planes get their assignments.
/// Returns the tokens the pool took (negative: gave back).
fn push(now: u64, pool: &mut Pool, shared: &mut Shared, planes: &mut [DataPlane]) -> i64 {
    let (answer, taken) = match pool.plan(now, &OPTIONS) {
        Ask::Take(n) => {
            let got = shared.take(now, n);
            (Answer::Granted(got), got as i64)
        }
        Ask::Refund(n) => {
            shared.give(now, n);
            (Answer::Refunded(n), -(n as i64))
        }
        Ask::Nothing => (Answer::Granted(0), 0),
    };
    for (id, strategy) in pool.settle(now, &OPTIONS, answer) {
        planes[id as usize].assign(now, strategy);
    }
    taken
}

struct Run {
    admitted: u64,
    taken_net: i64,
    slack: u64,
    per_plane: Vec<u64>,
}

/// Steps `planes` against one pool for `ms`, pushing every [`PUSH_MS`] and reporting every
/// `report_ms`, and checks the prepaid invariant at every step.
fn run(params: BucketParams, planes: &mut [DataPlane], report_ms: u64, ms: u64) -> Run {
    let mut shared = Shared::new(params);
    let mut pool = Pool::new(params);
    let mut taken_net: i64 = 0;
    let mut slack = 0;
    for dp in planes.iter() {
        pool.join(dp.id);
    }
    for now in 1..=ms {
        for dp in planes.iter_mut() {
            dp.step(now);
        }
        if now % report_ms == 0 {
            for dp in planes.iter_mut() {
                slack += pool.report(dp.id, now, dp.allowed, dp.denied).slack;
                dp.allowed = 0;
                dp.denied = 0;
            }
        }
        if now % PUSH_MS == 0 {
            taken_net += push(now, &mut pool, &mut shared, planes);
        }
        let admitted: u64 = planes.iter().map(|d| d.admitted_total).sum();
        assert!(
            admitted as i64 <= taken_net,
            "at {now} ms the data planes admitted {admitted} but the pool took only {taken_net}"
        );
    }
    Run {
        admitted: planes.iter().map(|d| d.admitted_total).sum(),
        taken_net,
        slack,
        per_plane: planes.iter().map(|d| d.admitted_total).collect(),
    }
}

fn per_second(n: u64) -> BucketParams {
    BucketParams {
        capacity: n,
        requests_per_unit: n,
        unit_ms: 1000,
    }
}

#[test]
fn over_demand_is_held_to_the_rule_and_every_admission_was_paid_first() {
    let params = per_second(100);
    let mut planes: Vec<DataPlane> = (0..3).map(|i| DataPlane::new(i, 200.0)).collect();
    let r = run(params, &mut planes, 1000, 20_000);
    // The bucket's own bound over 20 s: C + r·T.
    let bound = 100 + 100 * 20;
    assert!(r.admitted <= bound, "admitted {} > {bound}", r.admitted);
    // Demand is 6x the rate: the data planes get most of it.
    assert!(
        r.admitted >= bound * 7 / 10,
        "admitted only {} of {bound}",
        r.admitted
    );
    assert_eq!(r.slack, 0);
    assert!(r.taken_net as u64 >= r.admitted);
}

#[test]
fn the_rate_is_split_by_reported_demand() {
    let params = per_second(100);
    let mut planes = vec![
        DataPlane::new(0, 150.0),
        DataPlane::new(1, 150.0),
        DataPlane::new(2, 10.0),
    ];
    let r = run(params, &mut planes, 500, 30_000);
    // The quiet data plane gets what it asks (10/s over 30 s) or close to it; the two busy ones
    // share the rest evenly.
    assert!(
        r.per_plane[2] >= 200,
        "quiet plane admitted {:?}",
        r.per_plane
    );
    let (a, b) = (r.per_plane[0] as f64, r.per_plane[1] as f64);
    assert!(
        (a - b).abs() / a.max(b) < 0.2,
        "busy planes {:?}",
        r.per_plane
    );
    assert!(r.admitted <= 100 + 100 * 30);
}

#[test]
fn under_demand_everyone_is_admitted_and_unused_grants_go_back() {
    let params = per_second(100);
    let mut planes: Vec<DataPlane> = (0..2).map(|i| DataPlane::new(i, 20.0)).collect();
    let r = run(params, &mut planes, 1000, 10_000);
    // 40/s offered of 100/s: everything after the first assignment is admitted.
    assert!(r.admitted >= 2 * 20 * 9, "admitted {}", r.admitted);
    // What the pool still holds is the documented grant slack — each plane's bucket (its part of
    // the capacity at twice its demand: 40 tokens) and ttl (40/s · 0.6 s) — not the rule's rate.
    let slack_bound = 2 * (40 + 24);
    let held = r.taken_net - r.admitted as i64;
    assert!(held <= slack_bound, "held {held} > {slack_bound}");
}

#[test]
fn a_failure_policy_assigns_without_paying() {
    let params = per_second(100);
    let mut pool = Pool::new(params);
    pool.join(1);
    pool.join(2);
    for (mode, expect) in [
        (FailureMode::Open, Some(Strategy::AllowAll)),
        (FailureMode::Closed, Some(Strategy::DenyAll)),
        (FailureMode::Error, None),
    ] {
        let _ = pool.plan(1000, &OPTIONS);
        let assigned = pool.settle(1000, &OPTIONS, Answer::Failed { mode, replicas: 2 });
        assert_eq!(assigned.first().map(|(_, s)| *s), expect, "{mode:?}");
    }
    let _ = pool.plan(1000, &OPTIONS);
    let assigned = pool.settle(
        1000,
        &OPTIONS,
        Answer::Failed {
            mode: FailureMode::Local,
            replicas: 2,
        },
    );
    // 100/s over 2 replicas, split evenly between the two members.
    let rates: Vec<f64> = assigned
        .iter()
        .map(|(_, s)| s.rate_per_ms() * 1000.0)
        .collect();
    assert_eq!(rates, vec![25.0, 25.0]);
    assert_eq!(pool.held(), 0.0);
}

#[test]
fn an_empty_bucket_denies_until_it_refills_and_debt_is_paid_first() {
    let params = per_second(10);
    let mut pool = Pool::new(params);
    pool.join(7);
    // Before any assignment the data plane admitted 25 on its no-assignment behaviour.
    assert_eq!(
        pool.report(7, 100, 25, 0).slack,
        15,
        "owed beyond one capacity is slack"
    );
    assert_eq!(pool.held(), -10.0);
    let Ask::Take(n) = pool.plan(200, &OPTIONS) else {
        panic!("a pool in debt takes")
    };
    assert!(n > 10);
    // The shared bucket had only the debt.
    let assigned = pool.settle(200, &OPTIONS, Answer::Granted(10));
    assert_eq!(assigned, vec![(7, Strategy::DenyAll)]);
    assert_eq!(pool.held(), 0.0);
}

#[test]
fn leaving_spends_what_the_member_may_still_admit_and_an_empty_pool_drains() {
    let params = per_second(100);
    let mut pool = Pool::new(params);
    pool.join(1);
    let Ask::Take(n) = pool.plan(0, &OPTIONS) else {
        panic!("a new member needs tokens")
    };
    pool.settle(0, &OPTIONS, Answer::Granted(n));
    assert_eq!(pool.drain(), None);
    let held = pool.held();
    pool.leave(1);
    assert!(pool.held() < 1.0, "held {held} → {}", pool.held());
    assert_eq!(pool.drain(), Some(0));
}

#[test]
fn a_bucket_id_is_read_as_the_descriptor_whose_order_reaches_a_rule() {
    use crate::descriptor::Unplaced;
    use crate::request::Entry;
    let yaml = "domain: mesh
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: /api*
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 7}
";
    let config = crate::config::load_sources(&[("q.yaml".into(), yaml.into())]).unwrap();
    let domain = config.domain("mesh").unwrap();
    // Sorted by key, as the service hands them over: `path` first, yet `tenant` is the level the
    // tree starts with, so the search backtracks.
    let bucket = [Entry::new("path", "/api/v1"), Entry::new("tenant", "acme")];
    let (descriptor, rule) = domain.place(&bucket).unwrap();
    assert_eq!(descriptor, vec![bucket[1].clone(), bucket[0].clone()]);
    assert_eq!(rule.path, domain.find(&descriptor).unwrap().path);
    assert_eq!(rule.limit, domain.find(&descriptor).unwrap().limit);
    // A single entry reaches the top-level `path` rule.
    let (_, rule) = domain.place(&[Entry::new("path", "/x")]).unwrap();
    assert!(rule.path.contains("path"), "{}", rule.path);
    // An entry no level names leaves the bucket without a rule, and says which.
    let unplaced = domain
        .place(&[Entry::new("env", "prod"), Entry::new("tenant", "acme")])
        .unwrap_err();
    let Unplaced::NoPath { left, .. } = unplaced;
    assert_eq!(left, vec!["env".to_string()]);
}

#[test]
fn placing_a_bucket_id_visits_each_tree_node_at_most_once() {
    use crate::request::Entry;
    // Every level names all six keys and no path reaches a rule: the search still ends, having
    // walked each of the tree's 6 + 36 + 216 nodes once (not the 720 orders of six entries).
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    fn level(keys: &[String], depth: usize) -> String {
        let indent = "  ".repeat(depth * 2);
        let mut out = String::new();
        for k in keys {
            out.push_str(&format!("{indent}- key: {k}\n"));
            if depth < 2 {
                out.push_str(&format!("{indent}  descriptors:\n"));
                out.push_str(&level(keys, depth + 1));
            } else {
                out.push_str(&format!(
                    "{indent}  rate_limit: {{unit: second, requests_per_unit: 1}}\n"
                ));
            }
        }
        out
    }
    let yaml = format!("domain: d\ndescriptors:\n{}", level(&keys, 0));
    let config = crate::config::load_sources(&[("d.yaml".into(), yaml)]).unwrap();
    let domain = config.domain("d").unwrap();
    let bucket: Vec<Entry> = keys.iter().map(|k| Entry::new(k, "v")).collect();
    assert!(
        domain.place(&bucket).is_err(),
        "six entries cannot fit three levels"
    );
    let (placed, _) = domain.place(&bucket[3..]).unwrap();
    assert_eq!(placed.len(), 3);
}

mod generated {
    use proptest::prelude::{ProptestConfig, Strategy as Gen, prop, prop_assert, proptest};

    use super::{BucketParams, DataPlane, MemberId, PUSH_MS, Pool, Shared, push};

    /// One data plane of a generated run.
    #[derive(Clone, Debug)]
    struct Plan {
        offered_per_s: f64,
        report_ms: u64,
        join_ms: u64,
        /// Leaves (its stream closes) at this time, if ever.
        leave_ms: Option<u64>,
    }

    fn plane() -> impl Gen<Value = Plan> {
        (
            0.0..400.0f64,
            100u64..2000,
            0u64..3000,
            prop::option::of(1000u64..6000),
        )
            .prop_map(|(offered_per_s, report_ms, join_ms, leave)| Plan {
                offered_per_s,
                report_ms,
                join_ms,
                leave_ms: leave.map(|l| join_ms + l),
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever the demand, report cadence, churn, rule shape and competing consumer of
        /// the shared bucket, the data planes never admit a token the pool did not take first.
        #[test]
        fn no_admission_is_ever_unpaid(
            plans in prop::collection::vec(plane(), 1..5),
            rate in 1u64..300,
            burst_x in 1u64..4,
            unit_ms in prop::sample::select(vec![1000u64, 60_000]),
            competitor_per_ms in 0.0..0.2f64,
        ) {
            let params = BucketParams {
                capacity: rate * burst_x,
                requests_per_unit: rate,
                unit_ms,
            };
            let mut shared = Shared::new(params);
            let mut pool = Pool::new(params);
            let mut planes: Vec<DataPlane> = plans
                .iter()
                .enumerate()
                .map(|(i, p)| DataPlane::new(i as MemberId, p.offered_per_s))
                .collect();
            let mut taken_net: i64 = 0;
            // What leavers may admit past the horizon of their last push: the slack of a data
            // plane no push reaches any more.
            let mut unpushed = 0.0;
            let mut competing = 0.0;
            for now in 1..=8000u64 {
                // Another consumer (RLS calls, another replica) draws on the same bucket.
                competing += competitor_per_ms;
                while competing >= 1.0 {
                    competing -= 1.0;
                    shared.take(now, 1);
                }
                for (dp, plan) in planes.iter_mut().zip(&plans) {
                    let id = dp.id;
                    if now == plan.join_ms.max(1) {
                        pool.join(id);
                    }
                    if plan.leave_ms == Some(now) {
                        unpushed += pool.strategy(id).map_or(0.0, |s| {
                            s.rate_per_ms() * (super::OPTIONS.ttl_ms - super::OPTIONS.horizon_ms) as f64
                        });
                        pool.leave(id);
                    }
                    let member = pool.contains(id);
                    if member || plan.leave_ms.is_some_and(|l| now > l) {
                        // A leaver keeps enforcing what it was last told until it expires.
                        dp.step(now);
                    }
                    if member && now % plan.report_ms == 0 {
                        pool.report(id, now, dp.allowed, dp.denied);
                        dp.allowed = 0;
                        dp.denied = 0;
                    }
                }
                if now % PUSH_MS == 0 {
                    taken_net += push(now, &mut pool, &mut shared, &mut planes);
                }
                let admitted: u64 = planes.iter().map(|d| d.admitted_total).sum();
                prop_assert!(
                    admitted as f64 <= taken_net as f64 + unpushed.ceil(),
                    "at {} ms: admitted {} > taken {} + unpushed {}", now, admitted, taken_net, unpushed
                );
            }
        }
    }
}

#[test]
fn a_short_pool_keeps_the_small_plans_whole() {
    let params = per_second(100);
    let mut pool = Pool::new(params);
    for id in [1, 2] {
        pool.join(id);
    }
    // Two reports a second apart give demands: member 1 busy (300/s), member 2 quiet (5/s).
    for (id, n) in [(1, 300), (2, 5)] {
        pool.report(id, 0, 0, 0);
        pool.report(id, 1000, 0, n);
    }
    let Ask::Take(n) = pool.plan(1000, &OPTIONS) else {
        panic!("an unassigned pool takes")
    };
    // The shared bucket gives a third of what the plan needs.
    let assigned = pool.settle(1000, &OPTIONS, Answer::Granted(n / 3));
    let rate = |id| {
        assigned
            .iter()
            .find(|(m, _)| *m == id)
            .map(|(_, s)| s.rate_per_ms() * 1000.0)
            .unwrap()
    };
    let burst = |id| {
        assigned
            .iter()
            .find(|(m, _)| *m == id)
            .map(|(_, s)| s.burst())
            .unwrap()
    };
    // The quiet member planned 2 × 5/s (a tenth of the capacity as its bucket) and keeps it; the
    // busy one takes the cut, in its bucket before its rate.
    assert_eq!((rate(2), burst(2)), (10.0, 10.0), "{assigned:?}");
    assert!(burst(1) < 90.0, "{assigned:?}");
    assert!(pool.held() >= 0.0);
}

/// Envoy's cadence: 1 s pushes, a 3 s TTL, buckets of one push interval of the rate.
pub(super) const ENVOY: PoolOptions = PoolOptions {
    ttl_ms: 3_000,
    burst_ms: 1_000,
    horizon_ms: 1_000,
};

fn token_bucket(assigned: &[(MemberId, Strategy)]) -> TokenBucket {
    match assigned {
        [(_, Strategy::TokenBucket(b))] => *b,
        other => panic!("one token bucket expected: {other:?}"),
    }
}

/// Burst 10, then 5/s, one data plane whose first request (admitted before any assignment) is
/// owed: the pool cannot pay the rule's 10-token burst plus a second of the rate (15 of the 8 it
/// holds after the debt and the reserve), and shortens the bucket, not the rate, which lasts.
#[test]
fn a_short_first_assignment_keeps_the_rate_and_shortens_the_bucket() {
    let params = BucketParams {
        capacity: 10,
        requests_per_unit: 5,
        unit_ms: 1000,
    };
    let mut pool = Pool::new(params);
    pool.join(1);
    pool.report(1, 0, 1, 0);
    let Ask::Take(n) = pool.plan(10, &ENVOY) else {
        panic!("an unassigned pool takes")
    };
    assert_eq!(
        n, 17,
        "the rule's burst, a second of the rate, the debt and the reserve"
    );
    let first = token_bucket(&pool.settle(10, &ENVOY, Answer::Granted(10)));
    assert_eq!(first.rate_per_s(), 5.0, "{first:?}");
    assert_eq!(first.max_tokens, 3, "{first:?}");
    // A second later the bucket refilled a whole token less than the push needs (the push came a
    // little early): the reserve pays it, and the data plane keeps its bucket.
    let Ask::Take(n) = pool.plan(1_000, &ENVOY) else {
        panic!("a second of the rate is owed")
    };
    let kept = token_bucket(&pool.settle(1_000, &ENVOY, Answer::Granted(n - 1)));
    assert_eq!(kept, first);
}

/// Admissions past a prepaid assignment are slack once each: charged as debt up to one capacity
/// and forgiven beyond it, but counted one time, not once as excess and again as forgiven.
#[test]
fn an_excess_over_a_prepaid_assignment_is_counted_as_slack_once() {
    let params = per_second(10);
    let mut pool = Pool::new(params);
    pool.join(1);
    let Ask::Take(n) = pool.plan(0, &OPTIONS) else {
        panic!("a first plan takes")
    };
    let assigned = pool.settle(0, &OPTIONS, Answer::Granted(n));
    assert!(matches!(assigned[..], [(1, Strategy::TokenBucket(_))]));
    // Far past anything it could hold: the excess is the whole report but what was prepaid.
    let allowed = 1_000_000;
    let slack = pool.report(1, 100, allowed, 0).slack;
    assert!(slack <= allowed, "{slack} counted for {allowed} admitted");
    assert!(slack + n >= allowed, "{slack} + {n} prepaid < {allowed}");
    // The debt stops at one capacity.
    assert_eq!(pool.held(), -(params.capacity as f64));
    // A member with nothing prepaid is charged as debt first: slack only past one capacity.
    pool.join(2);
    let before = pool.held();
    assert_eq!(pool.report(2, 100, 5, 0).slack, 5);
    assert_eq!(pool.held(), before);
}

/// A reset bucket: the pool forgets what it held, keeps its members, and the next push takes
/// what their assignments need from the fresh bucket.
#[test]
fn a_pool_that_forgets_its_tokens_takes_afresh() {
    let params = per_second(100);
    let mut shared = Shared::new(params);
    let mut pool = Pool::new(params);
    let mut planes: Vec<DataPlane> = (0..2).map(|i| DataPlane::new(i, 50.0)).collect();
    for dp in &planes {
        pool.join(dp.id);
    }
    let first = push(PUSH_MS, &mut pool, &mut shared, &mut planes);
    assert!(first > 0, "the first push takes");
    assert!(pool.held() > 0.0);
    let held = pool.held();
    assert_eq!(pool.forget_held(), held);
    assert_eq!(pool.held(), 0.0);
    assert_eq!(pool.len(), 2, "members stay");
    let mut fresh = Shared::new(params);
    let again = push(2 * PUSH_MS, &mut pool, &mut fresh, &mut planes);
    assert!(again > 0, "the next push takes from the fresh bucket");
    assert!(pool.held() > 0.0);
}
