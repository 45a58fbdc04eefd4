//! Wake-ups on release: waiters sleep until the holder's release, not until a timer.
//!
//! Each lock manager has one pub/sub connection per Redis deployment it locks on (one for a
//! standalone server or a cluster — whose nodes forward every publish to each other — and one
//! per master for Redlock), each driven by one task on the background runtime. A task subscribes
//! to a lock's wake-up channel while some task of this process waits for the lock, and wakes that
//! lock's local waiters when a release publishes on it. Subscribe and unsubscribe requests go
//! through one ordered queue per connection, so a quick unsubscribe/subscribe pair can never
//! leave a channel unsubscribed that someone still watches. The queue holds at most an
//! unsubscribe and a subscribe per channel (see [`Requests`]): a connection that cannot keep up
//! (a master that accepts connections and never answers) falls behind by the channels in use,
//! not by every wait since.
//!
//! Wake-ups are an optimisation, never a requirement: a waiter also retries when the holder's
//! ttl runs out, so a lost message (reconnect, expiry instead of release) costs at most that.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::{Client, RedisResult};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{oneshot, Notify};

use crate::connection::Timeouts;
use crate::retry::Backoff;

/// The wake-up subscriptions of one lock manager.
pub(crate) struct WakeHub {
    /// One request queue per pub/sub connection.
    connections: Arc<Queues>,
    channels: Arc<Channels>,
    timeouts: Timeouts,
    /// How many connections must confirm a subscription before a waiter relies on it: enough to
    /// meet every majority of Redlock nodes that could hold the lock; 1 otherwise.
    confirmations: usize,
}

/// Channel name → the local watchers of that channel.
type Channels = Mutex<HashMap<String, Channel>>;

struct Channel {
    watchers: usize,
    notify: Arc<Notify>,
}

enum Request {
    Subscribe {
        channel: String,
        /// Everyone to tell how it went.
        done: Vec<oneshot::Sender<RedisResult<()>>>,
    },
    Unsubscribe {
        channel: String,
    },
}

impl Request {
    fn channel(&self) -> &str {
        match self {
            Request::Subscribe { channel, .. } | Request::Unsubscribe { channel } => channel,
        }
    }
}

/// The (un)subscribe requests of one pub/sub connection, served in order by its task.
///
/// Coalesced as they come in, so that it never holds more than an unsubscribe followed by a
/// subscribe for any channel: a subscribe for a channel that already waits to be subscribed
/// joins that request, and an unsubscribe takes back a subscribe that has not been sent yet
/// (the server never heard of it, so there is nothing to undo). A connection whose server
/// does not answer serves one request per connect timeout: queued one by one, its requests
/// would grow by two for every wait on a key, for as long as the server stays silent.
struct Requests {
    pending: Mutex<Pending>,
    /// Signalled when a request arrives or the queue closes.
    ready: Notify,
}

struct Pending {
    queue: VecDeque<Request>,
    /// No request will come any more: the hub and every `Watch` are gone.
    closed: bool,
}

