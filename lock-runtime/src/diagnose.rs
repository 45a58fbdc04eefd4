//! What in a Redis server's settings can break distlock's locks, and how to fix it: the one
//! rule that both the warning at connect and the `distlock doctor` command apply.
//!
//! A server with a memory limit and any eviction policy but `noeviction` deletes keys when
//! memory runs out. `allkeys-*` policies may pick any key; `volatile-*` policies pick keys with
//! an expiry — and every lock key has one. A held lock deleted that way is free for a second
//! holder while the first still works; under an `allkeys-*` policy a lock's fencing counter (a
//! key without an expiry) can be deleted too, so the next fencing token starts again at 1,
//! below the tokens already handed out.
//!
//! ```
//! use distlock::diagnose::Eviction;
//!
//! let eviction = Eviction::from_settings(10 * 1024 * 1024, "volatile-lru");
//! assert!(eviction.can_evict_locks());
//! assert!(!Eviction::from_settings(0, "allkeys-lru").can_evict_locks());
//! assert!(!Eviction::from_settings(1 << 30, "noeviction").can_evict_locks());
//! ```

/// What a held lock suffers on a server that may evict it.
pub const EVICTION_RISK: &str = "a held lock can be deleted to free memory and taken by a second \
holder while the first still works; under an `allkeys-*` policy a lock's fencing counter (a key \
without an expiry) can be deleted too, so its fencing tokens start again at 1";

/// How to make a server safe for locks.
pub const EVICTION_FIX: &str = "set `maxmemory-policy noeviction` (`CONFIG SET maxmemory-policy \
noeviction` and in redis.conf, or in the managed service's parameter group), or keep the locks on \
a Redis of their own with that policy";

/// How to read the settings by hand where distlock's user may not run `CONFIG GET`.
pub const CHECK_BY_HAND: &str = "check by hand with `redis-cli CONFIG GET maxmemory*` as an \
admin user, or in the managed service's console: `maxmemory-policy` must be `noeviction` or \
`maxmemory` 0";

/// What a server's `maxmemory` and `maxmemory-policy` do to lock keys.
///
/// ```
/// use distlock::diagnose::Eviction;
///
/// match Eviction::from_settings(10 * 1024 * 1024, "allkeys-lru") {
///     Eviction::Evicts { policy } => assert_eq!(policy, "allkeys-lru"),
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Eviction {
    /// `maxmemory 0`: no memory limit, so nothing is evicted. That is the meaning on a 64-bit
    /// server; a 32-bit server puts an implicit 3 GB limit with `noeviction` in its place, which
    /// evicts nothing either.
    NoLimit,
    /// `noeviction`: a full server refuses writes (a lock cannot be taken then), but deletes
    /// nothing.
    Refuses,
    /// Keys with an expiry — every lock key — may be deleted when memory is full.
    Evicts {
        /// The server's `maxmemory-policy`, e.g. `allkeys-lru` or `volatile-lru`.
        policy: String,
    },
}

impl Eviction {
    /// The rule, from the values of `CONFIG GET maxmemory` (bytes) and `maxmemory-policy`.
    ///
    /// Every policy but `noeviction` counts as evicting lock keys, also a policy this version
    /// of distlock does not know: a new policy is far likelier to evict than to refuse.
    ///
    /// ```
    /// use distlock::diagnose::Eviction;
    ///
    /// assert_eq!(Eviction::from_settings(0, "volatile-lru"), Eviction::NoLimit);
    /// assert_eq!(Eviction::from_settings(100, "NoEviction"), Eviction::Refuses);
    /// ```
    #[must_use]
    pub fn from_settings(maxmemory: u64, policy: &str) -> Eviction {
        if maxmemory == 0 {
            Eviction::NoLimit
        } else if policy.trim().eq_ignore_ascii_case("noeviction") {
            Eviction::Refuses
        } else {
            Eviction::Evicts {
                policy: policy.trim().to_owned(),
            }
        }
    }

    /// The rule from the pairs a `CONFIG GET maxmemory*` returns (names and values in any
    /// order, other names ignored); `None` when `maxmemory` or `maxmemory-policy` is missing or
    /// `maxmemory` is not a number.
    ///
    /// ```
    /// use distlock::diagnose::Eviction;
    ///
    /// let pairs = [("maxmemory", "10485760"), ("maxmemory-policy", "allkeys-lru")];
    /// assert!(Eviction::from_config(pairs).unwrap().can_evict_locks());
    /// assert_eq!(Eviction::from_config([("maxmemory", "0")]), None);
    /// ```
    pub fn from_config<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Self> {
        let (mut maxmemory, mut policy) = (None, None);
        for (name, value) in pairs {
            if name.eq_ignore_ascii_case("maxmemory") {
                maxmemory = value.trim().parse::<u64>().ok();
            } else if name.eq_ignore_ascii_case("maxmemory-policy") {
                policy = Some(value);
            }
        }
        Some(Eviction::from_settings(maxmemory?, policy?))
    }

    /// Whether a held lock can be evicted on this server.
    ///
    /// ```
    /// use distlock::diagnose::Eviction;
    ///
    /// assert!(Eviction::from_settings(1, "volatile-ttl").can_evict_locks());
    /// ```
    #[must_use]
    pub fn can_evict_locks(&self) -> bool {
        matches!(self, Eviction::Evicts { .. })
    }

    /// One line on what the settings mean for locks, e.g. `maxmemory-policy allkeys-lru with a
    /// memory limit: ...`.
    ///
    /// ```
    /// use distlock::diagnose::Eviction;
    ///
    /// assert!(Eviction::NoLimit.describe().contains("no memory limit"));
    /// ```
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            Eviction::NoLimit => "maxmemory 0: no memory limit, nothing is evicted".to_owned(),
            Eviction::Refuses => {
                "maxmemory-policy noeviction: a full server refuses writes and deletes nothing"
                    .to_owned()
            }
            Eviction::Evicts { policy } => format!(
                "maxmemory-policy {policy} with a memory limit: keys with an expiry, as every \
                 lock key has, are deleted when memory is full"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_but_noeviction_evicts_locks_under_a_limit() {
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
            "some-future-policy",
        ] {
            assert!(
                Eviction::from_settings(10 << 20, policy).can_evict_locks(),
                "{policy}"
            );
            assert_eq!(Eviction::from_settings(0, policy), Eviction::NoLimit);
        }
        assert_eq!(
            Eviction::from_settings(10 << 20, "noeviction"),
            Eviction::Refuses
        );
    }
}
