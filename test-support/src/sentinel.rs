//! [`SentinelSet`]: a Redis Sentinel deployment of its own for one test — a master, one
//! replica and three `redis-server --sentinel` processes, all on free ports — with the failovers
//! tests need: `SENTINEL FAILOVER`, and a killed master. [`SentinelSet::start_tls`] makes one
//! where every process speaks only TLS.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::{free_port, send_signal};
use super::server::{kill_and_reap, spawn_watchdog};
use super::tls::{require_redis_cli, run_bounded, TlsFiles};
use super::RedisServer;

/// How long a new deployment gets to be ready: the replica in sync, and every sentinel knowing
/// the replica and the two other sentinels (they meet through hello messages every 2 s).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a failover gets to complete.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// Connect, read and write timeout of the helper connections.
const HELPER_TIMEOUT: Duration = Duration::from_secs(5);

/// The name under which the sentinels monitor the master.
pub const SERVICE: &str = "distlock-test";

/// A master, one replica and three sentinels (quorum 2) that declare a master down after
/// 1 s without an answer. Dropping it kills every process.
pub struct SentinelSet {
    /// The two data servers; either may be the master (see [`SentinelSet::master`]).
    servers: [RedisServer; 2],
    sentinels: Vec<Sentinel>,
    /// The data servers' `requirepass`, if any.
    password: Option<String>,
    /// The certificates every process of a TLS set uses; their directory goes with the set.
    tls: Option<TlsFiles>,
}

/// One `redis-server <config> --sentinel` process.
struct Sentinel {
    port: u16,
    dir: PathBuf,
    child: Child,
    watchdog: Option<Child>,
    /// The certificates when it speaks only TLS.
    tls: Option<TlsFiles>,
}

impl SentinelSet {
    /// Starts the deployment and waits until a failover could promote the replica.
    pub fn start() -> Self {
        Self::start_with_password(None)
    }

