//! The contenders: distlock through the attribute and the manual API, rslock, the floor (the
//! same commands sent by hand), and what workload 2 runs each as.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{LockError, LockManager, LockOptions};
use redis::aio::MultiplexedConnection;

use crate::rslock::Rslock;
use crate::statistics::Section;
use crate::workloads::critical_section;
use crate::{FLOOR_RELEASE, PREFIX, RESPONSE_TIMEOUT, TTL};

/// Lock numbers for the whole run: every cycle of every contender takes a key of its own.
/// Starts at a value derived from the process id, so runs sharing a `REDIS_URL` never meet.
pub(crate) static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

pub(crate) fn next_keys(count: u64) -> u64 {
    NEXT_KEY.fetch_add(count, Ordering::Relaxed)
}

#[distlock::distributed_lock(key = "bench:{i}", ttl = 30)]
pub(crate) async fn attributed(i: u64) -> Result<(), LockError> {
    Ok(())
}

/// The raw-Redis floor: the commands of a lock cycle on a multiplexed connection, nothing else.
#[derive(Clone)]
pub(crate) struct Floor {
    pub(crate) connection: MultiplexedConnection,
    pub(crate) release: redis::Script,
    pub(crate) distlock_release: redis::Script,
}

impl Floor {
    pub(crate) async fn connect(client: &redis::Client) -> Self {
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("floor: cannot connect to Redis");
        Floor {
            connection,
            release: redis::Script::new(FLOOR_RELEASE),
            // distlock's release of a lock held alone, from lock-runtime itself: a diagnostic
            // floor that sends exactly distlock's commands with raw redis-rs, so the distance
            // from it to distlock is what distlock's client side costs.
            distlock_release: redis::Script::new(distlock_release_source()),
        }
    }

    /// A 36-character token (as long as distlock's UUIDs), unique in the run.
    pub(crate) fn token(n: u64) -> String {
        // The process id once, not per token: `std::process::id()` is a syscall each time, and
        // the floor must not pay for anything a lock does not need.
        static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        format!("floor-{:08x}-{n:021}", PID.get_or_init(std::process::id))
    }

    /// `SET key token NX PX 30000`, then the compare-and-delete script by SHA.
    pub(crate) async fn cycle(&mut self, n: u64) {
        self.cycle_releasing_with(n, false).await;
    }

    /// What distlock sends for one uncontended cycle: the floor's `SET NX PX`, then its own
    /// release script with its keys and arguments.
    pub(crate) async fn cycle_with_distlock_commands(&mut self, n: u64) {
        self.cycle_releasing_with(n, true).await;
    }

    /// `SET key token NX PX 30000` and `WAIT 1 500` in one round trip, then the
    /// compare-and-delete script by SHA: a lock that counts once one replica has it, by hand.
    pub(crate) async fn cycle_waiting_for_a_replica(&mut self, n: u64) {
        let key = format!("{PREFIX}bench:{n}");
        let token = Self::token(n);
        let (set, acknowledged): (redis::Value, i64) = redis::pipe()
            .cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .cmd("WAIT")
            .arg(1)
            .arg(500)
            .query_async(&mut self.connection)
            .await
            .expect("floor: SET + WAIT failed");
        assert_eq!(set, redis::Value::Okay, "floor: {key} was taken");
        assert_eq!(
            acknowledged, 1,
            "floor: the replica did not acknowledge {key}"
        );
        let deleted: i64 = self
            .release
            .key(&key)
            .arg(&token)
            .invoke_async(&mut self.connection)
            .await
            .expect("floor: release failed");
        assert_eq!(deleted, 1, "floor: {key} was not ours at release");
    }

