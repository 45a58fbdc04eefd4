//! [`Failure`]: why a store operation failed, as the store saw it. Every backend operation
//! returns one; `LockError`'s conversion (the one place that turns it into what a user is told)
//! is `From<Failure> for LockError` below.
//!
//! A store's own failures — no majority of Redlock masters, a fencing counter that cannot issue
//! a token, a write too few replicas acknowledged, a bound of distlock's own that ran out before
//! an answer came — are variants of their own, never dressed as a [`redis::RedisError`]: only
//! what Redis (or redis-rs, of the connection to it) said is a [`Failure::Redis`].

use std::time::Duration;

use redis::RedisError;

use crate::backend::keys::{Kind, LockKeys};
use crate::redis::connection::ConnectError;
use crate::redis::sentinel::NoMaster;
use crate::LockError;

/// A backend operation's result.
pub(crate) type Result<T> = std::result::Result<T, Failure>;

/// Why a backend operation failed.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// Redis answered with an error, or could not be reached in time.
    Redis(RedisError),
    /// Fewer Redlock masters than a majority answered.
    NoQuorum {
        /// How many masters there are.
        masters: usize,
        /// How many answered.
        answered: usize,
        /// How many make a majority.
        needed: usize,
        /// The last error a master gave.
        last_error: String,
    },
    /// Redlock masters that did not answer could still turn the answer either way.
    Undecided {
        /// How many masters there are.
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
    /// The fencing counter could not issue a token: it gave `value` (`None`: the hand-off that
    /// would have issued one could not).
    FencingBroken { counter: String, value: Option<i64> },
    /// Fewer replicas than `wait_for_replicas` asks for acknowledged a lock write in time.
    NotReplicated {
        key: String,
        acknowledged: u32,
        wanted: u32,
    },
    /// A store answered something its lock operation never answers: `what` answered `reply`.
    UnexpectedReply { what: &'static str, reply: String },
    /// `what` did not answer within `waited`, a bound of distlock's own (a Redlock master's
    /// per-node timeout): the request was sent, and may still run there.
    NoAnswer {
        what: &'static str,
        waited: Duration,
    },
    /// The sentinels of a Sentinel service named no master in time: no request was sent.
    NoMaster(NoMaster),
    /// The name is used another way by another caller — as a mutex and as a semaphore, or as
    /// semaphores of different sizes —: what to do, said in full. Nothing was taken.
    Usage(String),
}

impl Failure {
    /// Whether retrying cannot help (see `classify::is_permanent`): a store's own failures
    /// may pass (masters come back, a replica catches up), a broken fencing counter does not
    /// mend by itself but is reported at once by the acquisition that meets it.
    pub(crate) fn is_permanent(&self) -> bool {
        match self {
            Failure::Redis(error) => crate::redis::classify::is_permanent(error),
            Failure::Usage(_) => true,
            _ => false,
        }
    }

    /// A leased-set script's error reply made into what it means: `MODE <found> <wanted> ...`
    /// (a name used in two ways) and `PERMITS <stored> <asked> ...` (callers that disagree on
    /// n) are [`Failure::Usage`], with the script's own words (which name both values); any
    /// other error stays what Redis said.
    pub(crate) fn from_family(error: RedisError) -> Self {
        match error.code() {
            Some("MODE" | "PERMITS") => {
                let detail = error.detail().unwrap_or_default();
                // After the two values the script heads its reply with comes its sentence.
                let sentence = detail.splitn(3, ' ').nth(2).unwrap_or(detail);
                let sentence = sentence.strip_prefix("distlock: ").unwrap_or(sentence);
                Failure::Usage(sentence.to_owned())
            }
            _ => Failure::Redis(error),
        }
    }

    /// Whether the request may still have reached the store and run there (see
    /// `classify::may_have_run`): a Redis error without an answer, or a request that got no
    /// answer in time; a store's other failures come with every answer they needed, and one
    /// that found no master sent nothing.
    pub(crate) fn may_have_run(&self) -> bool {
        match self {
            Failure::Redis(error) => crate::redis::classify::may_have_run(error),
            Failure::NoAnswer { .. } => true,
            _ => false,
        }
    }

    /// Whether the lock was given back under the caller's token before this error returned:
    /// too few replicas acknowledged it (see `Node::not_acknowledged`).
    pub(crate) fn gave_the_lock_back(&self) -> bool {
        matches!(self, Failure::NotReplicated { .. })
    }

    /// Whether the request ran and was refused for what it found at the lock's keys (a key of
    /// another type, a name used another way): any send of it meets the same refusal, so an
    /// earlier send of it took nothing either.
    pub(crate) fn refused_for_what_it_found(&self) -> bool {
        match self {
            Failure::Redis(error) => {
                use crate::redis::classify::{classify, Meaning};
                classify(error) == Meaning::WrongType
            }
            Failure::Usage(_) => true,
            _ => false,
        }
    }

    /// Whether the request did not run because a Sentinel service's master is not where it
    /// was, or not known yet (see `sentinel::not_run_for_want_of_a_master`): trying again on
    /// the master the sentinels name next cannot run it twice.
    pub(crate) fn wants_a_master(&self) -> bool {
        match self {
            Failure::Redis(error) => crate::redis::sentinel::not_run_for_want_of_a_master(error),
            Failure::NoMaster(_) => true,
            _ => false,
        }
    }

    /// Whether the request failed because its connection dropped (see
    /// `classify::connection_dropped`).
    pub(crate) fn connection_dropped(&self) -> bool {
        match self {
            Failure::Redis(error) => crate::redis::classify::connection_dropped(error),
            _ => false,
        }
    }

    /// Whether Redis answered `WRONGTYPE` for the lock key itself (not for one of its helper
    /// keys, see `line::names_a_helper`): the key is no lock.
    pub(crate) fn is_lock_key_of_another_type(&self) -> bool {
        matches!(self, Failure::Redis(error)
            if crate::redis::classify::is_wrong_type_reply(error)
                && !super::line::names_a_helper(error))
    }
}

impl From<RedisError> for Failure {
    fn from(error: RedisError) -> Self {
        Failure::Redis(error)
    }
}

impl From<ConnectError> for Failure {
    fn from(error: ConnectError) -> Self {
        match error {
            ConnectError::Redis(error) => Failure::Redis(error),
            ConnectError::NoMaster(no_master) => Failure::NoMaster(no_master),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Redis(error) => error.fmt(f),
            Failure::UnexpectedReply { what, reply } => write!(f, "{what} answered {reply}"),
            Failure::NoAnswer { what, waited } => {
                write!(f, "{what} did not answer within {waited:?}")
            }
            Failure::NoMaster(no_master) => no_master.fmt(f),
            other => LockError::from(other.clone()).fmt(f),
        }
    }
}

/// The one place a store's failure becomes what the user is told.
impl From<Failure> for LockError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Redis(error) => LockError::Redis(error),
            Failure::NoQuorum {
                masters,
                answered,
                needed,
                last_error,
            } => LockError::NoQuorum {
                masters,
                answered,
                needed,
                last_error,
            },
            Failure::Undecided {
                masters,
                confirmed,
                silent,
                needed,
                last_error,
            } => LockError::QuorumUndecided {
                masters,
                confirmed,
                silent,
                needed,
                last_error,
            },
            Failure::FencingBroken { counter, value } => LockError::FencingBroken {
                counter,
                found: value.map_or_else(
                    || "a value that is not a number, or below 0".to_owned(),
                    |value| value.to_string(),
                ),
            },
            Failure::NotReplicated {
                key,
                acknowledged,
                wanted,
            } => LockError::NotReplicated {
                key,
                acknowledged,
                wanted,
            },
            Failure::UnexpectedReply { what, reply } => LockError::UnexpectedReply {
                what: what.to_owned(),
                reply,
            },
            Failure::NoAnswer { what, waited } => LockError::NoAnswer {
                what: what.to_owned(),
                waited,
            },
            Failure::NoMaster(NoMaster { service, waited }) => LockError::NoAnswer {
                what: format!("the sentinels of service `{service}` (or the master they named)"),
                waited,
            },
            Failure::Usage(message) => LockError::Config(message),
        }
    }
}