impl Requests {
    fn new() -> Self {
        Requests {
            pending: Mutex::new(Pending {
                queue: VecDeque::new(),
                closed: false,
            }),
            ready: Notify::new(),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks to subscribe `channel`; `done` hears how it went.
    fn subscribe(&self, channel: &str, done: oneshot::Sender<RedisResult<()>>) {
        let mut pending = self.pending();
        match pending
            .queue
            .iter_mut()
            .rev()
            .find(|request| request.channel() == channel)
        {
            Some(Request::Subscribe { done: waiting, .. }) => waiting.push(done),
            _ => pending.queue.push_back(Request::Subscribe {
                channel: channel.to_owned(),
                done: vec![done],
            }),
        }
        drop(pending);
        self.ready.notify_one();
    }

    /// Asks to unsubscribe `channel`.
    fn unsubscribe(&self, channel: &str) {
        let mut pending = self.pending();
        let last = pending
            .queue
            .iter()
            .rposition(|request| request.channel() == channel);
        match last {
            // Not sent yet: taking it back (with its `done`, whose watchers are gone) is enough.
            Some(index) if matches!(pending.queue[index], Request::Subscribe { .. }) => {
                pending.queue.remove(index);
            }
            // Already on its way out.
            Some(_) => {}
            None => {
                pending.queue.push_back(Request::Unsubscribe {
                    channel: channel.to_owned(),
                });
                drop(pending);
                self.ready.notify_one();
            }
        }
    }

    /// The next request, once there is one; `None` once the queue is closed and empty.
    async fn next(&self) -> Option<Request> {
        loop {
            {
                let mut pending = self.pending();
                if let Some(request) = pending.queue.pop_front() {
                    return Some(request);
                }
                if pending.closed {
                    return None;
                }
            }
            // `notify_one` keeps a permit when nobody waits, so a request queued between the
            // check above and this wait is not missed.
            self.ready.notified().await;
        }
    }

    fn len(&self) -> usize {
        self.pending().queue.len()
    }

    fn close(&self) {
        self.pending().closed = true;
        self.ready.notify_one();
    }
}

/// The request queues of a hub's connections, shared by the hub and its watches; the last of
/// them to go closes the queues, which ends the connections' tasks.
struct Queues(Box<[Arc<Requests>]>);

impl Drop for Queues {
    fn drop(&mut self) {
        for requests in &self.0 {
            requests.close();
        }
    }
}

/// A task's interest in one channel; the channel stays subscribed while any `Watch` of it lives.
pub(crate) struct Watch {
    connections: Arc<Queues>,
    channels: Arc<Channels>,
    channel: String,
    notify: Arc<Notify>,
}

impl WakeHub {
    /// A hub with one pub/sub connection per entry of `sources`; each entry lists the servers
    /// that connection may use, tried in turn (the seed nodes of a cluster, or one server).
    /// `confirmations` as on [`WakeHub`].
    pub(crate) fn new(sources: Vec<Vec<Client>>, timeouts: Timeouts, confirmations: usize) -> Self {
        let channels = Arc::new(Mutex::new(HashMap::new()));
        let connections = sources
            .into_iter()
            .map(|servers| {
                let requests = Arc::new(Requests::new());
                crate::background::spawn(watch_releases(
                    servers,
                    timeouts,
                    Arc::clone(&requests),
                    Arc::clone(&channels),
                ));
                requests
            })
            .collect();
        WakeHub {
            connections: Arc::new(Queues(connections)),
            channels,
            timeouts,
            confirmations,
        }
    }

    /// Watches `channel`: returns once enough connections confirmed the subscription, so that
    /// any release published after this returns wakes the watcher.
    pub(crate) async fn watch(&self, channel: &str) -> RedisResult<Watch> {
        let (notify, first) = {
            let mut channels = channel_map(&self.channels);
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    watchers: 0,
                    notify: Arc::new(Notify::new()),
                });
            entry.watchers += 1;
            (Arc::clone(&entry.notify), entry.watchers == 1)
        };
        // Built before any await, so a cancelled `watch` still unsubscribes.
        let watch = Watch {
            connections: Arc::clone(&self.connections),
            channels: Arc::clone(&self.channels),
            channel: channel.to_owned(),
            notify,
        };
        if first {
            let mut confirmations: FuturesUnordered<_> = self
                .connections
                .0
                .iter()
                .map(|connection| {
                    let (done, confirmed) = oneshot::channel();
                    connection.subscribe(channel, done);
                    async move { confirmed.await.map_err(|_| hub_gone())? }
                })
                .collect();
            let limit = self.timeouts.connect + self.timeouts.response;
            let (mut confirmed, mut last_error) = (0, None);
            let counting = async {
                while let Some(result) = confirmations.next().await {
                    match result {
                        Ok(()) => confirmed += 1,
                        Err(error) => last_error = Some(error),
                    }
                    if confirmed >= self.confirmations {
                        break;
                    }
                }
            };
            if tokio::time::timeout(limit, counting).await.is_err() && last_error.is_none() {
                last_error = Some(subscribe_timed_out(limit));
            }
            if confirmed < self.confirmations {
                return Err(last_error.unwrap_or_else(hub_gone));
            }
        }
        Ok(watch)
    }

    /// How many channels are watched now (for leak tests).
    pub(crate) fn watched_channels(&self) -> usize {
        channel_map(&self.channels).len()
    }

    /// How many (un)subscribe requests wait to be sent, over all connections (for leak tests).
    pub(crate) fn pending_requests(&self) -> usize {
        self.connections
            .0
            .iter()
            .map(|requests| requests.len())
            .sum()
    }
}

