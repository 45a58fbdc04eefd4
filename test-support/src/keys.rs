//! The names of distlock's helper keys for one lock, so that a test names the line, the fencing
//! counter or any other helper of a lock from the lock's full key instead of spelling the
//! format by hand.
//!
//! This mirrors `LockKeys::helper` in `lock-runtime/src/backend/keys.rs`, which is not public: the
//! helper `s` of the lock key `L` is `{T}:distlock:s` when the tag `T` is `L` itself, else
//! `{T}:distlock:s:L`, where `T` is `L`'s own hash tag when it has one and `L` otherwise.
//! A lock key with a `}` but no hash tag gets a tag from a table inside lock-runtime; no test
//! names such a helper, and [`helper`] refuses one rather than guess. `tests/harness` pins
//! these names against helpers that a real lock creates on a real server.
//!
//! ```ignore
//! use test_support::keys;
//!
//! assert_eq!(keys::named("job").line(), "{lock:job}:distlock:line");
//! assert_eq!(
//!     keys::of("lock:{user:7}:cart").fence(),
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

/// The full key of the lock `name` under the default key prefix `lock:`.
pub fn default_key(name: &str) -> String {
    format!("lock:{name}")
}

/// The helper keys of the lock whose full key is `lock`.
pub fn of(lock: impl Into<String>) -> HelperKeys {
    HelperKeys { lock: lock.into() }
}

/// The helper keys of the lock `name` under the default key prefix `lock:`, the prefix of
/// every manager that does not set its own.
pub fn named(name: &str) -> HelperKeys {
    of(default_key(name))
}

/// The helper keys of one lock, named from its full key (see the module docs).
#[derive(Debug, Clone)]
pub struct HelperKeys {
    lock: String,
}

impl HelperKeys {
    /// The lock key itself.
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// The line of waiters: a list of their entries, oldest first.
    pub fn line(&self) -> String {
        helper(&self.lock, "line")
    }

    /// The lease table of the line: the tokens whose places were renewed.
    pub fn leases(&self) -> String {
        helper(&self.lock, "leases")
    }

    /// The fencing counter, which never expires.
    pub fn fence(&self) -> String {
        helper(&self.lock, "fence")
    }

    /// On a cluster, the token of the lock's last release.
    pub fn released(&self) -> String {
        helper(&self.lock, "released")
    }

    /// When the lock's holder got it, for a holder that waited first.
    pub fn since(&self) -> String {
        helper(&self.lock, "since")
    }

    /// The token of the lock's last holder that an operator force-released.
    pub fn forced(&self) -> String {
        helper(&self.lock, "forced")
    }

    /// On a Redlock master, the waiters to wake.
    pub fn wake(&self) -> String {
        helper(&self.lock, "wake")
    }

    /// A `KEYS`/`SCAN` pattern that matches every helper of this lock.
    pub fn all(&self) -> String {
        helper(&self.lock, "*")
    }
}

/// A `KEYS`/`SCAN` pattern that matches every helper key `word` of every lock.
pub fn every(word: &str) -> String {
    format!("*{MARKER}{word}*")
}
