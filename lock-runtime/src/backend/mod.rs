//! The one seam between the lock manager and Redis.
//!
//! Everything above this module (manager, guard, watchdog, the attribute) speaks in lock
//! operations — try to take, release, extend, check, wait for a hand-off or a release — and
//! never learns which deployment it runs on:
//!
//! - **single**: one endpoint, a standalone server, the master of a Sentinel service, or a
//!   Redis Cluster (`line`): every key of a lock shares one hash slot, so each script runs on
//!   the one node that owns it, and waiters queue in one line per lock that releases hand the
//!   lock down;
//! - **quorum**: Redlock over independent masters (`quorum`, each master a `quorum::Master`),
//!   which cannot agree on a line: waiters take a place in the lock's wake list on each master
//!   where they find it held, and a release on a master wakes the first live waiter there,
//!   which then competes;
//! - **in-process** (`memory`): the line protocol of a single endpoint on a table in this
//!   process's memory, for tests and single-process tools. A release hands the lock over in
//!   the table, and the waiter is told by a message to its mailbox; it reads the table to
//!   see that the lock is its own (the look is a map lookup), so it declares no hand-off.
//!
//! The seam is an enum (`Locks`), not a trait: each operation below is one `match` with one
//! arm per store, and each store declares its [`Capabilities`] and maps its own failures into
//! [`failure::Failure`]. A new store is one file or folder here, one arm per operation and one
//! constructor (docs/backends.md, "Adding a store", walks through the in-process one).
//!
//! What a single endpoint's manager learns of each lock as it goes — a key just handed over,
//! its last place in a line, Redis's clock — is kept in `recent`.

mod capabilities;
#[cfg(feature = "resource-counts")]
mod counts;
pub(crate) mod failure;
pub(crate) mod grants;
pub(crate) mod keys;
mod line;
mod memory;
mod operations;
pub(crate) mod orders;
mod quorum;
pub(crate) mod recent;
mod replicas;
pub(crate) mod scripts;
pub(crate) mod waits;

use std::sync::Arc;
use std::time::Duration;

use crate::backend::grants::{GrantHub, Servers};
use crate::backend::keys::{Kind, LockKeys};
use crate::options::Timeouts;
use crate::redis::connection::{Connections, Endpoint};
use crate::redis::sentinel::Sentinels;
use crate::support::cold;
pub(crate) use capabilities::{Capabilities, Together};
#[cfg(feature = "resource-counts")]
pub use counts::ResourceCounts;
pub(crate) use failure::Failure;
pub(crate) use line::{LeasedLook, Look};
use line::{Node, ScanTarget};
use memory::Memory;
pub(crate) use operations::{Attempt, LockRequest, Ownership, Released, Taken, Unlock, Wait};
use quorum::Quorum;
pub(crate) use recent::RedisPlace;
pub(crate) use replicas::Replicas;

/// How long a place in line (or in a Redlock master's wake list) lasts unless its waiter renews
/// it: a waiter that dies in line is skipped at most this long after its last renewal.
pub(crate) const LEASE: Duration = Duration::from_secs(3);
/// How often a waiter renews its place in line (and looks whether the lock is already its own,
/// in case a hand-off message was lost; on Redlock, whether it is free, in case the wake-up
/// went to a waiter that has just died).
pub(crate) const RENEW: Duration = Duration::from_secs(1);
/// The longest ttl a hand-off gives before its new holder confirms it: a lock handed to a
/// waiter that has just died comes back at most this long after.
pub(crate) const CLAIM: Duration = Duration::from_secs(3);

/// The prefix of a manager's hand-off channel (standalone, cluster).
const GRANTS: &str = "distlock:grants:";
/// The prefix of a manager's wake-up channel (Redlock).
const WAKE_UPS: &str = "distlock:wake:";