/// The failure of an operation, for a lock taken as `keys.kind`, on a name held as `found`: the
/// name is used another way elsewhere.
pub(crate) fn used_otherwise(keys: &LockKeys, found: Kind) -> Failure {
    let held_as = match found {
        Kind::Permits(permits) => format!("a semaphore of {permits} permits"),
        Kind::Read => "a read-write lock's readers".to_owned(),
        Kind::Mutex => "a mutex (or a write lock)".to_owned(),
    };
    let used_as = match keys.kind {
        Kind::Permits(permits) => format!("a semaphore of {permits} permits"),
        Kind::Read => "a read lock".to_owned(),
        Kind::Mutex => "a mutex".to_owned(),
    };
    Failure::Usage(format!(
        "{} is held as {held_as}, and this caller uses it as {used_as}: every caller of a name \
         must use it the same way; use another name for one of them",
        keys.lock
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_used_two_ways_is_a_config_error_in_the_scripts_words() {
        let error = redis::make_extension_error(
            "PERMITS".to_owned(),
            Some(
                "5 3 distlock: the semaphore lock:a has 5 permits and this caller asks for 3"
                    .into(),
            ),
        );
        let failure = Failure::from_family(error);
        assert!(failure.is_permanent());
        assert!(matches!(
            LockError::from(failure),
            LockError::Config(message)
                if message.starts_with("the semaphore lock:a has 5 permits") && message.contains('3')
        ));
        let other = redis::make_extension_error("ERR".to_owned(), Some("boom".into()));
        assert!(matches!(Failure::from_family(other), Failure::Redis(_)));
    }

    #[test]
    fn a_stores_own_failures_are_typed_errors_not_redis_ones() {
        let not_replicated = Failure::NotReplicated {
            key: "lock:a b".into(),
            acknowledged: 0,
            wanted: 2,
        };
        assert!(matches!(
            LockError::from(not_replicated),
            LockError::NotReplicated { key, acknowledged: 0, wanted: 2 } if key == "lock:a b"
        ));
        let no_quorum = Failure::NoQuorum {
            masters: 5,
            answered: 2,
            needed: 3,
            last_error: "down".into(),
        };
        assert!(!no_quorum.is_permanent() && !no_quorum.may_have_run());
        assert!(no_quorum
            .to_string()
            .contains("only 2 of 5 Redlock masters answered"));
        assert!(matches!(
            LockError::from(no_quorum),
            LockError::NoQuorum { answered: 2, .. }
        ));
        let fence = Failure::FencingBroken {
            counter: "{lock:a}:distlock:fence".into(),
            value: Some(0),
        };
        assert!(matches!(
            LockError::from(fence),
            LockError::FencingBroken { .. }
        ));
    }

    /// Each store failure is read as a `RedisError` with the same news would be read: not
    /// permanent (an acquisition retries it until its deadline); not run (no clean-up of a
    /// grant that cannot be), but for a request that got no answer in time, which may have run
    /// (its grant is cleaned up); no dropped connection (no second send, no place kept); a
    /// missing Sentinel master is waited out by a release, as a failover is. A quorum failure read as permanent would end a waiting acquisition at once; one
    /// read as "may have run" would release a lock nobody was granted.
    #[test]
    fn a_stores_own_failures_read_as_their_redis_dressing_did() {
        use crate::redis::classify;
        use redis::ErrorKind;
        let text = |kind: ErrorKind| RedisError::from((kind, "dressing", "detail".to_owned()));
        let cases: [(Failure, RedisError); 8] = [
            (
                Failure::NoQuorum {
                    masters: 5,
                    answered: 2,
                    needed: 3,
                    last_error: "timed out".into(),
                },
                RedisError::from(std::io::Error::other(
                    "only 2 of 5 Redlock masters answered",
                )),
            ),
            (
                Failure::Undecided {
                    masters: 5,
                    confirmed: 2,
                    silent: 2,
                    needed: 3,
                    last_error: "timed out".into(),
                },
                RedisError::from(std::io::Error::other("2 of 5 Redlock masters confirmed")),
            ),
            (
                Failure::FencingBroken {
                    counter: "{l}:distlock:fence".into(),
                    value: Some(0),
                },
                text(ErrorKind::UnexpectedReturnType),
            ),
            (
                Failure::FencingBroken {
                    counter: "{l}:distlock:fence".into(),
                    value: None,
                },
                text(ErrorKind::UnexpectedReturnType),
            ),
            (
                Failure::NotReplicated {
                    key: "l".into(),
                    acknowledged: 0,
                    wanted: 1,
                },
                redis::make_extension_error(
                    "DISTLOCK_NOT_REPLICATED".to_owned(),
                    Some("0 1 l".to_owned()),
                ),
            ),
            (
                Failure::UnexpectedReply {
                    what: "the acquire script",
                    reply: "[7]".into(),
                },
                text(ErrorKind::UnexpectedReturnType),
            ),
            (
                Failure::NoAnswer {
                    what: "a Redlock master",
                    waited: Duration::from_millis(100),
                },
                RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)),
            ),
            (
                Failure::NoMaster(NoMaster {
                    service: "locks".into(),
                    waited: Duration::from_secs(6),
                }),
                text(ErrorKind::MasterNameNotFoundBySentinel),
            ),
        ];
        for (failure, dressed) in cases {
            assert_eq!(
                failure.is_permanent(),
                classify::is_permanent(&dressed),
                "{failure:?}"
            );
            assert_eq!(
                failure.may_have_run(),
                classify::may_have_run(&dressed),
                "{failure:?}"
            );
            assert_eq!(
                failure.connection_dropped(),
                classify::connection_dropped(&dressed),
                "{failure:?}"
            );
            assert_eq!(
                failure.wants_a_master(),
                crate::redis::sentinel::not_run_for_want_of_a_master(&dressed),
                "{failure:?}"
            );
            assert!(!failure.is_lock_key_of_another_type(), "{failure:?}");
            for keeps_place_on_drop in [false, true] {
                let capabilities = crate::backend::Capabilities {
                    fencing: true,
                    hands_over: true,
                    resends_commands: false,
                    waits_for_replicas: false,
                    keeps_place_on_drop,
                    leases: true,
                    together: crate::backend::Together::Never,
                    detects_deadlocks: true,
                };
                assert!(!capabilities.keeps_place_through(&failure), "{failure:?}");
            }
        }
    }

    /// Redis not answering within distlock's own bounds is a typed error of its own, which
    /// says what did not answer, how long it waited, and which settings to look at.
    #[test]
    fn no_answer_in_time_is_a_no_answer_error_that_says_what_to_do() {
        let master = LockError::from(Failure::NoAnswer {
            what: "a Redlock master",
            waited: Duration::from_millis(100),
        });
        assert!(
            matches!(&master, LockError::NoAnswer { what, waited }
                if what == "a Redlock master" && *waited == Duration::from_millis(100)),
            "{master:?}"
        );
        let sentinels = LockError::from(Failure::NoMaster(NoMaster {
            service: "locks".into(),
            waited: Duration::from_secs(6),
        }))
        .to_string();
        assert!(
            sentinels.starts_with(
                "the sentinels of service `locks` (or the master they named) did not answer \
                 within 6.0s: check that it runs and is reachable"
            ),
            "{sentinels}"
        );
        assert!(sentinels.contains("`connect_timeout`"), "{sentinels}");
    }

    #[test]
    fn a_redis_error_is_read_as_classify_reads_it() {
        let dropped = Failure::from(RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert!(dropped.connection_dropped() && dropped.may_have_run());
        assert!(!dropped.is_permanent());
    }
}