    /// `SET NX PX`, then the floor's release script, or distlock's (which also names the lock's
    /// waiters key).
    pub(crate) async fn cycle_releasing_with(&mut self, n: u64, distlock_release: bool) {
        let key = format!("{PREFIX}bench:{n}");
        let token = Self::token(n);
        let set: redis::Value = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut self.connection)
            .await
            .expect("floor: SET failed");
        assert_eq!(set, redis::Value::Okay, "floor: {key} was taken");
        let release = if distlock_release {
            // What distlock sends on a standalone server for a lock taken by `SET NX`: the
            // lock key and its line (whose emptiness says nobody waits), and the token.
            let mut release = self.distlock_release.key(&key);
            release.key(format!("{{{key}}}:distlock:line")).arg(&token);
            release
        } else {
            let mut release = self.release.key(&key);
            release.arg(&token);
            release
        };
        let deleted: i64 = release
            .invoke_async(&mut self.connection)
            .await
            .expect("floor: release failed");
        assert_eq!(deleted, 1, "floor: {key} was not ours at release");
    }
}

/// The floor with distlock's work: the commands distlock sends for an uncontended cycle, and
/// what distlock's promises make it do besides on every cycle, each in the plainest and
/// cheapest form (as lock-runtime itself writes values and commands), with none of distlock's
/// structure (no acquisition machine, no deadlock watch, no guard, no meters, no logging). Not
/// a lock: it is never cancelled here, and would not clean up if it were. The distance from it
/// to distlock is what distlock's structure costs:
///
/// - a connection that reconnects by itself after Redis or the network drops it (redis-rs's
///   `ConnectionManager`, as distlock's), one per tokio runtime, looked up by the runtime's id
///   for each command, as a connection's driver task lives on the runtime that made it;
/// - a lock value that says who holds it (`inspect`, the CLI): a UUID, then the host, the
///   process and the time, the part that stays the same in a process made once, written into a
///   reused buffer;
/// - the in-process line: the key entered, with the time its turn lapses (the lock's ttl), in a
///   table of keys this process holds or wants (under a lock, hashed with foldhash as
///   lock-runtime does) and taken out at the release, so that a process's tasks wanting one
///   key wait in order instead of racing;
/// - the fork check: the process id, read at the acquisition and at the release, so that a
///   forked child never releases its parent's lock;
/// - cancel safety's bookkeeping: from the `SET` until the release has run, a value that would
///   have to clean up if the cycle were dropped holds the key and the value;
/// - the fleet line: distlock's release of a lock held alone, which also names the lock's line
///   (as `floor with distlock's commands`), by `EVALSHA` (loaded once, on `NOSCRIPT`).
#[derive(Clone)]
pub(crate) struct WorkFloor {
    connections: Arc<std::sync::Mutex<Vec<(tokio::runtime::Id, redis::aio::ConnectionManager)>>>,
    release: redis::Script,
    /// `;h=<host>;p=<pid>;t=`, as distlock writes it after the UUID (the host unescaped: a
    /// host name with `;` or `%` in it would make the value a little longer than distlock's).
    holder: Arc<str>,
    table: Arc<std::sync::Mutex<WorkFloorTable>>,
    value: String,
    line: String,
}

/// Keys this process holds or wants, each with the time its turn lapses.
type WorkFloorTable = std::collections::HashMap<Arc<str>, Instant, foldhash::fast::RandomState>;

/// Held from a cycle's `SET` until its release has run: a lock that cleans up after a
/// cancelled acquisition needs at least this much. The floor is never cancelled.
struct Armed {
    key: Arc<str>,
    value: Arc<str>,
    live: bool,
}

impl Drop for Armed {
    fn drop(&mut self) {
        assert!(
            !self.live,
            "floor with distlock's work: a cycle on {} ({}) was cancelled, and a floor does \
             not clean up",
            self.key, self.value
        );
    }
}

impl WorkFloor {
    pub(crate) async fn connect(client: &redis::Client) -> Self {
        let config =
            redis::aio::ConnectionManagerConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
        let connection = client
            .get_connection_manager_with_config(config)
            .await
            .expect("floor with distlock's work: cannot connect to Redis");
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_or_else(|_| "unknown".to_owned(), |name| name.trim().to_owned());
        WorkFloor {
            connections: Arc::new(std::sync::Mutex::new(vec![(
                tokio::runtime::Handle::current().id(),
                connection,
            )])),
            release: redis::Script::new(distlock_release_source()),
            holder: Arc::from(format!(";h={host};p={};t=", std::process::id())),
            table: Arc::default(),
            value: String::with_capacity(128),
            line: String::with_capacity(64),
        }
    }

