//! Redis Sentinel: which server is the master of a service now.
//!
//! A Sentinel deployment is a standalone master with replicas, watched by sentinels that
//! promote a replica when the master fails. Locks live on the master, so everything here asks
//! the sentinels for it whenever a connection is (re)made: the lock connections
//! ([`crate::redis::connection`]) ask again once a command meets a dead, refusing or demoted
//! (read-only) server, and the hand-off subscription ([`crate::backend::grants`]) asks again when its
//! connection drops — a demoted master drops its clients, so both follow a failover.
//!
//! An old master that is still up keeps accepting writes until the sentinels demote it, which
//! can take them seconds after the promotion (they look at it every 10 s). Connections that
//! waited for an error would write there meanwhile, where nobody will read: two holders of one
//! lock, one on each master. So a task also listens to the sentinels' `+switch-master` events,
//! and every connection made before the last switch of our service counts as stale at once.
//!
//! Over TLS (`rediss://` sentinels) the master and every replica it may become are reached over
//! TLS too, trusting the same certificates as the sentinels: a deployment whose sentinels
//! require TLS has data servers that do, and the sentinels name only a host and port.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt;
use redis::sentinel::{
    SentinelClient, SentinelClientBuilder, SentinelNodeConnectionInfo, SentinelServerType,
};
use redis::{
    Client, ConnectionAddr, ConnectionInfo, RedisConnectionInfo, RedisError, RedisResult, TlsMode,
};
use tokio::sync::Notify;

use crate::redis::classify::{classify, Meaning};
use crate::redis::connection::{ConnectError, Timeouts};
use crate::support::retry::Backoff;

/// The sentinels of one service, and how to ask them for its master.
pub(crate) struct Sentinels {
    /// How many switches of the service's master the sentinels have announced since this
    /// manager connected: a connection made at an older count is to a master that is no more.
    switches: AtomicU64,
    /// Signalled at every switch, for the hand-off subscription to move too.
    pub(crate) switched: Notify,
    /// How to reach each sentinel: address, TLS trust and login, from its URL.
    nodes: Vec<ConnectionInfo>,
    service: String,
    /// How to log in to the master (the sentinels' own logins are in their URLs).
    master_login: SentinelNodeConnectionInfo,
    /// The master's login as given, for a TLS lookup, which takes it in pieces.
    login: Option<Login>,
    /// `Some` when the sentinels speak TLS, and so the master does: whether its certificate is
    /// checked, and against which roots.
    tls: Option<MasterTls>,
    timeouts: Timeouts,
}

/// How to reach the master over TLS.
pub(crate) struct MasterTls {
    /// `Secure`, or `Insecure` when every sentinel URL opts out of the check (`#insecure`).
    pub(crate) mode: TlsMode,
    /// The roots the builder was told to trust, if any (else the system's).
    #[cfg(feature = "tls")]
    pub(crate) certificates: Option<redis::TlsCertificates>,
}

/// A user name (empty: the default user) and password for the master.
pub(crate) type Login = (String, String);

impl Sentinels {
    /// Checks the sentinels and the service name without connecting.
    pub(crate) fn new(
        nodes: Vec<ConnectionInfo>,
        service: String,
        master_login: Option<&Login>,
        tls: Option<MasterTls>,
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
            switches: AtomicU64::new(0),
            switched: Notify::new(),
            nodes,
            service,
            master_login: master,
            login: master_login.cloned(),
            tls,
            timeouts,
        };
        sentinels.client().map(drop)?;
        Ok(sentinels)
    }

    /// A fresh client of the sentinels. Fresh on every lookup rather than kept: its connections
    /// to the sentinels would be driven by the runtime of the lookup that made them, and a
    /// global manager outlives runtimes. Lookups are rare (a connect, a failover).
    fn client(&self) -> RedisResult<SentinelClient> {
        match &self.tls {
            None => SentinelClient::build(
                self.nodes.clone(),
                self.service.clone(),
                Some(self.master_login.clone()),
                SentinelServerType::Master,
            ),
            Some(tls) => self.tls_client(tls),
        }
    }

    /// A client of TLS sentinels whose master speaks TLS. Only redis-rs' builder passes
    /// certificates on to the master; it takes one login for every sentinel, the first's
    /// ([`tls_logins_agree`] refuses sentinels that log in differently).
    fn tls_client(&self, tls: &MasterTls) -> RedisResult<SentinelClient> {
        let mut builder = SentinelClientBuilder::new(
            self.nodes.iter().map(|info| info.addr().clone()),
            &self.service,
            SentinelServerType::Master,
        )?
        .set_client_to_redis_tls_mode(tls.mode);
        if let Some(settings) = self.nodes.first().map(ConnectionInfo::redis_settings) {
            if let Some(user) = settings.username() {
                builder = builder.set_client_to_sentinel_username(user);
            }
            if let Some(password) = settings.password() {
                builder = builder.set_client_to_sentinel_password(password);
            }
        }
        if let Some((user, password)) = &self.login {
            builder = builder.set_client_to_redis_password(password);
            if !user.is_empty() {
                builder = builder.set_client_to_redis_username(user);
            }
        }
        #[cfg(feature = "tls")]
        if let Some(certificates) = &tls.certificates {
            builder = builder.set_client_to_redis_certificates(certificates.clone());
        }
        builder.build()
    }

    /// A client for the service's master now: the first sentinel that answers names it, and the
    /// server itself confirms that it is a master. Bounded: a sentinel or a named master that
    /// does not answer fails the lookup after the connect and response timeouts, with a
    /// [`NoMaster`] (no command of ours was sent, so whoever retries knows that nothing ran).
    pub(crate) async fn master(&self) -> Result<Client, ConnectError> {
        let mut client = self.client()?;
        let limit = self.timeouts.connect * 2 + self.timeouts.response * 2;
        match tokio::time::timeout(limit, client.async_get_client()).await {
            Ok(master) => Ok(master?),
            Err(_) => Err(ConnectError::NoMaster(NoMaster {
                service: self.service.clone(),
                waited: limit,
            })),
        }
    }
}

