//! One Redis endpoint — a standalone server or a whole cluster — and the lock operations on it.

//!
//! Every key of a lock shares one hash slot, so each script runs on the one node that owns it,
//! and waiters queue in one line per lock, served first come, first served, each release
//! handing the lock to the next waiter (`scripts::ACQUIRE`, `scripts::RELEASE`). A Redlock
//! master, which cannot hand a lock over on its own, is a `quorum::Master` built on a `Node`.
//!
//! The operations by what they do: taking the lock or a place in line (`acquire`), giving it
//! back, holding or extending it (`release`), looking at it (`look`). The entry points the
//! dispatch calls, `Node::attempt` and `Node::release`, are in `remembered`, with what this
//! manager remembers of each lock (a key just handed over, its last place in line, Redis's
//! clock) that they read and keep up to date around the operations above.

mod acquire;
mod leased;
mod look;
mod release;
mod remembered;
mod together;
mod waits;

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use redis::{RedisResult, Value};

use super::failure::{self, Failure};
use super::recent::Contended;
use super::replicas::Replicas;
use super::{Capabilities, Together, Unlock};
use crate::backend::keys::LockKeys;
use crate::redis::connection::{ConnectError, Connection, Connections};
use crate::support::cold;
pub(crate) use acquire::set_nx;
pub(crate) use look::{LeasedLook, Look, ScanTarget};

/// One endpoint: its per-runtime connections and the lock scripts run on them.
pub(crate) struct Node {
    connections: Arc<Connections>,
    /// What this manager recently learned of each lock (see `remembered`); a Redlock master's
    /// stays empty, as its operations are the quorum's.
    contended: Contended,
    /// Redis refused the one-command join (`RPUSHX`): joins run the acquire script.
    join_refused: AtomicBool,
    /// Redis refused the release of a lock held alone its read of the line (`EXISTS`):
    /// releases run the full release script.
    pub(super) alone_refused: AtomicBool,
    /// How many replicas must acknowledge a lock or an extension (`wait_for_replicas`).
    replicas: Option<Replicas>,
}

/// May a command be sent twice? Each operation names its rule where it sends the command, and
/// [`Node::sends_again`] applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Never sent again: a second run whose first reached the server would answer falsely (a
    /// release without the `released` marker, or Redlock's release and hold, which have none,
    /// would find the lock gone and report it lost).
    AtMostOnce,
    /// Runs the same twice: an extension, a forced release (its `forced` mark knows the first
    /// run), a Redlock vote, a first try (which finds the lock its first run took), a waiter
    /// leaving the line.
    Idempotent,
    /// Carries the lock's `released` marker, by which a second run learns what the first did
    /// (see `scripts::RELEASE`, `scripts::HOLD`).
    Marked,
}

impl Node {
    pub(crate) fn new(connections: Arc<Connections>) -> Self {
        Node {
            connections,
            contended: Contended::default(),
            join_refused: AtomicBool::new(false),
            alone_refused: AtomicBool::new(false),
            replicas: None,
        }
    }

    /// Counts a lock or an extension only once `replicas` acknowledged it.
    pub(crate) fn wait_for_replicas(&mut self, replicas: Replicas) {
        self.replicas = Some(replicas);
    }

