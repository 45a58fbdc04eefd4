//! Names of the Redis keys and channels that belong to one lock.
//!
//! Every helper of a lock (wait flag, fencing counter, wake-up channel) must live in the lock
//! key's hash slot, so that one script can touch them all on a Redis Cluster. A key's slot is
//! decided by its hash tag (the text between the first `{` and the next `}`, when not empty) or
//! else by the whole key; so a helper wraps the lock key in braces, or — when the lock key
//! already carries a tag — appends to it and keeps the tag.

use std::sync::Arc;

/// The names derived from one full lock key.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// The lock key itself: `prefix + name`. Shared, not copied, with the in-process queue that
    /// is keyed by it.
    pub(crate) lock: Arc<str>,
    /// Exists while somebody waits: tells the release script to publish a wake-up.
    pub(crate) wait_flag: String,
    /// The pub/sub channel a release publishes on when someone waits.
    pub(crate) wake_channel: String,
}

impl LockKeys {
    /// The fencing counter: never expires, so tokens keep increasing across lock lifetimes.
    /// Made on demand: only the acquire script needs it.
    pub(crate) fn fence(&self) -> String {
        helper(&self.lock, "fence")
    }

    pub(crate) fn new(lock: &str) -> Self {
        LockKeys {
            wait_flag: helper(lock, "waiting"),
            wake_channel: helper(lock, "released"),
            lock: Arc::from(lock),
        }
    }
}

/// `{key}:distlock:suffix`, or `key:distlock:suffix` when `key` already has a hash tag (which
/// then still decides the slot). Built by hand, not with `format!`: this runs for every lock.
fn helper(key: &str, suffix: &str) -> String {
    const MIDDLE: &str = ":distlock:";
    let mut name = String::with_capacity(key.len() + MIDDLE.len() + suffix.len() + 2);
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
        let keys = LockKeys::new("lock:trace:1");
        assert_eq!(keys.wait_flag, "{lock:trace:1}:distlock:waiting");
        assert_eq!(keys.fence(), "{lock:trace:1}:distlock:fence");
        assert_eq!(keys.wake_channel, "{lock:trace:1}:distlock:released");
    }

    #[test]
    fn helpers_keep_an_existing_hash_tag() {
        let keys = LockKeys::new("lock:{user:7}:cart");
        assert_eq!(keys.fence(), "lock:{user:7}:cart:distlock:fence");
    }

    #[test]
    fn empty_braces_are_not_a_hash_tag() {
        assert!(!has_hash_tag("lock:{}x"));
        assert!(has_hash_tag("a{b}c"));
        assert!(!has_hash_tag("a{b"));
    }
}
