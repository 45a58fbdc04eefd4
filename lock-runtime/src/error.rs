//! [`LockError`]: everything that can go wrong, each message saying what to do about it.

use std::time::Duration;

/// The error type of every fallible distlock operation.
///
/// Every message says what happened and what to do. The lock attribute hands it to the caller
/// as `E::from(LockError)`, so give your error type a `From<LockError>` impl (or use
/// `std::io::Error`, `Box<dyn Error + Send + Sync>` or `anyhow::Error`, which already have one).
///
/// ```
/// use distlock::LockError;
/// use std::time::Duration;
///
/// let error = LockError::Timeout { key: "lock:trace:1".into(), waited: Duration::from_secs(10) };
/// assert!(error.to_string().contains("lock:trace:1"));
/// let io: std::io::Error = error.into();
/// assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// A locked function ran before the global client was installed.
    #[error(
        "distlock is not initialized: call `distlock::init(\"redis://host:port\").await` (or \
         `distlock::blocking::init(..)` in synchronous code) once at startup, before any \
         `#[distributed_lock]` function runs"
    )]
    NotInitialized,

    /// `init` or `init_with` was called when a global client was already installed.
    #[error(
        "distlock is already initialized: call `distlock::init` once at startup; to talk to \
         another Redis, build a `LockManager` and use it directly"
    )]
    AlreadyInitialized,

    /// The lock was still held by someone else when the `timeout` ran out.
    #[error(
        "timed out after {} waiting for lock `{key}`: another worker holds it; raise \
         `timeout`, or retry later",
        readable(*.waited)
    )]
    Timeout {
        /// The full Redis key of the lock (for `acquire_all`, the one still held; for locks
        /// taken together by one script, each of them, joined by `, `).
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The lock stopped being this holder's before it was done with it; `cause` says why, and
    /// the message what to do about that cause.
    ///
    /// Match it with `LockError::Lost { key, .. }`: more fields may come.
    #[error("lock `{key}` was lost: {advice}", advice = lost_advice(*.cause))]
    Lost {
        /// The full Redis key of the lock.
        key: String,
        /// Why it was lost.
        cause: LostCause,
    },

    /// One attempt found the lock held by someone else: a function with `on_busy = "fail"`
    /// does not wait for it.
    #[error(
        "lock `{key}` is held by another worker and this call does not wait (`on_busy = \"fail\"`); \
         retry later, use `on_busy = \"skip\"` to return without running, or `on_busy = \"wait\"` \
         to wait up to `timeout`"
    )]
    Busy {
        /// The full Redis key of the lock.
        key: String,
    },

    /// Waiting for lock `key` would never end: its holder waits, directly or through other
    /// holders, for a lock this task holds. `cycle` names the locks around the wait-for cycle,
    /// from `key` to the lock of this task that closes it, each with its holder (label, or
    /// process and host). One waiter of a cycle gets this error — the one that began waiting
    /// last — so the others go on once it gives its locks back (a `#[distributed_lock]` body
    /// returns the error and releases). Detected on standalone, Sentinel, Cluster and the
    /// in-process store, for locks held inside a guard's scope and the keys an `acquire_all`
    /// holds while it waits for the rest (docs/deadlocks.md).
    ///
    /// ```
    /// let error = distlock::LockError::Deadlock {
    ///     key: "lock:b".into(),
    ///     cycle: vec!["lock:b (held by worker-2)".into(), "lock:a (held by worker-1)".into()],
    /// };
    /// assert!(error.to_string().contains("one order"));
    /// ```
    #[error(
        "deadlock: waiting for lock `{key}` would never end, because {}; this waiter gave up \
         so that the others of the cycle can go on: take these locks in one order everywhere \
         (sort their names), or take them together (`keys = [..]`), and run the work again",
        cycle.join(", which waits for ")
    )]
    Deadlock {
        /// The full Redis key of the lock this waiter asked for.
        key: String,
        /// The locks around the cycle, from `key` to the one this task holds, each as
        /// ``"<full key> (held by <holder>)"``.
        cycle: Vec<String>,
    },

    /// Redis could not be reached or answered with an error.
    #[error("Redis error: {0}; {hint}", hint = crate::redis::classify::advice(.0))]
    Redis(#[source] redis::RedisError),

    /// Redis did not answer within a bound distlock sets itself, where no Redis error says
    /// so: the sentinels of a Sentinel service (or the master they named) within twice the
    /// connect and response timeouts, or a Redlock master within the per-node timeout. Timeouts
    /// that redis-rs reports (a connection's `connect_timeout` and `response_timeout`) are
    /// [`LockError::Redis`] errors.
    ///
    /// Match it with `LockError::NoAnswer { .. }`: more fields may come.
    ///
    /// ```
    /// use distlock::LockError;
    /// use std::time::Duration;
    ///
    /// let error = LockError::NoAnswer {
    ///     what: "the sentinels of service `locks` (or the master they named)".into(),
    ///     waited: Duration::from_secs(6),
    /// };
    /// assert!(error.to_string().contains("did not answer within 6.0s"));
    /// let io: std::io::Error = error.into();
    /// assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
    /// ```
    #[error(
        "{what} did not answer within {}: check that it runs and is reachable from this host \
         (network, server load); if it is only slow, raise the manager's timeouts \
         (`connect_timeout`, `response_timeout` of its builder; `node_timeout` for Redlock \
         masters)",
        readable(*.waited)
    )]
    NoAnswer {
        /// What did not answer.
        what: String,
        /// How long distlock waited for it.
        waited: Duration,
    },

    /// Fewer replicas than `wait_for_replicas` asks for acknowledged a lock write in time, so
    /// the write does not count: an acquisition gave the lock back and tried again until its
    /// `timeout`; an extension (or an `auto_extend` renewal) could not make sure the lock
    /// survives a failover.
    ///
    /// Match it with `LockError::NotReplicated { key, .. }`: more fields may come.
    #[error(
        "lock `{key}`: {acknowledged} of the {wanted} replicas that `wait_for_replicas` asks \
         for acknowledged the write in time, so it does not count (a failover could lose it); \
         check that the replicas run and keep up (`INFO replication` on the master: \
         `connected_slaves`, each replica's `lag`), raise the timeout of `wait_for_replicas`, \
         or ask for fewer replicas"
    )]
    NotReplicated {
        /// The full Redis key of the lock.
        key: String,
        /// How many replicas acknowledged the write.
        acknowledged: u32,
        /// How many `wait_for_replicas` asks for.
        wanted: u32,
    },

    /// Fewer Redlock masters than a majority answered, so no lock can be granted, released or
    /// confirmed (a Redlock manager only).
    ///
    /// Match it with `LockError::NoQuorum { .. }`: more fields may come.
    #[error(
        "only {answered} of {masters} Redlock masters answered, and a majority ({needed}) is \
         needed (last error: {last_error}); bring masters back or check the URLs"
    )]
    NoQuorum {
        /// How many masters the manager was built with.
        masters: usize,
        /// How many answered.
        answered: usize,
        /// How many make a majority.
        needed: usize,
        /// The last error a master gave.
        last_error: String,
    },

    /// Redlock masters that did not answer may still hold the lock for this holder: a majority
    /// can neither be confirmed nor ruled out, so whether the lock is still its own is unknown
    /// (a Redlock manager only).
    ///
    /// Match it with `LockError::QuorumUndecided { .. }`: more fields may come.
    #[error(
        "{confirmed} of {masters} Redlock masters confirmed and {silent} did not answer, which \
         may still hold the lock: a majority ({needed}) can neither be confirmed nor ruled out \
         (last error: {last_error}); treat the lock as possibly lost, bring the silent masters \
         back (or check the URLs), then try again"
    )]
    QuorumUndecided {
        /// How many masters the manager was built with.
        masters: usize,
        /// How many confirmed.
        confirmed: usize,
        /// How many did not answer.
        silent: usize,
        /// How many make a majority.
        needed: usize,
        /// The last error a master gave.
        last_error: String,
    },

    /// The lock's fencing counter could not issue a token (it holds something other than a
    /// number of at least 1), so the lock was not given to this caller, or passed on.
    ///
    /// Match it with `LockError::FencingBroken { .. }`: more fields may come.
    #[error(
        "the fencing counter {counter} could not issue a token (it gave {found}), so the lock \
         was not taken; set the counter above the largest token your storage has accepted, or \
         delete it if no storage has seen its tokens"
    )]
    FencingBroken {
        /// The counter's Redis key.
        counter: String,
        /// What it gave.
        found: String,
    },

    /// The server answered a lock command with a reply that no Redis server gives it: the
    /// endpoint is something other than Redis (a proxy, another server speaking its protocol)
    /// that does not run the lock scripts as Redis does.
    ///
    /// Match it with `LockError::UnexpectedReply { .. }`: more fields may come.
    #[error(
        "{what} answered {reply}, which Redis never answers: point the URL at a Redis (or \
         Valkey) server, not a proxy or another server that speaks its protocol"
    )]
    UnexpectedReply {
        /// The command or script.
        what: String,
        /// Its reply.
        reply: String,
    },

    /// A setting is out of range or malformed (URL, ttl, timeout, ...), a lock key is
    /// refused (empty, or reserved for distlock's helper keys), or a guard was used in a
    /// process forked from the one that took its lock (only that process holds it).
    #[error("invalid distlock configuration: {0}")]
    Config(String),

    /// A `distlock::blocking` call (or a `#[distributed_lock]` plain `fn`) was made on a thread
    /// where a tokio runtime is current: inside a task, or in `spawn_blocking`. Blocking a
    /// runtime's worker thread can keep the very tasks that would release the lock from
    /// running, and tokio offers no way to tell a worker thread from a `spawn_blocking` one, so
    /// both are refused, at once.
    #[error(
        "distlock::blocking::{call} was called at {location} on a thread where a tokio runtime \
         is current (inside a task, or in `spawn_blocking`, which distlock cannot tell apart), \
         where blocking can keep the tasks that would release the lock from running; in async \
         code use the async API (`distlock::LockManager`, or `.as_async()` of the blocking \
         manager) and `.await` it; in `spawn_blocking`, run the async API with \
         `tokio::runtime::Handle::current().block_on(..)`, or move the synchronous code to a \
         `std::thread`"
    )]
    InsideAsyncRuntime {
        /// The blocking call, as `LockManager::acquire`.
        call: &'static str,
        /// Where in the caller's code it was made.
        location: &'static std::panic::Location<'static>,
    },

    /// A locked function ran without a global manager because the program's `init` failed
    /// earlier (and the program went on): the cause of that failure.
    #[error(
        "{call} failed earlier, so there is no global lock manager: {cause}; fix that and call \
         `{call}` again (stop at startup when it fails, rather than running on without locks)"
    )]
    InitFailed {
        /// The call that failed: `distlock::init` or `distlock::blocking::init`.
        call: &'static str,
        /// Its error's message.
        cause: String,
    },
}

