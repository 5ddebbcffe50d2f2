//! One bucket's quota on one replica: the tokens it took from the shared bucket ahead of the
//! data planes that enforce them, and each data plane's share.
//!
//! The prepaid contract: while pushes keep coming, a data plane is never told it may admit a token
//! that the pool has not already taken from the shared bucket. Each member's *exposure* is the
//! worst case of what it may have admitted without reporting it, plus what its local bucket still
//! holds: after a report at `t` it is at most the bucket's size, and it grows at the assigned rate
//! until the assignment expires. A push (every push interval) re-plans every member's share, asks
//! the shared bucket for what the plan needs beyond what the pool holds (or gives back what it
//! holds beyond that), and only then assigns: `held >= Σ exposure until the next push` (the
//! horizon, [`PoolOptions::horizon_ms`]) after every push. What a data plane admits past the
//! horizon (a late push; sluice gone until the assignment expires) the next push pays first, or,
//! with no push, is the `rate × ttl` of the slack below. A report
//! spends what it says was admitted (`held -= allowed`) and tightens the member's exposure to
//! what its bucket can still hold. A new strategy starts a fresh, full local bucket in Envoy, so
//! a change is paid its full size; an unchanged one re-sent only extends the expiry.
//!
//! Over any span T, the data planes admit at most what the shared bucket gave (C + r·T) plus
//! what the pools held when the span began: the grant slack, at most Σ (max_tokens + rate·ttl)
//! over the members, plus requests admitted while a report was in flight. Admissions beyond a
//! member's exposure (a data plane not enforcing, or on a failure policy's assignment) are charged
//! when reported, as debt of at most one bucket capacity that later pushes pay first (anything
//! beyond it is forgiven). Slack counts each such admission once: all of an excess over a
//! prepaid exposure, and of an unprepaid admission only what the debt could not take.

use std::collections::HashMap;

use crate::algorithm::BucketParams;
use crate::rule::FailureMode;

use super::strategy::{Strategy, TokenBucket};

/// Identifies one subscription (a stream × a bucket id) within a pool.
pub type MemberId = u64;

/// Push cadence and assignment shape, shared by every pool of a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolOptions {
    /// `assignment_time_to_live` of every assignment; longer than the push interval, so a data
    /// plane whose sluice is gone falls back to its expired-assignment behaviour within it.
    pub ttl_ms: u64,
    /// A token bucket holds this much of its rate (`max_tokens`): the burst a data plane may admit
    /// at once.
    pub burst_ms: u64,
    /// How far ahead a push pays each assignment's rate: the push interval, until the next push
    /// pays again. Not the whole ttl: Envoy reads whole seconds only, so a ttl of seconds paid
    /// ahead would cap a data plane's share at about C / (ttl + burst) where the rule's bucket is
    /// small. What a data plane may admit past the horizon without a push (sluice gone) is at most
    /// `rate × (ttl − horizon)`, inside the grant slack.
    pub horizon_ms: u64,
}

/// A current strategy within this fraction of the planned rate is kept as it is: re-sent
/// unchanged it only extends, where a change would refill the data plane's bucket.
const KEEP_WITHIN: f64 = 0.15;

/// Weight of the newest demand sample in a member's estimate.
const DEMAND_WEIGHT: f64 = 0.5;

/// Reports closer together than this say nothing reliable about a rate.
const MIN_SAMPLE_MS: u64 = 50;

/// Tokens a pool keeps beyond its plan, for a rule of at least [`RESERVE_FROM`] tokens: the shared
/// bucket yields whole tokens, so a push a little early finds one fewer than the plan needs, and
/// without this reserve the pool would replace a data plane's bucket by a smaller fresh one (and
/// pay a fresh one again to grow back). A smaller rule keeps none: a whole token is too large a
/// part of it to hold unassigned (RLS would find the bucket empty), and its data planes get
/// buckets the refill sustains ([`Pool::bucket_for`]), which need no reserve.
const RESERVE: f64 = 1.0;
const RESERVE_FROM: u64 = 10;

