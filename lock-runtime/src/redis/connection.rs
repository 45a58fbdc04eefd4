//! Connections to one Redis endpoint — a standalone server or a whole cluster — one per tokio
//! runtime that uses them.
//!
//! A redis-rs connection is driven by a task on the runtime that created it and dies with that
//! runtime. A global lock manager outlives runtimes — every `#[tokio::test]` has its own — so
//! each runtime gets its own multiplexed connection, created on first use there. Keeping the
//! connection's driver on the caller's runtime also keeps every round trip free of cross-thread
//! hand-offs. Connections of runtimes that have shut down are dropped when the next one is added.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use crate::redis::eviction::Checked;
use crate::redis::sentinel::{NoMaster, Sentinels};
use tokio::runtime::{Handle, Id};
use tokio::sync::oneshot;

/// Connection and response timeouts of one endpoint's connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

/// How many times a cluster connection sends a command again (after a dropped connection, a
/// response timeout, a redirection), and its longest pause before doing so, in milliseconds.
const CLUSTER_RETRIES: u32 = 3;
const CLUSTER_MAX_RETRY_WAIT_MS: u64 = 200;

/// How many lent connections a runtime keeps for the next `WAIT` once given back; more may be
/// lent at once (each `WAIT` in flight has one), the surplus is closed when given back.
const SPARES_KEPT: usize = 8;

/// Why no connection to an endpoint could be had: what redis-rs reported, or the sentinels of a
/// Sentinel service named no master in time. In neither case was a command of ours sent.
#[derive(Debug, Clone)]
pub(crate) enum ConnectError {
    /// The connect failed, as redis-rs reported it.
    Redis(RedisError),
    /// The sentinels, or the master they named, did not answer in time.
    NoMaster(NoMaster),
}

impl From<RedisError> for ConnectError {
    fn from(error: RedisError) -> Self {
        ConnectError::Redis(error)
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Redis(error) => error.fmt(f),
            ConnectError::NoMaster(no_master) => no_master.fmt(f),
        }
    }
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
    /// The master of a Sentinel service, asked of the sentinels at every connect.
    Sentinel(Arc<Sentinels>),
}

/// A connection to an [`Endpoint`]; cheap to clone, multiplexed.
#[derive(Clone)]
pub(crate) enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(MasterConnection),
}

/// A connection to the master a Sentinel named, which notes when a reply suggests that the
/// server is no longer the master, so that the next caller connects anew.
#[derive(Clone)]
pub(crate) struct MasterConnection {
    connection: ConnectionManager,
    stale: Arc<AtomicBool>,
    sentinels: Arc<Sentinels>,
    /// The sentinels' count of master switches when it was made.
    switches: u64,
    /// The master's address (`host:port`), for the eviction check.
    address: Arc<str>,
}

impl MasterConnection {
    fn note(&self, error: &redis::RedisError) {
        if crate::redis::sentinel::master_may_have_moved(error) {
            self.stale.store(true, Ordering::Release);
        }
    }

    fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire) || self.sentinels.switches() != self.switches
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Standalone(connection) => connection.req_packed_command(cmd),
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
            Connection::Sentinel(master) => {
                let noted = master.clone();
                let reply = master.connection.req_packed_command(cmd);
                Box::pin(async move {
                    let reply = reply.await;
                    if let Err(error) = &reply {
                        noted.note(error);
                    }
                    reply
                })
            }
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
            Connection::Sentinel(master) => {
                let noted = master.clone();
                let replies = master
                    .connection
                    .req_packed_commands(pipeline, offset, count);
                Box::pin(async move {
                    let replies = replies.await;
                    if let Err(error) = &replies {
                        noted.note(error);
                    }
                    replies
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Standalone(connection) => connection.get_db(),
            Connection::Cluster(connection) => connection.get_db(),
            Connection::Sentinel(master) => master.connection.get_db(),
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

    async fn connect(&self, timeouts: Timeouts) -> Result<Connection, ConnectError> {
        match self {
            Endpoint::Standalone(client) => Ok(Connection::Standalone(
                Self::manager(client.clone(), timeouts).await?,
            )),
            Endpoint::Sentinel(sentinels) => {
                // Counted before asking: a switch announced during the lookup makes the
                // connection stale rather than go unnoticed.
                let switches = sentinels.switches();
                let master = sentinels.master().await?;
                let address = Arc::from(master.get_connection_info().addr().to_string());
                Ok(Connection::Sentinel(MasterConnection {
                    connection: Self::manager(master, timeouts).await?,
                    stale: Arc::new(AtomicBool::new(false)),
                    sentinels: Arc::clone(sentinels),
                    switches,
                    address,
                }))
            }
            Endpoint::Cluster(client) => {
                Ok(Connection::Cluster(client.get_async_connection().await?))
            }
        }
    }

    /// A reconnecting connection to one server.
    async fn manager(client: redis::Client, timeouts: Timeouts) -> RedisResult<ConnectionManager> {
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
        ConnectionManager::new_with_config(client, config).await
    }
}

/// The connections to one endpoint, keyed by runtime.
pub(crate) struct Connections {
    endpoint: Endpoint,
    timeouts: Timeouts,
    slots: Mutex<Vec<RuntimeConnection>>,
    /// The servers whose eviction policy was checked.
    checked: Checked,
    /// Set by the endpoint's first connect: only that one is checked before its caller gets
    /// it. A flag of its own, not "nothing checked yet", because a check that failed (a lost
    /// reply, a cluster whose slots could not be read) leaves `checked` empty, and a later
    /// connect, whose caller may be an acquire, must still not wait for its check.
    first_connect_started: AtomicBool,
}

/// What one runtime has of the endpoint: a connection, or the one connect in flight.
struct RuntimeConnection {
    runtime: Id,
    state: State,
    /// When this runtime last took its connection for a request.
    last_used: std::time::Instant,
    /// Connections given back after a `WAIT` (see [`Connections::lend`]), for the next one.
    spares: Vec<Connection>,
}

enum State {
    Connected {
        connection: Connection,
        /// Upgradable while the runtime lives: a task parked on that runtime holds the `Arc`,
        /// and a runtime drops its tasks when it shuts down.
        runtime_alive: Weak<()>,
    },
    /// Every caller of the runtime awaits this one attempt; it takes itself out of the map
    /// when it ends (and when its runtime drops it), so the next caller after a failure
    /// starts a new one.
    Connecting(SharedConnect),
}

/// A connect in flight, which every caller of one runtime awaits.
type SharedConnect = Shared<BoxFuture<'static, Result<Connection, ConnectError>>>;

impl Connections {
    pub(crate) fn new(endpoint: Endpoint, timeouts: Timeouts) -> Arc<Self> {
        Arc::new(Connections {
            endpoint,
            timeouts,
            slots: Mutex::new(Vec::new()),
            checked: Checked::default(),
            first_connect_started: AtomicBool::new(false),
        })
    }

    /// The connection for the current runtime, connecting first if this runtime has none.
    ///
    /// At most one connect per runtime is in flight: callers that find one join it and share
    /// its result. Otherwise every operation on an endpoint that accepts connections but does
    /// not answer (a stalled network, a frozen server) would open a socket of its own, at the
    /// rate of operations, each held until its connect timeout.
    ///
    /// Must be called from within a tokio runtime (every caller is an `async fn` of ours).
    pub(crate) async fn get(self: &Arc<Self>) -> Result<Connection, ConnectError> {
        let runtime = Handle::current();
        let id = runtime.id();
        let (attempt, start) = {
            let mut slots = self.slots();
            // A Sentinel master that may have failed over: connect anew, asking the sentinels.
            if self.is_sentinel() {
                slots.retain(|slot| {
                    slot.runtime != id
                        || !matches!(&slot.state, State::Connected { connection: Connection::Sentinel(master), .. } if master.is_stale())
                });
            }
            match slots.iter_mut().find(|slot| slot.runtime == id) {
                Some(slot) => {
                    slot.last_used = std::time::Instant::now();
                    match &slot.state {
                        State::Connected { connection, .. } => return Ok(connection.clone()),
                        State::Connecting(attempt) => (attempt.clone(), None),
                    }
                }
                None => {
                    let (attempt, result) = self.connect_attempt();
                    slots.push(RuntimeConnection {
                        runtime: id,
                        state: State::Connecting(attempt.clone()),
                        last_used: std::time::Instant::now(),
                        spares: Vec::new(),
                    });
                    (attempt, Some(result))
                }
            }
        };
        if let Some(result) = start {
            // With the map unlocked: a runtime that is shutting down drops the task at once,
            // and its `EndAttempt` takes the lock.
            self.spawn_connect(&runtime, result);
        }
        attempt.await
    }

    /// The connect that a runtime's callers share, and the sender its result comes through.
    /// Should the connecting task end without a result (its runtime shut down under it), its
    /// callers connect on their own: what they get is then what the endpoint answers.
    ///
    /// Never inlined, nor is [`Connections::spawn_connect`]: the futures they make, needed only
    /// when a runtime has no connection yet, would otherwise take room in the stack frame of
    /// every request, which the uncontended cycle pays for in cache misses.
    #[inline(never)]
    fn connect_attempt(
        &self,
    ) -> (
        SharedConnect,
        oneshot::Sender<Result<Connection, ConnectError>>,
    ) {
        let (result, outcome) = oneshot::channel();
        let (endpoint, timeouts) = (self.endpoint.clone(), self.timeouts);
        let attempt = async move {
            match outcome.await {
                Ok(connected) => connected,
                Err(_) => endpoint.connect(timeouts).await,
            }
        }
        .boxed()
        .shared();
        (attempt, result)
    }

    /// Connects for the runtime `runtime` in a task of its own, and sends the result through
    /// `result`. In a task of its own, a caller that gives up (a Redlock per-node timeout, a
    /// cancelled acquire) does not abort the connect, whose connection is then there for the
    /// next call.
    #[inline(never)]
    fn spawn_connect(
        self: &Arc<Self>,
        runtime: &Handle,
        result: oneshot::Sender<Result<Connection, ConnectError>>,
    ) {
        let end = EndAttempt {
            connections: Arc::clone(self),
            runtime: runtime.id(),
            connected: false,
        };
        drop(runtime.spawn(async move {
            let connections = Arc::clone(&end.connections);
            let connected = connections.endpoint.connect(connections.timeouts).await;
            let connected = end.finish(connected);
            let mut checking = connected.as_ref().ok().cloned();
            // The endpoint's first connection — the one `connect` makes — is checked before
            // its caller gets it, so that the warning comes before `connect` returns and no
            // command of the check reaches Redis after it. Any later one (a new runtime, a
            // new Sentinel master after a failover) is checked after its caller has it:
            // that caller may be an acquire, which must not wait for the check.
            if !connections
                .first_connect_started
                .swap(true, Ordering::Relaxed)
            {
                if let Some(connection) = checking.take() {
                    connections.check_eviction(connection).await;
                }
            }
            let _ = result.send(connected);
            if let Some(connection) = checking {
                connections.check_eviction(connection).await;
            }
        }));
    }

    /// A connection of the current runtime's own for one request that blocks its connection
    /// (`WAIT`): a spare one given back before, or a new one. Redis answers a connection's
    /// commands in order, so a `WAIT` on the shared connection would hold up every command
    /// queued behind it, other `WAIT`s included, each for up to its whole timeout.
    ///
    /// Give it back with [`Lent::give_back`] once its reply came; one dropped instead (after an
    /// error, or by a caller that gave up while its `WAIT` may still block it) is closed.
    pub(crate) async fn lend(self: &Arc<Self>) -> Result<Lent, ConnectError> {
        let runtime = Handle::current().id();
        let spare = {
            let mut slots = self.slots();
            slots
                .iter_mut()
                .find(|slot| slot.runtime == runtime)
                .and_then(|slot| {
                    // A spare to a Sentinel master that may have failed over is closed.
                    std::iter::from_fn(|| slot.spares.pop()).find(
                        |spare| !matches!(spare, Connection::Sentinel(master) if master.is_stale()),
                    )
                })
        };
        let connection = match spare {
            Some(connection) => connection,
            // Made on the caller's runtime, whose task drives it: kept with that runtime's
            // `RuntimeConnection`.
            // Boxed: a connect (a Sentinel lookup, a connection manager) nests deep, and inlined
            // in every lock operation's future it would overflow the compiler's layout depth.
            None => self.endpoint.connect(self.timeouts).boxed().await?,
        };
        Ok(Lent {
            connection,
            connections: Arc::clone(self),
            runtime,
        })
    }

    /// Checks whether the server(s) behind `connection` may evict lock keys (see
    /// [`crate::redis::eviction`]): those not checked before by this endpoint.
    async fn check_eviction(&self, connection: Connection) {
        let timeout = self.timeouts.response;
        match (connection, &self.endpoint) {
            (Connection::Standalone(mut connection), Endpoint::Standalone(client)) => {
                let server = client.get_connection_info().addr().to_string();
                self.checked.server(&mut connection, &server, timeout).await;
            }
            (Connection::Sentinel(master), _) => {
                let mut connection = master.connection;
                self.checked
                    .server(&mut connection, &master.address, timeout)
                    .await;
            }
            (Connection::Cluster(mut connection), _) => {
                self.checked.cluster(&mut connection, timeout).await;
            }
            (Connection::Standalone(_), _) => {}
        }
    }

    /// How long ago the current runtime last took its connection for a request (zero when it
    /// has none yet: the next request connects anew).
    pub(crate) fn idle_for(&self) -> Duration {
        let Ok(runtime) = Handle::try_current() else {
            return Duration::ZERO;
        };
        let id = runtime.id();
        self.slots()
            .iter()
            .find(|slot| slot.runtime == id)
            .map_or(Duration::ZERO, |slot| slot.last_used.elapsed())
    }

    /// Whether this is a Redis Cluster, whose connection sends a command again after a dropped
    /// connection or a response timeout.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.endpoint, Endpoint::Cluster(_))
    }

    /// Whether this is the master of a Sentinel service, which may move.
    pub(crate) fn is_sentinel(&self) -> bool {
        matches!(self.endpoint, Endpoint::Sentinel(_))
    }

    /// How long after a command first ran a cluster connection may still send it again: each of
    /// its sends may wait out a connect, a response and a retry pause.
    pub(crate) fn resend_window(&self) -> Duration {
        (self.timeouts.connect
            + self.timeouts.response
            + Duration::from_millis(CLUSTER_MAX_RETRY_WAIT_MS))
            * (CLUSTER_RETRIES + 1)
    }

    /// How many runtimes currently have a connection or a connect in flight (for leak tests).
    #[cfg(any(test, feature = "resource-counts"))]
    pub(crate) fn len(&self) -> usize {
        self.slots().len()
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<RuntimeConnection>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection lent by [`Connections::lend`] for one request.
pub(crate) struct Lent {
    connection: Connection,
    connections: Arc<Connections>,
    runtime: Id,
}

impl Lent {
    /// The lent connection.
    pub(crate) fn connection(&mut self) -> &mut Connection {
        &mut self.connection
    }

    /// Keeps the connection for the next request that needs one of its own, when its runtime
    /// still has a connection (a runtime's `RuntimeConnection`, dropped with the runtime or for
    /// a stale Sentinel master, takes its spares with it) and keeps fewer than [`SPARES_KEPT`].
    pub(crate) fn give_back(self) {
        let mut slots = self.connections.slots();
        if let Some(slot) = slots.iter_mut().find(|slot| {
            slot.runtime == self.runtime && matches!(slot.state, State::Connected { .. })
        }) {
            if slot.spares.len() < SPARES_KEPT {
                slot.spares.push(self.connection);
            }
        }
    }
}

/// The end of a runtime's connect attempt: records the connection, or takes the attempt out
/// so that the next caller starts another; also when the runtime drops the attempt unfinished.
struct EndAttempt {
    connections: Arc<Connections>,
    runtime: Id,
    connected: bool,
}

impl EndAttempt {
    fn finish(
        mut self,
        result: Result<Connection, ConnectError>,
    ) -> Result<Connection, ConnectError> {
        let Ok(connection) = &result else {
            return result;
        };
        let alive = Arc::new(());
        let runtime_alive = Arc::downgrade(&alive);
        // Parks forever; dropped (with `alive`) when the runtime shuts down.
        drop(tokio::spawn(async move {
            std::future::pending::<()>().await;
            drop(alive);
        }));
        let mut slots = self.connections.slots();
        // Connections of runtimes that have shut down go now.
        slots.retain(|slot| match &slot.state {
            State::Connected { runtime_alive, .. } => runtime_alive.strong_count() > 0,
            State::Connecting(_) => true,
        });
        let state = State::Connected {
            connection: connection.clone(),
            runtime_alive,
        };
        match slots.iter_mut().find(|slot| slot.runtime == self.runtime) {
            Some(slot) => slot.state = state,
            None => slots.push(RuntimeConnection {
                runtime: self.runtime,
                state,
                last_used: std::time::Instant::now(),
                spares: Vec::new(),
            }),
        }
        self.connected = true;
        result
    }
}

impl Drop for EndAttempt {
    fn drop(&mut self) {
        if !self.connected {
            self.connections.slots().retain(|slot| {
                slot.runtime != self.runtime || !matches!(slot.state, State::Connecting(_))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failed_connect_is_not_kept_and_the_next_caller_tries_again() {
        // Nothing listens on port 1: every connect is refused at once.
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            response: Duration::from_secs(1),
        };
        let connections = Connections::new(Endpoint::Standalone(client), timeouts);
        let (first, second) = tokio::join!(connections.get(), connections.get());
        assert!(first.is_err() && second.is_err());
        assert_eq!(connections.len(), 0, "the failed attempt is gone");
        assert!(connections.get().await.is_err());
        assert_eq!(connections.len(), 0);
    }
}
