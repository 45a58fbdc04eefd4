//! [`RedisServer`]: a throwaway `redis-server` process owned by one test, with fault controls
//! (pause, resume, kill, restart) and small synchronous helpers for assertions.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::process::{free_port, send_signal};

/// How long a freshly spawned server gets to answer. Generous: a shared 2-core machine running
/// a parallel build can take seconds to schedule a new process.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How many fresh ports `start` tries before giving up (each try loses only to a port race).
const START_ATTEMPTS: usize = 10;
/// How long `restart` keeps trying to bind the *same* port again.
const RESTART_TIMEOUT: Duration = Duration::from_secs(10);
/// Connect, read and write timeout of the helper connections (`conn`, `get`, ...), so that a
/// paused or dead server makes a helper fail instead of hanging the test.
const HELPER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait for a killed process to be reaped.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);

const NOT_FOUND_MESSAGE: &str = "redis-server not found on PATH: install it \
     (Debian/Ubuntu: `apt-get install -y redis-server`, macOS: `brew install redis`), or name \
     a server binary in DISTLOCK_REDIS_SERVER";

/// A `redis-server` child process on `127.0.0.1`, on a port of its own, with its own temp dir.
///
/// The server never persists anything (`--save "" --appendonly no`), so [`restart`] always
/// comes back empty. Dropping it kills the process and removes the directory; a watchdog shell
/// also kills it if the test process dies without dropping it (a `static`, an abort, a
/// `wait_all` timeout in a parent), so no server outlives its test binary by more than ~1 s.
///
/// All methods take `&self`, so one server can be shared by threads and tasks (e.g. in an
/// `Arc`) while one of them injects faults.
///
/// Every method is synchronous. From an async test that is fine for the helpers (a local
/// round trip), but `start`, `restart` and `kill` block for as long as the process takes, so
/// in a `current_thread` runtime call them where no task needs to make progress meanwhile
/// (or via `tokio::task::spawn_blocking`).
///
/// The assertion helpers (`get`, `keys`, ...) connect as the default user without a password:
/// a test that locks the default user out via [`start_with`] must use its own connection.
///
/// [`restart`]: RedisServer::restart
/// [`start_with`]: RedisServer::start_with
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra_args: Vec<String>,
    readiness: Readiness,
    state: Mutex<State>,
}

/// How a freshly launched server is checked for answering (at start and at every restart).
#[derive(Clone, Debug)]
pub enum Readiness {
    /// `INFO server` over a plain socket on the port: every server that speaks plain RESP.
    Plain,
    /// `redis-cli --tls --cacert <ca_file> -p <port> INFO server`, for a server whose port only
    /// speaks TLS (see [`RedisServer::start_tls`]).
    Tls {
        /// The CA certificate (PEM) that signed the server's certificate.
        ca_file: PathBuf,
    },
}

/// What is running right now; `None` after [`RedisServer::kill`].
struct State {
    running: Option<Running>,
}

struct Running {
    child: Child,
    paused: bool,
    /// Kills the server if this test process dies first; `None` if `sh` could not be started
    /// (the server still works, it just has no safety net).
    watchdog: Option<Child>,
}

/// Why one launch attempt failed.
enum LaunchError {
    /// Something else holds the port: try another one (or, for restart, try again later).
    PortInUse,
    /// Anything else: a bad argument, a crash. Retrying would not help.
    Failed(String),
}

/// What a probe of the port found.
enum Probe {
    /// Nothing answers (yet).
    NoAnswer,
    /// A Redis answers and it is the given process (or it refused to say, see `probe`).
    Answered(Option<u32>),
}