    /// This runtime's connection to the endpoint (see [`Connections::get`]); not an `async fn`
    /// of its own, which would add a layer to every command's future.
    pub(crate) fn connection(&self) -> impl Future<Output = Result<Connection, ConnectError>> + '_ {
        self.connections.get()
    }

    #[cfg(feature = "resource-counts")]
    pub(crate) fn connections(&self) -> &Connections {
        &self.connections
    }

    /// What a single endpoint can do: issue fencing tokens from its one counter, hand a lock
    /// over by a message; a cluster's connection re-sends commands by itself, any other keeps a
    /// waiter's place through a dropped connection.
    pub(crate) fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: true,
            hands_over: true,
            resends_commands: self.resends_commands(),
            waits_for_replicas: self.waits_for_replicas(),
            keeps_place_on_drop: !self.resends_commands(),
            leases: true,
            // One server holds every key; a cluster's script reaches the keys of one slot.
            together: if self.connections.is_cluster() {
                Together::SameSlot
            } else {
                Together::Always
            },
            detects_deadlocks: true,
        }
    }

    /// Whether this endpoint's connection sends a command again after losing its reply.
    pub(crate) fn resends_commands(&self) -> bool {
        self.connections.is_cluster()
    }

    /// Runs `operation`, and once more — on the connection made anew — when its connection had
    /// dropped (see `classify::connection_dropped`) and `rule` allows it (see [`Resend`]): else
    /// a lock released after a long idle section would stay taken until its ttl, and every
    /// waiter with it. A cluster connection sends commands again by itself.
    pub(crate) async fn send<T, F>(
        &self,
        rule: Resend,
        operation: impl Fn() -> F,
    ) -> failure::Result<T>
    where
        F: std::future::Future<Output = failure::Result<T>>,
    {
        match operation().await {
            Err(first) if self.sends_again(rule, &first) => after_resend(first, operation().await),
            other => other,
        }
    }

    /// The rule of a release or hold that leaves the lock to another: [`Resend::Marked`] when
    /// its connection may have been closed for being idle, the one case where a drop is
    /// likely; else [`Resend::AtMostOnce`], as a release without the marker would, run twice,
    /// find the lock gone and report it lost.
    pub(crate) fn release_rule(&self) -> Resend {
        if self.may_be_idle_closed() {
            Resend::Marked
        } else {
            Resend::AtMostOnce
        }
    }

    /// How long a release sent by `rule` on `connection` is remembered in its lock's marks,
    /// so that a second run answers as the first: where it may run twice, that is on a
    /// cluster (whose connection sends a command again by itself) or when `rule` is
    /// [`Resend::Marked`]; `None` elsewhere.
    pub(super) fn resend_window_of(
        &self,
        connection: &Connection,
        rule: Resend,
    ) -> Option<Duration> {
        (matches!(connection, Connection::Cluster(_)) || rule == Resend::Marked)
            .then(|| self.connections.resend_window())
    }

    /// Whether this runtime's connection has gone unused long enough that a server may have
    /// closed it for being idle: Redis counts its `timeout` in whole seconds. (Not on a
    /// cluster, whose connection sends a command again by itself.)
    fn may_be_idle_closed(&self) -> bool {
        !self.resends_commands() && self.connections.idle_for() >= IDLE_CLOSE_POSSIBLE
    }

    /// The one answer to "is this request sent again?": when `rule` allows a second run, its
    /// connection dropped, and the endpoint's connection does not send it again by itself.
    pub(crate) fn sends_again(&self, rule: Resend, error: &Failure) -> bool {
        let again =
            rule != Resend::AtMostOnce && !self.resends_commands() && error.connection_dropped();
        if again {
            tracing::debug!(target: "distlock", %error, "connection dropped; sending once more on a new one");
        }
        again
    }

    /// `result`, with a `WRONGTYPE` error that names no key — Redis's own, from a command
    /// inside a lock script — made into one that names the key at fault: the lock's keys are
    /// read one by one (`GET`, `LRANGE` for the line: commands the lock scripts run anyway, so
    /// allowed by their ACL) until one answers `WRONGTYPE`. Only on that error: it costs
    /// nothing otherwise. The error is kept as it was when no key answers so by then.
    pub(crate) async fn naming_the_key<T>(
        &self,
        keys: &LockKeys,
        result: failure::Result<T>,
    ) -> failure::Result<T> {
        match result {
            Err(Failure::Redis(error))
                if crate::redis::classify::classify(&error)
                    == crate::redis::classify::Meaning::WrongType
                    && !crate::redis::classify::wrong_type_named(&error, "distlock:") =>
            {
                // Boxed: every lock operation carries this future, and only this rare error
                // looks at the keys.
                Err(cold::boxed(|| self.name_the_key(keys, error)).await)
            }
            other => other,
        }
    }

    /// The error of [`Node::naming_the_key`] for `error`, a `WRONGTYPE` that names no key.
    async fn name_the_key(&self, keys: &LockKeys, error: redis::RedisError) -> Failure {
        let Ok(mut connection) = self.connection().await else {
            return error.into();
        };
        let (line, fence, released, forced) =
            (keys.line(), keys.fence(), keys.released(), keys.forced());
        let candidates = [
            (&*keys.lock, None),
            (line.as_str(), Some("line of waiters")),
            (fence.as_str(), Some("fencing counter")),
            (released.as_str(), Some("`released` marker")),
            (forced.as_str(), Some("`forced` mark")),
        ];
        for (key, helper) in candidates {
            let read = if helper == Some("line of waiters") {
                let mut cmd = redis::cmd("LRANGE");
                cmd.arg(key).arg(0).arg(0);
                cmd
            } else {
                let mut cmd = redis::cmd("GET");
                cmd.arg(key);
                cmd
            };
            let answer: RedisResult<Value> = read.query_async(&mut connection).await;
            let Err(looked) = answer else { continue };
            if !crate::redis::classify::is_wrong_type_reply(&looked) {
                continue;
            }
            let detail = match helper {
                None => format!(
                    "distlock: the lock key {key} holds a value of another type, not a lock"
                ),
                Some(role) => format!(
                    "distlock: the {role} {key} of the lock {lock} {HELPER_OF_ANOTHER_TYPE}; \
                     delete it",
                    lock = keys.lock
                ),
            };
            // A leased set at the lock key is a semaphore or readers: the name is used another
            // way elsewhere, which the caller is told as such.
            if helper.is_none() {
                if let Some(found) = self.leased_marker(keys).await {
                    return failure::used_otherwise(keys, found);
                }
            }
            return redis::make_extension_error("WRONGTYPE".to_owned(), Some(detail)).into();
        }
        error.into()
    }

    /// Checks that the endpoint answers as Redis does and lets us run the lock scripts: a
    /// `PING`, then the release scripts on a probe key with a token that matches nothing (they
    /// delete nothing, and are loaded for the first real release).
    pub(crate) async fn ping(&self, probe: &LockKeys) -> failure::Result<()> {
        let mut connection = self.connection().await?;
        redis::cmd("PING")
            .query_async::<()>(&mut connection)
            .await?;
        self.unlock(probe, "no token matches this", Unlock::Release, None)
            .await?;
        self.release_alone(probe, "no token matches this")
            .await
            .map(drop)
    }

    /// With `wait_for_replicas`, checks that the server runs `WAIT` (see `Replicas::check`).
    pub(crate) async fn check_wait(&self) -> Result<(), crate::LockError> {
        match &self.replicas {
            Some(replicas) => {
                let mut connection = self.connection().await.map_err(Failure::from)?;
                replicas.check(&mut connection).await
            }
            None => Ok(()),
        }
    }

    /// Gives back a lock that too few replicas acknowledged (and the place in line of its
    /// token, if any): the error that says so. Should the give-back fail, the lock expires at
    /// the end of its ttl.
    async fn not_acknowledged(
        &self,
        keys: &LockKeys,
        token: &str,
        acknowledged: u32,
        replicas: Replicas,
    ) -> Failure {
        if let Err(error) = self.unlock(keys, token, Unlock::Leave, None).await {
            tracing::debug!(target: "distlock", key = %keys.lock, %error, "could not give back a lock too few replicas acknowledged; it expires with its ttl");
        }
        tracing::debug!(target: "distlock", key = %keys.lock, acknowledged, wanted = replicas.count, "too few replicas acknowledged the lock; given back");
        Failure::NotReplicated {
            key: keys.lock.to_string(),
            acknowledged,
            wanted: replicas.count,
        }
    }

    /// Whether locks count only once replicas acknowledged them.
    pub(crate) fn waits_for_replicas(&self) -> bool {
        self.replicas.is_some()
    }
}

