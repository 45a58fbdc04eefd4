//! The delivery task of a [`GrantHub`](super::GrantHub): one pub/sub connection per server, subscribed to the
//! manager's channel, handing each message to the waiter it names; reconnecting, and moving to
//! the new master after a Sentinel failover.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::RedisError;
use tokio::time::Instant;

use super::{HubCore, Servers, LINGER, RECONNECT_BACKOFF};
use crate::options::Timeouts;
use crate::redis::connection::ConnectError;
use crate::redis::sentinel::NoMaster;

/// Starts the task of the hub's connection `index` ([`deliver_grants`]): on the caller's
/// runtime when it is a multi-thread one, whose worker threads are always there to read a
/// message; else on the background runtime.
///
/// Where the waiters run matters for the gap between holders: a message read on the waiters'
/// own runtime wakes the waiting task on the thread that read it, whereas one read on the
/// background runtime's thread must wake a thread of theirs as well, a second thread woken per
/// hand-off. (Not on a current-thread runtime: it runs only while something blocks on it, and
/// messages to the waiters of every other runtime would wait for that.) Should that runtime shut
/// down, the task is dropped with it, and starts again on the background runtime, which is
/// always there: its waiters are told to look again meanwhile, as after a lost connection.
pub(super) fn spawn_delivery(
    shared: std::sync::Weak<HubCore>,
    index: usize,
    servers: Servers,
    timeouts: Timeouts,
) {
    let relocate = Relocate {
        shared: shared.clone(),
        index,
        servers: Some(servers.clone()),
        timeouts,
    };
    let task = async move {
        deliver_grants(shared, index, servers, timeouts).await;
        relocate.done();
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            drop(runtime.spawn(task));
        }
        _ => crate::support::background::spawn(task),
    }
}

/// Armed while a hub's connection task runs outside the background runtime: if the task is
/// dropped before it is done (its runtime shut down), the connection went with it, and the
/// task starts again on the background runtime.
pub(super) struct Relocate {
    shared: std::sync::Weak<HubCore>,
    index: usize,
    servers: Option<Servers>,
    timeouts: Timeouts,
}

impl Relocate {
    /// The task ended on its own (its hub is gone): nothing to restart.
    fn done(mut self) {
        self.servers = None;
    }
}

impl Drop for Relocate {
    fn drop(&mut self) {
        let Some(servers) = self.servers.take() else {
            return;
        };
        let Some(hub) = self.shared.upgrade() else {
            return;
        };
        // Messages published since the connection went are lost: look again.
        hub.state().subscribed[self.index] = false;
        hub.wake_all();
        drop(hub);
        crate::support::background::spawn(deliver_grants(
            self.shared.clone(),
            self.index,
            servers,
            self.timeouts,
        ));
    }
}

