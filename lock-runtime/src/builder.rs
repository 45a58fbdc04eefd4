//! [`LockManagerBuilder`]: where the locks live (standalone, cluster, Redlock, Sentinel) and
//! how to talk to it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::keys::LockKeys;
use crate::backend::{Backend, Replicas};
use crate::options::{Timeouts, MAX_DURATION};
use crate::redis::connection::Endpoint;
use crate::redis::sentinel::{MasterTls, Sentinels};
use crate::shared::Shared;
use crate::LockError;

/// Which Redis deployment a manager locks on.
#[derive(Clone)]
pub(crate) enum Topology {
    Standalone(String),
    Cluster(Vec<String>),
    Redlock(Vec<String>),
    Sentinel {
        sentinels: Vec<String>,
        service: String,
    },
}

/// Builds a [`LockManager`](crate::LockManager):
/// [`LockManager::builder`](crate::LockManager::builder),
/// [`LockManager::cluster_builder`](crate::LockManager::cluster_builder),
/// [`LockManager::redlock_builder`](crate::LockManager::redlock_builder) or
/// [`LockManager::sentinel_builder`](crate::LockManager::sentinel_builder), options, then
/// [`.connect().await`](LockManagerBuilder::connect). The options are the same
/// for every deployment; the attribute, the guard and the options never learn which one it is.
///
/// ```no_run
/// # async fn example() -> Result<(), distlock::LockError> {
/// use std::time::Duration;
///
/// let manager = distlock::LockManager::builder("redis://127.0.0.1:6379")
///     .key_prefix("lock:")                          // the default
///     .connect_timeout(Duration::from_secs(2))     // the default
///     .response_timeout(Duration::from_secs(1))    // the default
///     .connect()
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until `.connect().await`"]
pub struct LockManagerBuilder {
    topology: Topology,
    key_prefix: String,
    timeouts: Timeouts,
    node_timeout: Duration,
    /// How many replicas must acknowledge each lock write (`wait_for_replicas`).
    replicas: Option<Replicas>,
    /// Sentinel only: the master's user name and password.
    master_login: Option<crate::redis::sentinel::Login>,
    /// PEM of the certificate authority that signed the servers' certificates, for `rediss://`
    /// servers whose certificate the system's roots do not vouch for.
    #[cfg(feature = "tls")]
    tls_root_certificate: Option<Vec<u8>>,
}

// By hand, not derived: the URLs may carry passwords, which must never reach a log.
impl fmt::Debug for LockManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockManagerBuilder")
            .field("redis", &describe(&self.topology))
            .field("key_prefix", &self.key_prefix)
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

impl LockManagerBuilder {
    pub(crate) fn new(topology: Topology) -> Self {
        LockManagerBuilder {
            topology,
            key_prefix: "lock:".to_owned(),
            timeouts: Timeouts {
                connect: Duration::from_secs(2),
                response: Duration::from_secs(1),
            },
            node_timeout: Duration::from_millis(100),
            replicas: None,
            master_login: None,
            #[cfg(feature = "tls")]
            tls_root_certificate: None,
        }
    }