/// Where a member's part of the rule's capacity cannot pay a bucket of `burst_ms` of its rate
/// and a horizon of that rate ([`fitted`], [`sustained`]), its bucket still holds this fraction
/// of the part (at least one token) and the rate takes the rest. Envoy's filter admits a request
/// only for a whole token in hand, and requests reach it in bunches (one event-loop turn reads
/// many): a one-token bucket of rate ρ refuses every request that comes sooner than 1/ρ after
/// the one before, so a data plane far below its rate is refused a large part of its requests
/// (measured through Envoy 1.40: 10–27 % of 12–18k requests a second under a 50k/s bucket).
const BURST_PART: f64 = 0.1;

/// The bucket a part of `part` tokens keeps when it cannot pay a full one: [`BURST_PART`] of it,
/// whole, at least one token.
fn part_burst(part: f64) -> f64 {
    (part * BURST_PART).floor().max(1.0)
}

/// Below this, a fraction of a token is float error, not a token.
const WHOLE_EPSILON: f64 = 1e-9;

/// The requests a data plane may admit given `exposure` tokens: whole ones (Envoy's bucket
/// admits a request only for a whole token).
fn whole(exposure: f64) -> f64 {
    (exposure + WHOLE_EPSILON).floor().max(0.0)
}

#[derive(Clone, Debug)]
struct Member {
    strategy: Option<Strategy>,
    /// The strategy was paid from `held` (false before the first assignment and under a failure
    /// policy's assignment, whose admissions are charged when reported).
    prepaid: bool,
    expires_ms: u64,
    /// Exposure at `cap_at_ms`.
    cap: f64,
    cap_at_ms: u64,
    /// Requests per second the data plane saw (allowed + denied), smoothed; `None` until two
    /// reports give a rate.
    demand_per_s: Option<f64>,
    last_report_ms: Option<u64>,
}

impl Member {
    fn new() -> Self {
        Member {
            strategy: None,
            prepaid: false,
            expires_ms: 0,
            cap: 0.0,
            cap_at_ms: 0,
            demand_per_s: None,
            last_report_ms: None,
        }
    }

    /// Worst-case tokens admitted and not yet reported, or still in the local bucket, as of
    /// `at_ms`. The assigned rate accrues only until the assignment expires.
    fn exposure(&self, at_ms: u64) -> f64 {
        let (true, Some(strategy)) = (self.prepaid, self.strategy) else {
            return 0.0;
        };
        let until = at_ms.min(self.expires_ms).max(self.cap_at_ms);
        self.cap + strategy.rate_per_ms() * (until - self.cap_at_ms) as f64
    }

    /// Whether re-sending `strategy` keeps the data plane's current local bucket.
    fn keeps(&self, strategy: Strategy, now_ms: u64) -> bool {
        self.prepaid && self.strategy == Some(strategy) && now_ms < self.expires_ms
    }
}

/// What a push asks of the shared bucket for one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Take up to this many tokens.
    Take(u64),
    /// Give this many back.
    Refund(u64),
    Nothing,
}

/// The shared bucket's answer to an [`Ask`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Tokens taken (0 for [`Ask::Nothing`] or when none were left).
    Granted(u64),
    Refunded(u64),
    /// The backend could not answer: the rule's failure policy assigns. `replicas` divides the
    /// rule's rate under `local`.
    Failed {
        mode: FailureMode,
        replicas: u64,
    },
}

/// Effect of one report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reported {
    /// Admissions beyond what was prepaid for a member's assignment, or, without one, beyond
    /// one capacity of debt; each admission counted once (see the module docs).
    pub slack: u64,
}

/// One bucket's quota on one replica.
#[derive(Clone, Debug)]
pub struct Pool {
    params: BucketParams,
    /// Tokens taken from the shared bucket and not yet reported spent; negative while reported
    /// admissions are owed.
    held: f64,
    members: HashMap<MemberId, Member>,
    /// The plan of the push in progress: each member's strategy, if the pool can pay it.
    planned: Vec<(MemberId, Strategy)>,
    /// Exposure of every member as of the push in progress (owed whatever is assigned).
    fixed: f64,
    need: f64,
}

impl Pool {
    /// A pool for a rule of shape `params` (its capacity bounds the debt).
    pub fn new(params: BucketParams) -> Self {
        Pool {
            params,
            held: 0.0,
            members: HashMap::new(),
            planned: Vec::new(),
            fixed: 0.0,
            need: 0.0,
        }
    }

    pub fn params(&self) -> BucketParams {
        self.params
    }