/// Why a holder lost its lock: the [`LockError::Lost`] it is told carries one.
///
/// ```
/// use distlock::{LockError, LostCause};
///
/// let error = LockError::Lost { key: "lock:report".into(), cause: LostCause::Unreachable };
/// assert!(error.to_string().contains("could not be reached"));
/// match error {
///     LockError::Lost { cause: LostCause::ForceReleased, .. } => { /* an operator broke it */ }
///     LockError::Lost { key, .. } => eprintln!("{key} lost"),
///     _ => {}
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostCause {
    /// Its ttl ran out before the holder extended or released it, and nobody holds it now.
    Expired,
    /// Its ttl ran out before the holder extended or released it, and another holder has
    /// taken it since: the two may have worked at the same time.
    Taken,
    /// Redis could not be reached to extend it before its ttl would run out (the
    /// `auto_extend` watchdog gave it up): whether it still exists is unknown, so the holder
    /// must stop.
    Unreachable,
    /// An operator broke it — `distlock release --force`, which runs
    /// `LockManager::force_release` — while this holder still held it.
    ForceReleased,
}

impl std::fmt::Display for LostCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostCause::Expired => "expired",
            LostCause::Taken => "taken by another holder",
            LostCause::Unreachable => "Redis unreachable",
            LostCause::ForceReleased => "force-released",
        })
    }
}

