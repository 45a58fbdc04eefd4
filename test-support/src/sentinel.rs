//! [`SentinelSet`]: a Redis Sentinel deployment of its own for one test — a master, one
//! replica and three `redis-server --sentinel` processes, all on free ports — with the failovers
//! tests need: `SENTINEL FAILOVER`, and a killed master.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::free_port;
use super::server::{kill_and_reap, spawn_watchdog};
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
}

/// One `redis-server <config> --sentinel` process.
struct Sentinel {
    port: u16,
    dir: PathBuf,
    child: Child,
    watchdog: Option<Child>,
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
            .map(|_| Sentinel::start(master.port(), password))
            .collect();
        let set = SentinelSet {
            servers: [master, replica],
            sentinels,
            password: password.map(str::to_owned),
        };
        set.wait_ready();
        set
    }

    /// `redis://127.0.0.1:P/` of each sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|sentinel| format!("redis://127.0.0.1:{}/", sentinel.port))
            .collect()
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
            let asked: redis::RedisResult<()> =
                self.sentinels[0].command(redis::cmd("SENTINEL").arg("FAILOVER").arg(SERVICE));
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
                .data_conn(&self.servers[1])
                .and_then(|mut c| {
                    redis::cmd("INFO")
                        .arg("replication")
                        .query::<String>(&mut c)
                })
                .is_ok_and(|info| info.contains("master_link_status:up"));
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

    /// What `ROLE` says the server is (`master`, `slave`), or `None` if it does not answer.
    fn role(&self, server: &RedisServer) -> Option<String> {
        let mut connection = self.data_conn(server).ok()?;
        let reply: Vec<redis::Value> = redis::cmd("ROLE").query(&mut connection).ok()?;
        match reply.first()? {
            redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            redis::Value::SimpleString(text) => Some(text.clone()),
            _ => None,
        }
    }
}

impl Sentinel {
    fn start(master_port: u16, password: Option<&str>) -> Self {
        let auth = password
            .map(|password| format!("sentinel auth-pass {SERVICE} {password}\n"))
            .unwrap_or_default();
        for _ in 0..10 {
            let port = free_port();
            let dir = super::unique_temp_dir("sentinel");
            let config = dir.join("sentinel.conf");
            std::fs::write(
                &config,
                format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
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
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if sentinel.command::<String>(&redis::cmd("PING")).is_ok() {
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

    fn command<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        let mut connection = client.get_connection_with_timeout(HELPER_TIMEOUT)?;
        connection.set_read_timeout(Some(HELPER_TIMEOUT))?;
        connection.set_write_timeout(Some(HELPER_TIMEOUT))?;
        cmd.query(&mut connection)
    }

    fn master_port(&self) -> redis::RedisResult<u16> {
        let (_, port): (String, u16) = self.command(
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(SERVICE),
        )?;
        Ok(port)
    }

    /// How many replicas and other sentinels this sentinel knows of the service.
    fn known_replicas_and_sentinels(&self) -> redis::RedisResult<(u64, u64)> {
        let fields: Vec<String> =
            self.command(redis::cmd("SENTINEL").arg("MASTER").arg(SERVICE))?;
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