    /// [`start`](Self::start), with both data servers requiring `password` (the sentinels
    /// know it; the sentinels themselves take no password). The data servers' helpers
    /// (`get`, `keys`, ...) then fail: they log in as nobody.
    pub fn start_with_password(password: Option<&str>) -> Self {
        let auth: Vec<&str> = match password {
            Some(password) => vec!["--requirepass", password, "--masterauth", password],
            None => Vec::new(),
        };
        let master = RedisServer::start_with(&auth);
        let master_port = master.port().to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &master_port];
        replica_args.extend(&auth);
        let replica = RedisServer::start_with(&replica_args);
        let sentinels = (0..3)
            .map(|_| Sentinel::start(master.port(), password, None))
            .collect();
        let set = SentinelSet {
            servers: [master, replica],
            sentinels,
            password: password.map(str::to_owned),
            tls: None,
        };
        set.wait_ready();
        set
    }

    /// [`start`](Self::start), with every process speaking only TLS (`--port 0`), all with one
    /// certificate of a fresh CA ([`ca_pem`](Self::ca_pem)) for `127.0.0.1`: the replica
    /// replicates over TLS (`tls-replication yes`), and so do the sentinels talk to the data
    /// servers and to each other. [`sentinel_urls`](Self::sentinel_urls) are `rediss://`.
    /// The data servers' redis-rs helpers (`get`, `keys`, ...) speak plain text and fail: use
    /// [`RedisServer::tls_cli`].
    ///
    /// Panics with install hints if `openssl` or `redis-cli` is missing.
    pub fn start_tls() -> Self {
        require_redis_cli();
        let files = TlsFiles::generate(&crate::unique_temp_dir("sentinel-tls"));
        let master = RedisServer::start_tls_using(&files, &["--tls-replication", "yes"]);
        let master_port = master.port().to_string();
        let replica = RedisServer::start_tls_using(
            &files,
            &[
                "--tls-replication",
                "yes",
                "--replicaof",
                "127.0.0.1",
                &master_port,
            ],
        );
        let sentinels = (0..3)
            .map(|_| Sentinel::start(master.port(), None, Some(&files)))
            .collect();
        let set = SentinelSet {
            servers: [master, replica],
            sentinels,
            password: None,
            tls: Some(files),
        };
        set.wait_ready();
        set
    }

    /// `redis://127.0.0.1:P/` of each sentinel (`rediss://` for a [TLS set](Self::start_tls)).
    pub fn sentinel_urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        self.sentinels
            .iter()
            .map(|sentinel| format!("{scheme}://127.0.0.1:{}/", sentinel.port))
            .collect()
    }

    /// Freezes every sentinel with SIGSTOP (a frozen host): their connections stay open, and
    /// nothing is answered until [`resume_sentinels`](Self::resume_sentinels).
    pub fn pause_sentinels(&self) {
        for sentinel in &self.sentinels {
            send_signal(sentinel.child.id(), "STOP");
        }
    }

    /// Lets [`pause_sentinels`](Self::pause_sentinels)d sentinels run again (SIGCONT).
    pub fn resume_sentinels(&self) {
        for sentinel in &self.sentinels {
            send_signal(sentinel.child.id(), "CONT");
        }
    }

    /// Whether every process speaks only TLS ([`start_tls`](Self::start_tls)).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The PEM of the CA that signed every certificate of a [TLS set](Self::start_tls).
    /// Panics for a plain set.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.tls
            .as_ref()
            .expect("ca_pem: this SentinelSet was not started with start_tls")
            .ca_pem()
    }

    /// The data server the sentinels name as the master now (asking each in turn).
    pub fn master(&self) -> &RedisServer {
        let port = self
            .sentinels
            .iter()
            .find_map(|sentinel| sentinel.master_port().ok())
            .expect("no sentinel answered get-master-addr-by-name");
        self.server_on(port)
    }

    /// The data server that is not [`master`](Self::master).
    pub fn replica(&self) -> &RedisServer {
        let master = self.master().port();
        self.server_on_other_than(master)
    }

    /// Asks a sentinel for a failover (`SENTINEL FAILOVER`) and waits until the replica is the
    /// master for every sentinel and says so itself. Returns the new master. The old master
    /// may still accept writes until the sentinels demote it: see [`wait_demoted`].
    ///
    /// [`wait_demoted`]: SentinelSet::wait_demoted
    pub fn failover(&self) -> &RedisServer {
        let old = self.master().port();
        self.fail_over_from(old)
    }

    /// Waits until `old`, a master before a failover, has been turned into a replica (from then
    /// on nothing can be written there).
    pub fn wait_demoted(&self, old: &RedisServer) {
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        while self.role(old).as_deref() != Some("slave") {
            assert!(
                Instant::now() < deadline,
                "the old master on port {} was not turned into a replica within \
                 {FAILOVER_TIMEOUT:?}\n{}",
                old.port(),
                self.sentinel_logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn fail_over_from(&self, old: u16) -> &RedisServer {
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        loop {
            let asked = self.sentinels[0].failover();
            match asked {
                Ok(()) => break,
                // The replica was not seen as good yet, or a failover is in progress.
                Err(error) if Instant::now() < deadline => {
                    eprintln!("SENTINEL FAILOVER refused ({error}); asking again");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(error) => panic!("SENTINEL FAILOVER kept failing: {error}"),
            }
        }
        self.wait_master_moved_from(old)
    }

    /// Kills the master with SIGKILL (a crash) and returns once the sentinels promoted the
    /// replica. Returns the new master.
    pub fn kill_master(&self) -> &RedisServer {
        let old = self.master();
        old.kill();
        self.wait_master_moved_from(old.port())
    }

    /// Waits until every sentinel names a master other than `old` and that server says it is a
    /// master.
    pub fn wait_master_moved_from(&self, old: u16) -> &RedisServer {
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        loop {
            let ports: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|sentinel| sentinel.master_port().ok())
                .collect();
            if let Some(Some(new)) = ports.first() {
                if *new != old
                    && ports.iter().all(|port| *port == Some(*new))
                    && self.role(self.server_on(*new)).as_deref() == Some("master")
                {
                    return self.server_on(*new);
                }
            }
            assert!(
                Instant::now() < deadline,
                "no failover away from port {old} within {FAILOVER_TIMEOUT:?}: sentinels name \
                 {ports:?}\n{}",
                self.sentinel_logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn server_on(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|server| server.port() == port)
            .unwrap_or_else(|| panic!("the sentinels name port {port}, not one of ours"))
    }

    fn server_on_other_than(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|server| server.port() != port)
            .expect("two servers")
    }

    /// The replica is in sync, and every sentinel knows one replica and two other sentinels.
    fn wait_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let replica_up = self
                .data_query(&self.servers[1], &["INFO", "replication"])
                .is_some_and(|info| info.contains("master_link_status:up"));
            let views: Vec<Option<(u64, u64)>> = self
                .sentinels
                .iter()
                .map(|sentinel| sentinel.known_replicas_and_sentinels().ok())
                .collect();
            if replica_up && views.iter().all(|view| *view == Some((1, 2))) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Sentinel deployment was not ready within {READY_TIMEOUT:?} (replica in \
                 sync: {replica_up}; each sentinel's (replicas, other sentinels): {views:?})\n{}",
                self.sentinel_logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last lines of every sentinel's log, for failure messages.
    pub fn sentinel_logs(&self) -> String {
        self.sentinels
            .iter()
            .map(|sentinel| {
                let log =
                    std::fs::read_to_string(sentinel.dir.join("sentinel.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- sentinel {} ---\n{}", sentinel.port, tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A helper connection to a data server, logged in with the set's password.
    fn data_conn(&self, server: &RedisServer) -> redis::RedisResult<redis::Connection> {
        let mut connection = server.try_conn()?;
        if let Some(password) = &self.password {
            redis::cmd("AUTH")
                .arg(password)
                .query::<()>(&mut connection)?;
        }
        Ok(connection)
    }

    /// The text of a data server's answer to `args` (over TLS for a TLS set), or `None` if it
    /// does not answer.
    fn data_query(&self, server: &RedisServer, args: &[&str]) -> Option<String> {
        if let Some(files) = &self.tls {
            return tls_query(server.port(), files, args).ok();
        }
        let mut connection = self.data_conn(server).ok()?;
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&args[1..]);
        let reply: redis::Value = cmd.query(&mut connection).ok()?;
        let text = match reply {
            redis::Value::Array(items) => items
                .iter()
                .map(|item| redis::from_redis_value_ref::<String>(item).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n"),
            other => redis::from_redis_value::<String>(other).ok()?,
        };
        Some(text)
    }

    /// What `ROLE` says the server is (`master`, `slave`), or `None` if it does not answer.
    fn role(&self, server: &RedisServer) -> Option<String> {
        let reply = self.data_query(server, &["ROLE"])?;
        reply.lines().next().map(str::to_owned)
    }
}

/// `redis-cli --tls` on `port` with `args`, bounded: its output, or why it failed (redis-cli
/// shows error replies as their text, with a success status).
fn tls_query(port: u16, files: &TlsFiles, args: &[&str]) -> Result<String, String> {
    let mut command = Command::new("redis-cli");
    command
        .arg("--tls")
        .arg("--cacert")
        .arg(&files.ca_cert)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args);
    match run_bounded(&mut command, HELPER_TIMEOUT) {
        Ok(output) if output.status.success() => Ok(String::from_utf8_lossy(&output.stdout)
            .trim_end_matches(['\r', '\n'])
            .to_owned()),
        Ok(output) => Err(format!(
            "redis-cli {args:?} on port {port} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )),
        Err(error) => Err(format!("redis-cli {args:?} on port {port}: {error}")),
    }
}

impl Sentinel {
    fn start(master_port: u16, password: Option<&str>, tls: Option<&TlsFiles>) -> Self {
        let auth = password
            .map(|password| format!("sentinel auth-pass {SERVICE} {password}\n"))
            .unwrap_or_default();
        for _ in 0..10 {
            let port = free_port();
            let dir = super::unique_temp_dir("sentinel");
            let config = dir.join("sentinel.conf");
            // Over TLS the one port is the TLS port, which the sentinels announce to each other
            // since they also talk TLS to the servers (`tls-replication`).
            let listen = match tls {
                None => format!("port {port}\n"),
                Some(files) => files
                    .tls_only_settings(port)
                    .into_iter()
                    .map(|(name, value)| format!("{name} {value}\n"))
                    .fold("port 0\ntls-replication yes\n".to_owned(), |lines, line| {
                        lines + &line
                    }),
            };
            std::fs::write(
                &config,
                format!(
                    "{listen}bind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                     sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {SERVICE} 1000\n\
                     sentinel failover-timeout {SERVICE} 10000\n\
                     sentinel parallel-syncs {SERVICE} 1\n{auth}",
                    dir = dir.display()
                ),
            )
            .expect("write sentinel.conf");
            let log = std::fs::File::create(dir.join("sentinel.log")).expect("sentinel.log");
            let child = Command::new(super::binary::server_program())
                .arg(&config)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("cannot spawn redis-server --sentinel");
            let watchdog = spawn_watchdog(child.id(), &dir);
            let mut sentinel = Sentinel {
                port,
                dir,
                child,
                watchdog,
                tls: tls.cloned(),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if sentinel.query(&["PING"]).is_ok_and(|reply| reply == "PONG") {
                    return sentinel;
                }
                if sentinel.child.try_wait().ok().flatten().is_some() {
                    break; // lost a race for the port, or a bad config: see the log
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let log =
                std::fs::read_to_string(sentinel.dir.join("sentinel.log")).unwrap_or_default();
            assert!(
                log.contains("Address already in use"),
                "redis-server --sentinel on port {port} did not start:\n{log}"
            );
        }
        panic!("could not start a sentinel: every free port tried was taken");
    }

    /// The answer to `args` as text, one line per element of an array (over TLS for a TLS
    /// sentinel).
    fn query(&self, args: &[&str]) -> Result<String, String> {
        if let Some(files) = &self.tls {
            return tls_query(self.port, files, args);
        }
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&args[1..]);
        let reply: redis::Value = self.command(&cmd).map_err(|error| error.to_string())?;
        match reply {
            redis::Value::Array(items) => Ok(items
                .iter()
                .map(|item| redis::from_redis_value_ref::<String>(item).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n")),
            redis::Value::ServerError(error) => Err(format!("{error:?}")),
            other => redis::from_redis_value::<String>(other).map_err(|error| error.to_string()),
        }
    }

    fn command<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        let mut connection = client.get_connection_with_timeout(HELPER_TIMEOUT)?;
        connection.set_read_timeout(Some(HELPER_TIMEOUT))?;
        connection.set_write_timeout(Some(HELPER_TIMEOUT))?;
        cmd.query(&mut connection)
    }

    /// `SENTINEL FAILOVER` of the service: `Err` with the refusal.
    fn failover(&self) -> Result<(), String> {
        match self.query(&["SENTINEL", "FAILOVER", SERVICE])? {
            reply if reply == "OK" => Ok(()),
            refusal => Err(refusal),
        }
    }

    fn master_port(&self) -> Result<u16, String> {
        let reply = self.query(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE])?;
        reply
            .lines()
            .nth(1)
            .and_then(|port| port.trim().parse().ok())
            .ok_or(reply)
    }

    /// How many replicas and other sentinels this sentinel knows of the service.
    fn known_replicas_and_sentinels(&self) -> Result<(u64, u64), String> {
        let reply = self.query(&["SENTINEL", "MASTER", SERVICE])?;
        let fields: Vec<&str> = reply.lines().collect();
        let field = |name: &str| {
            fields
                .chunks(2)
                .find(|pair| pair[0] == name)
                .and_then(|pair| pair.get(1)?.parse().ok())
                .unwrap_or(0)
        };
        Ok((field("num-slaves"), field("num-other-sentinels")))
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
        if let Some(watchdog) = self.watchdog.as_mut() {
            kill_and_reap(watchdog);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        if let Some(files) = &self.tls {
            let _ = std::fs::remove_dir_all(&files.dir);
        }
    }
}