impl Watch {
    /// The watched channel (the lock's waiters key, whose name it shares).
    pub(crate) fn channel(&self) -> Arc<str> {
        Arc::from(self.channel.as_str())
    }

    /// Completes at the next release published on this channel. Registered before it returns,
    /// so a release that lands before the first poll (while an attempt is in flight) still
    /// completes it.
    pub(crate) fn next_release(&self) -> Pin<Box<OwnedNotified>> {
        let mut release = Box::pin(Arc::clone(&self.notify).notified_owned());
        release.as_mut().enable();
        release
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut channels = channel_map(&self.channels);
        let Some(entry) = channels.get_mut(&self.channel) else {
            return;
        };
        entry.watchers -= 1;
        if entry.watchers == 0 {
            channels.remove(&self.channel);
            // Queued under the map's lock: ordered before any later subscribe to the channel.
            for connection in &self.connections.0 {
                connection.unsubscribe(&self.channel);
            }
        }
    }
}

fn channel_map(channels: &Channels) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
    channels.lock().unwrap_or_else(PoisonError::into_inner)
}

fn hub_gone() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "distlock wake-up task has stopped",
    ))
}

fn subscribe_timed_out(limit: Duration) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("SUBSCRIBE was not confirmed within {limit:?}"),
    ))
}

/// The hub's task: owns the pub/sub connection, serves (un)subscribe requests in order, and
/// dispatches published releases to the local watchers. Ends when the manager is dropped.
async fn watch_releases(
    servers: Vec<Client>,
    timeouts: Timeouts,
    requests: Arc<Requests>,
    channels: Arc<Channels>,
) {
    let mut servers = Servers {
        candidates: servers,
        next: 0,
    };
    let mut connection: Option<(PubSubSink, PubSubStream)> = None;
    // Set while the connection is lost and someone still watches: when to reconnect.
    let mut reconnect: Option<(tokio::time::Instant, Duration)> = None;
    loop {
        let message = async {
            match connection.as_mut() {
                Some((_, stream)) => stream.next().await,
                None => std::future::pending().await,
            }
        };
        let reconnect_due = async {
            match reconnect {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            request = requests.next() => {
                let Some(request) = request else { return };
                serve(request, &mut servers, timeouts, &mut connection, &channels).await;
                if connection.is_none() && reconnect.is_none() && !channel_map(&channels).is_empty() {
                    let first = RECONNECT_BACKOFF.first;
                    reconnect = Some((tokio::time::Instant::now() + first, first * 2));
                }
            }
            message = message => match message {
                Some(message) => {
                    let channel = message.get_channel_name();
                    if let Some(entry) = channel_map(&channels).get(channel) {
                        entry.notify.notify_waiters();
                    }
                }
                None => {
                    tracing::debug!(target: "distlock", "wake-up connection lost; reconnecting");
                    connection = None;
                    reconnect = Some((tokio::time::Instant::now(), RECONNECT_BACKOFF.first));
                    // Releases published meanwhile are missed: let the waiters look again now.
                    wake_all(&channels);
                }
            },
            () = reconnect_due => {
                let backoff = reconnect.map_or(RECONNECT_BACKOFF.first, |(_, backoff)| backoff);
                reconnect = None;
                if connection.is_none() && !channel_map(&channels).is_empty() {
                    match connect(&mut servers, timeouts, &channels).await {
                        Ok(connected) => {
                            connection = Some(connected);
                            wake_all(&channels);
                        }
                        Err(error) => {
                            tracing::debug!(target: "distlock", %error, "wake-up reconnect failed; waiters use ttl timers meanwhile");
                            let next = (backoff * 2).min(RECONNECT_BACKOFF.max);
                            reconnect = Some((tokio::time::Instant::now() + backoff, next));
                        }
                    }
                }
            }
        }
    }
}

/// Delay before reconnecting the wake-up connection: first, then doubling up to the last.
const RECONNECT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));

fn wake_all(channels: &Channels) {
    for entry in channel_map(channels).values() {
        entry.notify.notify_waiters();
    }
}

