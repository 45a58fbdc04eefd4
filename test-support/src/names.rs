//! Lock names and key prefixes that stress how distlock names a lock's keys (braces in every
//! position, empty and nested hash tags, names shaped like distlock's own helper keys), the
//! rule that tells which full keys distlock refuses, and [`no_two_locks_share_a_key`], the
//! property check run on a standalone server and on a cluster.
//!
//! The helper-key format read here is the one documented in `lock-runtime/src/backend/keys.rs`:
//! `{T}:distlock:<word>` when the tag `T` is the lock key itself, else
//! `{T}:distlock:<word>:<lock key>`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use distlock::{LockError, LockGuard, LockManager, LockOptions};

/// Key prefixes: the default, none, and prefixes that open or close a brace or carry a tag.
pub const PREFIXES: [&str; 5] = ["lock:", "", "{", "{p}", "}"];

/// The `response_timeout` of the managers given to [`no_two_locks_share_a_key`]. Its counts
/// hold only where no command times out: on a test machine that stalls for the default second,
/// a release fails, a lock is not taken, or a waiter goes on under a new token whose grant
/// takes the next fencing token — each right under a timeout, none a key shared.
pub const PATIENT_RESPONSE: Duration = Duration::from_secs(30);

/// A few dozen lock names: braces that form no hash tag (`order:a}b`, `x}{y`, `{}x`), tags in
/// every place, names shaped like helper keys (under some prefix above), the empty name, binary
/// and unicode text, and every three-character word over `{`, `}`, `x`.
pub fn lock_names() -> Vec<String> {
    let mut names: Vec<String> = [
        "",
        "order:a}b",
        "x}{y",
        "{}x",
        "a{b}c",
        "{{a}}",
        "a",
        "{a}",
        "t",
        "{t}",
        "{t}:distlock:waiters",
        "{t}:distlock:fence",
        "{t}:distlock:waiters:{t}",
        "t}:distlock:fence",
        "}:distlock:waiters",
        ":distlock:fence",
        "distlock:waiters",
        "{}",
        "}{",
        "{}{a}",
        "{a}{b}",
        "a}{b}",
        "\u{0}}\u{7f}",
        "鍵}🔒{",
        "\u{ffff}{\u{ffff}}",
    ]
    .map(str::to_owned)
    .into();
    for code in 0..27u32 {
        let word: String = [code % 3, code / 3 % 3, code / 9]
            .iter()
            .map(|&c| ['{', '}', 'x'][c as usize])
            .collect();
        if !names.contains(&word) {
            names.push(word);
        }
    }
    names
}

/// Whether distlock refuses the full key `key`: it is empty, or shaped like a helper key
/// (`{`, then text up to the first `}`, then `:distlock:`).
pub fn is_refused(key: &str) -> bool {
    key.is_empty()
        || key
            .strip_prefix('{')
            .and_then(|rest| rest.split_once('}'))
            .is_some_and(|(_, after)| after.starts_with(":distlock:"))
}

/// The helper word and the lock key of a distlock helper key, or `None` for any other key.
pub fn helper_owner(key: &str) -> Option<(&str, &str)> {
    let (tag, after) = key.strip_prefix('{')?.split_once('}')?;
    let after = after.strip_prefix(":distlock:")?;
    Some(match after.split_once(':') {
        Some((word, lock)) => (word, lock),
        None => (after, tag),
    })
}