/// One server to scan for lock keys, and which node of the backend reaches it.
#[derive(Debug, Clone)]
pub(crate) struct Scan {
    node: usize,
    target: ScanTarget,
    /// The Redis type of the keys looked for: `string` (a mutex, a writer) or `zset` (a
    /// semaphore's permits, readers).
    of_type: &'static str,
}

/// Where the locks live, and how their waiters hear of a release.
pub(crate) struct Backend {
    locks: Locks,
    /// What `locks` can do, as its store declares it.
    capabilities: Capabilities,
    /// This manager's message channel: hand-offs (single endpoint) and wake-ups (Redlock).
    grants: GrantHub,
}

enum Locks {
    Single(Box<Node>),
    Quorum(Quorum),
    Memory(Memory),
}

impl Locks {
    /// What the store declares it can do.
    fn capabilities(&self) -> Capabilities {
        match self {
            Locks::Single(node) => node.capabilities(),
            Locks::Quorum(_) => Quorum::CAPABILITIES,
            Locks::Memory(_) => Memory::CAPABILITIES,
        }
    }
}

impl Backend {
    /// A standalone server.
    pub(crate) fn standalone(client: redis::Client, timeouts: Timeouts) -> Self {
        Backend::with(
            GrantHub::new(
                GRANTS,
                vec![Servers::Fixed(vec![client.clone()])],
                timeouts,
                1,
            ),
            Locks::Single(Box::new(Node::new(Connections::new(
                Endpoint::Standalone(client),
                timeouts,
            )))),
        )
    }

    /// A Redis Cluster, reached through its seed nodes. Hand-off messages use one pub/sub
    /// connection to any node: a cluster forwards every publish to all its nodes.
    pub(crate) fn cluster(
        seeds: Vec<redis::Client>,
        endpoint: Endpoint,
        timeouts: Timeouts,
    ) -> Self {
        Backend::with(
            GrantHub::new(GRANTS, vec![Servers::Fixed(seeds)], timeouts, 1),
            Locks::Single(Box::new(Node::new(Connections::new(endpoint, timeouts)))),
        )
    }

    /// The master of a Sentinel service, followed across failovers: a standalone server whose
    /// address the sentinels give.
    pub(crate) fn sentinel(sentinels: Sentinels, timeouts: Timeouts) -> Self {
        let sentinels = Arc::new(sentinels);
        crate::support::background::spawn(crate::redis::sentinel::watch_switches(Arc::downgrade(
            &sentinels,
        )));
        Backend::with(
            GrantHub::new(
                GRANTS,
                vec![Servers::Sentinel(Arc::clone(&sentinels))],
                timeouts,
                1,
            ),
            Locks::Single(Box::new(Node::new(Connections::new(
                Endpoint::Sentinel(sentinels),
                timeouts,
            )))),
        )
    }

    /// The in-process lock table (see `memory`).
    pub(crate) fn in_process() -> Self {
        Backend::with(GrantHub::in_process(), Locks::Memory(Memory::new()))
    }

    /// Redlock over independent masters, with one wake-up connection per master.
    pub(crate) fn redlock(
        masters: Vec<redis::Client>,
        timeouts: Timeouts,
        node_timeout: Duration,
    ) -> Self {
        let nodes = masters
            .iter()
            .map(|client| {
                quorum::Master::new(Connections::new(
                    Endpoint::Standalone(client.clone()),
                    timeouts,
                ))
            })
            .collect();
        // A waiter must hear a release from at least one master of any majority the holder
        // may have: n - majority + 1 subscriptions guarantee that.
        let confirmations = masters.len() - (masters.len() / 2 + 1) + 1;
        let sources = masters
            .into_iter()
            .map(|client| Servers::Fixed(vec![client]))
            .collect();
        let grants = GrantHub::new(WAKE_UPS, sources, timeouts, confirmations);
        let channel = Arc::clone(grants.channel());
        Backend::with(
            grants,
            Locks::Quorum(Quorum::new(nodes, node_timeout, channel)),
        )
    }

