//! `distlock doctor`: checks a deployment for what breaks locks, one line per check (✓ / ✗ /
//! ?), with the fix for each ✗ and ?.
//!
//! Each server of the deployment is asked directly (its own connection, every command with a
//! timeout): a standalone server, every Redlock master, every master of a cluster, a Sentinel
//! service's master and its replicas (which a failover may promote). Nothing is written.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use distlock::diagnose::{cluster_masters, Eviction, CHECK_BY_HAND, EVICTION_FIX, EVICTION_RISK};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, RedisResult, Value};
use serde_json::json;

use crate::{format, redact, write_out, Cli, Failure};

/// How long a connect, and each command, may take.
const TIMEOUT: Duration = Duration::from_secs(2);
/// How many `PING`s the latency check sends.
const PINGS: usize = 5;
/// The oldest Redis distlock supports (docs/compatibility.md).
const OLDEST: (u32, u32) = (6, 2);

/// What a server is to the deployment, which decides how strict some checks are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Standalone,
    RedlockMaster,
    ClusterMaster,
    SentinelMaster,
    SentinelReplica,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Standalone => "server",
            Role::RedlockMaster => "Redlock master",
            Role::ClusterMaster => "cluster master",
            Role::SentinelMaster => "Sentinel master",
            Role::SentinelReplica => "Sentinel replica",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    Fail,
    Unknown,
}

impl Status {
    fn mark(self) -> &'static str {
        match self {
            Status::Ok => "✓",
            Status::Fail => "✗",
            Status::Unknown => "?",
        }
    }

    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Fail => "fail",
            Status::Unknown => "unknown",
        }
    }
}

/// One check's outcome on one server.
struct Check {
    server: String,
    role: Role,
    name: &'static str,
    status: Status,
    detail: String,
    /// What to do, for ✗ and ?.
    fix: Option<String>,
}

/// Runs every check and prints them; `Err(NotDone)` (status 1) when any is ✗.
pub(crate) async fn run(cli: &Cli, deployment: &str, json: bool) -> Result<(), Failure> {
    let mut checks = Vec::new();
    let servers = servers(cli, &mut checks).await?;
    for (role, client) in servers {
        check_server(role, &client, &cli.prefix, &mut checks).await;
    }
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    let text = if json {
        let all: Vec<_> = checks
            .iter()
            .map(|c| {
                json!({
                    "server": c.server,
                    "role": c.role.name(),
                    "check": c.name,
                    "status": c.status.word(),
                    "detail": c.detail,
                    "fix": c.fix,
                })
            })
            .collect();
        format!(
            "{}\n",
            json!({ "deployment": deployment, "ok": failed == 0, "checks": all })
        )
    } else {
        let mut text = format!("{deployment}\n");
        for c in &checks {
            let _ = writeln!(
                text,
                "{} {} ({}) {}: {}",
                c.status.mark(),
                format::cell(&c.server),
                c.role.name(),
                c.name,
                format::cell(&c.detail)
            );
            if let Some(fix) = &c.fix {
                let _ = writeln!(text, "    fix: {}", format::cell(fix));
            }
        }
        let unknown = checks
            .iter()
            .filter(|c| c.status == Status::Unknown)
            .count();
        let _ = writeln!(text, "{} checks: {failed} ✗, {unknown} ?", checks.len());
        text
    };
    crate::keep_going(write_out(&mut std::io::stdout().lock(), &text))?;
    if failed == 0 {
        Ok(())
    } else {
        Err(Failure::NotDone(format!(
            "{failed} check(s) failed: locks on this deployment can break; see the fixes above"
        )))
    }
}