impl RedisServer {
    /// Starts a server with the default arguments; see [`start_with`](Self::start_with).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts `redis-server` from `PATH` on a free port of 127.0.0.1 with
    /// `--port P --bind 127.0.0.1 --save "" --appendonly no --dir <temp dir> --daemonize no`
    /// followed by `extra_args` (e.g. `&["--maxmemory", "1mb"]`), and waits until it answers.
    ///
    /// Its stdout and stderr go to `redis.log` in its directory ([`log_path`](Self::log_path)).
    /// Panics with the install instructions if `redis-server` is not on `PATH`, and with the
    /// log if the server exits or does not answer within 10 s.
    pub fn start_with(extra_args: &[&str]) -> Self {
        let extra_args: Vec<String> = extra_args
            .iter()
            .map(std::string::ToString::to_string)
            .collect();
        Self::start_custom(crate::unique_temp_dir("redis"), Readiness::Plain, |_| {
            extra_args.clone()
        })
    }

    /// The general form of [`start_with`](Self::start_with), for servers that need more than
    /// fixed arguments:
    /// - `dir` is a new directory the caller made (e.g. with [`unique_temp_dir`]) and may have
    ///   filled (certificates); the server owns it from now on and removes it when dropped;
    /// - `args_for_port` gets each port tried and returns the arguments that follow the default
    ///   ones, so they may name that port or pick other ports of their own (a cluster bus port)
    ///   that change with every attempt; the arguments of the attempt that worked are the ones
    ///   [`restart`](Self::restart) uses again;
    /// - `readiness` says how to tell that the server answers.
    ///
    /// [`unique_temp_dir`]: crate::unique_temp_dir
    pub fn start_custom(
        dir: PathBuf,
        readiness: Readiness,
        args_for_port: impl FnMut(u16) -> Vec<String>,
    ) -> Self {
        Self::start_custom_on(dir, readiness, free_port, args_for_port)
    }

    /// [`start_custom`](Self::start_custom) on ports chosen by `pick_port` instead of any
    /// free port (a cluster node needs its bus port free too).
    pub fn start_custom_on(
        dir: PathBuf,
        readiness: Readiness,
        mut pick_port: impl FnMut() -> u16,
        mut args_for_port: impl FnMut(u16) -> Vec<String>,
    ) -> Self {
        for _ in 0..START_ATTEMPTS {
            // The port was free a moment ago; losing a race for it is the only expected failure.
            let port = pick_port();
            let extra_args = args_for_port(port);
            match launch(port, &dir, &extra_args, &readiness, START_TIMEOUT) {
                Ok(running) => {
                    return Self {
                        port,
                        dir,
                        extra_args,
                        readiness,
                        state: Mutex::new(State {
                            running: Some(running),
                        }),
                    }
                }
                // Taken between choosing the port and binding it: try another.
                Err(LaunchError::PortInUse) => {}
                Err(LaunchError::Failed(message)) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    panic!("{message}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        panic!("could not start redis-server: every one of {START_ATTEMPTS} free ports was taken before it could bind");
    }

    /// The TCP port the server listens on; it stays the same across [`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The connection URL, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's process id. Panics if the server is not running (after [`kill`](Self::kill)).
    pub fn pid(&self) -> u32 {
        match &self.lock().running {
            Some(running) => running.child.id(),
            None => panic!("redis-server on port {} is not running (killed)", self.port),
        }
    }

    /// Whether the process is running (paused counts as running).
    pub fn is_running(&self) -> bool {
        self.lock().running.is_some()
    }

    /// The CA certificate file a TLS client must trust, if the server speaks only TLS
    /// ([`start_tls`](Self::start_tls)); `None` for a plain server.
    pub fn tls_ca_file(&self) -> Option<&Path> {
        match &self.readiness {
            Readiness::Plain => None,
            Readiness::Tls { ca_file } => Some(ca_file),
        }
    }

    /// The server's private directory (working dir, log file).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that receives the server's stdout and stderr, appended to across restarts.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// A `redis::Client` for [`url`](Self::url).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url())
            .unwrap_or_else(|e| panic!("invalid redis url {}: {e}", self.url()))
    }

    /// Opens a sync connection with 5 s connect, read and write timeouts, so that a paused server
    /// makes the caller's command fail instead of hanging.
    ///
    /// # Errors
    /// Connecting or setting the timeouts failed: returned, where [`RedisServer::conn`] panics.
    pub fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        let conn = self.client().get_connection_with_timeout(HELPER_TIMEOUT)?;
        conn.set_read_timeout(Some(HELPER_TIMEOUT))?;
        conn.set_write_timeout(Some(HELPER_TIMEOUT))?;
        Ok(conn)
    }

    /// Like [`try_conn`](Self::try_conn), but panics if the server cannot be reached.
    pub fn conn(&self) -> redis::Connection {
        self.try_conn()
            .unwrap_or_else(|e| panic!("cannot connect to redis-server at {}: {e}", self.url()))
    }

    /// Runs one command on a fresh helper connection, panicking with the command and error.
    fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut conn = self.conn();
        cmd.query(&mut conn)
            .unwrap_or_else(|e| panic!("redis command on port {} failed: {e}", self.port))
    }

