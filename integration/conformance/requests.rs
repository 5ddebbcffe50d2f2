//! Whole requests in the conformance suite: keys of several algorithms in one call (all or
//! nothing), lease takes, descriptor values as bytes, always-charged takes.

use sluice::algorithm::Algorithm;
use sluice::backend::{Backend, Hit};

use super::{
    Subject, T0, fixed, gcra, key, leasing, params, refunding, shadowed, sliding, take, took, v,
};

// ---------------------------------------------------------------------------------------------
// Requests over keys of several algorithms: one call, all or nothing.

pub(super) async fn mixed_algorithms_all_or_nothing<B: Backend>(s: &Subject<B>) {
    let (a, b, c, d) = (
        key("mixed", "tb"),
        key("mixed", "fw"),
        key("mixed", "sw"),
        key("mixed", "gcra"),
    );
    let tb = |tokens| take(&a, params(5, 5, 1_000), tokens);
    let fw = |tokens| fixed(&b, 3, 1_000, tokens);
    let sw = |tokens| sliding(&c, 3, 1_000, tokens);
    let gc = |tokens| gcra(&d, 2, 2, 1_000, tokens);
    s.clock.set(T0);
    // GCRA cannot take 3 (burst 2): nothing is counted anywhere.
    s.expect(
        &[tb(1), fw(1), sw(1), gc(3)],
        &[
            v(true, 5, Some(0), 0),
            v(true, 3, Some(0), 1_000),
            v(true, 3, Some(0), 0),
            v(false, 2, None, 0),
        ],
    )
    .await;
    s.expect(
        &[tb(1), fw(1), sw(1), gc(1)],
        &[
            v(true, 4, Some(0), 200),
            v(true, 2, Some(0), 1_000),
            v(true, 2, Some(0), 2_000),
            v(true, 1, Some(0), 500),
        ],
    )
    .await;
    // A short shadow key does not reject, and is not counted.
    s.expect(
        &[fw(2), shadowed(gc(2))],
        &[v(true, 0, Some(0), 1_000), v(false, 1, Some(500), 500)],
    )
    .await;
    // The full window rejects; the sliding window is not counted, the refund still applies.
    s.expect(
        &[fw(1), sw(1), refunding(tb(1))],
        &[
            v(false, 0, Some(1_000), 1_000),
            v(true, 2, Some(0), 2_000),
            v(true, 5, Some(0), 0),
        ],
    )
    .await;
}