/// Holds every lock of [`lock_names`] under the prefix of each pair of managers at once (the
/// first manager of a pair holds, the second contends), with fencing, and checks that no two
/// distinct locks share a Redis key:
/// - exactly the full keys that [`is_refused`] names are refused, with a `Config` error;
/// - every other lock is free at first and gets fencing token 1 (its counter is its own);
/// - with a contender waiting on each, Redis holds exactly three keys per lock (the lock, its
///   fencing counter, its waiters key) besides the lease tables of the lines whose contender
///   has renewed its place (after a second), each lock key still holds its own holder's token,
///   and every helper key names a held lock (and, with `slot_of`, lies in that lock's slot);
/// - every release succeeds, every contender is then handed its lock with token 2, and once
///   the lease tables have expired (two leases, 6 s, after their last renewal) only each
///   lock's fencing counter stays, with its `released` marker where a release was sent
///   marked: on a cluster every lock has one, holding the token of its last release (the
///   contender's); on one server a lock has one only when a release went out on a connection
///   idle for a second (which a stalled test machine makes), holding one of its releases'
///   tokens.
///
/// The managers are built with [`PATIENT_RESPONSE`]. `all_keys` lists every key of the
/// deployment (which nothing else may use meanwhile); `get` reads one; `slot_of`, given for a
/// cluster and only there, gives a key's cluster slot as the server computes it.
pub async fn no_two_locks_share_a_key(
    managers: &[(LockManager, LockManager)],
    all_keys: impl Fn() -> Vec<String>,
    get: impl Fn(&str) -> Option<String>,
    slot_of: Option<&dyn Fn(&str) -> u16>,
) {
    let names = lock_names();
    let fenced = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .timeout(Duration::from_secs(60))
        .fencing(true);
    let mut full_keys = HashSet::new();
    let mut holders: Vec<(LockGuard, LockManager, String)> = Vec::new();
    let mut refused = 0;
    for (holder, contender) in managers {
        for name in &names {
            let key = format!("{}{name}", holder.key_prefix());
            if !full_keys.insert(key.clone()) {
                continue; // the same lock under another (prefix, name) split
            }
            match holder.try_acquire(name, &fenced).await {
                Err(LockError::Config(message)) if is_refused(&key) => {
                    assert!(
                        message.contains("use another lock name or key prefix"),
                        "{key:?}: {message}"
                    );
                    refused += 1;
                }
                Ok(Some(guard)) if !is_refused(&key) => {
                    assert_eq!(guard.key(), key);
                    assert_eq!(
                        guard.fencing_token(),
                        Some(1),
                        "{key:?}: a new lock's first fencing token is 1 unless its counter is shared"
                    );
                    holders.push((guard, contender.clone(), name.clone()));
                }
                other => panic!(
                    "{key:?} (refused: {}): {:?}",
                    is_refused(&key),
                    other.map(|guard| guard.map(|guard| guard.key().to_owned()))
                ),
            }
        }
    }
    assert!(refused > 0, "the names include keys of the helper shape");
    let locks: HashMap<String, String> = holders
        .iter()
        .map(|(guard, _, _)| (guard.key().to_owned(), guard.token().to_owned()))
        .collect();
    assert_eq!(locks.len(), holders.len());

    let contenders: Vec<_> = holders
        .iter()
        .map(|(_, contender, name)| {
            let (contender, name, fenced) = (contender.clone(), name.clone(), fenced.clone());
            tokio::spawn(async move { contender.acquire(&name, &fenced).await })
        })
        .collect();
    // Each contender waits in the lock's line (a waiters key on Redlock); a key shared with
    // another lock would keep the count below three per lock.
    let expected = 3 * holders.len();
    let is_lease_table = |key: &String| matches!(helper_owner(key), Some(("leases", _)));
    let all_but_lease_tables = || {
        let (lease_tables, keys): (Vec<String>, Vec<String>) =
            all_keys().into_iter().partition(is_lease_table);
        (keys, lease_tables)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut keys, mut lease_tables) = all_but_lease_tables();
    while keys.len() != expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        (keys, lease_tables) = all_but_lease_tables();
    }
    for key in &lease_tables {
        let (_, lock) = helper_owner(key).expect("a helper key");
        assert!(
            locks.contains_key(lock),
            "lease table {key:?} names {lock:?}, not a held lock"
        );
        if let Some(slot_of) = slot_of {
            assert_eq!(
                slot_of(key),
                slot_of(lock),
                "{key:?} is not in its lock's slot"
            );
        }
    }
    let mut helpers: BTreeMap<(String, String), String> = BTreeMap::new();
    for key in &keys {
        if locks.contains_key(key) {
            continue;
        }
        let (word, lock) = helper_owner(key)
            .unwrap_or_else(|| panic!("{key:?} is neither a held lock nor a helper key"));
        assert!(
            locks.contains_key(lock),
            "helper {key:?} names {lock:?}, not a held lock"
        );
        assert!(["line", "waiters", "fence"].contains(&word), "{key:?}");
        if let Some(slot_of) = slot_of {
            assert_eq!(
                slot_of(key),
                slot_of(lock),
                "helper {key:?} is not in the slot of its lock {lock:?}"
            );
        }
        helpers.insert((word.to_owned(), lock.to_owned()), key.clone());
    }
    assert_eq!(
        keys.len(),
        expected,
        "{} locks with a contender each should make {expected} keys (lock, fence, line)",
        holders.len()
    );
    assert_eq!(
        helpers.len(),
        2 * holders.len(),
        "every lock has both helpers"
    );
    eprintln!(
        "{} locks held at once with a contender each ({refused} names refused): {} keys",
        holders.len(),
        keys.len()
    );
    for (lock, token) in &locks {
        assert_eq!(
            get(lock).as_ref(),
            Some(token),
            "{lock:?} no longer holds its holder's token"
        );
    }
    assert!(
        contenders.iter().all(|task| !task.is_finished()),
        "a contender finished while every lock was held"
    );

    for (guard, _, _) in holders {
        let key = guard.key().to_owned();
        guard
            .release()
            .await
            .unwrap_or_else(|error| panic!("release of {key:?}: {error}"));
    }
    let mut last_releases = HashMap::new();
    for task in contenders {
        let guard = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("every contender is handed its lock after the release")
            .unwrap()
            .expect("the contender's acquire succeeds");
        assert_eq!(
            guard.fencing_token(),
            Some(2),
            "{:?}: the second holder's token",
            guard.key()
        );
        last_releases.insert(guard.key().to_owned(), guard.token().to_owned());
        guard.release().await.expect("release");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while all_keys().iter().any(is_lease_table) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = all_keys();
    let on_cluster = slot_of.is_some();
    let mut fenced_locks = HashSet::new();
    let mut marked_locks = HashSet::new();
    for key in &left {
        match helper_owner(key) {
            Some(("fence", lock)) if locks.contains_key(lock) => {
                fenced_locks.insert(lock);
            }
            Some(("released", lock)) if locks.contains_key(lock) => {
                let marker = get(key);
                if on_cluster {
                    assert_eq!(
                        marker.as_ref(),
                        last_releases.get(lock),
                        "{key:?} holds the token of {lock:?}'s last release"
                    );
                } else {
                    assert!(
                        marker.as_ref() == locks.get(lock)
                            || marker.as_ref() == last_releases.get(lock),
                        "{key:?} holds {marker:?}, the token of neither release of {lock:?}"
                    );
                }
                marked_locks.insert(lock);
            }
            _ => panic!("{key:?} is left after every lock was released"),
        }
    }
    assert_eq!(
        fenced_locks.len(),
        locks.len(),
        "every lock keeps its fencing counter: {left:?}"
    );
    if on_cluster {
        assert_eq!(
            marked_locks.len(),
            locks.len(),
            "on a cluster every lock keeps its `released` marker: {left:?}"
        );
    }
    assert_eq!(
        left.len(),
        fenced_locks.len() + marked_locks.len(),
        "one fencing counter and at most one marker per lock: {left:?}"
    );
}