    /// `GET key` as a string; `None` if the key does not exist.
    pub fn get(&self, key: &str) -> Option<String> {
        self.query(redis::cmd("GET").arg(key))
    }

    /// `SET key value` (no expiry).
    pub fn set(&self, key: &str, value: &str) {
        self.query::<()>(redis::cmd("SET").arg(key).arg(value));
    }

    /// `SET key value PX millis`: a holder that bypasses distlock (a thief, a hand-written lock,
    /// a holder that vanishes without releasing).
    pub fn set_px(&self, key: &str, value: &str, millis: u64) {
        self.query::<()>(redis::cmd("SET").arg(key).arg(value).arg("PX").arg(millis));
    }

    /// `DEL key`; returns whether the key existed.
    pub fn del(&self, key: &str) -> bool {
        self.query::<i64>(redis::cmd("DEL").arg(key)) == 1
    }

    /// `EXISTS key`.
    pub fn exists(&self, key: &str) -> bool {
        self.query::<i64>(redis::cmd("EXISTS").arg(key)) == 1
    }

    /// `PTTL key`: milliseconds left, `-1` if the key has no expiry, `-2` if it does not exist.
    pub fn pttl(&self, key: &str) -> i64 {
        self.query(redis::cmd("PTTL").arg(key))
    }

    /// Every key matching the glob `pattern`, sorted, found with `SCAN` (not `KEYS`, which the
    /// code under test must never rely on either). SCAN may repeat a key; duplicates are removed.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut conn = self.conn();
        let mut cmd = redis::cmd("SCAN");
        cmd.cursor_arg(0)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let mut keys: Vec<String> = cmd
            .iter::<String>(&mut conn)
            .unwrap_or_else(|e| panic!("SCAN on port {} failed: {e}", self.port))
            .map(|key| key.unwrap_or_else(|e| panic!("SCAN returned a non-string key: {e}")))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// `FLUSHALL`: removes every key.
    pub fn flushall(&self) {
        self.query::<()>(&redis::cmd("FLUSHALL"));
    }

    /// The raw text of `INFO <section>`.
    pub fn info(&self, section: &str) -> String {
        self.query(redis::cmd("INFO").arg(section))
    }

    /// How many times the command `name` ran since start or [`reset_stats`](Self::reset_stats),
    /// from `INFO commandstats` (`cmdstat_<name>:calls=N,...`); `0` if it never ran.
    ///
    /// `name` is case-insensitive; subcommands are written `"client|setinfo"`, as Redis does.
    /// A server that counts no subcommands of their own (Redis before 7: `cmdstat_script`, not
    /// `cmdstat_script|load`) gives the count of the whole command, every subcommand of it.
    /// The helper's own `INFO` call is counted under `info` and nothing else.
    pub fn command_count(&self, name: &str) -> u64 {
        let name = name.to_ascii_lowercase();
        let name = match name.split_once('|') {
            Some((command, _)) if !self.counts_subcommands() => command.to_owned(),
            _ => name,
        };
        self.command_counts().get(&name).copied().unwrap_or(0)
    }

