//! [`FaultProxy`]: a TCP proxy between the code under test and a Redis server that can add
//! latency, hold traffic, cut connections, refuse new ones and lose a reply.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the proxy waits to connect to the upstream before dropping the client connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `Drop` waits for the proxy's threads to finish before leaving them detached.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a stalled forwarding thread re-checks its state even without a notification.
const STALL_POLL: Duration = Duration::from_millis(50);

/// A TCP proxy on a free port of 127.0.0.1 that forwards every connection to
/// `127.0.0.1:<upstream_port>` and injects network faults on demand.
///
/// Each accepted connection gets its own upstream connection and two threads, one per
/// direction, with blocking IO. Faults apply to all connections, current and future:
/// - [`set_delay`](Self::set_delay): one-way latency added to every chunk in each direction;
/// - [`stall`](Self::stall) / [`unstall`](Self::unstall): hold all bytes (nothing is dropped);
/// - [`cut`](Self::cut): close every current connection on both sides;
/// - [`set_refuse`](Self::set_refuse): accept new connections and close them at once;
/// - [`lose_next_reply`](Self::lose_next_reply): let one request through, then drop its reply
///   and cut its connection (the command ran, the client never hears so).
///
/// Dropping the proxy closes every connection and stops all its threads.
pub struct FaultProxy {
    port: u16,
    upstream_port: u16,
    shared: Arc<Shared>,
    listener: Option<JoinHandle<()>>,
}

/// State shared by the proxy handle, the accept thread and the forwarding threads.
struct Shared {
    upstream: SocketAddr,
    control: Mutex<Control>,
    /// Signalled whenever `control` changes or connections are closed, so that forwarding
    /// threads waiting out a stall or a delay react at once.
    changed: Condvar,
    refuse: AtomicBool,
    shutdown: AtomicBool,
    /// How many replies [`FaultProxy::lose_next_reply`] has dropped.
    replies_lost: AtomicUsize,
    connections: Mutex<Vec<Arc<Connection>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next_id: AtomicU64,
    /// Every connection the listener accepted, refused ones included.
    accepted: AtomicU64,
}

struct Control {
    delay: Duration,
    stalled: bool,
    /// Armed by [`FaultProxy::lose_next_reply`]: the next request from a client whose bytes
    /// contain this (any request when empty) has its reply dropped.
    lose_reply_to: Option<Vec<u8>>,
}

/// One proxied connection: the client's socket and the upstream socket.
struct Connection {
    id: u64,
    client: TcpStream,
    upstream: TcpStream,
    closed: AtomicBool,
    /// How many of the two directions have finished; the second one unregisters the connection.
    finished: AtomicUsize,
    /// Set when a request that is to lose its reply went through: the next bytes from the
    /// upstream are dropped and the connection is cut.
    losing_reply: AtomicBool,
}

/// Which way a forwarding thread copies bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Requests, from the client to the upstream.
    ToUpstream,
    /// Replies, from the upstream to the client.
    ToClient,
}

/// Bytes read from one side, to be written to the other once `due`.
struct Chunk {
    due: Instant,
    data: Vec<u8>,
}