    /// Prefix of every lock key: the lock named `trace:1` lives at `key_prefix + "trace:1"`.
    /// Default `"lock:"`.
    ///
    /// A lock's helper keys (its line of waiters, its fencing counter) are named
    /// `{<tag>}:distlock:<word>…`, so a full lock key of that shape — one that starts with `{`
    /// and whose first `}` is followed by `:distlock:` — is refused with
    /// [`LockError::Config`], as is the empty key. No name is ever refused under a prefix that
    /// does not start with `{`, such as the default; `connect` refuses a prefix that has that
    /// shape itself.
    ///
    /// ```
    /// let builder = distlock::LockManager::builder("redis://127.0.0.1").key_prefix("app1:lock:");
    /// ```
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// How long to wait for a TCP connection (and Redis handshake). Default 2 s.
    ///
    /// ```
    /// let builder = distlock::LockManager::builder("redis://127.0.0.1")
    ///     .connect_timeout(std::time::Duration::from_millis(500));
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.connect = timeout;
        self
    }

    /// How long to wait for the answer to any one Redis command before failing it. Default 1 s.
    ///
    /// ```
    /// let builder = distlock::LockManager::builder("redis://127.0.0.1")
    ///     .response_timeout(std::time::Duration::from_millis(250));
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.response = timeout;
        self
    }

    /// Redlock only: how long each master may take to answer one lock operation before it
    /// counts as a "no". Keep it far below the ttl, so a slow or stopped master costs little.
    /// Default 100 ms.
    ///
    /// ```
    /// let builder = distlock::LockManager::redlock_builder(&["redis://a", "redis://b", "redis://c"])
    ///     .node_timeout(std::time::Duration::from_millis(50));
    /// ```
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Counts an acquisition, an extension (also an `auto_extend` renewal), a hand-off and a
    /// fencing token only once `n` replicas acknowledged the write, waiting up to `timeout` for
    /// them (Redis's `WAIT n timeout`, sent in the same round trip as the lock's command): a
    /// failover that promotes one of those replicas keeps the lock, and fencing tokens never go
    /// back. For a standalone master with replicas, a Sentinel service, or a Redis Cluster (each
    /// master's own replicas). Not for Redlock, whose majority of independent masters is its
    /// durability: `connect` refuses it there.
    ///
    /// A write that fewer than `n` replicas acknowledged in time is never a weaker lock: an
    /// acquisition gives the lock back and tries again until its `timeout`, then fails with
    /// [`LockError::NotReplicated`]; an extension fails with it (the watchdog of `auto_extend`
    /// takes it for a failed renewal). Releases wait for no replica. `timeout` must be below
    /// `response_timeout` (1 s by default), which bounds the round trip it is part of; `n` at
    /// least 1. `connect` checks that the server accepts `WAIT` (some managed services, an ACL
    /// without `+wait`, a `rename-command` refuse it) and fails with [`LockError::Config`] when
    /// it does not. What it guarantees and does not: docs/backends.md.
    ///
    /// ```
    /// let builder = distlock::LockManager::sentinel_builder(&["redis://10.0.0.1:26379"], "locks")
    ///     .wait_for_replicas(1, std::time::Duration::from_millis(100));
    /// ```
    pub fn wait_for_replicas(mut self, n: u32, timeout: Duration) -> Self {
        self.replicas = Some(Replicas { count: n, timeout });
        self
    }

    /// Sentinel only: log in to the master (and, after a failover, the replica promoted in its
    /// place) as `user` with `password`; an empty `user` is the default user (`requirepass`).
    /// The sentinels' own logins, if any, go in their URLs. Never shown in `Debug` output or
    /// error messages.
    ///
    /// ```
    /// let builder = distlock::LockManager::sentinel_builder(&["redis://10.0.0.1:26379"], "locks")
    ///     .master_login("locker", "s3cret");
    /// ```
    pub fn master_login(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.master_login = Some((user.into(), password.into()));
        self
    }

    /// Trust the certificate authority in `pem` (PEM-encoded) for `rediss://` servers, instead
    /// of the system's root certificates — for a private CA or a self-signed server.
    ///
    /// ```
    /// let ca = b"-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n".to_vec();
    /// let builder = distlock::LockManager::builder("rediss://redis.internal:6380").tls_root_certificate(ca);
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_certificate = Some(pem.into());
        self
    }

    /// Checks the settings, connects, and checks that Redis answers: what
    /// [`LockManagerBuilder::connect`] does, up to the manager it wraps around the result.
    pub(crate) async fn connect_shared(self) -> Result<Shared, LockError> {
        let probe = probe_keys(&self.key_prefix)?;
        let shared = self.build()?;
        shared.backend.ping(&probe).await?;
        shared.backend.check_wait().await?;
        Ok(shared)
    }

    /// Checks the settings and makes a manager's inside from them, without a Redis call (each
    /// connection is made by its first use); with a copy of the settings, so that a process
    /// forked from this one can make its own.
    fn build(&self) -> Result<Shared, LockError> {
        for (name, value) in [
            ("connect_timeout", self.timeouts.connect),
            ("response_timeout", self.timeouts.response),
            ("node_timeout", self.node_timeout),
        ] {
            if value.is_zero() || value > MAX_DURATION {
                return Err(LockError::config(format!(
                    "{name} {value:?} is out of range; use a duration between 1 ms and 365 days"
                )));
            }
        }
        if let Some(replicas) = self.replicas {
            self.check_replicas(replicas)?;
        }
        let mut backend = match &self.topology {
            Topology::Standalone(url) => Backend::standalone(self.open(url)?, self.timeouts),
            Topology::Cluster(urls) => {
                if urls.is_empty() {
                    return Err(LockError::config(
                        "a cluster manager needs the URL of at least one cluster node",
                    ));
                }
                let seeds = urls
                    .iter()
                    .map(|url| self.open(url))
                    .collect::<Result<_, _>>()?;
                let endpoint = Endpoint::cluster(urls, self.timeouts, self.tls_certificates())
                    .map_err(|error| {
                        LockError::config(format!("cannot use these cluster nodes: {error}"))
                    })?;
                Backend::cluster(seeds, endpoint, self.timeouts)
            }
            Topology::Redlock(urls) => {
                if urls.len() < 3 {
                    return Err(LockError::config(format!(
                        "Redlock needs at least 3 independent masters (5 is usual) so that a \
                         majority survives the loss of one, and got {}; for a single server use \
                         `LockManager::builder(url)`",
                        urls.len()
                    )));
                }
                let masters = urls
                    .iter()
                    .map(|url| self.open(url))
                    .collect::<Result<_, _>>()?;
                Backend::redlock(masters, self.timeouts, self.node_timeout)
            }
            Topology::Sentinel { sentinels, service } => {
                if sentinels.is_empty() {
                    return Err(LockError::config(
                        "a Sentinel manager needs the URL of at least one sentinel (three or \
                         more are usual)",
                    ));
                }
                if service.is_empty() {
                    return Err(LockError::config(
                        "a Sentinel manager needs the name of the service whose master holds \
                         the locks (`sentinel monitor <name> ...` in the sentinels' \
                         configuration)",
                    ));
                }
                let sentinels: Vec<redis::ConnectionInfo> = sentinels
                    .iter()
                    .map(|url| Ok(self.open(url)?.get_connection_info().clone()))
                    .collect::<Result<_, LockError>>()?;
                let tls = crate::redis::sentinel::master_tls_mode(&sentinels)
                    .map_err(|mixed| {
                        LockError::config(format!(
                            "{mixed}: write every sentinel URL with the same scheme, \
                             `rediss://` when the sentinels and the master require TLS, \
                             `redis://` when none does"
                        ))
                    })?
                    .map(|mode| {
                        crate::redis::sentinel::tls_logins_agree(&sentinels)
                            .map_err(|differ| {
                                LockError::config(format!("cannot use these sentinels: {differ}"))
                            })
                            .map(|()| mode)
                    })
                    .transpose()?
                    .map(|mode| MasterTls {
                        mode,
                        #[cfg(feature = "tls")]
                        certificates: self.tls_certificates(),
                    });
                let sentinels = Sentinels::new(
                    sentinels,
                    service.clone(),
                    self.master_login.as_ref(),
                    tls,
                    self.timeouts,
                )
                .map_err(|error| {
                    LockError::config(format!("cannot use these sentinels: {error}"))
                })?;
                Backend::sentinel(sentinels, self.timeouts)
            }
        };
        if let Some(replicas) = self.replicas {
            backend.wait_for_replicas(replicas);
        }
        let settings = self.clone();
        Ok(Shared::new(
            backend,
            self.key_prefix.clone(),
            describe(&self.topology),
            Arc::new(move || settings.build()),
        ))
    }
}