/// What happened and what to do, for each cause of a [`LockError::Lost`].
fn lost_advice(cause: LostCause) -> &'static str {
    match cause {
        LostCause::Expired => {
            "its ttl ran out before this holder extended or released it, and nobody holds it \
             now; raise `ttl`, call `extend` in time, or use `auto_extend = true` (with it on, \
             its watchdog did not get to run in time: keep blocking calls off the async \
             runtime, or use `distlock::blocking` for blocking work)"
        }
        LostCause::Taken => {
            "its ttl ran out before this holder extended or released it, and another worker \
             took it, so both may have worked at the same time; raise `ttl`, call `extend` in \
             time, or use `auto_extend = true`"
        }
        LostCause::Unreachable => {
            "Redis could not be reached to extend it before it would expire (each extension \
             failed or timed out: the `distlock` debug events say how), so mutual \
             exclusion could no longer be guaranteed and the holder was stopped (a \
             `#[distributed_lock]` body is cancelled); check that Redis is running and \
             reachable from this host (network, server load, `response_timeout`), then run \
             the work again"
        }
        LostCause::ForceReleased => {
            "an operator force-released it (`distlock release --force`, or \
             `LockManager::force_release`) while this holder still held it, and another worker \
             may hold it now; find out why this holder looked stuck (work longer than expected, \
             a hung call) before running the work again"
        }
    }
}