/// Whether `error` is one that [`Node::naming_the_key`] made to name a helper key of the
/// lock (its line, fencing counter or a marker) that holds another type: the lock itself may
/// be held all the same.
pub(crate) fn names_a_helper(error: &redis::RedisError) -> bool {
    crate::redis::classify::names_a_helper_key(error, HELPER_OF_ANOTHER_TYPE)
}

/// What [`Node::naming_the_key`] says of a helper key of another type (and what
/// [`names_a_helper`] looks for).
pub(super) const HELPER_OF_ANOTHER_TYPE: &str =
    "holds a value of another type: something other than distlock wrote that key";

/// How long a connection must have gone unused before a server may have closed it for being
/// idle (see [`Node::may_be_idle_closed`]).
pub(super) const IDLE_CLOSE_POSSIBLE: Duration = Duration::from_secs(1);

/// The failure of a lock script that answered `reply`, which it never answers.
pub(super) fn unexpected_reply(what: &'static str, reply: &[i64]) -> Failure {
    Failure::UnexpectedReply {
        what,
        reply: format!("{reply:?}"),
    }
}

/// The failure of a fencing token below 1, naming the counter.
pub(super) fn bad_fence(counter: String, value: i64) -> Failure {
    Failure::FencingBroken {
        counter,
        value: Some(value),
    }
}