impl LockManagerBuilder {
    /// Refuses a `wait_for_replicas` that cannot work: on Redlock, for no replica, or with a
    /// timeout the response timeout would cut short.
    fn check_replicas(&self, replicas: Replicas) -> Result<(), LockError> {
        if matches!(self.topology, Topology::Redlock(_)) {
            return Err(LockError::config(
                "`wait_for_replicas` is not for Redlock: a lock there is held by a majority of \
                 independent masters, which is its durability (a replica promoted on one master \
                 costs one vote, not the lock); leave it out, or use a Sentinel service or a \
                 master with replicas (`LockManager::sentinel_builder`, `LockManager::builder`)",
            ));
        }
        if replicas.count == 0 {
            return Err(LockError::config(
                "`wait_for_replicas(0, ..)` waits for no replica; ask for 1 or more, or leave \
                 `wait_for_replicas` out",
            ));
        }
        // `WAIT` takes whole milliseconds, and reads 0 as "wait forever": a timeout below 1 ms
        // would hold every command of the connection until the replicas answer.
        if replicas.timeout < Duration::from_millis(1) || replicas.timeout >= self.timeouts.response
        {
            return Err(LockError::config(format!(
                "the timeout of `wait_for_replicas` ({:?}) must be at least 1 ms (`WAIT` counts \
                 whole milliseconds, and 0 would wait forever) and below `response_timeout` \
                 ({:?}), which bounds the round trip `WAIT` is part of; raise or lower it, or \
                 raise `response_timeout`",
                replicas.timeout, self.timeouts.response
            )));
        }
        Ok(())
    }