    /// Every command that ran since start or [`reset_stats`](Self::reset_stats), by name as
    /// `INFO commandstats` writes it (`"set"`, `"config|resetstat"` on Redis 7 and later,
    /// `"config"` before), with its calls. The commands a script runs count too, and so does the
    /// helper's own `INFO`, under `info`.
    pub fn command_counts(&self) -> BTreeMap<String, u64> {
        parse_command_counts(&self.info("commandstats"))
    }

    /// [`command_counts`](Self::command_counts) asked on `connection`: one opened before the
    /// counts were reset adds only its `INFO`, whereas a new connection adds its handshake
    /// (`CLIENT SETINFO`, which servers before 7.2 count as `client`).
    pub fn command_counts_on(connection: &mut redis::Connection) -> BTreeMap<String, u64> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(connection)
            .expect("INFO commandstats");
        parse_command_counts(&info)
    }

    /// Whether `INFO commandstats` counts subcommands on their own lines (`cmdstat_config|get`):
    /// Redis 7 and later, and Valkey (which reports `redis_version:7.2.4`).
    pub fn counts_subcommands(&self) -> bool {
        let info = self.info("server");
        let version = info
            .lines()
            .find_map(|line| line.strip_prefix("redis_version:"))
            .unwrap_or_else(|| panic!("no redis_version in INFO server: {info}"));
        let major: u32 = version
            .split('.')
            .next()
            .and_then(|major| major.trim().parse().ok())
            .unwrap_or_else(|| panic!("cannot parse redis_version:{version}"));
        major >= 7
    }

    /// `CONFIG RESETSTAT`: sets every [`command_count`](Self::command_count) back to 0.
    pub fn reset_stats(&self) {
        self.query::<()>(redis::cmd("CONFIG").arg("RESETSTAT"));
    }

    /// `PUBSUB CHANNELS`: the channels that have at least one subscriber, sorted.
    pub fn pubsub_channels(&self) -> Vec<String> {
        let mut channels: Vec<String> = self.query(redis::cmd("PUBSUB").arg("CHANNELS"));
        channels.sort();
        channels
    }

    /// How many clients are connected, not counting the connection this helper opens to ask.
    pub fn client_count(&self) -> usize {
        let mut conn = self.conn();
        let own_id: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query(&mut conn)
            .unwrap_or_else(|e| panic!("CLIENT ID on port {} failed: {e}", self.port));
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut conn)
            .unwrap_or_else(|e| panic!("CLIENT LIST on port {} failed: {e}", self.port));
        let own = format!("id={own_id} ");
        list.lines()
            .filter(|line| !line.trim().is_empty() && !line.starts_with(&own))
            .count()
    }

    /// Freezes the server with SIGSTOP: connections stay open, but nothing is answered until
    /// [`resume`](Self::resume). Expires do not advance while it is stopped.
    pub fn pause(&self) {
        let mut state = self.lock();
        let running = running_mut(&mut state, self.port, "pause");
        send_signal(running.child.id(), "STOP");
        running.paused = true;
    }

    /// Lets a [`pause`](Self::pause)d server run again (SIGCONT).
    pub fn resume(&self) {
        let mut state = self.lock();
        let running = running_mut(&mut state, self.port, "resume");
        send_signal(running.child.id(), "CONT");
        running.paused = false;
    }

    /// Kills the server with SIGKILL (no clean shutdown, like a crash) and waits until it is
    /// gone; its data is lost. Does nothing if it is not running.
    pub fn kill(&self) {
        if let Some(running) = self.lock().running.take() {
            stop(running);
        }
    }

    /// Kills the server if it is running, then starts it again on the same port with the same
    /// arguments and waits until it answers. The new server is empty.
    ///
    /// Retries for up to 10 s while the port cannot be bound yet; panics if it never can.
    pub fn restart(&self) {
        let mut state = self.lock();
        if let Some(running) = state.running.take() {
            stop(running);
        }
        let deadline = Instant::now() + RESTART_TIMEOUT;
        loop {
            match launch(
                self.port,
                &self.dir,
                &self.extra_args,
                &self.readiness,
                START_TIMEOUT,
            ) {
                Ok(running) => {
                    state.running = Some(running);
                    return;
                }
                Err(LaunchError::PortInUse) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(LaunchError::PortInUse) => panic!(
                    "restart: port {} stayed in use for {RESTART_TIMEOUT:?}; log: {}",
                    self.port,
                    self.log_path().display()
                ),
                Err(LaunchError::Failed(message)) => panic!("restart: {message}"),
            }
        }
    }

    /// Locks the state, ignoring poisoning: a test that panicked while holding the lock must
    /// not stop `Drop` from killing the server.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The test failed: what the server logged is often the explanation.
            eprintln!(
                "--- redis-server on port {} log ({}), last lines ---\n{}",
                self.port,
                self.log_path().display(),
                log_tail(&self.log_path(), 0, 20)
            );
        }
        if let Some(running) = self.lock().running.take() {
            stop(running);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("dir", &self.dir)
            .field("running", &self.is_running())
            .finish_non_exhaustive()
    }
}

