use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;

fn label(n: u64) -> Arc<str> {
    Arc::from(format!("user={n}"))
}

fn options(capacity: usize) -> TopOptions {
    TopOptions {
        capacity,
        window_ms: 60_000,
        max_rules: 10,
    }
}

fn record(top: &mut TopKeys, now_ms: u64, rule: &Arc<str>, key: u64, over: bool) {
    top.record(now_ms, rule, Seen { hash: key, over }, || label(key));
}

#[test]
fn below_capacity_every_count_is_exact() {
    let mut s = SpaceSaving::new(4);
    for (key, times) in [(1, 5), (2, 3), (3, 1)] {
        for _ in 0..times {
            s.offer(key, || label(key), 1);
        }
    }
    let counts: Vec<(u64, u64, u64)> = s
        .counters()
        .iter()
        .map(|c| (c.hash, c.count, c.error))
        .collect();
    assert_eq!(counts, [(1, 5, 0), (2, 3, 0), (3, 1, 0)]);
    assert_eq!(s.floor(), 0);
    assert_eq!(s.offered(), 9);
}

#[test]
fn a_new_key_replaces_the_smallest_counter_and_inherits_its_count_as_error() {
    let mut s = SpaceSaving::new(2);
    for key in [1, 1, 1, 2, 3] {
        s.offer(key, || label(key), 1);
    }
    let three = s.counters().iter().find(|c| c.hash == 3).unwrap();
    assert_eq!((three.count, three.error, &*three.label), (2, 1, "user=3"));
    assert!(s.counters().iter().all(|c| c.hash != 2));
}

proptest! {
    /// The Space-Saving guarantees over skewed streams: every counter within its error of the
    /// truth, every error at most N / capacity, every key offered more than N / capacity times
    /// counted.
    #[test]
    fn counts_stay_within_their_error_and_heavy_keys_are_kept(
        stream in prop::collection::vec((0u64..40).prop_map(|x| x * x / 40), 1..2_000),
        capacity in 1usize..16,
    ) {
        let mut s = SpaceSaving::new(capacity);
        let mut truth: HashMap<u64, u64> = HashMap::new();
        for &key in &stream {
            s.offer(key, || label(key), 1);
            *truth.entry(key).or_default() += 1;
        }
        let n = stream.len() as u64;
        for c in s.counters() {
            let t = truth[&c.hash];
            prop_assert!(c.count - c.error <= t && t <= c.count, "{c:?} truth {t}");
            prop_assert!(c.error * capacity as u64 <= n);
        }
        for (key, t) in &truth {
            if t * capacity as u64 > n {
                prop_assert!(s.counters().iter().any(|c| c.hash == *key), "heavy key {key} ({t} of {n}) lost");
            }
        }
    }
}

#[test]
fn a_view_covers_the_current_and_the_previous_window() {
    let rule: Arc<str> = Arc::from("edge.user");
    let mut top = TopKeys::new(options(8));
    for _ in 0..3 {
        record(&mut top, 1_000, &rule, 7, true);
    }
    record(&mut top, 1_000, &rule, 8, false);
    // Next window: key 7 twice more, over its limit once.
    record(&mut top, 61_000, &rule, 7, true);
    record(&mut top, 61_500, &rule, 7, false);
    let view = top.view(62_000, 10, None);
    assert_eq!(view.len(), 1);
    let v = &view[0];
    assert_eq!(&*v.rule, "edge.user");
    assert_eq!((v.limited_total, v.active_total), (4, 6));
    assert_eq!(
        v.limited[0],
        Ranked {
            key: label(7),
            count: 4,
            error: 0
        }
    );
    assert_eq!(
        v.active[0],
        Ranked {
            key: label(7),
            count: 5,
            error: 0
        }
    );
    assert_eq!(
        v.active[1],
        Ranked {
            key: label(8),
            count: 1,
            error: 0
        }
    );
    // Two windows on, the first one is gone.
    let v = &top.view(121_000, 10, None)[0];
    assert_eq!((v.limited_total, v.active_total), (1, 2));
    // With no decision for two whole windows the rule leaves the view (and memory).
    assert!(top.view(240_000, 10, None).is_empty());
}

#[test]
fn a_key_missing_from_one_window_carries_that_windows_floor_as_error() {
    let rule: Arc<str> = Arc::from("edge.user");
    let mut top = TopKeys::new(options(2));
    for key in [1, 1, 2, 2] {
        record(&mut top, 0, &rule, key, false);
    }
    // Next window: key 3 only.
    record(&mut top, 60_000, &rule, 3, false);
    let v = &top.view(60_000, 10, None)[0];
    let three = v.active.iter().find(|r| &*r.key == "user=3").unwrap();
    // Key 3 may have been offered up to twice in the full first window without a counter.
    assert_eq!((three.count, three.error), (1, 2));
}