impl From<LockError> for std::io::Error {
    fn from(error: LockError) -> Self {
        use std::io::ErrorKind;
        let kind = match &error {
            LockError::Timeout { .. } | LockError::NoAnswer { .. } => ErrorKind::TimedOut,
            LockError::Busy { .. } => ErrorKind::WouldBlock,
            LockError::Config(_) => ErrorKind::InvalidInput,
            // Not a bad value: the call cannot be made where it was.
            LockError::InsideAsyncRuntime { .. } => ErrorKind::Unsupported,
            LockError::Redis(redis) if redis.is_timeout() => ErrorKind::TimedOut,
            LockError::Redis(redis) if redis.is_connection_refusal() => {
                ErrorKind::ConnectionRefused
            }
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, error)
    }
}

impl From<redis::RedisError> for LockError {
    fn from(error: redis::RedisError) -> Self {
        LockError::Redis(error)
    }
}

/// A duration as people write it: `250ms` under a second, `5.0s` under a minute, then `2m05s`
/// and `3h07m` (the debug form would print `5.002455865s`).
fn readable(duration: Duration) -> String {
    let secs = duration.as_secs();
    if secs < 1 {
        format!("{}ms", duration.as_millis())
    } else if secs < 60 {
        format!("{:.1}s", duration.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    }
}

impl LockError {
    /// A [`LockError::Config`] with the given explanation.
    pub(crate) fn config(message: impl Into<String>) -> Self {
        LockError::Config(message.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wait a timeout reports reads as written in a `timeout`, not as a debug `Duration`.
    #[test]
    fn a_timeout_says_how_long_it_waited_readably() {
        for (waited, shown) in [
            (Duration::new(5, 2_455_865), "5.0s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_millis(10_049), "10.0s"),
            (Duration::from_secs(125), "2m05s"),
            (Duration::from_secs(3 * 3600 + 7 * 60), "3h07m"),
        ] {
            let error = LockError::Timeout {
                key: "lock:k".into(),
                waited,
            };
            assert!(
                error.to_string().starts_with(&format!(
                    "timed out after {shown} waiting for lock `lock:k`"
                )),
                "{error}"
            );
        }
    }
}
