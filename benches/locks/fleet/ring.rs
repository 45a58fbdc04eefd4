//! The fleet workload's floors: no lock, but a ring. The turn goes round every task of the
//! fleet in the order of their numbers, each task handing it to the next with a message on that
//! task's own channel, as a lock that hands over tells its next holder. What a floor costs
//! between two holders is the least such a lock can cost on the machine.
//!
//! The turn is passed with a plain `PUBLISH`, or by [`HAND_OFF`], a script that first does the
//! Redis work of an atomic hand-off, then (see [`Pass::ScriptThenJoin`]) followed by the one
//! command with which a lock's releaser that asks again takes its place at the back of the
//! line. And it travels through redis-rs's connections, as
//! distlock's messages do ([`Transport::Client`]), or through sockets that the tasks read and
//! write themselves ([`Transport::Raw`]), without the background task that each redis-rs
//! connection puts between a task and its socket.

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
    /// Whether it is the task's last section: after it the task asks for no other turn.
    pub last: bool,
}

/// What a ring's task sends to Redis when its turn ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Pass {
    /// A plain `PUBLISH` to the next task.
    Publish,
    /// [`HAND_OFF`].
    Script,
    /// [`HAND_OFF`], then, unless it was the task's last turn, one `RPUSHX` of a line entry
    /// (see [`Ring::pass`]): the Redis work of a lock whose holder releases with an atomic
    /// hand-off and asks again, going to the back of the line — in a steady fleet, the least a
    /// lock that serves first come, first served across processes sends per section.
    ScriptThenJoin,
}

/// The scripted floor's hand-off: the Redis work of handing a lock over in one script — read
/// the lock, take the next waiter off its line (which stays empty here: the ring knows the next
/// holder), give the lock to the next holder, tell it — and no more. `KEYS[1]` the lock,
/// `KEYS[2]` its line, `ARGV[1]` the value to give the lock, `ARGV[2]` the next holder's channel.
const HAND_OFF: &str = r"
local held = redis.call('GET', KEYS[1])
local waiter = redis.call('LPOP', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', 30000)
return redis.call('PUBLISH', ARGV[2], ARGV[1])
";

/// The channel on which task `task` (numbered over the whole fleet) is given the turn of the
/// ring whose lock name is `name`.
fn turn_channel(name: &str, task: usize) -> String {
    format!("{PREFIX}{name}:turn:{task}")
}

/// One process's part of a ring.
pub(super) struct Ring {
    transport: Transport,
    /// Tasks in the whole ring.
    tasks: usize,
    /// The fleet-wide number of this process's first task.
    first_task: usize,
    /// [`HAND_OFF`], for the scripted floors; `None`: a plain `PUBLISH`.
    hand_off: Option<redis::Script>,
    /// Whether a task asks again after passing the turn ([`Pass::ScriptThenJoin`]).
    joins: bool,
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
    /// `name`: every task subscribed to its channel, the script loaded.
    pub(super) async fn connect(
        url: &str,
        name: &str,
        (process, processes, tasks): (usize, usize, usize),
        pass: Pass,
        raw: bool,
    ) -> Ring {
        let first_task = process * tasks;
        let scripted = pass != Pass::Publish;
        let hand_off = scripted.then(|| redis::Script::new(HAND_OFF));
        let transport = if raw {
            let mut turns = Vec::with_capacity(tasks);
            for task in 0..tasks {
                let mut connection = RawConnection::open(url).await;
                let channel = turn_channel(name, first_task + task);
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
                    .subscribe(turn_channel(name, first_task + task))
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
        Ring {
            transport,
            tasks: processes * tasks,
            first_task,
            hand_off,
            joins: pass == Pass::ScriptThenJoin,
        }
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
    pub(super) async fn wait(&self, turn: Turn) {
        if self.first_task + turn.task == 0 && turn.n == 0 {
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
    ///
    /// A joining ring's task then asks again, but after its last turn: it appends an entry of a
    /// lock's line's length (token, lease deadline, ttl, fencing flag, its channel) with
    /// `RPUSHX`, to the line that the hand-off's `LPOP` reads. The ring knows its order, so the
    /// line is never created (`RPUSHX` writes only into a list that exists) and the hand-off
    /// finds it empty, as in the other scripted floors: the join costs its command and its round
    /// trip, and changes nothing else.
    pub(super) async fn pass(&self, name: &str, token: &str, turn: Turn) {
        let next = (self.first_task + turn.task + 1) % self.tasks;
        let channel = turn_channel(name, next);
        let mut cmd;
        match &self.hand_off {
            Some(script) => {
                cmd = redis::cmd("EVALSHA");
                cmd.arg(script.get_hash())
                    .arg(2)
                    .arg(format!("{PREFIX}{name}"))
                    .arg(format!("{PREFIX}{name}:line"))
                    .arg(token)
                    .arg(&channel);
            }
            None => {
                cmd = redis::cmd("PUBLISH");
                cmd.arg(&channel).arg(token);
            }
        }
        self.transport.query(&cmd).await;
        if self.joins && !turn.last {
            let own_channel = turn_channel(name, self.first_task + turn.task);
            let entry = format!("{token} 0 {} 0 {own_channel}", super::TTL.as_millis());
            self.transport
                .query(
                    redis::cmd("RPUSHX")
                        .arg(format!("{PREFIX}{name}:line"))
                        .arg(entry),
                )
                .await;
        }
    }
}

impl Transport {
    /// Sends `cmd` on the publishing connection and waits for its reply.
    async fn query(&self, cmd: &redis::Cmd) {
        match self {
            Transport::Client { publisher, .. } => {
                let _: redis::Value = cmd
                    .query_async(&mut publisher.clone())
                    .await
                    .expect("fleet worker: Redis refused a command of the ring");
            }
            Transport::Raw { publisher, .. } => {
                publisher.lock().await.query(cmd).await;
            }
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
