//! The names of distlock's helper keys for one lock, so that a test names the line, the fencing
//! counter or any other helper of a lock from the lock's full key instead of spelling the
//! format by hand.
//!
//! This mirrors `LockKeys::helper` in `lock-runtime/src/keys.rs`, which is not public: the
//! helper `s` of the lock key `L` is `{T}:distlock:s` when the tag `T` is `L` itself, else
//! `{T}:distlock:s:L`, where `T` is `L`'s own hash tag when it has one and `L` otherwise.
//! A lock key with a `}` but no hash tag gets a tag from a table inside lock-runtime; no test
//! names such a helper, and [`helper`] refuses one rather than guess. `tests/harness` pins
//! these names against helpers that a real lock creates on a real server.
//!
//! ```ignore
//! assert_eq!(test_support::keys::line("lock:job"), "{lock:job}:distlock:line");
//! assert_eq!(
//!     test_support::keys::fence("lock:{user:7}:cart"),
//!     "{user:7}:distlock:fence:lock:{user:7}:cart"
//! );
//! ```

/// What follows a helper's tag, before its word.
const MARKER: &str = ":distlock:";

/// The helper key `word` (`line`, `fence`, ...) of the lock whose full key is `lock`.
pub fn helper(lock: &str, word: &str) -> String {
    assert!(!word.contains(':'), "a helper word has no `:`: {word:?}");
    match own_hash_tag(lock) {
        Some(tag) => format!("{{{tag}}}{MARKER}{word}:{lock}"),
        None => {
            assert!(
                !lock.contains('}'),
                "{lock:?} has a `}}` but no hash tag: its helpers take a tag from lock-runtime's \
                 slot table, which this mirror does not copy"
            );
            format!("{{{lock}}}{MARKER}{word}")
        }
    }
}

/// The text between the first `{` and the first `}` after it, when not empty (as Redis
/// Cluster finds a hash tag).
fn own_hash_tag(key: &str) -> Option<&str> {
    let (_, after) = key.split_once('{')?;
    let (tag, _) = after.split_once('}')?;
    (!tag.is_empty()).then_some(tag)
}

/// The line of waiters of `lock`: a list of their entries, oldest first.
pub fn line(lock: &str) -> String {
    helper(lock, "line")
}

/// The lease table of `lock`'s line: the tokens whose places were renewed.
pub fn leases(lock: &str) -> String {
    helper(lock, "leases")
}

/// The fencing counter of `lock`, which never expires.
pub fn fence(lock: &str) -> String {
    helper(lock, "fence")
}

/// On a cluster, the token of `lock`'s last release.
pub fn released(lock: &str) -> String {
    helper(lock, "released")
}

/// When `lock`'s holder got it, for a holder that waited first.
pub fn since(lock: &str) -> String {
    helper(lock, "since")
}

/// The token of `lock`'s last holder that an operator force-released.
pub fn forced(lock: &str) -> String {
    helper(lock, "forced")
}

/// On a Redlock master, the waiters of `lock` to wake.
pub fn wake(lock: &str) -> String {
    helper(lock, "wake")
}

/// A `KEYS`/`SCAN` pattern that matches every helper key `word` of every lock.
pub fn every(word: &str) -> String {
    format!("*{MARKER}{word}*")
}

/// A `KEYS`/`SCAN` pattern that matches every helper of `lock` (for a lock named by its tag,
/// `{T}:distlock:*`).
pub fn all_of(lock: &str) -> String {
    helper(lock, "*")
}
