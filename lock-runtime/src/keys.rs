//! Names of the Redis keys and channels that belong to one lock.
//!
//! Every helper key of a lock (the fencing counter) must live in the lock key's hash slot, so
//! that one script can touch them all on a Redis Cluster. A key's slot is decided by its hash
//! tag (the text between the first `{` and the next `}`, when not empty) or else by the whole
//! key; so a helper wraps the lock key in braces, or — when the lock key already carries a tag —
//! appends to it and keeps the tag. The wake-up channel is not a key (classic pub/sub reaches
//! every node of a cluster) and is named by the release script itself, from the lock key.

use std::sync::Arc;

/// The names derived from one full lock key. Cheap to clone: the key is shared, and the
/// helpers, which only a contended or fenced lock needs, are made on demand.
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

    /// The fencing counter: never expires, so tokens keep increasing across lock lifetimes.
    pub(crate) fn fence(&self) -> String {
        let mut name = String::with_capacity(self.lock.len() + 2 + FENCE_SUFFIX.len());
        if has_hash_tag(&self.lock) {
            name.push_str(&self.lock);
        } else {
            name.push('{');
            name.push_str(&self.lock);
            name.push('}');
        }
        name.push_str(FENCE_SUFFIX);
        name
    }

    /// The pub/sub channel a release publishes on when someone waits: the lock key followed by
    /// [`crate::scripts::WAKE_CHANNEL_SUFFIX`], as the release script names it.
    pub(crate) fn wake_channel(&self) -> String {
        let suffix = crate::scripts::WAKE_CHANNEL_SUFFIX;
        let mut name = String::with_capacity(self.lock.len() + suffix.len());
        name.push_str(&self.lock);
        name.push_str(suffix);
        name
    }
}

const FENCE_SUFFIX: &str = ":distlock:fence";

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
    fn the_fencing_counter_wraps_an_untagged_key_in_braces() {
        let keys = LockKeys::new("lock:trace:1".to_owned());
        assert_eq!(keys.fence(), "{lock:trace:1}:distlock:fence");
    }

    #[test]
    fn the_fencing_counter_keeps_an_existing_hash_tag() {
        let keys = LockKeys::new("lock:{user:7}:cart".to_owned());
        assert_eq!(keys.fence(), "lock:{user:7}:cart:distlock:fence");
    }

    #[test]
    fn the_wake_channel_is_the_lock_key_and_a_suffix() {
        let keys = LockKeys::new("lock:trace:1".to_owned());
        assert_eq!(keys.wake_channel(), "lock:trace:1:distlock:released");
    }

    #[test]
    fn empty_braces_are_not_a_hash_tag() {
        assert!(!has_hash_tag("lock:{}x"));
        assert!(has_hash_tag("a{b}c"));
        assert!(!has_hash_tag("a{b"));
    }
}
