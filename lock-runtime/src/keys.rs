//! Names of the Redis keys and channels that belong to one lock.
//!
//! Every helper of a lock (waiters key, fencing counter) must live in the lock key's hash slot,
//! so that one script can touch them all on a Redis Cluster. A key's slot is decided by its hash
//! tag (the text between the first `{` and the next `}`, when not empty) or else by the whole
//! key; so a helper wraps the lock key in braces, or — when the lock key already carries a tag —
//! appends to it and keeps the tag.
//!
//! distlock never writes into a key it does not hold: waiting is recorded in a key of its own,
//! so a lock key holds exactly its holder's token, and clients that share the keys and compare
//! `GET` with their token (the seeds' Python locks, say) keep working next to distlock.

use std::sync::Arc;

/// The names derived from one full lock key. Cheap to clone: the key is shared, and the
/// helper names are made when an operation needs them.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// The lock key itself: `prefix + name`. Shared, not copied, with the in-process queue that
    /// is keyed by it.
    pub(crate) lock: Arc<str>,
}

impl LockKeys {
    pub(crate) fn new(lock: String) -> Self {
        LockKeys {
            lock: Arc::from(lock),
        }
    }

    /// Two names in one: the key that exists while somebody waits (it tells the release script
    /// to publish a wake-up), and the pub/sub channel that wake-up is published on. Keys and
    /// channels are separate namespaces, and one name spares the release script an argument.
    pub(crate) fn waiters(&self) -> String {
        self.helper("waiters")
    }

    /// The fencing counter: never expires, so tokens keep increasing across lock lifetimes.
    pub(crate) fn fence(&self) -> String {
        self.helper("fence")
    }

    /// `{key}:distlock:suffix`, or `key:distlock:suffix` when `key` already has a hash tag
    /// (which then still decides the slot). Built by hand, not with `format!`: the release of
    /// every lock names its waiters key.
    fn helper(&self, suffix: &str) -> String {
        const MIDDLE: &str = ":distlock:";
        let key = &*self.lock;
        let mut name = String::with_capacity(key.len() + 2 + MIDDLE.len() + suffix.len());
        if has_hash_tag(key) {
            name.push_str(key);
        } else {
            name.push('{');
            name.push_str(key);
            name.push('}');
        }
        name.push_str(MIDDLE);
        name.push_str(suffix);
        name
    }
}

/// Whether Redis Cluster would hash `key` by a tag rather than by the whole key.
fn has_hash_tag(key: &str) -> bool {
    match key.find('{') {
        Some(open) => key[open + 1..].find('}').is_some_and(|len| len > 0),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_wrap_an_untagged_key_in_braces() {
        let keys = LockKeys::new("lock:trace:1".to_owned());
        assert_eq!(keys.waiters(), "{lock:trace:1}:distlock:waiters");
        assert_eq!(keys.fence(), "{lock:trace:1}:distlock:fence");
    }

    #[test]
    fn helpers_keep_an_existing_hash_tag() {
        let keys = LockKeys::new("lock:{user:7}:cart".to_owned());
        assert_eq!(keys.fence(), "lock:{user:7}:cart:distlock:fence");
        assert_eq!(keys.waiters(), "lock:{user:7}:cart:distlock:waiters");
    }

    #[test]
    fn empty_braces_are_not_a_hash_tag() {
        assert!(!has_hash_tag("lock:{}x"));
        assert!(has_hash_tag("a{b}c"));
        assert!(!has_hash_tag("a{b"));
    }
}