/// The servers to check, by role; a server that cannot be listed is a ✗ in `checks`.
async fn servers(cli: &Cli, checks: &mut Vec<Check>) -> Result<Vec<(Role, Client)>, Failure> {
    let clients: Vec<Client> = cli
        .url
        .iter()
        .map(|url| open(cli, url))
        .collect::<Result<_, _>>()?;
    if cli.cluster {
        for seed in &clients {
            let Ok(mut connection) = connect(seed).await else {
                continue;
            };
            let mut slots = redis::cmd("CLUSTER");
            slots.arg("SLOTS");
            let ranges: Vec<Value> = match slots.query_async(&mut connection).await {
                Ok(ranges) => ranges,
                Err(error) => {
                    return Err(Failure::Error(format!(
                        "{} does not answer CLUSTER SLOTS ({error}): is it a cluster node? \
                         Leave out --cluster for a single server",
                        address(seed)
                    )))
                }
            };
            return Ok(cluster_masters(&ranges)
                .into_iter()
                .map(|(host, port)| (Role::ClusterMaster, at(seed, host, port)))
                .collect());
        }
        checks.push(none_reachable(cli, Role::ClusterMaster));
        return Ok(Vec::new());
    }
    if let Some(service) = &cli.sentinel {
        for sentinel in &clients {
            let Ok(mut connection) = connect(sentinel).await else {
                continue;
            };
            let master: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(service)
                .query_async(&mut connection)
                .await
                .ok()
                .flatten();
            let Some((host, port)) = master else {
                return Err(Failure::Error(format!(
                    "the sentinel at {} knows no service `{}`: give the name in `sentinel \
                     monitor <name> ...` of the sentinels' configuration",
                    address(sentinel),
                    format::cell(service)
                )));
            };
            let replicas: Vec<Vec<(String, String)>> = redis::cmd("SENTINEL")
                .arg("replicas")
                .arg(service)
                .query_async(&mut connection)
                .await
                .unwrap_or_default();
            // As the library does: the service's servers are reached over TLS when the
            // sentinels are, trusting the same certificates, and without the sentinel's login,
            // which is not theirs.
            let mut servers = vec![(Role::SentinelMaster, service_server(sentinel, &host, port)?)];
            for replica in replicas {
                let field = |name: &str| {
                    replica
                        .iter()
                        .find(|(key, _)| key == name)
                        .map(|(_, value)| value.clone())
                };
                let flags = field("flags").unwrap_or_default();
                if flags.contains("down") || flags.contains("disconnected") {
                    continue;
                }
                if let (Some(ip), Some(port)) = (field("ip"), field("port")) {
                    if let Ok(port) = port.parse() {
                        servers.push((Role::SentinelReplica, service_server(sentinel, &ip, port)?));
                    }
                }
            }
            return Ok(servers);
        }
        checks.push(none_reachable(cli, Role::SentinelMaster));
        return Ok(Vec::new());
    }
    let role = if cli.redlock {
        if clients.len() < 3 {
            return Err(Failure::Error(format!(
                "--redlock needs the URLs of at least 3 independent masters (5 is usual), and \
                 got {}; for a single server leave out --redlock",
                clients.len()
            )));
        }
        Role::RedlockMaster
    } else if clients.len() == 1 {
        Role::Standalone
    } else {
        return Err(Failure::Error(
            "several URLs: add `--cluster` if they are nodes of one Redis Cluster, `--redlock` if \
             they are independent Redlock masters, or `--sentinel SERVICE` if they are \
             sentinels; or give one URL"
                .into(),
        ));
    };
    Ok(clients.into_iter().map(|client| (role, client)).collect())
}

/// A client for `url`, trusting `--tls-ca-cert` when given.
fn open(cli: &Cli, url: &str) -> Result<Client, Failure> {
    #[cfg(feature = "tls")]
    if let Some(path) = &cli.tls_ca_cert {
        let pem = crate::tls::read_ca(path).map_err(Failure::Error)?;
        let certificates = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        };
        return Client::build_with_tls(url, certificates).map_err(|error| bad_url(url, &error));
    }
    #[cfg(not(feature = "tls"))]
    let _ = cli;
    Client::open(url).map_err(|error| bad_url(url, &error))
}