impl FaultProxy {
    /// Starts a proxy on a free port of 127.0.0.1 forwarding to `127.0.0.1:upstream_port`.
    ///
    /// The upstream need not be up yet: a connection is made to it for each client, and the
    /// client is disconnected if that fails (as with a dead server).
    pub fn start(upstream_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("FaultProxy: cannot bind 127.0.0.1:0: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("FaultProxy: cannot read the listener address: {e}"))
            .port();
        let shared = Arc::new(Shared {
            upstream: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            control: Mutex::new(Control {
                delay: Duration::ZERO,
                stalled: false,
                lose_reply_to: None,
            }),
            changed: Condvar::new(),
            refuse: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            replies_lost: AtomicUsize::new(0),
            connections: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
        });
        let accept_shared = Arc::clone(&shared);
        let listener = std::thread::Builder::new()
            .name(format!("fault-proxy-{port}-accept"))
            .spawn(move || accept_loop(&listener, &accept_shared))
            .unwrap_or_else(|e| panic!("FaultProxy: cannot spawn the accept thread: {e}"));
        Self {
            port,
            upstream_port,
            shared,
            listener: Some(listener),
        }
    }

    /// The port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port it forwards to.
    pub fn upstream_port(&self) -> u16 {
        self.upstream_port
    }

    /// The Redis URL that goes through the proxy, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Delays every chunk forwarded in either direction by `delay` from the moment it was read:
    /// one-way latency, so a request/response round trip takes at least `2 * delay` longer.
    ///
    /// Chunks are queued with their due time rather than forwarded one sleep at a time, so
    /// pipelined traffic is not serialised: throughput stays that of the link. Applies to bytes
    /// read after the call; `Duration::ZERO` turns it off.
    pub fn set_delay(&self, delay: Duration) {
        self.shared.control().delay = delay;
        self.shared.changed.notify_all();
    }

    /// Stops forwarding in both directions: connections stay open and bytes are held (in the
    /// proxy or in the kernel's socket buffers), not dropped, until [`unstall`](Self::unstall).
    /// To the code under test this looks like a network partition or a frozen server.
    pub fn stall(&self) {
        self.shared.control().stalled = true;
        self.shared.changed.notify_all();
    }

    /// Resumes forwarding after [`stall`](Self::stall); held bytes are delivered in order.
    pub fn unstall(&self) {
        self.shared.control().stalled = false;
        self.shared.changed.notify_all();
    }

    /// Closes every current connection at once, towards the client and towards the upstream,
    /// as a broken network path would. New connections are accepted as usual.
    pub fn cut(&self) {
        self.shared.close_all();
    }

    /// While `true`, new connections are accepted and closed immediately, before any byte is
    /// forwarded (like a server that is up but rejects clients). Existing connections go on.
    pub fn set_refuse(&self, refuse: bool) {
        self.shared.refuse.store(refuse, Ordering::SeqCst);
    }

    /// Loses the reply to the next request: the next bytes any client sends are forwarded to
    /// the upstream as usual, so the server runs the command; the first bytes of its reply are
    /// dropped and that connection is closed on both sides instead. To the client this is a
    /// connection that dropped after its command ran and before the reply arrived — what makes
    /// a client that re-sends on a dropped connection (a redis-rs cluster connection) run the
    /// command twice. One-shot: later requests and other connections are untouched.
    ///
    /// "A request" is one read from the client's socket: meant for a client with one command
    /// in flight on that connection (a reply to an earlier request still in flight there would
    /// be the one dropped). Use [`lose_next_reply_to`](Self::lose_next_reply_to) when other
    /// traffic (a handshake, another connection) may come first.
    pub fn lose_next_reply(&self) {
        self.lose_next_reply_to("");
    }

    /// [`lose_next_reply`](Self::lose_next_reply) for the next request whose bytes contain
    /// `needle` (a key name, say); requests without it pass untouched and leave the proxy armed.
    /// The needle must lie within one read of the client's socket, as it does in a small
    /// command.
    pub fn lose_next_reply_to(&self, needle: &str) {
        self.shared.control().lose_reply_to = Some(needle.as_bytes().to_vec());
    }

    /// How many replies [`lose_next_reply`](Self::lose_next_reply) has dropped so far.
    pub fn replies_lost(&self) -> usize {
        self.shared.replies_lost.load(Ordering::SeqCst)
    }

    /// Whether a [`lose_next_reply`](Self::lose_next_reply) is still waiting for its request.
    pub fn is_armed(&self) -> bool {
        self.shared.control().lose_reply_to.is_some()
    }

    /// How many proxied connections are open now.
    pub fn connection_count(&self) -> usize {
        self.shared.connections().len()
    }

    /// How many connections the proxy has accepted since it started, whatever became of them
    /// (refused, cut, closed): how many times the code under test opened a socket to it.
    pub fn accepted_count(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let deadline = Instant::now() + JOIN_TIMEOUT;
        self.shared.shutdown.store(true, Ordering::SeqCst);
        // The accept thread blocks in accept(): a connection of our own wakes it up to see
        // the shutdown flag. If that connect fails, the bounded join below reports it.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_secs(1),
        );
        // Join the accept thread first, so no connection is registered after close_all.
        if let Some(listener) = self.listener.take() {
            join_bounded(listener, deadline, "accept thread");
        }
        self.shared.close_all();
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for thread in threads {
            join_bounded(thread, deadline, "forwarding thread");
        }
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("port", &self.port)
            .field("upstream_port", &self.upstream_port)
            .field("connections", &self.connection_count())
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn control(&self) -> MutexGuard<'_, Control> {
        lock(&self.control)
    }