/// Whether `PUBLISH` on `connection` answers how many of the waiters' connections received the
/// message, which tells a dead waiter (see `scripts::LINE_PRELUDE`): everywhere but on a
/// cluster, which forwards a publish to every node and counts only the receivers on the one
/// the lock lives on.
pub(super) fn counts_receivers(connection: &Connection) -> bool {
    !matches!(connection, Connection::Cluster(_))
}

pub(crate) fn flag(on: bool) -> &'static str {
    if on {
        "1"
    } else {
        "0"
    }
}

/// The outcome of a request sent once more after its first send failed with `first` (its
/// connection dropped, so it may have run): the second send's when it took the lock, or was
/// refused for what it found at the lock's keys (which the first would have met too). Any other
/// failure of the second — its connection refused, no master, an error from the handshake or
/// from a server not ready (`NOAUTH`, `LOADING`, `READONLY`) — says nothing of the first, which
/// may have taken the lock: the first's error is returned, and the caller cleans up after it.
pub(crate) fn after_resend<T>(first: Failure, second: failure::Result<T>) -> failure::Result<T> {
    match second {
        Err(second) if !second.refused_for_what_it_found() && !second.may_have_run() => Err(first),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::options::Timeouts;
    use crate::redis::connection::Endpoint;

    /// A standalone endpoint that is never contacted.
    fn standalone() -> Node {
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            response: Duration::from_secs(1),
        };
        Node::new(Connections::new(Endpoint::Standalone(client), timeouts))
    }

    fn io(kind: std::io::ErrorKind) -> Failure {
        Failure::from(redis::RedisError::from(std::io::Error::from(kind)))
    }

    /// How many times `Node::send` runs an operation that fails with `error` each time.
    async fn runs(node: &Node, rule: Resend, error: &Failure) -> usize {
        let count = AtomicUsize::new(0);
        let result: failure::Result<()> = node
            .send(rule, || async {
                count.fetch_add(1, Ordering::Relaxed);
                Err(error.clone())
            })
            .await;
        assert!(result.is_err());
        count.into_inner()
    }

    /// The resend rule as each operation relies on it: a command that must run at most once
    /// (an unmarked release, a Redlock release or hold, a join, a look in line) is never sent
    /// twice; the others are sent once more only when their connection dropped — never after a
    /// refused connection (nothing was sent), a timeout (the connection is still there, and the
    /// command may still run on it), an answer, or a store's own failure.
    #[tokio::test]
    async fn only_a_command_allowed_to_run_twice_is_sent_again_and_only_after_a_drop() {
        use std::io::ErrorKind;
        let node = standalone();
        let dropped = io(ErrorKind::ConnectionReset);
        let answered = Failure::from(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "ERR",
            "an answer".to_owned(),
        )));
        let no_quorum = Failure::NoQuorum {
            masters: 5,
            answered: 2,
            needed: 3,
            last_error: String::new(),
        };
        for (rule, twice) in [
            (Resend::AtMostOnce, false),
            (Resend::Idempotent, true),
            (Resend::Marked, true),
        ] {
            assert_eq!(
                runs(&node, rule, &dropped).await,
                if twice { 2 } else { 1 },
                "{rule:?} after a dropped connection"
            );
            for other in [
                io(ErrorKind::ConnectionRefused),
                io(ErrorKind::TimedOut),
                answered.clone(),
                no_quorum.clone(),
            ] {
                assert_eq!(
                    runs(&node, rule, &other).await,
                    1,
                    "{rule:?} after {other:?}"
                );
            }
        }
        // A release or hold on a connection in use is sent once: unmarked, a second run that
        // followed a first one that did reach Redis would find the lock gone.
        assert_eq!(node.release_rule(), Resend::AtMostOnce);
    }

    /// A second send that may not have run, for any reason but a refusal for what it found,
    /// leaves the first send's error, which may have run: the caller cleans up after it.
    #[test]
    fn a_resend_that_says_nothing_of_the_first_keeps_the_first_sends_error() {
        use redis::{ErrorKind, RedisError, ServerErrorKind};
        let seconds: Vec<(&str, Failure)> = vec![
            ("refused", io(std::io::ErrorKind::ConnectionRefused)),
            (
                "no master",
                RedisError::from((ErrorKind::MasterNameNotFoundBySentinel, "no master")).into(),
            ),
            (
                "DNS",
                RedisError::from(std::io::Error::other(
                    "failed to lookup address information",
                ))
                .into(),
            ),
            (
                "AUTH in the handshake",
                RedisError::from((ErrorKind::AuthenticationFailed, "auth failed")).into(),
            ),
            (
                "READONLY",
                RedisError::from((
                    ErrorKind::Server(ServerErrorKind::ReadOnly),
                    "read only replica",
                ))
                .into(),
            ),
        ];
        for (what, second) in seconds {
            let outcome = after_resend::<()>(io(std::io::ErrorKind::ConnectionReset), Err(second));
            assert!(
                matches!(&outcome, Err(error) if error.may_have_run()),
                "after a second send failed ({what}): {outcome:?}"
            );
        }
    }

    /// A second send refused for what it found answers for the first too; one that took the
    /// lock is the answer.
    #[test]
    fn a_resend_refused_for_what_it_found_or_answered_is_the_answer() {
        let first = || io(std::io::ErrorKind::ConnectionReset);
        // As Redis 7 and Valkey reply to a script meeting a key of another type, and Redis 6.2.
        for reply in [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "ERR Error running script (call to f_9e5f): @user_script:1: WRONGTYPE Operation \
             against a key holding the wrong kind of value",
        ] {
            let wrong_type = redis::parse_redis_value(format!("-{reply}\r\n").as_bytes())
                .expect("an error line parses")
                .extract_error()
                .expect_err("an error line is an error");
            let outcome = after_resend::<()>(first(), Err(wrong_type.into()));
            assert!(
                matches!(&outcome, Err(error) if error.refused_for_what_it_found()),
                "{reply}: {outcome:?}"
            );
        }
        let usage = Failure::Usage("held as a semaphore".to_owned());
        let outcome = after_resend::<()>(first(), Err(usage));
        assert!(matches!(outcome, Err(Failure::Usage(_))), "{outcome:?}");
        assert!(matches!(after_resend(first(), Ok(7)), Ok(7)));
    }
}