fn bad_url(url: &str, error: &redis::RedisError) -> Failure {
    Failure::Error(format!(
        "`{}` is not a Redis URL ({error}); write it as redis://[user:password@]host[:port][/db] \
         (rediss:// for TLS)",
        redact(url)
    ))
}

/// The client of `seed` (its login, its TLS settings) for another node, at `host:port`.
fn at(seed: &Client, host: String, port: u16) -> Client {
    let info = seed.get_connection_info().clone();
    let mut addr = info.addr().clone();
    match &mut addr {
        ConnectionAddr::Tcp(h, p)
        | ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => {
            *h = host;
            *p = port;
        }
        _ => {}
    }
    Client::open(info.set_addr(addr)).unwrap_or_else(|_| seed.clone())
}

/// The client of a Sentinel service's server at `host:port`, named by the sentinel `sentinel`:
/// over TLS with the sentinel's trust when the sentinel speaks TLS, with no login (the
/// sentinel's own is not the data servers').
fn service_server(sentinel: &Client, host: &str, port: u16) -> Result<Client, Failure> {
    let info = sentinel.get_connection_info().clone();
    let addr = match info.addr().clone() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure,
            tls_params,
        },
        _ => ConnectionAddr::Tcp(host.to_owned(), port),
    };
    let info = info
        .set_addr(addr)
        .set_redis_settings(redis::RedisConnectionInfo::default());
    Client::open(info).map_err(|error| Failure::Error(error.to_string()))
}

/// `host:port` of a client: no login, so no password.
fn address(client: &Client) -> String {
    client.get_connection_info().addr().to_string()
}

async fn connect(client: &Client) -> RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(TIMEOUT))
        .set_response_timeout(Some(TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// The ✗ for a topology none of whose seed URLs (shown without passwords) answered.
fn none_reachable(cli: &Cli, role: Role) -> Check {
    let seeds: Vec<String> = cli.url.iter().map(|url| redact(url)).collect();
    unreachable(seeds.join(", "), role)
}

fn unreachable(server: String, role: Role) -> Check {
    Check {
        server,
        role,
        name: "reachable",
        status: Status::Fail,
        detail: "no server answered".into(),
        fix: Some("check --url (or REDIS_URL), the password, and that the server runs".into()),
    }
}

/// Every check of one server.
async fn check_server(role: Role, client: &Client, prefix: &str, checks: &mut Vec<Check>) {
    let server = address(client);
    let mut add = |name, status, detail: String, fix: Option<String>| {
        checks.push(Check {
            server: server.clone(),
            role,
            name,
            status,
            detail,
            fix,
        });
    };
    let mut connection = match connect(client).await {
        Ok(connection) => connection,
        Err(error) => {
            add(
                "reachable",
                Status::Fail,
                format!("cannot connect: {error}"),
                Some("check the URL, the password, and that the server runs".into()),
            );
            return;
        }
    };
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut connection)
        .await
        .unwrap_or_default();
    let replication: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut connection)
        .await
        .unwrap_or_default();
    let version = field(&info, "redis_version");
    let (status, detail, fix) = version_check(version.as_deref(), field(&info, "valkey_version"));
    add("version", status, detail, fix);

    let (status, detail, fix) = eviction_check(config(&mut connection, "maxmemory*").await);
    add("eviction", status, detail, fix);

    if role != Role::SentinelReplica {
        let (status, detail, fix) =
            persistence_check(role, config(&mut connection, "append*").await);
        add("persistence", status, detail, fix);
        let (status, detail, fix) = replicas_check(
            role,
            &replication,
            &config(&mut connection, "min-replicas-to-write").await,
        );
        add("replicas", status, detail, fix);
        let major = version.as_deref().and_then(major_minor).map(|(m, _)| m);
        let (status, detail, fix) = acl_check(role, major, prefix, &mut connection).await;
        add("acl", status, detail, fix);
    }

    let mut times = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let sent = Instant::now();
        if redis::cmd("PING")
            .query_async::<()>(&mut connection)
            .await
            .is_ok()
        {
            times.push(sent.elapsed());
        }
    }
    times.sort();
    let (status, detail, fix) = match (times.get(times.len() / 2), times.last()) {
        (Some(p50), Some(max)) => {
            let detail = format!("{} PINGs: p50 {p50:.1?}, max {max:.1?}", times.len());
            if *p50 > Duration::from_millis(50) {
                (
                    Status::Unknown,
                    detail,
                    Some(
                        "every lock operation waits at least one round trip: keep Redis near \
                         the workers, and the locks' ttl far above this"
                            .into(),
                    ),
                )
            } else {
                (Status::Ok, detail, None)
            }
        }
        _ => (
            Status::Fail,
            "no PING answered".into(),
            Some("check the network and the server's load".into()),
        ),
    };
    add("latency", status, detail, fix);
}

