//! The eviction check at connect: a server that may evict lock keys (see
//! [`crate::diagnose`]) gets one warning, and one metric, per server and manager.
//!
//! It runs in the connecting task after a connection is made: for the manager's first
//! connection before `connect` returns (one round trip more, bounded by the response
//! timeout), for later ones — each runtime's first, each one to a new Sentinel master after a
//! failover — once the caller has the connection. Never on an acquire or a release, and it
//! cannot fail a connect: whatever goes wrong is logged. Each server is checked once per
//! manager; one whose check could not finish (a timeout, a dropped connection) is checked
//! again at the next connect.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisResult, Value};
use tokio::time::error::Elapsed;

use crate::diagnose::{cluster_nodes, Eviction, CHECK_BY_HAND, EVICTION_FIX, EVICTION_RISK};

/// The servers of one endpoint checked so far (by address, `host:port`).
#[derive(Default)]
pub(crate) struct Checked(Mutex<HashSet<String>>);

impl Checked {
    /// Whether `server` is still to be checked; it counts as checked from now on.
    fn claim(&self, server: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(server.to_owned())
    }

    /// `server`'s check did not finish: the next connect tries again.
    fn release(&self, server: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(server);
    }

    /// Checks one server through `connection`, unless it was checked already.
    pub(crate) async fn server(
        &self,
        connection: &mut impl ConnectionLike,
        server: &str,
        timeout: Duration,
    ) {
        if !self.claim(server) {
            return;
        }
        let reply =
            tokio::time::timeout(timeout, config_get().query_async::<Value>(connection)).await;
        if !judge(server, reply) {
            self.release(server);
        }
    }

    /// Checks every node of a cluster — masters, and replicas, since a failover may promote
    /// any of them, and the cluster connection follows that without telling us — each unless
    /// it was checked already.
    pub(crate) async fn cluster(&self, connection: &mut ClusterConnection, timeout: Duration) {
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let asked =
            tokio::time::timeout(timeout, slots.query_async::<Vec<Value>>(connection)).await;
        let ranges = match asked {
            Ok(Ok(ranges)) => ranges,
            Ok(Err(error)) => {
                tracing::debug!(target: "distlock", %error, "the cluster's nodes could not be listed for the eviction check now; listed again at the next connect");
                return;
            }
            Err(_) => {
                tracing::debug!(target: "distlock", ?timeout, "the cluster did not list its nodes for the eviction check within the response timeout; listed again at the next connect");
                return;
            }
        };
        for (host, port) in cluster_nodes(&ranges) {
            let server = format!("{host}:{port}");
            if !self.claim(&server) {
                continue;
            }
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
            let reply =
                tokio::time::timeout(timeout, connection.route_command(config_get(), routing))
                    .await;
            if !judge(&server, reply) {
                self.release(&server);
            }
        }
    }
}

/// Says what `server`'s `CONFIG GET maxmemory*` reply (`Err` when none came within the response
/// timeout) means; `false` when the check did not finish and should be tried again.
fn judge(server: &str, reply: Result<RedisResult<Value>, Elapsed>) -> bool {
    let Ok(reply) = reply else {
        tracing::debug!(target: "distlock", server, "Redis did not tell its eviction policy within the response timeout; asked again at the next connect");
        return false;
    };
    let error = match reply {
        Ok(value) => {
            let pairs =
                redis::from_redis_value::<Vec<(String, String)>>(value.clone()).or_else(|_| {
                    redis::from_redis_value::<std::collections::HashMap<String, String>>(value)
                        .map(|map| map.into_iter().collect())
                });
            let eviction = pairs.ok().and_then(|pairs| {
                Eviction::from_config(pairs.iter().map(|(n, v)| (n.as_str(), v.as_str())))
            });
            match eviction {
                Some(eviction) => {
                    report(server, &eviction);
                    return true;
                }
                None => {
                    tracing::info!(target: "distlock", server, "could not check whether Redis at {server} may evict lock keys: its CONFIG GET maxmemory* reply has no maxmemory or maxmemory-policy; {CHECK_BY_HAND}");
                    return true;
                }
            }
        }
        Err(error) => error,
    };
    if error.is_timeout()
        || error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
    {
        tracing::debug!(target: "distlock", server, %error, "could not ask Redis for its eviction policy now; asked again at the next connect");
        return false;
    }
    // Refused: an ACL without CONFIG, or a managed service that renamed or removed it.
    tracing::info!(target: "distlock", server, %error, "could not check whether Redis at {server} may evict lock keys: CONFIG GET was refused ({error}); {CHECK_BY_HAND}");
    true
}

/// Says what `eviction` means for locks on `server`: a warning when locks can be evicted.
fn report(server: &str, eviction: &Eviction) {
    eviction_risk(server, eviction.can_evict_locks());
    if let Eviction::Evicts { policy } = eviction {
        tracing::warn!(
            target: "distlock",
            server,
            policy = policy.as_str(),
            "Redis at {server} may evict lock keys: {}. So {EVICTION_RISK}. Fix: {EVICTION_FIX}",
            eviction.describe()
        );
    } else {
        tracing::debug!(target: "distlock", server, "Redis at {server} keeps lock keys: {}", eviction.describe());
    }
}

/// `CONFIG GET maxmemory*`: the limit and the policy (with a few other `maxmemory-` settings).
/// A pattern rather than two names, which only Redis 7 takes in one `CONFIG GET`.
fn config_get() -> redis::Cmd {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory*");
    cmd
}

/// Records whether `server` may evict lock keys, as the check at connect found.
pub(crate) fn eviction_risk(server: &str, evicts: bool) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("distlock_eviction_risk", "server" => server.to_owned()).set(if evicts {
        1.0
    } else {
        0.0
    });
    #[cfg(not(feature = "metrics"))]
    let _ = (server, evicts);
}
