//! [`LockManagerBuilder`]: where the locks live (standalone, cluster, Redlock) and how to talk
//! to it.

use std::fmt;
use std::time::Duration;

use crate::backend::Backend;
use crate::connection::{Endpoint, Timeouts};
use crate::keys::LockKeys;
use crate::options::MAX_DURATION;
use crate::{LockError, LockManager};

/// Which Redis deployment a manager locks on.
#[derive(Clone)]
pub(crate) enum Topology {
    Standalone(String),
    Cluster(Vec<String>),
    Redlock(Vec<String>),
}

/// Builds a [`LockManager`]: [`LockManager::builder`], [`LockManager::cluster_builder`] or
/// [`LockManager::redlock_builder`], options, then `.connect().await`. The options are the same
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
            #[cfg(feature = "tls")]
            tls_root_certificate: None,
        }
    }

    /// Prefix of every lock key: the lock named `trace:1` lives at `key_prefix + "trace:1"`.
    /// Default `"lock:"`.
    ///
    /// A lock's helper keys (its waiters key, its fencing counter) are named
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

    /// Connects and checks that Redis answers and lets this user run distlock's scripts (a
    /// majority of the masters, for Redlock), so that a wrong URL, password or ACL fails here
    /// rather than at the first release.
    ///
    /// # Errors
    /// [`LockError::Config`] for a malformed URL, an out-of-range timeout or too few Redlock
    /// masters; [`LockError::Redis`] when Redis cannot be reached within the timeouts or does
    /// not answer like Redis.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), distlock::LockError> {
    /// let manager = distlock::LockManager::builder("redis://127.0.0.1:6379").connect().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(self) -> Result<LockManager, LockError> {
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
        let backend = match &self.topology {
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
        };
        let probe = probe_keys(&self.key_prefix)?;
        let manager = LockManager::new(backend, self.key_prefix, describe(&self.topology));
        manager.backend().ping(&probe).await?;
        Ok(manager)
    }
}

impl LockManagerBuilder {
    /// A client for `url`, or a `Config` error that shows the expected form (password hidden).
    fn open(&self, url: &str) -> Result<redis::Client, LockError> {
        let tls_url = url
            .get(..9)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"));
        let client = match self.tls_certificates() {
            // Refused here, not left to redis-rs: another crate in the build may have turned on
            // redis' TLS support (features unify), and TLS without ours has no crypto provider
            // chosen, so rustls would panic inside the connecting task.
            _ if tls_url && !cfg!(feature = "tls") => Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "TLS is not enabled",
            ))),
            #[cfg(feature = "tls")]
            Some(certificates) => redis::Client::build_with_tls(url, certificates),
            _ => redis::Client::open(url),
        };
        client.map_err(|error| {
            let tls_hint = if tls_url && !cfg!(feature = "tls") {
                "; rediss:// (TLS) needs distlock's `tls` feature"
            } else {
                ""
            };
            LockError::config(format!(
                "`{}` is not a Redis URL ({error}){tls_hint}; write it as \
                 redis://[user:password@]host[:port][/db] (rediss:// for TLS)",
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
    }
}

/// The URL with any password replaced, for messages and logs.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            let hidden = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_owned()
            };
            format!("{}{}{}", &url[..scheme_end + 3], hidden, &rest[at..])
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            redact("redis://app:s3cret@host:6379/0"),
            "redis://app:***@host:6379/0"
        );
        assert_eq!(redact("redis://:s3cret@host"), "redis://:***@host");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact("not a url"), "not a url");
    }
}