type Outcome = (Status, String, Option<String>);

/// `name:value` of an `INFO` section.
fn field(info: &str, name: &str) -> Option<String> {
    info.lines().find_map(|line| {
        line.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|value| value.trim().to_owned())
    })
}

fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.').map(|part| part.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

/// `CONFIG GET pattern` as pairs, or the refusal's text.
async fn config(
    connection: &mut MultiplexedConnection,
    pattern: &str,
) -> Result<Vec<(String, String)>, String> {
    let reply: RedisResult<Value> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(pattern)
        .query_async(connection)
        .await;
    let value = reply.map_err(|error| error.to_string())?;
    redis::from_redis_value::<Vec<(String, String)>>(value.clone())
        .or_else(|_| {
            redis::from_redis_value::<std::collections::HashMap<String, String>>(value)
                .map(|map| map.into_iter().collect())
        })
        .map_err(|error| error.to_string())
}

fn setting<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

fn version_check(version: Option<&str>, valkey: Option<String>) -> Outcome {
    let Some(version) = version else {
        return (
            Status::Unknown,
            "INFO server names no redis_version".into(),
            Some(
                "check the server's version by hand: distlock needs Redis 6.2 or newer, or Valkey"
                    .into(),
            ),
        );
    };
    let shown = match valkey {
        Some(valkey) => format!("Valkey {valkey} (redis_version {version})"),
        None => format!("Redis {version}"),
    };
    match major_minor(version) {
        Some(found) if found >= OLDEST => (
            Status::Ok,
            format!(
                "{shown}; distlock needs 6.2 or newer (tested: Redis 6.2.14, 7.0.15, Valkey 8.1.8)"
            ),
            None,
        ),
        Some(_) => (
            Status::Fail,
            format!("{shown}: older than 6.2, which distlock needs"),
            Some("upgrade to Redis 6.2 or newer, or Valkey (see docs/compatibility.md)".into()),
        ),
        None => (
            Status::Unknown,
            format!("{shown}: not a version distlock can read"),
            Some("check by hand that it is Redis 6.2 or newer, or Valkey".into()),
        ),
    }
}

/// The rule of [`Eviction`], shared with the warning at connect.
fn eviction_check(settings: Result<Vec<(String, String)>, String>) -> Outcome {
    let pairs = match settings {
        Ok(pairs) => pairs,
        Err(error) => {
            return (
                Status::Unknown,
                format!("CONFIG GET was refused ({error})"),
                Some(CHECK_BY_HAND.into()),
            )
        }
    };
    match Eviction::from_config(pairs.iter().map(|(n, v)| (n.as_str(), v.as_str()))) {
        Some(eviction) if eviction.can_evict_locks() => (
            Status::Fail,
            format!("{}: {EVICTION_RISK}", eviction.describe()),
            Some(EVICTION_FIX.into()),
        ),
        Some(eviction) => (Status::Ok, eviction.describe(), None),
        None => (
            Status::Unknown,
            "CONFIG GET maxmemory* named no maxmemory-policy".into(),
            Some(CHECK_BY_HAND.into()),
        ),
    }
}

