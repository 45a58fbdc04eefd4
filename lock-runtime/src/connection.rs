//! Connections to one Redis endpoint — a standalone server or a whole cluster — one per tokio
//! runtime that uses them.
//!
//! A redis-rs connection is driven by a task on the runtime that created it and dies with that
//! runtime. A global lock manager outlives runtimes — every `#[tokio::test]` has its own — so
//! each runtime gets its own multiplexed connection, created on first use there. Keeping the
//! connection's driver on the caller's runtime also keeps every round trip free of cross-thread
//! hand-offs. Connections of runtimes that have shut down are dropped when the next one is added.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tokio::runtime::{Handle, Id};

/// How many times a cluster connection sends a command again (after a dropped connection, a
/// response timeout, a redirection), and its longest pause before doing so, in milliseconds.
const CLUSTER_RETRIES: u32 = 3;
const CLUSTER_MAX_RETRY_WAIT_MS: u64 = 200;

/// Connection and response timeouts of one endpoint's connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

/// How to reach one endpoint.
// Made once per manager and never moved on a hot path: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(crate) enum Endpoint {
    /// One server, through a reconnecting `ConnectionManager`.
    Standalone(redis::Client),
    /// A Redis Cluster: redirections (MOVED/ASK) and failovers are followed by redis-rs.
    Cluster(ClusterClient),
}

/// A connection to an [`Endpoint`]; cheap to clone, multiplexed.
#[derive(Clone)]
pub(crate) enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Standalone(connection) => connection.req_packed_command(cmd),
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Standalone(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            Connection::Cluster(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Standalone(connection) => connection.get_db(),
            Connection::Cluster(connection) => connection.get_db(),
        }
    }
}

impl Endpoint {
    /// A cluster endpoint from its seed nodes.
    pub(crate) fn cluster(
        urls: &[String],
        timeouts: Timeouts,
        #[cfg(feature = "tls")] certificates: Option<redis::TlsCertificates>,
        #[cfg(not(feature = "tls"))] _certificates: Option<std::convert::Infallible>,
    ) -> RedisResult<Self> {
        let builder = ClusterClientBuilder::new(urls.to_vec());
        #[cfg(feature = "tls")]
        let builder = match certificates {
            Some(certificates) => builder.certs(certificates),
            None => builder,
        };
        builder
            .connection_timeout(timeouts.connect)
            .response_timeout(timeouts.response)
            // A few quick retries ride out MOVED/ASK and a failover; our callers retry until
            // their own deadline after that.
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(10)
            .max_retry_wait(CLUSTER_MAX_RETRY_WAIT_MS)
            .build()
            .map(Endpoint::Cluster)
    }

    async fn connect(&self, timeouts: Timeouts) -> RedisResult<Connection> {
        match self {
            Endpoint::Standalone(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeouts.connect))
                    .set_response_timeout(Some(timeouts.response))
                    // Our own callers retry until their deadline; a reconnect loop inside
                    // redis-rs would only hide that Redis is down. Not even one retry: its
                    // backoff sleep (up to 50 ms) would be paid by every operation on a dead
                    // Redlock master (each op waits for all masters), slowing the whole quorum.
                    .set_number_of_retries(0)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_millis(500));
                ConnectionManager::new_with_config(client.clone(), config)
                    .await
                    .map(Connection::Standalone)
            }
            Endpoint::Cluster(client) => {
                client.get_async_connection().await.map(Connection::Cluster)
            }
        }
    }
}

/// The connections to one endpoint, keyed by runtime.
pub(crate) struct Connections {
    endpoint: Endpoint,
    timeouts: Timeouts,
    slots: Mutex<Vec<Slot>>,
}

struct Slot {
    runtime: Id,
    connection: Connection,
    /// Upgradable while the runtime lives: a task parked on that runtime holds the `Arc`, and a
    /// runtime drops its tasks when it shuts down.
    runtime_alive: Weak<()>,
}

impl Connections {
    pub(crate) fn new(endpoint: Endpoint, timeouts: Timeouts) -> Arc<Self> {
        Arc::new(Connections {
            endpoint,
            timeouts,
            slots: Mutex::new(Vec::new()),
        })
    }

    /// The connection for the current runtime, connecting first if this runtime has none.
    ///
    /// Must be called from within a tokio runtime (every caller is an `async fn` of ours).
    pub(crate) async fn get(self: &Arc<Self>) -> RedisResult<Connection> {
        let runtime = Handle::current();
        let id = runtime.id();
        if let Some(connection) = self.find(id) {
            return Ok(connection);
        }
        // Connect in a task of its own: a caller that gives up (a Redlock per-node timeout, a
        // cancelled acquire) does not abort the connection, which is then there for the next
        // call instead of being started over and over.
        let connections = Arc::clone(self);
        match runtime
            .spawn(async move { connections.connect(id).await })
            .await
        {
            Ok(result) => result,
            Err(join_error) => Err(redis::RedisError::from(std::io::Error::other(format!(
                "the connecting task ended: {join_error}"
            )))),
        }
    }

    async fn connect(&self, id: Id) -> RedisResult<Connection> {
        let connection = self.endpoint.connect(self.timeouts).await?;
        let alive = Arc::new(());
        let runtime_alive = Arc::downgrade(&alive);
        // Parks forever; dropped (with `alive`) when the runtime shuts down.
        drop(tokio::spawn(async move {
            let _alive = alive;
            std::future::pending::<()>().await;
        }));
        let mut slots = self.lock();
        slots.retain(|slot| slot.runtime_alive.strong_count() > 0);
        // Another task of this runtime may have connected meanwhile: keep one connection.
        if let Some(slot) = slots.iter().find(|slot| slot.runtime == id) {
            return Ok(slot.connection.clone());
        }
        slots.push(Slot {
            runtime: id,
            connection: connection.clone(),
            runtime_alive,
        });
        Ok(connection)
    }

    fn find(&self, id: Id) -> Option<Connection> {
        self.lock()
            .iter()
            .find(|slot| slot.runtime == id)
            .map(|slot| slot.connection.clone())
    }

    /// Whether this is a Redis Cluster, whose connection sends a command again after a dropped
    /// connection or a response timeout.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.endpoint, Endpoint::Cluster(_))
    }

    /// How long after a command first ran a cluster connection may still send it again: each of
    /// its sends may wait out a connect, a response and a retry pause.
    pub(crate) fn resend_window(&self) -> Duration {
        (self.timeouts.connect
            + self.timeouts.response
            + Duration::from_millis(CLUSTER_MAX_RETRY_WAIT_MS))
            * (CLUSTER_RETRIES + 1)
    }

    /// How many runtimes currently have a connection (for leak tests).
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