    /// This runtime's connection.
    fn connection(&self) -> redis::aio::ConnectionManager {
        let runtime = tokio::runtime::Handle::current().id();
        self.connections
            .lock()
            .expect("floor with distlock's work: connections poisoned")
            .iter()
            .find(|(id, _)| *id == runtime)
            .map(|(_, connection)| connection.clone())
            .expect("floor with distlock's work: used on the runtime it connected on")
    }

    /// `SET key value NX PX 30000`, then distlock's release of a lock held alone, with the
    /// work above around them.
    pub(crate) async fn cycle(&mut self, n: u64) {
        let key: Arc<str> = Arc::from(format!("{PREFIX}bench:{n}"));
        std::hint::black_box(std::process::id());
        let mut uuid = uuid::Uuid::encode_buffer();
        let uuid = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut uuid);
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.value.clear();
        self.value.push_str(uuid);
        self.value.push_str(&self.holder);
        // A `u64`, not the `u128` of `as_millis`: its digits are the CPU's divisions, not a
        // library call each.
        let _ = write!(
            self.value,
            "{}",
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        );
        let value: Arc<str> = Arc::from(&*self.value);
        let lapses = Instant::now() + TTL;
        let entered = self
            .table
            .lock()
            .expect("floor with distlock's work: table poisoned")
            .insert(Arc::clone(&key), lapses);
        assert!(
            entered.is_none(),
            "floor with distlock's work: {key} taken twice"
        );
        let mut armed = Armed {
            key: Arc::clone(&key),
            value: Arc::clone(&value),
            live: true,
        };
        let mut set = redis::Cmd::with_capacity(6, 3 + 3 + key.len() + value.len() + 2 + 2 + 20);
        set.arg("SET")
            .arg(&*key)
            .arg(&*value)
            .arg("NX")
            .arg("PX")
            .arg(30_000u64);
        let set: redis::Value = set
            .query_async(&mut self.connection())
            .await
            .expect("floor with distlock's work: SET failed");
        assert_eq!(
            set,
            redis::Value::Okay,
            "floor with distlock's work: {key} was taken"
        );

        std::hint::black_box(std::process::id());
        self.line.clear();
        self.line.push('{');
        self.line.push_str(&key);
        self.line.push_str("}:distlock:line");
        let mut release =
            redis::Cmd::with_capacity(6, 7 + 40 + 1 + key.len() + self.line.len() + value.len());
        release
            .arg("EVALSHA")
            .arg(self.release.get_hash())
            .arg(2)
            .arg(&*key)
            .arg(&*self.line)
            .arg(&*value);
        let mut connection = self.connection();
        let deleted: i64 = match release.query_async(&mut connection).await {
            Err(error)
                if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                self.release
                    .load_async(&mut connection)
                    .await
                    .expect("floor with distlock's work: SCRIPT LOAD failed");
                release.query_async(&mut connection).await
            }
            deleted => deleted,
        }
        .expect("floor with distlock's work: release failed");
        assert_eq!(
            deleted, 1,
            "floor with distlock's work: {key} was not ours at release"
        );
        armed.live = false;
        self.table
            .lock()
            .expect("floor with distlock's work: table poisoned")
            .remove(&key);
    }
}

pub(crate) async fn manual_cycle(manager: &LockManager, options: &LockOptions, n: u64) {
    let guard = manager
        .acquire(&format!("bench:{n}"), options)
        .await
        .expect("distlock: acquire failed");
    guard.release().await.expect("distlock: release failed");
}

pub(crate) async fn rslock_cycle(manager: &Rslock, n: u64) {
    manager
        .acquire(&format!("{PREFIX}bench:{n}"), TTL)
        .await
        .release()
        .await;
}