    /// A client for `url`, or a `Config` error that shows the expected form (password hidden).
    fn open(&self, url: &str) -> Result<redis::Client, LockError> {
        let tls_url = url
            .get(..9)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"));
        if tls_url && !cfg!(feature = "tls") {
            // Refused here, not left to redis-rs: another crate in the build may have turned on
            // redis' TLS support (features unify), and TLS without ours has no crypto provider
            // chosen, so rustls would panic inside the connecting task.
            return Err(LockError::config(format!(
                "`{}` needs distlock's `tls` feature, which this build does not have: enable it \
                 (`distlock = {{ version = \"0.1\", features = [\"tls\"] }}` in Cargo.toml), or \
                 connect over plain TCP with a `redis://` URL",
                redact(url)
            )));
        }
        let client = match self.tls_certificates() {
            #[cfg(feature = "tls")]
            Some(certificates) => redis::Client::build_with_tls(url, certificates),
            _ => redis::Client::open(url),
        };
        client.map_err(|error| {
            // A password with one of these cuts the URL short where the parser sees it.
            let password_hint = if url.contains('@') {
                "; in a password, write / ? # @ : as %2F %3F %23 %40 %3A"
            } else {
                ""
            };
            LockError::config(format!(
                "`{}` is not a Redis URL ({error}); write it as \
                 redis://[user:password@]host[:port][/db] (rediss:// for TLS){password_hint}",
                redact(url)
            ))
        })
    }

    /// The extra trust anchors for TLS, when set.
    #[cfg(feature = "tls")]
    fn tls_certificates(&self) -> Option<redis::TlsCertificates> {
        self.tls_root_certificate
            .clone()
            .map(|root_cert| redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root_cert),
            })
    }

    #[cfg(not(feature = "tls"))]
    #[allow(clippy::unused_self)] // same signature as with the `tls` feature
    fn tls_certificates(&self) -> Option<std::convert::Infallible> {
        None
    }
}

/// The keys of the lock that `connect` releases (holding nothing) to check the scripts run.
///
/// Under the key prefix, so an ACL narrowed to the prefix allows it. Its name has no `}` and
/// starts with `_`, which cannot continue `:distlock:`: so the probe key has the reserved shape
/// of a helper key only when the prefix alone has it — and then every lock key would, so the
/// prefix is refused here rather than at the first lock.
fn probe_keys(prefix: &str) -> Result<LockKeys, LockError> {
    LockKeys::new(format!("{prefix}_distlock:connect-probe")).map_err(|_| {
        LockError::config(format!(
            "key prefix `{prefix}` is reserved for distlock's helper keys: every lock key under \
             it starts with `{{`, and its first `}}` is followed by `:distlock:`, the shape of \
             the keys that hold a lock's waiters and fencing counter; use another key prefix"
        ))
    })
}