/// A Redlock master that restarts empty gives its vote again: its persistence matters. A
/// single server's is advice.
fn persistence_check(role: Role, settings: Result<Vec<(String, String)>, String>) -> Outcome {
    let pairs = match settings {
        Ok(pairs) => pairs,
        Err(error) => {
            return (
                Status::Unknown,
                format!("CONFIG GET was refused ({error})"),
                Some("check by hand with `redis-cli CONFIG GET append*` as an admin user".into()),
            )
        }
    };
    let appendonly = setting(&pairs, "appendonly").unwrap_or("?");
    let fsync = setting(&pairs, "appendfsync").unwrap_or("?");
    let detail = format!("appendonly {appendonly}, appendfsync {fsync}");
    let redlock = role == Role::RedlockMaster;
    if appendonly == "yes" && fsync == "always" {
        return (Status::Ok, detail, None);
    }
    if appendonly == "yes" {
        return (
            if redlock { Status::Unknown } else { Status::Ok },
            detail,
            redlock.then(|| {
                "a crash can lose the last second of locks, which the master then grants \
                 again: set `appendfsync always`, or keep a restarted master out for one \
                 longest ttl"
                    .into()
            }),
        );
    }
    if redlock {
        (
            Status::Fail,
            format!("{detail}: a master that restarts forgets its locks and votes for them again, so two holders can each get a majority"),
            Some(
                "set `appendonly yes` and `appendfsync always`, or keep a restarted master \
                 out for one longest ttl"
                    .into(),
            ),
        )
    } else {
        (
            Status::Unknown,
            format!("{detail}: a restart forgets every held lock"),
            Some(
                "if a restart must not free locks, set `appendonly yes` (a held lock's body \
                 should check its fencing token or ttl anyway)"
                    .into(),
            ),
        )
    }
}

/// Replicas that a failover may promote lose what the master had not copied yet.
fn replicas_check(
    role: Role,
    replication: &str,
    settings: &Result<Vec<(String, String)>, String>,
) -> Outcome {
    let server_role = field(replication, "role").unwrap_or_default();
    if server_role == "slave" {
        return (
            Status::Fail,
            "this server is a replica: it refuses lock writes".into(),
            Some("point distlock at the master".into()),
        );
    }
    let replicas: u32 = field(replication, "connected_slaves")
        .and_then(|count| count.parse().ok())
        .unwrap_or(0);
    if replicas == 0 {
        return match role {
            Role::SentinelMaster => (
                Status::Unknown,
                "no replica connected: a failover has nowhere to go".into(),
                Some("add a replica for the sentinels to promote".into()),
            ),
            _ => (
                Status::Ok,
                "no replicas: no failover can lose a lock".into(),
                None,
            ),
        };
    }
    let min = match settings {
        Ok(pairs) => setting(pairs, "min-replicas-to-write").and_then(|v| v.parse::<u32>().ok()),
        Err(_) => None,
    };
    match min {
        Some(0) => (
            Status::Unknown,
            format!("{replicas} replica(s), min-replicas-to-write 0: a failover can lose a lock the master had not copied yet, and give it to a second holder"),
            Some(
                "set `min-replicas-to-write 1` (with `min-replicas-max-lag 10`), or have \
                 distlock wait for the copies with `LockManagerBuilder::wait_for_replicas`"
                    .into(),
            ),
        ),
        Some(min) => (
            Status::Ok,
            format!("{replicas} replica(s), min-replicas-to-write {min}"),
            None,
        ),
        None => (
            Status::Unknown,
            format!("{replicas} replica(s); min-replicas-to-write could not be read"),
            Some("check by hand with `redis-cli CONFIG GET min-replicas-to-write`".into()),
        ),
    }
}