#[test]
fn rules_past_the_bound_are_counted_not_summarized_and_views_rank_rules_by_limits() {
    let mut top = TopKeys::new(TopOptions {
        max_rules: 2,
        ..options(4)
    });
    let rules: Vec<Arc<str>> = ["a", "b", "c"].into_iter().map(Arc::from).collect();
    record(&mut top, 0, &rules[0], 1, false);
    record(&mut top, 0, &rules[1], 1, true);
    record(&mut top, 0, &rules[2], 1, true);
    assert_eq!(top.untracked(), 1);
    let views = top.view(0, 5, None);
    let order: Vec<&str> = views.iter().map(|v| &*v.rule).collect();
    assert_eq!(order, ["b", "a"], "the rule with a limited key first");
    let only: Vec<Arc<str>> = top
        .view(0, 5, Some("a"))
        .into_iter()
        .map(|v| v.rule)
        .collect();
    assert_eq!(only, [rules[0].clone()]);
}

#[test]
fn summaries_of_one_stream_split_between_workers_merge_as_one() {
    let rule: Arc<str> = Arc::from("edge.user");
    let mut a = TopKeys::new(options(8));
    let mut b = TopKeys::new(options(8));
    // Made at different times, their windows still line up (multiples of the window).
    for _ in 0..3 {
        record(&mut a, 1_000, &rule, 7, true);
    }
    record(&mut b, 59_000, &rule, 7, true);
    record(&mut b, 59_500, &rule, 8, false);
    record(&mut a, 61_000, &rule, 8, false);
    let views = merged_view(&mut [&mut a, &mut b], 62_000, 10, None);
    assert_eq!(views.len(), 1);
    let v = &views[0];
    assert_eq!((v.limited_total, v.active_total), (4, 6));
    assert_eq!(
        v.limited,
        [Ranked {
            key: label(7),
            count: 4,
            error: 0
        }]
    );
    assert_eq!(
        v.active,
        [
            Ranked {
                key: label(7),
                count: 4,
                error: 0
            },
            Ranked {
                key: label(8),
                count: 2,
                error: 0
            },
        ]
    );
    // Two windows on, only what was counted since 60 s is left, from either worker.
    let v = &merged_view(&mut [&mut a, &mut b], 121_000, 10, None)[0];
    assert_eq!((v.limited_total, v.active_total), (0, 1));
}

#[test]
fn sets_sharing_bounds_track_at_most_max_rules_between_them() {
    let options = TopOptions {
        max_rules: 2,
        ..options(4)
    };
    let bounds = TopBounds::for_options(&options);
    let mut a = TopKeys::sharing(options, bounds.clone());
    let mut b = TopKeys::sharing(options, bounds.clone());
    let rules: Vec<Arc<str>> = ["r1", "r2", "r3"].into_iter().map(Arc::from).collect();
    record(&mut a, 0, &rules[0], 1, false);
    record(&mut a, 0, &rules[1], 1, false);
    // A rule tracked by the other set is tracked here too; a third one is not, in either set.
    record(&mut b, 0, &rules[1], 2, false);
    record(&mut b, 0, &rules[2], 1, false);
    record(&mut a, 0, &rules[2], 1, false);
    assert_eq!((a.untracked(), b.untracked()), (1, 1));
    assert_eq!(bounds.rules(), 2);
    let views = merged_view(&mut [&mut a, &mut b], 0, 10, None);
    assert_eq!(views.len(), 2);
    // Once both windows pass without decisions the rules are released, and a new one fits.
    let _ = merged_view(&mut [&mut a, &mut b], 180_000, 10, None);
    assert_eq!((bounds.rules(), bounds.counters()), (0, 0));
    record(&mut b, 180_000, &rules[2], 1, false);
    assert_eq!(bounds.rules(), 1);
}

#[test]
fn counters_past_the_shared_bound_are_not_taken_and_the_error_says_so() {
    let bounds = TopBounds::new(10, 3);
    let rule: Arc<str> = Arc::from("edge.user");
    let mut a = TopKeys::sharing(options(8), bounds.clone());
    let mut b = TopKeys::sharing(options(8), bounds.clone());
    for key in 1..=5 {
        record(&mut a, 0, &rule, key, false);
    }
    // `a` took every counter (2 for `active`, the third for `limited` of key 1 below).
    record(&mut a, 0, &rule, 1, true);
    assert_eq!(bounds.counters(), 3);
    for _ in 0..4 {
        record(&mut b, 0, &rule, 9, false);
    }
    assert_eq!(bounds.counters(), 3, "b got no counter");
    let v = &merged_view(&mut [&mut a, &mut b], 0, 10, None)[0];
    assert_eq!(v.active_total, 10);
    // Every key carries b's 4 uncounted offers as possible error.
    assert!(v.active.iter().all(|r| r.error >= 4), "{v:?}");
    drop((a, b));
    assert_eq!((bounds.rules(), bounds.counters()), (0, 0));
}