/// The deployment, passwords hidden, for `Debug` output.
fn describe(topology: &Topology) -> String {
    let list = |urls: &[String]| {
        urls.iter()
            .map(|url| redact(url))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match topology {
        Topology::Standalone(url) => redact(url),
        Topology::Cluster(urls) => format!("cluster [{}]", list(urls)),
        Topology::Redlock(urls) => format!("redlock [{}]", list(urls)),
        Topology::Sentinel { sentinels, service } => {
            format!("sentinel [{}] service `{service}`", list(sentinels))
        }
    }
}

/// The URL with every password hidden (`***`), for messages and `Debug` output.
///
/// Fails safe rather than parsing the URL as redis-rs would: a password may hold characters
/// that end the userinfo early for a URL parser (`/`, `?`, `#`, `@`), the URL may be malformed
/// or lack its scheme, and whatever is shown of a URL that did not parse is shown to help find
/// the mistake, which a password never does. So:
/// - everything between `://` (or the start, without one) and the *last* `@` counts as
///   userinfo: it is hidden but for a user name before its first `:` that looks like one;
/// - the value of every query parameter whose name, decoded and in any case, contains `pass`
///   (`pass` for unix sockets, `password`) is hidden up to the next parameter redis-rs reads
///   (`&db=`, `&user=`, ...), or to the end: a raw `&` may be part of the password.
pub(crate) fn redact(url: &str) -> String {
    let mut hidden = vec![false; url.len()];
    let start = url.find("://").map_or(0, |scheme_end| scheme_end + 3);
    if let Some(at) = url[start..].rfind('@').map(|at| start + at) {
        let userinfo = &url[start..at];
        let shown = match userinfo.find(':') {
            Some(colon) if userinfo[..colon].bytes().all(is_user_name_byte) => colon + 1,
            _ => 0,
        };
        hidden[start + shown..at].fill(true);
    }
    for (separator, _) in url.match_indices(['?', '&']) {
        let name_start = separator + 1;
        let Some(equals) = url[name_start..]
            .find(['=', '&', '#'])
            .map(|end| name_start + end)
        else {
            continue;
        };
        if url.as_bytes()[equals] != b'='
            || !decoded_lowercase(&url[name_start..equals]).contains("pass")
        {
            continue;
        }
        let value_end = next_known_parameter(url, equals + 1).unwrap_or(url.len());
        hidden[equals + 1..value_end].fill(true);
    }
    let mut shown = String::with_capacity(url.len());
    let mut hiding = false;
    for (index, character) in url.char_indices() {
        if hidden[index] {
            if !hiding {
                shown.push_str("***");
            }
            hiding = true;
        } else {
            hiding = false;
            shown.push(character);
        }
    }
    shown
}

/// Whether `byte` may appear in a URL's user name as written (unreserved, percent-encoded or
/// a sub-delimiter other than `&`); anything else suggests the `:` was not the user's.
fn is_user_name_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"-._~%!$'()*+,;=".contains(&byte)
}

/// Where the query parameter after `from` that redis-rs reads begins (its `&`), if any.
fn next_known_parameter(url: &str, from: usize) -> Option<usize> {
    const KNOWN: [&str; 5] = ["db=", "user=", "pass=", "password=", "protocol="];
    url[from..]
        .match_indices('&')
        .map(|(at, _)| from + at)
        .find(|&at| {
            let rest = &url.as_bytes()[at + 1..];
            KNOWN.iter().any(|name| {
                rest.get(..name.len())
                    .is_some_and(|start| start.eq_ignore_ascii_case(name.as_bytes()))
            })
        })
}