    fn connections(&self) -> MutexGuard<'_, Vec<Arc<Connection>>> {
        lock(&self.connections)
    }

    fn close_all(&self) {
        let connections = std::mem::take(&mut *self.connections());
        for connection in connections {
            connection.close();
        }
        // Wake threads waiting out a stall or a delay so they notice the closed flag now.
        let _guard = self.control();
        self.changed.notify_all();
    }

    fn unregister(&self, id: u64) {
        self.connections().retain(|c| c.id != id);
    }

    /// Called with each request read from `connection`'s client, before it is forwarded (so
    /// before its reply can exist): if a lost reply is armed and `request` matches, disarms and
    /// marks the connection to lose the reply.
    fn mark_if_losing(&self, connection: &Connection, request: &[u8]) {
        let mut control = self.control();
        let matches = control.lose_reply_to.as_deref().is_some_and(|needle| {
            needle.is_empty() || request.windows(needle.len()).any(|window| window == needle)
        });
        if matches {
            control.lose_reply_to = None;
            connection.losing_reply.store(true, Ordering::SeqCst);
        }
    }
}

impl Connection {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Shuts both sockets down: the peers see EOF at once, and blocked reads and writes in the
    /// forwarding threads return, which is what makes those threads exit.
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.upstream.shutdown(Shutdown::Both);
    }
}

