//! The fleet workload's floors: no lock, but a ring. The turn goes round every task of the
//! fleet, each task handing it to the next with a message on that task's own channel, as a lock
//! that hands over tells its next holder. What a floor costs between two holders is the least
//! such a lock can cost on the machine.
//!
//! The order is the tasks' places in the ring: the first task of every process, then the second
//! of every process, and so on, so that (with two processes or more) every turn moves to another
//! process, as a fleet-wide line moves its lock. The turn is passed with a plain `PUBLISH`, or by
//! [`HAND_OFF`], a script that first does the Redis work of an atomic hand-off; with
//! [`Pass::ScriptThenJoin`] every task also asks for each of its turns with the one command with
//! which a lock's waiter takes its place at the back of the line. And it travels through
//! redis-rs's connections, as distlock's messages do ([`Transport::Client`]), or through sockets
//! that the tasks read and write themselves ([`Transport::Raw`]), without the background task
//! that each redis-rs connection puts between a task and its socket.

use futures_util::StreamExt;
use redis::aio::{MultiplexedConnection, PubSubStream};
use tokio::sync::Mutex;

use super::{PREFIX, RESPONSE_TIMEOUT};

/// Which of its task's sections a worker is at: a ring needs it to know whose turn is next and
/// who starts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Turn {
    /// The task's number in its process.
    pub task: usize,
    /// The section's number in its task.
    pub n: usize,
}

/// What a ring's tasks send to Redis for a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Pass {
    /// A plain `PUBLISH` to the next task.
    Publish,
    /// [`HAND_OFF`].
    Script,
    /// [`HAND_OFF`], and every turn asked for with one `RPUSHX` of a line entry (see
    /// [`Ring::wait`]): the Redis work of a lock whose holder releases with an atomic hand-off
    /// and whose waiters, the releaser asking again among them, go to the back of the line — in
    /// a steady fleet, the least a lock that serves first come, first served across processes
    /// sends per section.
    ScriptThenJoin,
}

