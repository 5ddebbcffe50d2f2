//! Redis Cluster: one script call per distinct slot of a request, issued concurrently.

use redis::Value;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};

use super::{RedisOptions, bounded, classify, collect, invalid_url, script};
use crate::algorithm::Verdict;
use crate::backend::{BackendError, Hit};
use crate::key::slot;

/// Redirects (MOVED/ASK) and TRYAGAIN are retried inside the cluster connection; these bound
/// how often and how long it waits, since a check has only its command timeout to spend.
const RETRIES: u32 = 4;
const MIN_RETRY_WAIT_MS: u64 = 2;
const MAX_RETRY_WAIT_MS: u64 = 100;

pub(super) async fn connect(opts: &RedisOptions) -> Result<ClusterConnection, BackendError> {
    let mut nodes = Vec::with_capacity(opts.urls.len());
    for (index, url) in opts.urls.iter().enumerate() {
        let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
            .map_err(|err| invalid_url(index, &err))?;
        nodes.push(info);
    }
    let client = ClusterClientBuilder::new(nodes)
        .connection_timeout(opts.connect_timeout)
        .retries(RETRIES)
        .min_retry_wait(MIN_RETRY_WAIT_MS)
        .max_retry_wait(MAX_RETRY_WAIT_MS)
        .build()
        .map_err(|err| BackendError::Unavailable(format!("Redis Cluster client: {err}")))?;
    let mut conn = bounded(opts.connect_timeout, async {
        client.get_async_connection().await.map_err(classify)
    })
    .await?;

    // Every master caches the script, so the first EVALSHA of each slot is one round trip.
    let reply = bounded(opts.connect_timeout, async {
        conn.route_command(
            script::load_command(),
            RoutingInfo::MultiNode((
                MultipleNodeRoutingInfo::AllMasters,
                Some(ResponsePolicy::AllSucceeded),
            )),
        )
        .await
        .map_err(classify)
    })
    .await?;
    script::check_loaded(&reply)?;
    Ok(conn)
}

/// Decides `hits`, grouped by slot; results come back in hit order.
pub(super) async fn check(
    conn: &ClusterConnection,
    hits: &[Hit],
    args: script::CallArgs,
) -> Result<Vec<Verdict>, BackendError> {
    let first = slot(&hits[0].key);
    if hits[1..].iter().all(|hit| slot(&hit.key) == first) {
        let reply = script::run(&mut conn.clone(), hits.iter(), hits.len(), args)
            .await
            .map_err(classify)?;
        return collect(&reply, hits.len());
    }

    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (index, hit) in hits.iter().enumerate() {
        let slot = slot(&hit.key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, members)) => members.push(index),
            None => groups.push((slot, vec![index])),
        }
    }
    let calls = groups.iter().map(|(_, members)| {
        let mut conn = conn.clone();
        async move {
            let group = members.iter().map(|&index| &hits[index]);
            script::run(&mut conn, group, members.len(), args)
                .await
                .map_err(classify)
        }
    });
    let replies: Vec<Value> = futures::future::try_join_all(calls).await?;

    let mut verdicts = vec![script::UNSET; hits.len()];
    for ((_, members), reply) in groups.iter().zip(&replies) {
        for (&index, verdict) in members.iter().zip(script::decode(reply, members.len())?) {
            verdicts[index] = verdict?;
        }
    }
    Ok(verdicts)
}