    /// A backend over `locks`, its waiters told by `grants`, knowing nothing of any lock yet.
    fn with(grants: GrantHub, locks: Locks) -> Self {
        Backend {
            capabilities: locks.capabilities(),
            locks,
            grants,
        }
    }

    /// Counts a lock, an extension, a hand-off and a fencing token only once `replicas`
    /// acknowledged it (`wait_for_replicas`); on a single endpoint (standalone, Sentinel,
    /// cluster), the only kind whose builder accepts it.
    pub(crate) fn wait_for_replicas(&mut self, replicas: Replicas) {
        if let Locks::Single(node) = &mut self.locks {
            node.wait_for_replicas(replicas);
        }
        self.capabilities = self.locks.capabilities();
    }

    /// With `wait_for_replicas`, checks that the server runs `WAIT`: a `Config` error that
    /// names the fix when it does not.
    pub(crate) async fn check_wait(&self) -> Result<(), crate::LockError> {
        match &self.locks {
            Locks::Single(node) => node.check_wait().await,
            Locks::Quorum(_) | Locks::Memory(_) => Ok(()),
        }
    }

    /// Confirms a lock handed over to `token` with its full ttl, counted once the replicas
    /// `wait_for_replicas` asks for acknowledged it: `true` then, `false` when it is not
    /// `token`'s. When too few did, gives it back (and `token`'s place in line) and fails with
    /// the error that says so.
    ///
    /// The hand-off was the releasing holder's write, on another connection, which a `WAIT`
    /// on this one does not count; this write of its own does, and a replica's stream is one
    /// ordered log, so the replica that acknowledged it also has the hand-off and its fencing
    /// token.
    pub(crate) async fn confirm_replicated(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> failure::Result<bool> {
        match &self.locks {
            Locks::Single(node) => node.confirm_replicated(keys, token, ttl_millis).await,
            Locks::Quorum(_) | Locks::Memory(_) => Ok(true),
        }
    }

    /// What the store can do, which the manager's choices depend on.
    pub(crate) fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    /// Where waiters hear of a hand-off or a wake-up.
    pub(crate) fn grants(&self) -> &GrantHub {
        &self.grants
    }

    /// Checks that Redis answers (a majority of the masters, for Redlock) and lets us release
    /// `probe`, a lock nobody holds.
    pub(crate) async fn ping(&self, probe: &LockKeys) -> failure::Result<()> {
        match &self.locks {
            Locks::Single(node) => node.ping(probe).await,
            Locks::Quorum(quorum) => quorum.ping(probe).await,
            Locks::Memory(_) => Ok(()),
        }
    }

    /// One attempt to take the lock; its `wait` says what else it must find out or mark.
    ///
    /// A permit's or reader's operations are boxed here and below: their futures stay out of
    /// the mutex's, whose size every acquisition and release carries.
    pub(crate) async fn try_lock(&self, request: LockRequest<'_>) -> failure::Result<Attempt> {
        match &self.locks {
            Locks::Single(node) if request.keys.kind != Kind::Mutex => {
                cold::boxed(|| node.leased_attempt(request)).await
            }
            // The other stores' attempts and a multi-key one are boxed: inlined, the largest
            // would set the size of every attempt's future, which each acquisition moves.
            Locks::Single(node) if request.keys.together.is_some() => {
                cold::boxed(|| node.attempt_together(request)).await
            }
            Locks::Single(node) => node.attempt(request).await,
            Locks::Quorum(quorum) => cold::boxed(|| quorum.try_lock(request)).await,
            Locks::Memory(memory) if request.keys.kind != Kind::Mutex => memory.try_lease(
                request.keys,
                request.token,
                Duration::from_millis(request.ttl_millis),
                request.fencing,
                &request.wait,
            ),
            Locks::Memory(memory) => memory.try_lock(
                request.keys,
                request.token,
                Duration::from_millis(request.ttl_millis),
                request.fencing,
                &request.wait,
            ),
        }
    }

    /// Deletes the lock if it is still ours (handing it to the next waiter, or waking the
    /// waiters); why not, if it was not ours. `taken`: how it was taken.
    pub(crate) async fn unlock(
        &self,
        keys: &LockKeys,
        token: &str,
        taken: Taken,
    ) -> failure::Result<Ownership> {
        match &self.locks {
            Locks::Single(node) if keys.kind != Kind::Mutex => {
                cold::boxed(|| node.leased_release(keys, token)).await
            }
            // Boxed, as in `try_lock`: the mutex's own release sets the future's size.
            Locks::Single(node) if keys.together.is_some() => {
                cold::boxed(|| node.release_together(keys, token, false)).await
            }
            Locks::Single(node) => node.release(keys, token, taken).await,
            Locks::Quorum(quorum) => Ok(Ownership::from_majority(
                cold::boxed(|| quorum.unlock(keys, token)).await?,
            )),
            Locks::Memory(memory) if keys.kind != Kind::Mutex => {
                Ok(match memory.unlock_lease(keys, token, false)? {
                    Released::Freed | Released::HandedOver => Ownership::Ours,
                    Released::NotOurs(cause) => Ownership::Lost(cause),
                })
            }
            Locks::Memory(memory) => Ok(memory.unlock(keys, token, Unlock::Release)),
        }
    }

    /// Breaks the lock for an operator (`LockManager::force_release`) if its key still holds
    /// the value `seen` (a mutex's one; every permit's or reader's seen, for `keys.kind`),
    /// releasing it as its holder would; `true` if it did. On a single endpoint and in
    /// process it also leaves a `forced` mark with each value, so that the holder's next
    /// release, hold or extension learns it was force-released — and never mistakes the
    /// release for its own.
    pub(crate) async fn force_unlock(
        &self,
        keys: &LockKeys,
        seen: &[String],
    ) -> failure::Result<bool> {
        let Some(value) = seen.first() else {
            return Ok(false);
        };
        match &self.locks {
            Locks::Single(node) if keys.kind != Kind::Mutex => {
                cold::boxed(|| node.force_release_leases(keys, seen)).await
            }
            Locks::Single(node) => node.force_release(keys, value).await,
            Locks::Quorum(quorum) => quorum.unlock(keys, value).await,
            Locks::Memory(memory) if keys.kind != Kind::Mutex => {
                Ok(memory.force_unlock_leases(keys, seen))
            }
            Locks::Memory(memory) => Ok(memory.force_unlock(keys, value)),
        }
    }

    /// `token`'s place in `key`'s line may have been handed on or dropped: a hand-off message
    /// came for it (a place is taken off the line when it is handed over), or messages may
    /// have been lost. Its next renewal looks for it rather than trusting its last lease.
    pub(crate) fn place_may_be_gone(&self, key: &str, token: &str) {
        if let Locks::Single(node) = &self.locks {
            node.place_may_be_gone(key, token);
        }
    }

    /// Whether this manager saw `key` handed over within the last second (by its own release,
    /// or to one of its acquisitions): a first try would most likely find it held, so the next
    /// acquisition joins the line at once. Only where releases hand locks over.
    pub(crate) fn recently_contended(&self, key: &str) -> bool {
        matches!(&self.locks, Locks::Single(node) if node.recently_contended(key))
    }

    /// Records that `key` was just handed to one of this manager's acquisitions.
    pub(crate) fn handed_over(&self, key: &Arc<str>) {
        if let Locks::Single(node) = &self.locks {
            node.handed_over(key);
        }
    }

    /// Takes `token` out of the lock's line, and releases the lock as [`Backend::unlock`] does
    /// if it was handed to `token` meanwhile (`true` then): for a waiter that gives up.
    pub(crate) async fn leave(&self, keys: &LockKeys, token: &str) -> failure::Result<bool> {
        match &self.locks {
            Locks::Single(node) if keys.kind != Kind::Mutex => {
                cold::boxed(|| node.leased_leave(keys, token)).await
            }
            Locks::Single(node) if keys.together.is_some() => {
                Ok(node.release_together(keys, token, true).await?.is_ours())
            }
            Locks::Single(node) => node.leave(keys, token).await,
            Locks::Quorum(quorum) => quorum.unlock(keys, token).await,
            Locks::Memory(memory) if keys.kind != Kind::Mutex => Ok(!matches!(
                memory.unlock_lease(keys, token, true)?,
                Released::NotOurs(_)
            )),
            Locks::Memory(memory) => Ok(memory.unlock(keys, token, Unlock::Leave).is_ours()),
        }
    }

    /// Releases a lock whose `hold_at_least` is not over: leaves it to expire `keep_millis`
    /// from now rather than deleting it, if it is still ours (why not, if it was not), and wakes
    /// the first waiter in line to learn that expiry. Whoever waits gets it when it expires.
    pub(crate) async fn hold(
        &self,
        keys: &LockKeys,
        token: &str,
        keep_millis: u64,
    ) -> failure::Result<Ownership> {
        match &self.locks {
            // A permit or read lock keeps its lease until the hold's end, then comes back at
            // the next look after it, with no hand-off.
            Locks::Single(node) if keys.kind != Kind::Mutex => {
                cold::boxed(|| node.leased_extend(keys, token, keep_millis)).await
            }
            // Left to expire at the hold's end; waiters find the keys free at their next look.
            Locks::Single(node) if keys.together.is_some() => {
                node.extend_together(keys, token, keep_millis).await
            }
            Locks::Single(node) => {
                node.naming_the_key(keys, node.hold(keys, token, keep_millis).await)
                    .await
            }
            Locks::Quorum(quorum) => Ok(Ownership::from_majority(
                quorum.hold(keys, token, keep_millis).await?,
            )),
            Locks::Memory(memory) if keys.kind != Kind::Mutex => {
                Ok(memory.extend_lease(keys, token, Duration::from_millis(keep_millis)))
            }
            Locks::Memory(memory) => {
                Ok(memory.hold(keys, token, Duration::from_millis(keep_millis)))
            }
        }
    }

    /// Sets the lock's remaining ttl if it is still ours; why not, if it was not ours.
    pub(crate) async fn extend(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> failure::Result<Ownership> {
        match &self.locks {
            Locks::Single(node) if keys.kind != Kind::Mutex => {
                cold::boxed(|| node.leased_extend(keys, token, ttl_millis)).await
            }
            Locks::Single(node) if keys.together.is_some() => {
                node.extend_together(keys, token, ttl_millis).await
            }
            Locks::Single(node) => {
                node.naming_the_key(keys, node.extend(keys, token, ttl_millis).await)
                    .await
            }
            Locks::Quorum(quorum) => Ok(Ownership::from_majority(
                quorum.extend(keys, token, ttl_millis).await?,
            )),
            Locks::Memory(memory) if keys.kind != Kind::Mutex => {
                Ok(memory.extend_lease(keys, token, Duration::from_millis(ttl_millis)))
            }
            Locks::Memory(memory) => {
                Ok(memory.extend(keys, token, Duration::from_millis(ttl_millis)))
            }
        }
    }

    /// After a mutex's one attempt found the name held: `Config` when it is held as a
    /// semaphore (see `Node::refuse_a_semaphore`); the in-process table refuses in the attempt.
    pub(crate) async fn refuse_a_semaphore(&self, keys: &LockKeys) -> failure::Result<()> {
        match &self.locks {
            Locks::Single(node) if keys.kind == Kind::Mutex && keys.together.is_none() => {
                node.refuse_a_semaphore(keys).await
            }
            _ => Ok(()),
        }
    }

    /// Whether the lock is still ours.
    pub(crate) async fn is_held(&self, keys: &LockKeys, token: &str) -> failure::Result<bool> {
        match &self.locks {
            Locks::Single(node) if keys.kind != Kind::Mutex => {
                cold::boxed(|| node.leased_is_held(keys, token)).await
            }
            Locks::Single(node) if keys.together.is_some() => {
                node.is_held_together(keys, token).await
            }
            Locks::Single(node) => node.is_held(keys, token).await,
            Locks::Quorum(quorum) => quorum.is_held(keys, token).await,
            Locks::Memory(memory) if keys.kind != Kind::Mutex => {
                Ok(memory.holds_lease(keys, token))
            }
            Locks::Memory(memory) => Ok(memory.is_held(keys, token)),
        }
    }

    /// One look at the lock as inspection shows it; `None` when it is free (on Redlock: not
    /// held by a majority of the masters).
    pub(crate) async fn inspect(&self, keys: &LockKeys) -> failure::Result<Option<Look>> {
        match &self.locks {
            Locks::Single(node) => node.naming_the_key(keys, node.inspect(keys).await).await,
            Locks::Quorum(quorum) => quorum.inspect(keys).await,
            Locks::Memory(memory) => Ok(memory.inspect(keys)),
        }
    }

    /// Every server to scan for lock keys: the standalone server, each master of a cluster,
    /// or each Redlock master (whose keyspaces overlap: the caller drops repeated names).
    pub(crate) async fn scan_targets(&self) -> failure::Result<Vec<Scan>> {
        match &self.locks {
            Locks::Single(node) => Ok(node
                .scan_targets()
                .await?
                .into_iter()
                .flat_map(|target| {
                    ["string", "zset"].map(|of_type| Scan {
                        node: 0,
                        target: target.clone(),
                        of_type,
                    })
                })
                .collect()),
            Locks::Quorum(quorum) => Ok((0..quorum.nodes().len())
                .map(|node| Scan {
                    node,
                    target: ScanTarget::Server,
                    of_type: "string",
                })
                .collect()),
            Locks::Memory(_) => Ok(vec![Scan {
                node: 0,
                target: ScanTarget::Server,
                of_type: "string",
            }]),
        }
    }

    /// One `SCAN` step on `scan`: the next cursor (0 when done) and the string keys found
    /// that match `pattern`.
    pub(crate) async fn scan(
        &self,
        scan: &Scan,
        cursor: u64,
        pattern: &str,
    ) -> failure::Result<(u64, Vec<Vec<u8>>)> {
        match &self.locks {
            Locks::Single(node) => node.scan(&scan.target, cursor, pattern, scan.of_type).await,
            Locks::Quorum(quorum) => {
                quorum.nodes()[scan.node]
                    .scan(&scan.target, cursor, pattern)
                    .await
            }
            // The whole table in one step.
            Locks::Memory(memory) => Ok((0, memory.held_keys(pattern))),
        }
    }

    /// Resource counts for leak tests, with the manager's `queued_keys`.
    #[cfg(feature = "resource-counts")]
    pub(crate) fn resource_counts(&self, queued_keys: usize) -> ResourceCounts {
        if let Locks::Memory(memory) = &self.locks {
            // No connection, no channel; the hub and the table are the process's, so what
            // they hold is counted as waiters.
            return ResourceCounts {
                queued_keys,
                watched_channels: 0,
                wake_requests: 0,
                connections: 0,
                registered_waiters: self.grants.waiters() + memory.len(),
            };
        }
        let connections = match &self.locks {
            Locks::Single(node) => node.connections().len(),
            Locks::Quorum(quorum) => quorum
                .nodes()
                .iter()
                .map(|node| node.connections().len())
                .sum(),
            Locks::Memory(_) => 0,
        };
        ResourceCounts {
            queued_keys,
            watched_channels: usize::from(self.grants.is_subscribed()),
            wake_requests: 0,
            connections,
            registered_waiters: self.grants.waiters(),
        }
    }
}

#[cfg(test)]
mod tests;