/// The scripted floor's hand-off: the Redis work of handing a lock over in one script — read
/// the lock, take the next waiter off its line (empty but for [`Pass::ScriptThenJoin`]'s
/// entries, which nobody reads: the ring knows the next holder), give the lock to the next
/// holder, tell it — and no more. `KEYS[1]` the lock, `KEYS[2]` its line, `ARGV[1]` the value
/// to give the lock, `ARGV[2]` the next holder's channel.
const HAND_OFF: &str = r"
local held = redis.call('GET', KEYS[1])
local waiter = redis.call('LPOP', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', 30000)
return redis.call('PUBLISH', ARGV[2], ARGV[1])
";

/// The channel on which the task at `position` in the ring is given the turn of the ring whose
/// lock name is `name`.
fn turn_channel(name: &str, position: usize) -> String {
    format!("{PREFIX}{name}:turn:{position}")
}

/// The lock's line, which the hand-off pops and the joins append to.
fn line_key(name: &str) -> String {
    format!("{PREFIX}{name}:line")
}

/// A line entry of the form distlock's waiters append (token, lease deadline in Redis ms, ttl
/// in ms, fencing flag, grant channel), for the joining ring. Written out here rather than
/// taken from lock-runtime: the floors use none of distlock's code, so that they measure Redis
/// and the client alone.
fn line_entry(token: &str, channel: &str) -> String {
    format!(
        "{token} 1800000000000 {} 0 {channel}",
        super::TTL.as_millis()
    )
}

/// Where task `task` of process `process` of `processes` stands in the ring: the first task of
/// every process, then the second of every process, and so on.
fn position(task: usize, process: usize, processes: usize) -> usize {
    task * processes + process
}

/// How long the line that process 0 of a joining ring creates lives: past any run, so that it
/// is never missing under the joins, and gone after.
const LINE_EXPIRY_MS: u64 = 600_000;

/// One process's part of a ring.
pub(super) struct Ring {
    transport: Transport,
    /// This process's number, and how many processes the ring has.
    process: usize,
    processes: usize,
    /// Tasks in the whole ring.
    tasks: usize,
    pass: Pass,
    /// [`HAND_OFF`], for the scripted floors; `None`: a plain `PUBLISH`.
    hand_off: Option<redis::Script>,
}

/// How a process's tasks send and receive the turn.
enum Transport {
    /// A redis-rs multiplexed connection to send, a redis-rs subscription per task to receive.
    Client {
        publisher: MultiplexedConnection,
        /// By task number in the process: each task waits on its own, as a waiter of a lock
        /// waits for its own message.
        turns: Vec<Mutex<PubSubStream>>,
    },
    /// The same, on [`RawConnection`]s.
    Raw {
        publisher: Mutex<RawConnection>,
        turns: Vec<Mutex<RawConnection>>,
    },
}

impl Ring {
    /// Connects process `process` of `processes`, each of `tasks` tasks, to the ring of lock
    /// `name`: every task subscribed to its channel, the script loaded; for a joining ring,
    /// process 0 also creates the line (see [`Ring::wait`]).
    pub(super) async fn connect(
        url: &str,
        name: &str,
        (process, processes, tasks): (usize, usize, usize),
        pass: Pass,
        raw: bool,
    ) -> Ring {
        let position = |task: usize| position(task, process, processes);
        let scripted = pass != Pass::Publish;
        let hand_off = scripted.then(|| redis::Script::new(HAND_OFF));
        let transport = if raw {
            let mut turns = Vec::with_capacity(tasks);
            for task in 0..tasks {
                let mut connection = RawConnection::open(url).await;
                let channel = turn_channel(name, position(task));
                connection.query(redis::cmd("SUBSCRIBE").arg(channel)).await;
                turns.push(Mutex::new(connection));
            }
            let mut publisher = RawConnection::open(url).await;
            if scripted {
                publisher
                    .query(redis::cmd("SCRIPT").arg("LOAD").arg(HAND_OFF))
                    .await;
            }
            Transport::Raw {
                publisher: Mutex::new(publisher),
                turns,
            }
        } else {
            let client = redis::Client::open(url).expect("bad Redis URL");
            let mut turns = Vec::with_capacity(tasks);
            for task in 0..tasks {
                let mut pubsub = client
                    .get_async_pubsub()
                    .await
                    .expect("fleet worker: cannot connect to Redis");
                pubsub
                    .subscribe(turn_channel(name, position(task)))
                    .await
                    .expect("fleet worker: SUBSCRIBE failed");
                turns.push(Mutex::new(pubsub.into_on_message()));
            }
            let config =
                redis::AsyncConnectionConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
            let mut publisher = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .expect("fleet worker: cannot connect to Redis");
            if let Some(script) = &hand_off {
                script
                    .load_async(&mut publisher)
                    .await
                    .expect("fleet worker: SCRIPT LOAD failed");
            }
            Transport::Client { publisher, turns }
        };
        let ring = Ring {
            transport,
            process,
            processes,
            tasks: processes * tasks,
            pass,
            hand_off,
        };
        if pass == Pass::ScriptThenJoin && process == 0 {
            // One entry, never popped before a join has added another: every turn is asked for
            // before it is passed on, so the line never empties under the joins.
            ring.transport
                .query(
                    redis::cmd("RPUSH")
                        .arg(line_key(name))
                        .arg(line_entry("start", &turn_channel(name, 0))),
                )
                .await;
            ring.transport
                .query(
                    redis::cmd("PEXPIRE")
                        .arg(line_key(name))
                        .arg(LINE_EXPIRY_MS),
                )
                .await;
        }
        ring
    }

    /// Where `task` of this process stands in the ring.
    fn position(&self, task: usize) -> usize {
        position(task, self.process, self.processes)
    }

    /// One message on the publishing connection (the subscriptions are open already), on a
    /// channel of `name`'s that nobody listens to.
    pub(super) async fn warm_up(&self, name: &str) {
        self.transport
            .query(redis::cmd("PUBLISH").arg(name).arg("warm-up"))
            .await;
    }

    /// Returns when it is `turn`'s task's turn. The ring starts with the first task of the
    /// first process holding it.
    ///
    /// A joining ring's task first asks for the turn, as a lock's waiter takes its place: it
    /// appends an entry of a line's form (token, lease deadline, ttl, fencing flag, its channel)
    /// with `RPUSHX` to the line, which exists (process 0 made it) and which the hand-offs pop,
    /// and waits for the reply. The ring knows its order, so nobody reads what is popped: the
    /// join costs its command, its round trip and its place in the acquisition, and changes
    /// nothing else.
    pub(super) async fn wait(&self, name: &str, token: &str, turn: Turn) {
        if self.pass == Pass::ScriptThenJoin {
            let entry = line_entry(token, &turn_channel(name, self.position(turn.task)));
            let length = self
                .transport
                .query(redis::cmd("RPUSHX").arg(line_key(name)).arg(entry))
                .await;
            // A join into no line would cost Redis less than a lock's: the floor would lie low.
            assert!(
                matches!(length, redis::Value::Int(length) if length > 0),
                "fleet worker: the ring's line is gone (RPUSHX answered {length:?})"
            );
        }
        if self.position(turn.task) == 0 && turn.n == 0 {
            return;
        }
        match &self.transport {
            Transport::Client { turns, .. } => {
                turns[turn.task]
                    .lock()
                    .await
                    .next()
                    .await
                    .expect("fleet worker: the turn subscription closed");
            }
            Transport::Raw { turns, .. } => {
                turns[turn.task].lock().await.next_value().await;
            }
        }
    }

    /// Hands the turn from `turn`'s task to the next, telling it `token`. The last turn of a
    /// run goes to a task that is done, which nobody hears.
    pub(super) async fn pass(&self, name: &str, token: &str, turn: Turn) {
        let next = (self.position(turn.task) + 1) % self.tasks;
        let channel = turn_channel(name, next);
        let mut cmd;
        match &self.hand_off {
            Some(script) => {
                cmd = redis::cmd("EVALSHA");
                cmd.arg(script.get_hash())
                    .arg(2)
                    .arg(format!("{PREFIX}{name}"))
                    .arg(line_key(name))
                    .arg(token)
                    .arg(&channel);
            }
            None => {
                cmd = redis::cmd("PUBLISH");
                cmd.arg(&channel).arg(token);
            }
        }
        self.transport.query(&cmd).await;
    }
}

impl Transport {
    /// Sends `cmd` on the publishing connection and waits for its reply.
    async fn query(&self, cmd: &redis::Cmd) -> redis::Value {
        match self {
            Transport::Client { publisher, .. } => cmd
                .query_async(&mut publisher.clone())
                .await
                .expect("fleet worker: Redis refused a command of the ring"),
            Transport::Raw { publisher, .. } => publisher.lock().await.query(cmd).await,
        }
    }
}

/// A connection of the raw floors: a socket that the task using it reads and writes itself,
/// with redis-rs's command packing and reply parser, and none of its connection tasks.
///
/// Replies are read whole: at most one reply or message is on its way to it at any time (a
/// command's reply is awaited before the next command; the ring sends a task one turn at a
/// time), so whatever arrives is one value, parsed once it is complete.
struct RawConnection {
    socket: tokio::net::TcpStream,
    received: Vec<u8>,
}

impl RawConnection {
    async fn open(url: &str) -> Self {
        use redis::IntoConnectionInfo;
        let info = url.into_connection_info().expect("bad Redis URL");
        let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
            panic!("fleet worker: the raw floors speak plain TCP only, not {url}");
        };
        RawConnection {
            socket: tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .expect("fleet worker: cannot connect to Redis"),
            received: Vec::with_capacity(256),
        }
    }

    /// The next value Redis sends: a reply, or a message on a subscribed channel.
    async fn next_value(&mut self) -> redis::Value {
        use tokio::io::AsyncReadExt;
        loop {
            if !self.received.is_empty() {
                // An error here is an incomplete value: read on.
                if let Ok(value) = redis::parse_redis_value(&self.received) {
                    self.received.clear();
                    return value;
                }
            }
            assert!(
                self.received.len() < 64 * 1024,
                "fleet worker: Redis sent what the raw floor cannot parse"
            );
            let read = self
                .socket
                .read_buf(&mut self.received)
                .await
                .expect("fleet worker: cannot read from Redis");
            assert!(read > 0, "fleet worker: Redis closed the connection");
        }
    }

    /// Sends `cmd` and reads its reply.
    async fn query(&mut self, cmd: &redis::Cmd) -> redis::Value {
        use tokio::io::AsyncWriteExt;
        self.socket
            .write_all(&cmd.get_packed_command())
            .await
            .expect("fleet worker: cannot write to Redis");
        match self.next_value().await {
            redis::Value::ServerError(error) => panic!("fleet worker: Redis answered {error:?}"),
            value => value,
        }
    }
}