/// Who runs workloads 1 and 3.
#[derive(Clone)]
pub(crate) enum Cycler {
    Floor(Floor),
    FloorScripts(Floor),
    FloorWork(WorkFloor),
    /// The floor with `WAIT 1` pipelined after its `SET` (workload 8).
    FloorWait(Floor),
    Manual(LockManager, LockOptions),
    Attribute,
    Rslock(Rslock),
}

impl Cycler {
    /// Cycles on the keys numbered `keys`, one after the other.
    pub(crate) async fn run(&mut self, keys: std::ops::Range<u64>) {
        match self {
            Cycler::Floor(floor) => {
                for i in keys {
                    floor.cycle(i).await;
                }
            }
            Cycler::FloorScripts(floor) => {
                for i in keys {
                    floor.cycle_with_distlock_commands(i).await;
                }
            }
            Cycler::FloorWork(floor) => {
                for i in keys {
                    floor.cycle(i).await;
                }
            }
            Cycler::FloorWait(floor) => {
                for i in keys {
                    floor.cycle_waiting_for_a_replica(i).await;
                }
            }
            Cycler::Manual(manager, options) => {
                for i in keys {
                    manual_cycle(manager, options, i).await;
                }
            }
            Cycler::Attribute => {
                for i in keys {
                    attributed(i)
                        .await
                        .expect("distlock attribute: cycle failed");
                }
            }
            Cycler::Rslock(manager) => {
                for i in keys {
                    rslock_cycle(manager, i).await;
                }
            }
        }
    }
}

/// Who runs workload 2.
#[derive(Clone)]
pub(crate) enum Contender {
    Distlock(LockManager),
    Rslock(Rslock),
    /// Not a Redis lock: the same tasks handing over a `tokio::sync::Mutex`. Its hand-off gap
    /// is what the runtime and the machine's scheduling cost by themselves.
    InProcess(Arc<tokio::sync::Mutex<()>>),
}

impl Contender {
    /// One task's `m` sections on the lock `name`.
    pub(crate) async fn sections(
        self,
        holder: usize,
        name: String,
        m: usize,
        critical: Duration,
    ) -> Vec<Section> {
        let options = LockOptions::new().ttl(TTL).timeout(Duration::from_secs(60));
        let key = format!("{PREFIX}{name}");
        let mut sections = Vec::with_capacity(m);
        for _ in 0..m {
            let called = Instant::now();
            let section = match &self {
                Contender::Distlock(manager) => {
                    let guard = manager
                        .acquire(&name, &options)
                        .await
                        .expect("distlock: acquire failed");
                    let acquired = Instant::now();
                    critical_section(acquired, critical).await;
                    let release_start = Instant::now();
                    guard.release().await.expect("distlock: release failed");
                    Section {
                        holder,
                        called,
                        acquired,
                        release_start,
                    }
                }
                Contender::Rslock(manager) => {
                    let guard = manager.acquire(&key, TTL).await;
                    let acquired = Instant::now();
                    critical_section(acquired, critical).await;
                    let release_start = Instant::now();
                    guard.release().await;
                    Section {
                        holder,
                        called,
                        acquired,
                        release_start,
                    }
                }
                Contender::InProcess(mutex) => {
                    let guard = mutex.lock().await;
                    let acquired = Instant::now();
                    critical_section(acquired, critical).await;
                    let release_start = Instant::now();
                    drop(guard);
                    Section {
                        holder,
                        called,
                        acquired,
                        release_start,
                    }
                }
            };
            sections.push(section);
        }
        sections
    }
}

/// The text of distlock's release of a lock held alone (taken by `SET NX`, nobody in line),
/// lock-runtime's own Lua file; the uncontended workload checks that Redis knows the same SHA
/// after distlock connected, so a copy that drifted fails there rather than measure a
/// different script.
pub(crate) fn distlock_release_source() -> &'static str {
    include_str!("../../lock-runtime/src/backend/scripts/release_alone.lua")
}
