//! Redis Sentinel: which server is the master of a service now.
//!
//! A Sentinel deployment is a standalone master with replicas, watched by sentinels that
//! promote a replica when the master fails. Locks live on the master, so everything here asks
//! the sentinels for it whenever a connection is (re)made: the lock connections
//! ([`crate::connection`]) ask again once a command meets a dead, refusing or demoted
//! (read-only) server, and the hand-off subscription ([`crate::grants`]) asks again when its
//! connection drops — a demoted master drops its clients, so both follow a failover.

use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Client, ErrorKind, RedisConnectionInfo, RedisError, RedisResult};

use crate::classify::{classify, Meaning};
use crate::connection::Timeouts;

/// The sentinels of one service, and how to ask them for its master.
pub(crate) struct Sentinels {
    urls: Vec<String>,
    service: String,
    /// How to log in to the master (the sentinels' own logins are in their URLs).
    master_login: SentinelNodeConnectionInfo,
    timeouts: Timeouts,
}

/// A user name (empty: the default user) and password for the master.
pub(crate) type Login = (String, String);

impl Sentinels {
    /// Checks the URLs and the service name without connecting.
    pub(crate) fn new(
        urls: Vec<String>,
        service: String,
        master_login: Option<&Login>,
        timeouts: Timeouts,
    ) -> RedisResult<Self> {
        let mut master = SentinelNodeConnectionInfo::default();
        if let Some((user, password)) = master_login {
            let mut info = RedisConnectionInfo::default().set_password(password);
            if !user.is_empty() {
                info = info.set_username(user);
            }
            master = master.set_redis_connection_info(info);
        }
        let sentinels = Sentinels {
            urls,
            service,
            master_login: master,
            timeouts,
        };
        sentinels.client().map(drop)?;
        Ok(sentinels)
    }

    /// A fresh client of the sentinels. Fresh on every lookup rather than kept: its connections
    /// to the sentinels would be driven by the runtime of the lookup that made them, and a
    /// global manager outlives runtimes. Lookups are rare (a connect, a failover).
    fn client(&self) -> RedisResult<SentinelClient> {
        SentinelClient::build(
            self.urls.clone(),
            self.service.clone(),
            Some(self.master_login.clone()),
            SentinelServerType::Master,
        )
    }

    /// A client for the service's master now: the first sentinel that answers names it, and the
    /// server itself confirms that it is a master. Bounded: a sentinel or a named master that
    /// does not answer fails the lookup after the connect and response timeouts.
    pub(crate) async fn master(&self) -> RedisResult<Client> {
        let mut client = self.client()?;
        let limit = self.timeouts.connect * 2 + self.timeouts.response * 2;
        match tokio::time::timeout(limit, client.async_get_client()).await {
            Ok(master) => master,
            // Of the lookup's kind, not a timeout: no command of ours was sent, so whoever
            // retries knows that nothing ran.
            Err(_) => Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no master found in time",
                format!(
                    "the sentinels did not name a reachable master of `{}` within {limit:?}",
                    self.service
                ),
            ))),
        }
    }
}

/// Whether `error` says that a command did not run because the master is not where it was, or
/// not known yet (a failover under way): trying again on the master the sentinels name next
/// cannot run it twice.
pub(crate) fn not_run_for_want_of_a_master(error: &RedisError) -> bool {
    error.is_connection_refusal()
        || error.kind() == ErrorKind::MasterNameNotFoundBySentinel
        || classify(error) == Meaning::ReadOnly
}

/// Whether `error` suggests the server is no longer the master: it died, refuses connections,
/// stopped answering, or was demoted to a read-only replica. The next connection asks the
/// sentinels again.
pub(crate) fn master_may_have_moved(error: &RedisError) -> bool {
    error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_io_error()
        || error.is_timeout()
        || classify(error) == Meaning::ReadOnly
}