    /// A reloaded rule's shape; the next push plans with it.
    pub fn set_params(&mut self, params: BucketParams) {
        self.params = params;
    }

    /// Whether `member` is subscribed.
    pub fn contains(&self, member: MemberId) -> bool {
        self.members.contains_key(&member)
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Tokens held (negative: owed).
    pub fn held(&self) -> f64 {
        self.held
    }

    /// Forgets what the pool holds or owes, for a shared bucket that was reset: its tokens and
    /// debt belonged to the bucket that is gone. Members and their assignments stay, so the next
    /// push takes from the fresh bucket all that the assignments it keeps need. Returns what was
    /// held.
    pub fn forget_held(&mut self) -> f64 {
        std::mem::take(&mut self.held)
    }

    /// The strategy `member` was last assigned.
    pub fn strategy(&self, member: MemberId) -> Option<Strategy> {
        self.members.get(&member).and_then(|m| m.strategy)
    }

    /// The token bucket of a `share_per_s` share: its rate quantized, and a bucket of the larger
    /// of `burst_ms` of that rate and the member's part of the rule's capacity (a rule's burst
    /// reaches the data planes in proportion to their shares). Where that part cannot pay one
    /// token plus a horizon of the share (a small rule: `1/min`, `1/day`, `2/s` pushed every
    /// second), the bucket is one the refill sustains instead ([`sustained`]).
    fn bucket_for(&self, share_per_s: f64, options: &PoolOptions) -> Strategy {
        let rate = self.rate_per_s();
        let part = if rate > 0.0 {
            (self.params.capacity as f64 * share_per_s / rate).floor()
        } else {
            0.0
        };
        let horizon_s = options.horizon_ms as f64 / 1000.0;
        if part.max(1.0) < 1.0 + share_per_s * horizon_s {
            return sustained(share_per_s, part.max(1.0), horizon_s);
        }
        let Some(bucket) = TokenBucket::for_rate(share_per_s, options.burst_ms) else {
            return Strategy::DenyAll;
        };
        Strategy::TokenBucket(TokenBucket {
            max_tokens: bucket.max_tokens.max(part.min(f64::from(u32::MAX)) as u32),
            ..bucket
        })
    }

    /// See [`RESERVE`].
    fn reserve(&self) -> f64 {
        if self.params.capacity >= RESERVE_FROM {
            RESERVE
        } else {
            0.0
        }
    }

    /// The rule's rate in tokens per second.
    fn rate_per_s(&self) -> f64 {
        self.params.requests_per_unit as f64 * 1000.0 / self.params.unit_ms.max(1) as f64
    }

    /// Subscribes `member` (no assignment until the next push).
    pub fn join(&mut self, member: MemberId) {
        self.members.entry(member).or_insert_with(Member::new);
    }

    /// Unsubscribes `member` (its stream closed, or it was abandoned): whatever it may still admit
    /// under its assignment is counted as spent, never given back.
    pub fn leave(&mut self, member: MemberId) {
        if let Some(m) = self.members.remove(&member) {
            self.held -= whole(m.exposure(m.expires_ms));
        }
    }

    /// Applies one usage report of `member` at `now_ms`.
    pub fn report(&mut self, member: MemberId, now_ms: u64, allowed: u64, denied: u64) -> Reported {
        let capacity = self.params.capacity as f64;
        let Some(m) = self.members.get_mut(&member) else {
            return Reported::default();
        };
        let allowed_f = allowed as f64;
        let mut excess = 0.0;
        if m.prepaid {
            let exposure = m.exposure(now_ms);
            // Past the exposure the data plane admitted what it was not given (or requests that
            // were in flight with the report): slack, and charged below like any admission.
            excess = (allowed_f - exposure).max(0.0);
            let burst = m.strategy.map_or(0.0, |s| s.burst());
            m.cap = burst.min((exposure - allowed_f).max(0.0));
            m.cap_at_ms = now_ms.max(m.cap_at_ms);
        }
        if let Some(last) = m.last_report_ms
            && now_ms >= last + MIN_SAMPLE_MS
        {
            let sample = (allowed_f + denied as f64) * 1000.0 / (now_ms - last) as f64;
            m.demand_per_s = Some(match m.demand_per_s {
                Some(d) => d + DEMAND_WEIGHT * (sample - d),
                None => sample,
            });
        }
        m.last_report_ms = Some(now_ms);
        self.held -= allowed_f;
        let mut forgiven = 0.0;
        if self.held < -capacity {
            forgiven = -capacity - self.held;
            self.held = -capacity;
        }
        // Each admission counts once: an excess over a prepaid assignment is slack whether it
        // became debt or was forgiven; otherwise only what the debt could not take is.
        Reported {
            slack: excess.max(forgiven).ceil() as u64,
        }
    }

    /// Each member's planned rate (tokens per second): what it wants — twice its observed
    /// demand, at least a twentieth of an even split; an even split before it has a rate — with
    /// the rule's rate split max-min fairly when the wants exceed it: members wanting less than
    /// an even part get what they want, the rest share what is left evenly.
    fn shares(&self) -> Vec<(MemberId, f64)> {
        let rate = self.rate_per_s();
        let n = self.members.len().max(1) as f64;
        let floor = rate / (20.0 * n);
        let mut wants: Vec<(MemberId, f64)> = self
            .members
            .iter()
            .map(|(id, m)| {
                let want = m.demand_per_s.map_or(rate / n, |d| (2.0 * d).max(floor));
                (*id, want)
            })
            .collect();
        wants.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let mut left = rate;
        let count = wants.len();
        for (i, (_, want)) in wants.iter_mut().enumerate() {
            let even = left / (count - i) as f64;
            *want = want.min(even);
            left -= *want;
        }
        wants
    }

    /// Plans a push at `now_ms`: every member's strategy, and what the pool must take from (or may
    /// give back to) the shared bucket to pay for it. Follow with [`Pool::settle`].
    pub fn plan(&mut self, now_ms: u64, options: &PoolOptions) -> Ask {
        let horizon = options.horizon_ms as f64;
        self.fixed = self
            .members
            .values()
            .map(|m| whole(m.exposure(now_ms)))
            .sum();
        self.planned.clear();
        let mut future = 0.0;
        for (id, share) in self.shares() {
            let member = &self.members[&id];
            let strategy = match member.strategy {
                Some(Strategy::TokenBucket(current))
                    if member.keeps(Strategy::TokenBucket(current), now_ms)
                        && (share - current.rate_per_s()).abs()
                            <= KEEP_WITHIN * current.rate_per_s() =>
                {
                    Strategy::TokenBucket(current)
                }
                _ => self.bucket_for(share, options),
            };
            future += cost(member, strategy, now_ms, horizon);
            self.planned.push((id, strategy));
        }
        self.need = self.fixed + future;
        let gap = self.need + self.reserve() - self.held;
        if gap > 0.0 {
            Ask::Take(gap.ceil() as u64)
        } else if gap <= -1.0 {
            Ask::Refund((-gap).floor() as u64)
        } else {
            Ask::Nothing
        }
    }

    /// Settles the push planned by [`Pool::plan`] with the shared bucket's answer, and returns
    /// the assignments to send (none under the `error` policy: the current ones expire).
    pub fn settle(
        &mut self,
        now_ms: u64,
        options: &PoolOptions,
        answer: Answer,
    ) -> Vec<(MemberId, Strategy)> {
        let mut planned = std::mem::take(&mut self.planned);
        // Members that left while the backend was asked are out of the plan.
        planned.retain(|(id, _)| self.members.contains_key(id));
        match answer {
            Answer::Granted(tokens) => self.held += tokens as f64,
            Answer::Refunded(tokens) => self.held -= tokens as f64,
            Answer::Failed { mode, replicas } => {
                return self.assign_unpaid(now_ms, options, mode, replicas);
            }
        }
        let planned = if self.held + 1e-9 >= self.need {
            planned
        } else {
            self.shrink(now_ms, options, &planned)
        };
        for (id, strategy) in &planned {
            let m = self
                .members
                .get_mut(id)
                .expect("planned members are members");
            let fresh = if m.keeps(*strategy, now_ms) {
                0.0
            } else {
                strategy.burst()
            };
            m.cap = m.exposure(now_ms) + fresh;
            m.cap_at_ms = now_ms;
            m.strategy = Some(*strategy);
            m.prepaid = true;
            m.expires_ms = now_ms + options.ttl_ms;
        }
        planned
    }

    /// The plan cut down to what the pool holds, split as the rate is: max-min fairly. What is
    /// left after every member's exposure is shared out by water-filling over what each planned
    /// assignment costs, so a member that planned little keeps its plan and the large ones share
    /// the rest evenly; a member short of its plan gets the largest bucket its part pays for.
    fn shrink(
        &self,
        now_ms: u64,
        options: &PoolOptions,
        planned: &[(MemberId, Strategy)],
    ) -> Vec<(MemberId, Strategy)> {
        let horizon = options.horizon_ms as f64;
        let costs: Vec<f64> = planned
            .iter()
            .map(|(id, strategy)| cost(&self.members[id], *strategy, now_ms, horizon))
            .collect();
        let mut order: Vec<usize> = (0..planned.len()).collect();
        order.sort_by(|&a, &b| costs[a].total_cmp(&costs[b]).then(a.cmp(&b)));
        let mut left = (self.held - self.fixed - self.reserve()).max(0.0);
        let mut parts = vec![0.0; planned.len()];
        for (n, &i) in order.iter().enumerate() {
            parts[i] = costs[i].min(left / (order.len() - n) as f64);
            left -= parts[i];
        }
        whole_parts(&mut parts, &order);
        planned
            .iter()
            .zip(costs.iter().zip(parts))
            .map(|((id, planned), (&planned_cost, part))| {
                let member = &self.members[id];
                if planned_cost <= part {
                    return (*id, *planned);
                }
                // Whole requests: a member's fraction of a token plus the fitted bucket may come to
                // one more than the part; then the bucket a token smaller fits.
                let fresh = [part, part - 1.0]
                    .into_iter()
                    .map(|p| fitted(p, *planned, options))
                    .find(|s| cost(member, *s, now_ms, horizon) <= part + 1e-6)
                    .unwrap_or(Strategy::DenyAll);
                // The bucket the data plane has, kept, costs only its rate: better than a
                // smaller fresh one whenever the part pays for it.
                let strategy = match member.strategy {
                    Some(current)
                        if member.keeps(current, now_ms)
                            && current.rate_per_ms() > fresh.rate_per_ms()
                            && cost(member, current, now_ms, horizon) <= part =>
                    {
                        current
                    }
                    _ => fresh,
                };
                (*id, strategy)
            })
            .collect()
    }

    /// The failure policy's assignments, paid by no one: `open` admits all, `closed` denies all,
    /// `local` gives each member its share of the rule's rate divided by the replicas, `error`
    /// sends nothing.
    fn assign_unpaid(
        &mut self,
        now_ms: u64,
        options: &PoolOptions,
        mode: FailureMode,
        replicas: u64,
    ) -> Vec<(MemberId, Strategy)> {
        let shares = self.shares();
        let rate = self.rate_per_s();
        let total: f64 = shares.iter().map(|(_, s)| s).sum();
        let mut assigned = Vec::with_capacity(shares.len());
        for (id, share) in shares {
            let strategy = match mode {
                FailureMode::Error => return Vec::new(),
                FailureMode::Open => Strategy::AllowAll,
                FailureMode::Closed => Strategy::DenyAll,
                FailureMode::Local => {
                    let part = if total > 0.0 { share / total } else { 0.0 };
                    let rate = rate / replicas.max(1) as f64 * part;
                    TokenBucket::for_rate(rate, options.burst_ms)
                        .map_or(Strategy::DenyAll, Strategy::TokenBucket)
                }
            };
            let m = self.members.get_mut(&id).expect("shares are of members");
            // What it was exposed to stays held until it reports; nothing new is prepaid.
            m.prepaid = false;
            m.strategy = Some(strategy);
            m.expires_ms = now_ms + options.ttl_ms;
            assigned.push((id, strategy));
        }
        assigned
    }

    /// Tokens the pool may give back once it has no members (`None` while it has any).
    pub fn drain(&mut self) -> Option<u64> {
        if !self.members.is_empty() {
            return None;
        }
        let tokens = self.held.max(0.0).floor() as u64;
        self.held -= tokens as f64;
        Some(tokens)
    }
}

/// Rounds water-filled `parts` (visited in `order`, smallest plan first) down to whole tokens and
/// hands the whole tokens their fractions add up to, one each, to the first members that lost a
/// fraction: two data planes sharing one token get one token and none, not half a token each
/// (which pays no bucket, so the pool would hold the token for nobody).
fn whole_parts(parts: &mut [f64], order: &[usize]) {
    let total: f64 = parts.iter().sum();
    let mut spare = whole(total) - parts.iter().map(|p| whole(*p)).sum::<f64>();
    for &i in order {
        let floor = whole(parts[i]);
        let had_fraction = parts[i] - floor > WHOLE_EPSILON;
        parts[i] = floor;
        if had_fraction && spare >= 1.0 {
            parts[i] += 1.0;
            spare -= 1.0;
        }
    }
}

/// The fastest fresh token bucket `part` tokens pay for, no faster and no larger than `planned`:
/// the bucket keeps [`BURST_PART`] of the part (at least one token), the rate takes the rest (it
/// lasts), and the bucket's size (paid once) whatever the rate leaves.
fn fitted(part: f64, planned: Strategy, options: &PoolOptions) -> Strategy {
    let horizon = options.horizon_ms as f64;
    let ceiling_per_s = planned.rate_per_ms() * 1000.0;
    let burst = part_burst(part);
    let rate_per_s = ((part - burst).max(0.0) * 1000.0 / horizon.max(1.0)).min(ceiling_per_s);
    let Some(bucket) = TokenBucket::for_rate(rate_per_s, options.burst_ms) else {
        // One token pays a single-token bucket whose rate comes due no earlier than the refill.
        return if part >= 1.0 {
            sustained(ceiling_per_s, 1.0, horizon / 1000.0)
        } else {
            Strategy::DenyAll
        };
    };
    let room = (part - bucket.rate_per_ms() * horizon).floor();
    Strategy::TokenBucket(TokenBucket {
        max_tokens: room.clamp(1.0, planned.burst().max(1.0)) as u32,
        ..bucket
    })
}

/// What assigning `strategy` to `member` at `now_ms` adds to the requests it may admit until the
/// next push, in whole requests: the rate for the horizon, plus a full bucket when it is not the
/// one the data plane already has, on top of its exposure.
fn cost(member: &Member, strategy: Strategy, now_ms: u64, horizon_ms: f64) -> f64 {
    let fresh = if member.keeps(strategy, now_ms) {
        0.0
    } else {
        strategy.burst()
    };
    let exposure = member.exposure(now_ms);
    whole(exposure + fresh + strategy.rate_per_ms() * horizon_ms) - whole(exposure)
}

/// A bucket of a small rule that the shared bucket's refill sustains push after push, for a
/// member whose part of the rule's capacity is `part` (at least 1) tokens. A push pays one horizon
/// ahead, so a data plane's bucket of `max_tokens` B and rate ρ needs B + ρ·horizon in hand where
/// the part holds fewer: either the rate that leaves the part room for a bucket of
/// [`BURST_PART`] of it (B = ⌊part / 10⌋, at least 1; ρ = (part − B) / horizon), or the share's
/// rate slowed by one horizon per token
/// (ρ = 1 / (1/share + horizon), B = part), whose every token comes due no earlier than the shared
/// bucket refills it; whichever is faster, never above the share. `1/min` is one token at once,
/// then one per 61 s; `2/s` pushed every second, 1/s with one token. Never DENY_ALL while the
/// share is positive.
fn sustained(share_per_s: f64, part: f64, horizon_s: f64) -> Strategy {
    if !(share_per_s > 0.0 && share_per_s.is_finite()) {
        return Strategy::DenyAll;
    }
    let burst = part_burst(part);
    let roomy = (part - burst) / horizon_s.max(1e-3);
    let lagged = 1.0 / (1.0 / share_per_s + horizon_s);
    let (rate, max_tokens) = if roomy >= lagged {
        (roomy.min(share_per_s), burst)
    } else {
        (lagged.min(share_per_s), part)
    };
    let max_tokens = max_tokens.clamp(1.0, f64::from(u32::MAX)) as u32;
    let bucket = TokenBucket::for_rate(rate, 0).unwrap_or(TokenBucket {
        max_tokens: 1,
        tokens_per_fill: 1,
        fill_interval_s: (1.0 / rate).ceil().min(f64::from(u32::MAX)) as u32,
    });
    Strategy::TokenBucket(TokenBucket {
        max_tokens,
        ..bucket
    })
}