/// A lease take gets the demand plus as many whole tokens as the bucket holds, up to the lease;
/// a bucket short of the demand itself grants nothing; a rejected request grants nothing.
pub(super) async fn lease_takes<B: Backend>(s: &Subject<B>) {
    let (a, b, g) = (
        key("lease", "tb"),
        key("lease", "other"),
        key("lease", "gcra"),
    );
    // 10 tokens, one per 100 ms.
    let p = params(10, 10, 1_000);
    s.clock.set(T0);
    s.expect_granted(
        &[leasing(take(&a, p, 1), 4)],
        &[took(v(true, 5, Some(0), 500), 5)],
    )
    .await;
    s.expect_granted(
        &[leasing(take(&a, p, 2), 9)],
        &[took(v(true, 0, Some(0), 1_000), 5)],
    )
    .await;
    // 50 ms later half a token: not even the demand fits, nothing is taken.
    s.clock.set(T0 + 50);
    s.expect_granted(&[leasing(take(&a, p, 1), 4)], &[v(false, 0, Some(50), 950)])
        .await;
    // 1.5 tokens: the demand and no whole extra; the half token stays.
    s.clock.set(T0 + 150);
    s.expect_granted(
        &[leasing(take(&a, p, 1), 4)],
        &[took(v(true, 0, Some(0), 950), 1)],
    )
    .await;
    // Another key of the request rejects it: the lease take takes nothing.
    s.clock.set(T0 + 1_150);
    s.expect_granted(
        &[
            leasing(take(&a, p, 1), 4),
            take(&b, params(1, 1, 60_000), 2),
        ],
        &[v(true, 10, Some(0), 0), v(false, 1, None, 0)],
    )
    .await;
    // GCRA, one per 100 ms, burst 4: a lease of 9 gets the rest of the burst.
    s.expect_granted(
        &[leasing(gcra(&g, 4, 10, 1_000, 1), 9)],
        &[took(v(true, 0, Some(0), 400), 4)],
    )
    .await;
    s.clock.set(T0 + 1_350);
    s.expect_granted(
        &[leasing(gcra(&g, 4, 10, 1_000, 1), 9)],
        &[took(v(true, 0, Some(0), 400), 2)],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Descriptor values are bytes (Envoy copies header values unchanged): each value, UTF-8 or not,
// short or 60 KB, is its own bucket under the key the key module writes for it.

pub(super) async fn byte_values_have_their_own_buckets<B: Backend>(s: &Subject<B>) {
    use sluice::key::{RuleTag, bucket_key};
    use sluice::request::{Entry, Value};
    let long = [vec![b'u'; 60_000], vec![0xff]].concat();
    let mut long_other = long.clone();
    long_other[0] = 0xfe;
    let values: Vec<Value> = vec![
        b"ab\xff".as_slice().into(),
        "ab\u{FFFD}".into(),
        "ab\\xFF".into(),
        "ab%FF".into(),
        b"\xc3\x28".as_slice().into(),
        "".into(),
        long.into(),
        long_other.into(),
    ];
    let p = params(1, 1, 86_400_000);
    let keys: Vec<String> = values
        .into_iter()
        .map(|value| {
            // One hash tag (the first entry) for all: one Cluster slot, one script call.
            let entries = [
                Entry::new("scenario", "byte_values"),
                Entry::new("user", value),
            ];
            bucket_key(
                "",
                "conformance",
                &entries,
                RuleTag::Configured,
                Algorithm::TokenBucket,
            )
        })
        .collect();
    for k in &keys {
        assert!(k.is_ascii() && k.len() < 200, "{k}");
    }
    let hits: Vec<Hit> = keys.iter().map(|k| take(k, p, 1)).collect();
    s.clock.set(T0);
    let full = v(true, 0, Some(0), 86_400_000);
    s.expect(&hits, &vec![full; hits.len()]).await;
    for hit in &hits {
        s.expect(
            std::slice::from_ref(hit),
            &[v(false, 0, Some(86_400_000), 86_400_000)],
        )
        .await;
    }
}

/// The same hit, always charged (`charge: always`): counted whatever the answer, into debt.
fn always(mut hit: Hit) -> Hit {
    hit.demand.always = true;
    hit
}

/// Always-charged hits of every algorithm put their key into debt, which refuses check-only
/// hits until it is repaid; a request refused by another key still charges them.
pub(super) async fn charges_always_land<B: Backend>(s: &Subject<B>) {
    let p = params(100, 100, 60_000);
    // A minute boundary, where the windows start.
    s.clock.set(T0 + 40_000);
    let k = key("charges", "tb");
    s.expect(&[always(take(&k, p, 60))], &[v(true, 40, Some(0), 36_000)])
        .await;
    s.expect_granted(
        &[always(take(&k, p, 60))],
        &[took(v(false, 0, Some(48_000), 72_000), 60)],
    )
    .await;
    s.expect(&[take(&k, p, 0)], &[v(false, 0, Some(12_600), 72_000)])
        .await;
    let k = key("charges", "fw");
    s.expect(
        &[always(fixed(&k, 100, 60_000, 60))],
        &[v(true, 40, Some(0), 60_000)],
    )
    .await;
    s.expect(
        &[always(fixed(&k, 100, 60_000, 60))],
        &[v(false, 0, Some(60_000), 60_000)],
    )
    .await;
    s.expect(
        &[fixed(&k, 100, 60_000, 0)],
        &[v(false, 0, Some(60_000), 60_000)],
    )
    .await;
    let k = key("charges", "sw");
    s.expect(
        &[always(sliding(&k, 100, 60_000, 120))],
        &[v(false, 0, None, 120_000)],
    )
    .await;
    s.expect(
        &[sliding(&k, 100, 60_000, 0)],
        &[v(false, 0, Some(70_500), 120_000)],
    )
    .await;
    let k = key("charges", "gcra");
    s.expect(
        &[always(gcra(&k, 100, 100, 60_000, 120))],
        &[v(false, 0, None, 72_000)],
    )
    .await;
    s.expect(
        &[gcra(&k, 100, 100, 60_000, 0)],
        &[v(false, 0, Some(12_600), 72_000)],
    )
    .await;
    // Refused by `tight`: the always-charged key pays, the ordinary one does not.
    let (tight, paid, spared) = (
        key("refused", "tight"),
        key("refused", "paid"),
        key("refused", "spared"),
    );
    let one = params(1, 1, 3_600_000);
    s.expect(&[take(&tight, one, 1)], &[v(true, 0, Some(0), 3_600_000)])
        .await;
    s.expect_granted(
        &[
            take(&tight, one, 1),
            always(take(&paid, p, 5)),
            take(&spared, p, 5),
        ],
        &[
            v(false, 0, Some(3_600_000), 3_600_000),
            took(v(true, 95, Some(0), 3_000), 5),
            v(true, 100, Some(0), 0),
        ],
    )
    .await;
}