/// The commands distlock sends (docs/tls-acl.md), with keys and channels of its own shapes
/// under `prefix`, asked of `ACL DRYRUN` for the connected user.
async fn acl_check(
    role: Role,
    major: Option<u32>,
    prefix: &str,
    connection: &mut MultiplexedConnection,
) -> Outcome {
    let by_hand = "compare `ACL GETUSER <user>` with the minimal ACL in docs/tls-acl.md";
    if major.is_none_or(|major| major < 7) {
        return (
            Status::Unknown,
            "ACL DRYRUN needs Redis 7".into(),
            Some(by_hand.into()),
        );
    }
    let user: String = match redis::cmd("ACL")
        .arg("WHOAMI")
        .query_async(connection)
        .await
    {
        Ok(user) => user,
        Err(error) => {
            return (
                Status::Unknown,
                format!("ACL WHOAMI was refused ({error})"),
                Some(by_hand.into()),
            )
        }
    };
    let key = format!("{prefix}doctor");
    let line = format!("{{{key}}}:distlock:line");
    let lease = format!("{{{key}}}:distlock:lease");
    let fence = format!("{{{key}}}:distlock:fence");
    let wake = format!("{{{key}}}:distlock:wake");
    let waits = format!("{{{key}}}:distlock:waits");
    let channel = "distlock:grants:doctor";
    let mut commands: Vec<Vec<&str>> = vec![
        vec![
            "evalsha",
            "0000000000000000000000000000000000000000",
            "1",
            &key,
        ],
        vec!["eval", "return 1", "1", &key],
        vec!["script", "load", "return 1"],
        vec!["get", &key],
        vec!["set", &key, "v"],
        vec!["del", &key],
        vec!["pexpire", &key, "1000"],
        vec!["pttl", &key],
        vec!["incr", &fence],
        vec!["publish", channel, "m"],
        vec!["subscribe", channel],
        vec!["ping"],
        vec!["time"],
        vec!["lpop", &line],
        vec!["rpush", &line, "w"],
        vec!["rpushx", &line, "w"],
        vec!["lrange", &line, "0", "-1"],
        vec!["lset", &line, "0", "w"],
        vec!["lrem", &line, "0", "w"],
        vec!["lindex", &line, "0"],
        vec!["lpos", &line, "w"],
        vec!["zadd", &lease, "1", "w"],
        vec!["zscore", &lease, "w"],
        vec!["zremrangebyscore", &lease, "0", "1"],
        // Whether several locks taken together are still held: one read of their keys.
        vec!["mget", &key, &line],
        // Deadlock detection's wait records, a hash per lock read and written by scripts.
        vec!["hset", &waits, "w", "v"],
        vec!["hgetall", &waits],
        // The release of a lock nobody waits for: whether anyone is in its line.
        vec!["exists", &line],
    ];
    if role == Role::RedlockMaster {
        commands.push(vec!["zrem", &wake, "w"]);
        commands.push(vec!["zpopmin", &wake]);
    }
    let mut denied = Vec::new();
    for command in &commands {
        let reply: RedisResult<Value> = redis::cmd("ACL")
            .arg("DRYRUN")
            .arg(&user)
            .arg(command)
            .query_async(connection)
            .await;
        match reply {
            Ok(Value::Okay) => {}
            Ok(Value::SimpleString(text)) if text == "OK" => {}
            Ok(other) => {
                let why: String = redis::from_redis_value(other).unwrap_or_default();
                denied.push(format!(
                    "{} ({why})",
                    command[..command.len().min(2)].join(" ")
                ));
            }
            Err(error) => {
                return (
                    Status::Unknown,
                    format!("ACL DRYRUN was refused ({error})"),
                    Some(format!(
                        "run `distlock doctor` as an admin user, or {by_hand}"
                    )),
                )
            }
        }
    }
    if denied.is_empty() {
        (
            Status::Ok,
            format!(
                "user `{}` may run distlock's {} commands",
                format::cell(&user),
                commands.len()
            ),
            None,
        )
    } else {
        (
            Status::Fail,
            format!(
                "user `{}` may not run: {}",
                format::cell(&user),
                denied.join("; ")
            ),
            Some(format!(
                "grant what is missing (`ACL SETUSER {} ...`): the minimal ACL is in \
                 docs/tls-acl.md",
                format::cell(&user)
            )),
        )
    }
}