/// The task of the hub's connection `index`: keeps the channel subscribed there while it is
/// wanted, and delivers messages. Ends when the hub is dropped.
pub(super) async fn deliver_grants(
    shared: std::sync::Weak<HubCore>,
    index: usize,
    servers: Servers,
    timeouts: Timeouts,
) {
    let mut next_server = 0usize;
    let mut connection: Option<(PubSubSink, PubSubStream)> = None;
    let mut backoff = RECONNECT_BACKOFF;
    let mut reconnect_at: Option<Instant> = None;
    // Sentinel: the master switches counted when the connection was made.
    let mut connected_at_switch = 0u64;
    let Some(channel) = shared.upgrade().map(|hub| Arc::clone(&hub.channel)) else {
        return;
    };
    loop {
        let Some(hub) = shared.upgrade() else {
            // The manager is gone: leave the channel before the connection closes.
            if let Some((sink, _)) = connection.as_mut() {
                let _ = tokio::time::timeout(timeouts.response, sink.unsubscribe(&*channel)).await;
            }
            return;
        };
        let (wanted, idle_since) = {
            let state = hub.state();
            (
                !state.pending.is_empty() || !state.waiters.is_empty(),
                state.idle_since,
            )
        };
        // Registered before the count is read, so that a switch after the read still wakes us.
        let mut switched = match &servers {
            Servers::Sentinel(sentinels) => Some(Box::pin(sentinels.switched.notified())),
            Servers::Fixed(_) => None,
        };
        if let Some(switched) = switched.as_mut() {
            switched.as_mut().enable();
        }
        // The sentinels switched the master: the releases publish on the new one now.
        if let Servers::Sentinel(sentinels) = &servers {
            if connection.is_some() && sentinels.switches() != connected_at_switch {
                connection = None;
                hub.state().subscribed[index] = false;
                reconnect_at = None;
                hub.wake_all();
            }
        }
        let subscribed = hub.state().subscribed[index];
        // Subscribe when someone waits or asks, and the connection is not in its backoff.
        if wanted && !subscribed && reconnect_at.is_none_or(|at| Instant::now() >= at) {
            if let Servers::Sentinel(sentinels) = &servers {
                if connection.is_none() {
                    connected_at_switch = sentinels.switches();
                }
            }
            let result = subscribe(
                &servers,
                &mut next_server,
                timeouts,
                &mut connection,
                &hub.channel,
            )
            .await;
            if let Err(error) = &result {
                tracing::debug!(target: "distlock", %error, "grant channel subscription failed; waiters look at Redis on their own meanwhile");
                connection = None;
                reconnect_at = Some(Instant::now() + backoff.next_pause());
            } else {
                reconnect_at = None;
                backoff.reset();
            }
            hub.confirm(index, &result);
            continue;
        }
        // Unsubscribe once nobody has waited for the linger.
        let unsubscribe_at = match idle_since {
            Some(since) if subscribed && !wanted => Some(since + LINGER),
            _ => None,
        };
        if unsubscribe_at.is_some_and(|at| Instant::now() >= at) {
            // Not subscribed from before the `UNSUBSCRIBE` is sent, and only while nobody has
            // registered since the linger was read: a waiter that registers from now on waits
            // for the subscription that follows, instead of naming a channel that this
            // `UNSUBSCRIBE` is about to leave (a release would take it for dead).
            {
                let mut state = hub.state();
                if !state.pending.is_empty() || !state.waiters.is_empty() {
                    continue;
                }
                state.subscribed[index] = false;
            }
            if let Some((sink, _)) = connection.as_mut() {
                let unsubscribed =
                    tokio::time::timeout(timeouts.response, sink.unsubscribe(&*hub.channel)).await;
                if !matches!(unsubscribed, Ok(Ok(()))) {
                    connection = None;
                }
            }
            continue;
        }
        let woken = Arc::clone(&hub);
        let task_notified = woken.tasks[index].notified();
        let wake_at = unsubscribe_at.or(reconnect_at.filter(|_| wanted));
        drop(hub);
        let message = async {
            match connection.as_mut() {
                Some((_, stream)) => stream.next().await,
                None => std::future::pending().await,
            }
        };
        let timer = async {
            match wake_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let switched = async {
            match switched {
                Some(switched) => switched.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = task_notified => {}
            () = timer => {}
            () = switched => {}
            message = message => match message {
                Some(message) => {
                    // Read in place: the payload is already a buffer of its own.
                    if let Ok(text) = std::str::from_utf8(message.get_payload_bytes()) {
                        woken.deliver(text);
                    }
                }
                None => {
                    tracing::debug!(target: "distlock", "grant channel connection lost; reconnecting");
                    connection = None;
                    woken.state().subscribed[index] = false;
                    // The first pause after a lost connection, not a doubled one: the
                    // subscription before it had succeeded.
                    reconnect_at = Some(Instant::now() + backoff.next_pause());
                    backoff.reset();
                    woken.wake_all();
                }
            },
        }
    }
}

/// Subscribes to `channel`, connecting first when there is no connection.
pub(super) async fn subscribe(
    servers: &Servers,
    next_server: &mut usize,
    timeouts: Timeouts,
    connection: &mut Option<(PubSubSink, PubSubStream)>,
    channel: &str,
) -> Result<(), SubscribeError> {
    if connection.is_none() {
        let client = match servers {
            Servers::Fixed(clients) => {
                let client = clients[*next_server % clients.len()].clone();
                *next_server = next_server.wrapping_add(1);
                client
            }
            // Bounded by the lookup itself.
            Servers::Sentinel(sentinels) => sentinels.master().await?,
        };
        let pubsub = tokio::time::timeout(timeouts.connect, client.get_async_pubsub())
            .await
            .map_err(|_| SubscribeError::TimedOut {
                what: "connecting for hand-off messages",
                limit: timeouts.connect,
            })??;
        *connection = Some(pubsub.split());
    }
    let (sink, _) = connection.as_mut().expect("connected above");
    Ok(
        tokio::time::timeout(timeouts.response, sink.subscribe(channel))
            .await
            .map_err(|_| SubscribeError::TimedOut {
                what: "the confirmation of SUBSCRIBE",
                limit: timeouts.response,
            })??,
    )
}

/// Why the hand-off channel is not subscribed: waiters then look at Redis on their own.
#[derive(Debug, Clone)]
pub(crate) enum SubscribeError {
    /// Connecting or subscribing failed, as redis-rs reported it.
    Redis(RedisError),
    /// The sentinels named no master to subscribe on in time.
    NoMaster(NoMaster),
    /// `what` did not finish within `limit`.
    TimedOut { what: &'static str, limit: Duration },
    /// The hub's delivery task has stopped: its manager is gone.
    Stopped,
}

impl From<RedisError> for SubscribeError {
    fn from(error: RedisError) -> Self {
        SubscribeError::Redis(error)
    }
}

impl From<ConnectError> for SubscribeError {
    fn from(error: ConnectError) -> Self {
        match error {
            ConnectError::Redis(error) => SubscribeError::Redis(error),
            ConnectError::NoMaster(no_master) => SubscribeError::NoMaster(no_master),
        }
    }
}

impl std::fmt::Display for SubscribeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubscribeError::Redis(error) => error.fmt(f),
            SubscribeError::NoMaster(no_master) => no_master.fmt(f),
            SubscribeError::TimedOut { what, limit } => {
                write!(f, "{what} did not finish within {limit:?}")
            }
            SubscribeError::Stopped => f.write_str("the hand-off task has stopped"),
        }
    }
}