/// A query parameter name percent-decoded and in lower case, as far as it is ASCII.
fn decoded_lowercase(name: &str) -> String {
    let bytes = name.as_bytes();
    let mut decoded = String::with_capacity(name.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%')
            .then(|| name.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(char::from(byte.to_ascii_lowercase()));
                index += 3;
            }
            None => {
                decoded.push(char::from(bytes[index].to_ascii_lowercase()));
                index += 1;
            }
        }
    }
    decoded
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the `tls` feature a `rediss://` URL is refused with one thing to do, not as a URL
    /// that is not a Redis URL; the password stays hidden.
    #[cfg(not(feature = "tls"))]
    #[test]
    fn a_rediss_url_without_the_tls_feature_names_the_feature() {
        let url = "rediss://app:s3cret@127.0.0.1:6380";
        let builder = LockManagerBuilder::new(Topology::Standalone(url.to_owned()));
        let Err(LockError::Config(message)) = builder.open(url) else {
            panic!("a rediss:// URL opened without the `tls` feature");
        };
        assert!(
            message.starts_with("`rediss://app:***@127.0.0.1:6380` needs distlock's `tls` feature"),
            "{message}"
        );
        assert!(!message.contains("not a Redis URL"), "{message}");
        assert!(!message.contains("s3cret"), "{message}");
    }

    #[test]
    fn a_wait_for_replicas_that_cannot_work_is_refused_with_the_fix() {
        let redlock = Topology::Redlock(vec![
            "redis://a".into(),
            "redis://b".into(),
            "redis://c".into(),
        ]);
        let standalone = Topology::Standalone("redis://127.0.0.1".into());
        let ms = Duration::from_millis;
        for (topology, n, timeout, says) in [
            (redlock, 1, ms(100), "not for Redlock"),
            (standalone.clone(), 0, ms(100), "ask for 1 or more"),
            (standalone.clone(), 1, ms(0), "below `response_timeout`"),
            // `WAIT 1 0` would wait forever.
            (
                standalone.clone(),
                1,
                Duration::from_micros(500),
                "at least 1 ms",
            ),
            (standalone, 1, ms(1000), "raise `response_timeout`"),
        ] {
            let builder = LockManagerBuilder::new(topology).wait_for_replicas(n, timeout);
            let Err(LockError::Config(message)) = builder.build() else {
                panic!("wait_for_replicas({n}, {timeout:?}) was accepted");
            };
            assert!(message.contains(says), "{message}");
        }
    }

    #[test]
    fn the_probe_works_under_every_prefix_but_those_that_reserve_every_key() {
        const PIECES: [&str; 8] = ["", "{", "}", "x", ":", ":dist", "lock:", ":distlock:"];
        let mut refused = 0;
        for a in PIECES {
            for b in PIECES {
                for c in PIECES {
                    let prefix = format!("{a}{b}{c}");
                    // Every lock key under the prefix has the helper shape.
                    let reserves_all = prefix.starts_with('{')
                        && prefix
                            .split_once('}')
                            .is_some_and(|(_, after)| after.starts_with(":distlock:"));
                    match probe_keys(&prefix) {
                        Ok(_) => assert!(!reserves_all, "{prefix:?}"),
                        Err(LockError::Config(message)) => {
                            assert!(reserves_all, "{prefix:?}: {message}");
                            assert!(message.contains(&format!("key prefix `{prefix}`")));
                            refused += 1;
                        }
                        Err(error) => panic!("{prefix:?}: {error:?}"),
                    }
                }
            }
        }
        assert!(refused > 0);
    }

    #[test]
    fn passwords_never_reach_messages() {
        for (url, shown) in [
            (
                "redis://app:s3cret@host:6379/0",
                "redis://app:***@host:6379/0",
            ),
            ("redis://:s3cret@host", "redis://:***@host"),
            ("redis://host:6379", "redis://host:6379"),
            ("not a url", "not a url"),
            // Characters that end the userinfo early for a URL parser.
            ("redis://app:pa/ss@host", "redis://app:***@host"),
            ("redis://app:p@ss@host/1", "redis://app:***@host/1"),
            ("redis://app:p#ss@host", "redis://app:***@host"),
            (
                "rediss://app:p?ss@[::1]:6380",
                "rediss://app:***@[::1]:6380",
            ),
            // A lone name may be a password written in the wrong place.
            ("redis://s3cret@host", "redis://***@host"),
            // Without a scheme, or with a broken one.
            ("app:s3cret@host:6379", "app:***@host:6379"),
            ("redis:app:s3cret@host", "redis:***@host"),
            ("redis://host/0?u=a@b", "redis://***@b"),
            // Query parameters, in any case or encoding.
            (
                "redis+unix:///run/redis.sock?user=app&pass=s3cret",
                "redis+unix:///run/redis.sock?user=app&pass=***",
            ),
            (
                "unix:///run/redis.sock?pass=s3&cret&db=1",
                "unix:///run/redis.sock?pass=***&db=1",
            ),
            (
                "redis://host/?PassWord=s3cret#x",
                "redis://host/?PassWord=***",
            ),
            (
                "unix:///s?pa%73s=s3cret&Protocol=3",
                "unix:///s?pa%73s=***&Protocol=3",
            ),
            ("unix:///s?pass=p@ss", "unix://***"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }
}