/// The sentinels of `service`, or the master they named, did not answer within `waited`: no
/// master is known to connect to. distlock's own finding, made when its bound on the lookup
/// ran out, not an error that Redis or redis-rs reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NoMaster {
    /// The service whose master was asked for.
    pub(crate) service: String,
    /// How long the lookup waited.
    pub(crate) waited: Duration,
}

impl std::fmt::Display for NoMaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the sentinels of service `{}` (or the master they named) did not answer within {:?}",
            self.service, self.waited
        )
    }
}

impl Sentinels {
    /// The number of master switches announced so far (see [`watch_switches`]).
    pub(crate) fn switches(&self) -> u64 {
        self.switches.load(Ordering::Acquire)
    }
}

/// The pauses between the switch watcher's reconnections to the sentinels.
const SWITCH_WATCH_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_secs(2));

/// Listens to the sentinels' `+switch-master` events for as long as `sentinels` lives, on one
/// sentinel at a time (the next after a failure), and counts those of our service. Runs on the
/// background runtime.
pub(crate) async fn watch_switches(sentinels: Weak<Sentinels>) {
    let mut next = 0usize;
    let mut backoff = SWITCH_WATCH_BACKOFF;
    loop {
        let (client, service, timeouts) = {
            let Some(sentinels) = sentinels.upgrade() else {
                return;
            };
            let sentinel = sentinels.nodes[next % sentinels.nodes.len()].clone();
            next = next.wrapping_add(1);
            (
                Client::open(sentinel),
                sentinels.service.clone(),
                sentinels.timeouts,
            )
        };
        // Either bound running out is a failed subscription like any other: try the next
        // sentinel after a pause.
        let subscribed = async {
            let mut pubsub =
                tokio::time::timeout(timeouts.connect, client.ok()?.get_async_pubsub())
                    .await
                    .ok()?
                    .ok()?;
            tokio::time::timeout(timeouts.response, pubsub.subscribe("+switch-master"))
                .await
                .ok()?
                .ok()?;
            Some(pubsub)
        };
        if let Some(pubsub) = subscribed.await {
            backoff.reset();
            let mut messages = pubsub.into_on_message();
            loop {
                // Woken now and then to notice that the manager is gone.
                match tokio::time::timeout(Duration::from_secs(1), messages.next()).await {
                    Ok(Some(message)) => {
                        let payload: String = message.get_payload().unwrap_or_default();
                        // "<service> <old ip> <old port> <new ip> <new port>"
                        if payload.split(' ').next() == Some(service.as_str()) {
                            match sentinels.upgrade() {
                                Some(sentinels) => {
                                    sentinels.switches.fetch_add(1, Ordering::AcqRel);
                                    sentinels.switched.notify_waiters();
                                    tracing::debug!(target: "distlock", %payload, "the sentinels switched the master; reconnecting");
                                }
                                None => return,
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(_) if sentinels.strong_count() == 0 => return,
                    Err(_) => {}
                }
            }
        }
        tokio::time::sleep(backoff.next_pause()).await;
    }
}

/// How the master is reached given the sentinels' addresses: over TLS when they are, in the
/// mode they ask for. `Err` names the two kinds of address when the sentinels mix TLS with
/// plain connections, which cannot say how to reach the one master.
pub(crate) fn master_tls_mode(sentinels: &[ConnectionInfo]) -> Result<Option<TlsMode>, String> {
    let kind = |info: &ConnectionInfo| match info.addr() {
        ConnectionAddr::TcpTls { insecure, .. } => Some(*insecure),
        _ => None,
    };
    let tls: Vec<bool> = sentinels.iter().filter_map(kind).collect();
    if tls.is_empty() {
        return Ok(None);
    }
    if tls.len() != sentinels.len() {
        return Err(format!(
            "{} of the {} sentinel URLs are `rediss://` (TLS) and the others are not",
            tls.len(),
            sentinels.len()
        ));
    }
    Ok(Some(if tls.iter().all(|&insecure| insecure) {
        TlsMode::Insecure
    } else {
        TlsMode::Secure
    }))
}

/// Whether sentinels reached over TLS can be asked with the one login redis-rs' TLS builder
/// takes for all of them: `Err` says what to write when their URLs log in differently.
pub(crate) fn tls_logins_agree(sentinels: &[ConnectionInfo]) -> Result<(), &'static str> {
    let logins: Vec<(Option<&str>, Option<&str>)> = sentinels
        .iter()
        .map(|info| {
            let settings = info.redis_settings();
            (settings.username(), settings.password())
        })
        .collect();
    if logins.windows(2).any(|pair| pair[0] != pair[1]) {
        return Err(
            "the `rediss://` sentinel URLs log in differently, and sentinels over TLS \
                    must share one login: give every sentinel URL the same user and password",
        );
    }
    Ok(())
}

/// Whether `error` says that a command did not run because the master is not where it was, or
/// not known yet (a failover under way): trying again on the master the sentinels name next
/// cannot run it twice.
pub(crate) fn not_run_for_want_of_a_master(error: &RedisError) -> bool {
    error.is_connection_refusal()
        || crate::redis::classify::no_master_named(error)
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