/// Locks a mutex, ignoring poisoning: a panicking test must not stop the proxy shutting down.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits up to `deadline` for `thread` to finish; past it, leaves it detached and says so
/// (panicking in `Drop` could abort the test process).
fn join_bounded(thread: JoinHandle<()>, deadline: Instant, what: &str) {
    while !thread.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    if thread.is_finished() {
        let _ = thread.join();
    } else {
        eprintln!("FaultProxy: a {what} did not stop within {JOIN_TIMEOUT:?} of drop; detached");
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for incoming in listener.incoming() {
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = incoming else {
            // E.g. out of file descriptors: back off instead of spinning.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        if shared.refuse.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(upstream) = TcpStream::connect_timeout(&shared.upstream, UPSTREAM_CONNECT_TIMEOUT)
        else {
            // The upstream is down: the client sees its connection closed, as it would
            // through a real network path to a dead server.
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        if let Err(e) = start_connection(shared, client, upstream) {
            eprintln!("FaultProxy: cannot set up a proxied connection: {e}");
        }
    }
}

/// Registers a connection and starts its two forwarding threads.
fn start_connection(
    shared: &Arc<Shared>,
    client: TcpStream,
    upstream: TcpStream,
) -> std::io::Result<()> {
    // Small requests and replies must not wait for Nagle's algorithm: that would add latency
    // the test did not ask for.
    client.set_nodelay(true)?;
    upstream.set_nodelay(true)?;
    let connection = Arc::new(Connection {
        id: shared.next_id.fetch_add(1, Ordering::SeqCst),
        client: client.try_clone()?,
        upstream: upstream.try_clone()?,
        closed: AtomicBool::new(false),
        finished: AtomicUsize::new(0),
        losing_reply: AtomicBool::new(false),
    });
    let directions = [
        (
            Direction::ToUpstream,
            client.try_clone()?,
            upstream.try_clone()?,
        ),
        (Direction::ToClient, upstream, client),
    ];
    shared.connections().push(Arc::clone(&connection));

    let mut threads = lock(&shared.threads);
    // Forget threads that are done, so a long test with many reconnects does not pile them up.
    threads.retain(|t| !t.is_finished());
    for (direction, src, dst) in directions {
        let thread_shared = Arc::clone(shared);
        let thread_connection = Arc::clone(&connection);
        let name = match direction {
            Direction::ToUpstream => "c2u",
            Direction::ToClient => "u2c",
        };
        let spawned = std::thread::Builder::new()
            .name(format!("fault-proxy-{}-{name}", connection.id))
            .spawn(move || {
                forward(&thread_shared, &thread_connection, direction, src, dst);
                finish_direction(&thread_shared, &thread_connection);
            });
        match spawned {
            Ok(thread) => threads.push(thread),
            Err(e) => {
                connection.close();
                shared.unregister(connection.id);
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Called by each forwarding thread as it exits; the last one closes and unregisters.
fn finish_direction(shared: &Shared, connection: &Connection) {
    if connection.finished.fetch_add(1, Ordering::SeqCst) + 1 == 2 {
        connection.close();
        shared.unregister(connection.id);
    }
}

/// Copies bytes from `src` to `dst`, holding each chunk until its due time and while stalled.
///
/// Reads and writes happen in one thread: the read timeout is set to the time left until the
/// oldest queued chunk is due, so the thread wakes up to write it even when no new bytes come.
/// On EOF from `src` the queue is drained and only the write half of `dst` is shut down, so a
/// reply still in flight in the other direction is delivered.
///
/// A reply to be lost ([`FaultProxy::lose_next_reply`]) is dropped as soon as its first bytes
/// are read, and the connection closed: nothing of it reaches the client.
fn forward(
    shared: &Shared,
    connection: &Connection,
    direction: Direction,
    mut src: TcpStream,
    mut dst: TcpStream,
) {
    let mut queue: VecDeque<Chunk> = VecDeque::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut eof = false;
    loop {
        if connection.is_closed() || shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let stalled = shared.control().stalled;
        if !stalled {
            let now = Instant::now();
            while let Some(chunk) = queue.front() {
                if chunk.due > now {
                    break;
                }
                if dst.write_all(&chunk.data).is_err() {
                    connection.close();
                    return;
                }
                queue.pop_front();
            }
        }
        if eof && queue.is_empty() {
            let _ = dst.shutdown(Shutdown::Write);
            return;
        }
        if stalled || eof {
            // Not reading: wait for unstall, close, or the next chunk's due time. The state is
            // re-checked under the lock so a notification sent just before cannot be missed.
            let control = shared.control();
            let wait = if control.stalled {
                STALL_POLL
            } else if eof {
                queue.front().map_or(Duration::ZERO, |chunk| {
                    chunk.due.saturating_duration_since(Instant::now())
                })
            } else {
                Duration::ZERO // unstalled meanwhile: go back to reading
            };
            if !wait.is_zero() && !connection.is_closed() {
                let _ = shared.changed.wait_timeout(control, wait);
            }
            continue;
        }
        // Block until new bytes arrive, or until the oldest queued chunk is due.
        let timeout = queue.front().map(|chunk| {
            chunk
                .due
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        });
        if src.set_read_timeout(timeout).is_err() {
            connection.close();
            return;
        }
        match src.read(&mut buf) {
            Ok(0) => eof = true,
            Ok(n) => {
                match direction {
                    Direction::ToUpstream => shared.mark_if_losing(connection, &buf[..n]),
                    Direction::ToClient if connection.losing_reply.load(Ordering::SeqCst) => {
                        shared.replies_lost.fetch_add(1, Ordering::SeqCst);
                        connection.close();
                        return;
                    }
                    Direction::ToClient => {}
                }
                let delay = shared.control().delay;
                queue.push_back(Chunk {
                    due: Instant::now() + delay,
                    data: buf[..n].to_vec(),
                });
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => {
                connection.close();
                return;
            }
        }
    }
}

/// Unstalls its proxy when dropped, so a failing test does not leave its sockets frozen.
pub struct Unstall<'a>(pub &'a FaultProxy);

impl Drop for Unstall<'_> {
    fn drop(&mut self) {
        self.0.unstall();
    }
}
