//! What in a Redis server's settings can break distlock's locks, and how to fix it: the one
//! rule that both the warning at connect and the `distlock doctor` command apply; and the one
//! reading of a cluster's `CLUSTER SLOTS` reply, to find the servers to check
//! ([`cluster_masters`], [`cluster_nodes`]).
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

/// The masters a `CLUSTER SLOTS` reply names, each once, in the order of the reply:
/// `(host, port)`. The one parser of that reply, for whoever must reach every master (a scan of
/// lock keys, `distlock doctor --cluster`).
///
/// `ranges` is the reply's array: each range is its first and last slot, then its master
/// `[host, port, id, ..]`, then its replicas in the same form. `CLUSTER SLOTS` rather than
/// `CLUSTER SHARDS`, since Redis 6.2 has only this one. An entry of another shape is skipped.
///
/// ```
/// use distlock::diagnose::cluster_masters;
/// use redis::Value;
///
/// let node = |host: &str, port: i64| {
///     Value::Array(vec![Value::BulkString(host.into()), Value::Int(port)])
/// };
/// let range = |first: i64, last: i64, master: Value, replica: Value| {
///     Value::Array(vec![Value::Int(first), Value::Int(last), master, replica])
/// };
/// let reply = [
///     range(0, 5460, node("10.0.0.1", 7000), node("10.0.0.4", 7003)),
///     range(5461, 10922, node("10.0.0.2", 7001), node("10.0.0.5", 7004)),
///     range(10923, 16383, node("10.0.0.1", 7000), node("10.0.0.4", 7003)),
/// ];
/// assert_eq!(
///     cluster_masters(&reply),
///     [("10.0.0.1".to_owned(), 7000), ("10.0.0.2".to_owned(), 7001)]
/// );
/// ```
#[must_use]
pub fn cluster_masters(ranges: &[redis::Value]) -> Vec<(String, u16)> {
    cluster_addresses(ranges, 1)
}

/// Every node a `CLUSTER SLOTS` reply names — masters and replicas, since a failover may
/// promote any replica — each once, in the order of the reply: `(host, port)`. The reply's
/// shape is as in [`cluster_masters`].
///
/// ```
/// use distlock::diagnose::cluster_nodes;
/// use redis::Value;
///
/// let node = |host: &str, port: i64| {
///     Value::Array(vec![Value::BulkString(host.into()), Value::Int(port)])
/// };
/// let reply = [Value::Array(vec![
///     Value::Int(0),
///     Value::Int(16383),
///     node("10.0.0.1", 7000),
///     node("10.0.0.4", 7003),
/// ])];
/// assert_eq!(
///     cluster_nodes(&reply),
///     [("10.0.0.1".to_owned(), 7000), ("10.0.0.4".to_owned(), 7003)]
/// );
/// ```
#[must_use]
pub fn cluster_nodes(ranges: &[redis::Value]) -> Vec<(String, u16)> {
    cluster_addresses(ranges, usize::MAX)
}

/// The first `per_range` nodes of each range (the master first), each once.
fn cluster_addresses(ranges: &[redis::Value], per_range: usize) -> Vec<(String, u16)> {
    use redis::Value;
    let mut addresses: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        for node in fields.iter().skip(2).take(per_range) {
            let Value::Array(node) = node else {
                continue;
            };
            let host: Option<String> = node
                .first()
                .and_then(|v| redis::from_redis_value_ref(v).ok());
            // Read wide and narrowed checked: redis-rs wraps an integer too large for a `u16`.
            let port: Option<u16> = node
                .get(1)
                .and_then(|v| redis::from_redis_value_ref::<i64>(v).ok())
                .and_then(|port| u16::try_from(port).ok());
            if let (Some(host), Some(port)) = (host, port) {
                if !addresses.iter().any(|(h, p)| *h == host && *p == port) {
                    addresses.push((host, port));
                }
            }
        }
    }
    addresses
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

    #[test]
    fn cluster_slots_entries_of_another_shape_are_skipped() {
        use redis::Value;
        let reply = [
            Value::Int(1),
            Value::Array(vec![Value::Int(0), Value::Int(1)]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::Array(vec![Value::BulkString(b"h".to_vec()), Value::Int(70000)]),
                Value::Nil,
                Value::Array(vec![Value::BulkString(b"r".to_vec()), Value::Int(7001)]),
            ]),
        ];
        assert_eq!(cluster_masters(&reply), Vec::<(String, u16)>::new());
        assert_eq!(cluster_nodes(&reply), [("r".to_owned(), 7001)]);
    }
}