async fn serve(
    request: Request,
    servers: &mut Servers,
    timeouts: Timeouts,
    connection: &mut Option<(PubSubSink, PubSubStream)>,
    channels: &Channels,
) {
    match request {
        Request::Subscribe { channel, done } => {
            let result = subscribe(servers, timeouts, connection, channels, &channel).await;
            if result.is_err() {
                *connection = None;
            }
            for done in done {
                let _ = done.send(result.clone());
            }
        }
        Request::Unsubscribe { channel } => {
            if let Some((sink, _)) = connection.as_mut() {
                let unsubscribe =
                    tokio::time::timeout(timeouts.response, sink.unsubscribe(&channel));
                if !matches!(unsubscribe.await, Ok(Ok(()))) {
                    *connection = None;
                }
            }
        }
    }
}

/// Subscribes to `channel`, connecting first (and resubscribing every watched channel) when
/// there is no connection.
async fn subscribe(
    servers: &mut Servers,
    timeouts: Timeouts,
    connection: &mut Option<(PubSubSink, PubSubStream)>,
    channels: &Channels,
    channel: &str,
) -> RedisResult<()> {
    if connection.is_none() {
        *connection = Some(connect(servers, timeouts, channels).await?);
    }
    let (sink, _) = connection.as_mut().expect("connected above");
    tokio::time::timeout(timeouts.response, sink.subscribe(channel))
        .await
        .map_err(|_| subscribe_timed_out(timeouts.response))?
}

/// The servers one pub/sub connection may use; a failed connect moves on to the next.
struct Servers {
    candidates: Vec<Client>,
    next: usize,
}

/// A new pub/sub connection, subscribed to every channel watched now.
async fn connect(
    servers: &mut Servers,
    timeouts: Timeouts,
    channels: &Channels,
) -> RedisResult<(PubSubSink, PubSubStream)> {
    let client = &servers.candidates[servers.next % servers.candidates.len()];
    servers.next = servers.next.wrapping_add(1);
    let pubsub = tokio::time::timeout(timeouts.connect, client.get_async_pubsub())
        .await
        .map_err(|_| connect_timed_out(timeouts.connect))??;
    let (mut sink, stream) = pubsub.split();
    let watched: Vec<String> = channel_map(channels).keys().cloned().collect();
    if !watched.is_empty() {
        tokio::time::timeout(timeouts.response, sink.subscribe(&watched))
            .await
            .map_err(|_| subscribe_timed_out(timeouts.response))??;
    }
    Ok((sink, stream))
}

fn connect_timed_out(limit: Duration) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("could not connect for wake-ups within {limit:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    fn subscribe(requests: &Requests, channel: &str) -> oneshot::Receiver<RedisResult<()>> {
        let (done, confirmed) = oneshot::channel();
        requests.subscribe(channel, done);
        confirmed
    }

    /// The queued requests, oldest first, as (`'S'` or `'U'`, channel, how many wait on it).
    fn drain(requests: &Requests) -> Vec<(char, String, usize)> {
        std::iter::from_fn(|| {
            if requests.len() == 0 {
                return None;
            }
            requests.next().now_or_never().flatten()
        })
        .map(|request| match request {
            Request::Subscribe { channel, done } => ('S', channel, done.len()),
            Request::Unsubscribe { channel } => ('U', channel, 0),
        })
        .collect()
    }

    #[test]
    fn requests_coalesce_to_at_most_an_unsubscribe_and_a_subscribe_per_channel() {
        let requests = Requests::new();
        // A subscribe taken back before it was sent leaves nothing to send.
        let taken_back = subscribe(&requests, "a");
        requests.unsubscribe("a");
        assert_eq!(requests.len(), 0);
        assert!(taken_back.now_or_never().unwrap().is_err());

        // Many waits come and go on many channels while nothing is served.
        let mut confirmations = Vec::new();
        for _ in 0..1000 {
            for channel in ["a", "b", "c"] {
                confirmations.push(subscribe(&requests, channel));
                requests.unsubscribe(channel);
            }
        }
        confirmations.push(subscribe(&requests, "b"));
        confirmations.push(subscribe(&requests, "b"));
        assert_eq!(drain(&requests), [('S', "b".to_owned(), 2)]);

        // Once sent, a subscribe is undone by an unsubscribe, and a new one follows it.
        requests.unsubscribe("b");
        requests.unsubscribe("b");
        confirmations.push(subscribe(&requests, "b"));
        assert_eq!(
            drain(&requests),
            [('U', "b".to_owned(), 0), ('S', "b".to_owned(), 1)]
        );

        requests.close();
        assert!(requests.next().now_or_never().unwrap().is_none());
    }
}