fn running_mut<'a>(state: &'a mut State, port: u16, action: &str) -> &'a mut Running {
    state
        .running
        .as_mut()
        .unwrap_or_else(|| panic!("cannot {action} redis-server on port {port}: it is not running"))
}

/// Spawns one `redis-server` on `port` and waits up to `timeout` for it to answer.
fn launch(
    port: u16,
    dir: &Path,
    extra_args: &[String],
    readiness: &Readiness,
    timeout: Duration,
) -> Result<Running, LaunchError> {
    let log_path = dir.join("redis.log");
    let open_log = || {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let log_err = log.try_clone()?;
        Ok::<_, std::io::Error>((log, log_err))
    };
    let (log, log_err) = open_log()
        .map_err(|e| LaunchError::Failed(format!("cannot open {}: {e}", log_path.display())))?;
    // Only this launch's part of the (appended) log tells why this launch failed.
    let log_start = log.metadata().map_or(0, |m| m.len());

    let port_arg = port.to_string();
    let mut child = match Command::new(crate::binary::server_program())
        .args(["--port", &port_arg, "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == ErrorKind::NotFound && crate::binary::is_primary() => {
            return Err(LaunchError::Failed(NOT_FOUND_MESSAGE.to_string()))
        }
        Err(e) => {
            return Err(LaunchError::Failed(format!(
                "cannot spawn {}: {e}",
                crate::binary::server_program().to_string_lossy()
            )))
        }
    };

    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().ok().flatten() {
            let log = log_tail(&log_path, log_start, 20);
            if log.contains("Address already in use") {
                return Err(LaunchError::PortInUse);
            }
            return Err(LaunchError::Failed(format!(
                "redis-server on port {port} exited ({status}) before answering; args {extra_args:?}; log {}:\n{log}",
                log_path.display()
            )));
        }
        let answer = match readiness {
            Readiness::Plain => probe(port),
            Readiness::Tls { ca_file } => match crate::tls::probe_tls(port, ca_file) {
                Some(pid) => Probe::Answered(pid),
                None => Probe::NoAnswer,
            },
        };
        match answer {
            Probe::Answered(Some(pid)) if pid != child.id() => {
                // Another Redis (another test's) owns the port; ours is about to fail to bind.
                kill_and_reap(&mut child);
                return Err(LaunchError::PortInUse);
            }
            Probe::Answered(_) => {
                let watchdog = spawn_watchdog(child.id(), dir);
                return Ok(Running {
                    child,
                    paused: false,
                    watchdog,
                });
            }
            Probe::NoAnswer => {}
        }
        if Instant::now() >= deadline {
            kill_and_reap(&mut child);
            return Err(LaunchError::Failed(format!(
                "redis-server on port {port} did not answer within {timeout:?}; log {}:\n{}",
                log_path.display(),
                log_tail(&log_path, log_start, 20)
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asks whatever listens on `port` for `INFO server` over a raw socket.
///
/// A raw socket rather than redis-rs so that a server started with a password or ACL still
/// counts as answering (it replies `-NOAUTH`, which proves it is up), and so that the reply's
/// `process_id` tells whether the answer came from our process or from another one that won
/// the race for the port.
fn probe(port: u16) -> Probe {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return Probe::NoAnswer;
    };
    let timeout = Some(Duration::from_millis(500));
    if stream.set_read_timeout(timeout).is_err()
        || stream.set_write_timeout(timeout).is_err()
        || stream.write_all(b"INFO server\r\n").is_err()
    {
        return Probe::NoAnswer;
    }
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
        if reply_complete(&reply) {
            break;
        }
    }
    let text = String::from_utf8_lossy(&reply);
    if text.starts_with("-LOADING") || !reply_complete(&reply) {
        return Probe::NoAnswer;
    }
    if text.starts_with('-') {
        return Probe::Answered(None);
    }
    let pid = text
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok());
    Probe::Answered(pid)
}

/// Whether `reply` holds one whole RESP reply (a line, or a bulk string with its payload).
fn reply_complete(reply: &[u8]) -> bool {
    let Some(line_end) = reply.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    if reply.first() != Some(&b'$') {
        return true;
    }
    let len: i64 = match std::str::from_utf8(&reply[1..line_end])
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(len) => len,
        None => return true, // malformed: stop reading, the caller sees no process_id
    };
    // A negative length is a null reply: complete as it is.
    usize::try_from(len).map_or(true, |len| reply.len() >= line_end + 2 + len + 2)
}

/// Starts a shell that kills `redis_pid` (and removes `dir`) once this test process is gone.
///
/// Needed because `Drop` does not run for statics or on abort, and std has no "die with the
/// parent" option; a poll every second costs nothing measurable.
pub(super) fn spawn_watchdog(redis_pid: u32, dir: &Path) -> Option<Child> {
    const SCRIPT: &str = "while kill -0 \"$1\" 2>/dev/null; do sleep 1; done; \
                          kill -9 \"$2\" 2>/dev/null; rm -rf \"$3\"";
    Command::new("sh")
        .args(["-c", SCRIPT, "distlock-redis-watchdog"])
        .arg(std::process::id().to_string())
        .arg(redis_pid.to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// Kills a running server (resuming it first if paused) and its watchdog, and reaps both.
fn stop(mut running: Running) {
    if running.paused {
        // SIGKILL ends a stopped process too; continuing it first means that, should the kill
        // fail for any reason, no frozen server is left behind holding the port.
        let _ = Command::new("sh")
            .args(["-c", "kill -s CONT \"$1\" 2>/dev/null", "resume"])
            .arg(running.child.id().to_string())
            .status();
    }
    kill_and_reap(&mut running.child);
    if let Some(mut watchdog) = running.watchdog.take() {
        kill_and_reap(&mut watchdog);
    }
}

/// SIGKILLs `child` and waits (bounded) until it has exited.
pub(super) fn kill_and_reap(child: &mut Child) {
    let _ = child.kill();
    let deadline = Instant::now() + EXIT_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if Instant::now() >= deadline => {
                let message = format!(
                    "process {} did not exit within {EXIT_TIMEOUT:?} of SIGKILL",
                    child.id()
                );
                if std::thread::panicking() {
                    eprintln!("{message}");
                    return;
                }
                panic!("{message}");
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// The last `lines` lines of the log written after byte `from`, or a note why there are none.
fn log_tail(path: &Path, from: u64, lines: usize) -> String {
    let mut text = String::new();
    let read = File::open(path).and_then(|mut file| {
        file.seek(SeekFrom::Start(from))?;
        file.read_to_string(&mut text)
    });
    if let Err(e) = read {
        return format!("(cannot read {}: {e})", path.display());
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `INFO commandstats` as command name → calls.
fn parse_command_counts(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .map(|line| {
            let (name, stats) = line
                .split_once(':')
                .unwrap_or_else(|| panic!("no `:` after the name in cmdstat_{line}"));
            let calls = stats
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))
                .and_then(|calls| calls.parse().ok())
                .unwrap_or_else(|| panic!("cannot parse the calls of cmdstat_{line}"));
            (name.to_owned(), calls)
        })
        .collect()
}
