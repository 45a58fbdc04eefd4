//! The one seam between the lock manager and Redis.
//!
//! Everything above this module (manager, guard, watchdog, the attribute) speaks in lock
//! operations — try to take, release, extend, check, watch for releases — and never learns
//! which deployment it runs on:
//!
//! - **single**: one endpoint, a standalone server or a Redis Cluster (`node`): every key of a
//!   lock shares one hash slot, so each script runs on the one node that owns it;
//! - **quorum**: Redlock over independent masters (`quorum`).

mod node;
mod quorum;

use std::time::Duration;

use redis::RedisResult;

use crate::connection::{Connections, Endpoint, Timeouts};
use crate::keys::LockKeys;
use crate::wake::{WakeHub, Watch};
use node::Node;
use quorum::Quorum;

/// What one attempt to take a lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours now; `fence` is the fencing token when one was asked for.
    Acquired { fence: Option<u64> },
    /// Someone else holds it, for at most `remaining` more (`None`: unknown).
    Held { remaining: Option<Duration> },
}

/// What an attempt must find out besides whether it got the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Nothing: a first try needs only `SET NX PX` — exactly the command a hand-written lock
    /// sends, the cheapest thing Redis can run.
    FirstTry,
    /// The holder's remaining ttl, to know when to retry.
    Poll,
    /// That, and mark the lock as awaited, so that its release publishes a wake-up (the caller
    /// is subscribed).
    Subscribed,
}

/// Where the locks live, and the wake-ups that come from there.
pub(crate) struct Backend {
    locks: Locks,
    wake: WakeHub,
}

enum Locks {
    Single(Box<Node>),
    Quorum(Quorum),
}

impl Backend {
    /// A standalone server.
    pub(crate) fn standalone(client: redis::Client, timeouts: Timeouts) -> Self {
        Backend {
            wake: WakeHub::new(vec![vec![client.clone()]], timeouts, 1),
            locks: Locks::Single(Box::new(Node::new(Connections::new(
                Endpoint::Standalone(client),
                timeouts,
            )))),
        }
    }

    /// A Redis Cluster, reached through its seed nodes. Wake-ups use one pub/sub connection to
    /// any node: a cluster forwards every publish to all its nodes.
    pub(crate) fn cluster(
        seeds: Vec<redis::Client>,
        endpoint: Endpoint,
        timeouts: Timeouts,
    ) -> Self {
        Backend {
            wake: WakeHub::new(vec![seeds], timeouts, 1),
            locks: Locks::Single(Box::new(Node::new(Connections::new(endpoint, timeouts)))),
        }
    }

    /// Redlock over independent masters.
    pub(crate) fn redlock(
        masters: Vec<redis::Client>,
        timeouts: Timeouts,
        node_timeout: Duration,
    ) -> Self {
        let quorum = Quorum::new(
            masters
                .iter()
                .map(|client| {
                    Node::new(Connections::new(
                        Endpoint::Standalone(client.clone()),
                        timeouts,
                    ))
                })
                .collect(),
            node_timeout,
        );
        // A waiter must hear a release from at least one master of any majority the holder
        // may have: n - majority + 1 subscriptions guarantee that.
        let confirmations = masters.len() - quorum.majority() + 1;
        let sources = masters.into_iter().map(|client| vec![client]).collect();
        Backend {
            wake: WakeHub::new(sources, timeouts, confirmations),
            locks: Locks::Quorum(quorum),
        }
    }

    /// Whether fencing tokens can be issued: they need one counter that every acquisition
    /// increments in order, which independent masters cannot provide.
    pub(crate) fn supports_fencing(&self) -> bool {
        matches!(self.locks, Locks::Single(_))
    }

    /// Checks that Redis answers (a majority of the masters, for Redlock) and lets us release
    /// `probe`, a lock nobody holds.
    pub(crate) async fn ping(&self, probe: &LockKeys) -> RedisResult<()> {
        match &self.locks {
            Locks::Single(node) => node.ping(probe).await,
            Locks::Quorum(quorum) => quorum.ping(probe).await,
        }
    }

    /// One attempt to take the lock; `wait` says what else it must find out or mark.
    pub(crate) async fn try_lock(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
        fencing: bool,
        wait: Wait,
    ) -> RedisResult<Attempt> {
        match &self.locks {
            Locks::Single(node) => node.try_lock(keys, token, ttl_millis, fencing, wait).await,
            Locks::Quorum(quorum) => quorum.try_lock(keys, token, ttl_millis, wait).await,
        }
    }

    /// Deletes the lock if it is still ours (waking its waiters); `false` if it was not ours.
    pub(crate) async fn unlock(&self, keys: &LockKeys, token: &str) -> RedisResult<bool> {
        match &self.locks {
            Locks::Single(node) => node.unlock(keys, token).await,
            Locks::Quorum(quorum) => quorum.unlock(keys, token).await,
        }
    }

    /// Sets the lock's remaining ttl if it is still ours; `false` if it was not ours.
    pub(crate) async fn extend(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> RedisResult<bool> {
        match &self.locks {
            Locks::Single(node) => node.extend(keys, token, ttl_millis).await,
            Locks::Quorum(quorum) => quorum.extend(keys, token, ttl_millis).await,
        }
    }

    /// Whether the lock is still ours.
    pub(crate) async fn is_held(&self, keys: &LockKeys, token: &str) -> RedisResult<bool> {
        match &self.locks {
            Locks::Single(node) => node.is_held(keys, token).await,
            Locks::Quorum(quorum) => quorum.is_held(keys, token).await,
        }
    }

    /// Subscribes to the lock's releases (see [`WakeHub::watch`]).
    pub(crate) async fn watch(&self, keys: &LockKeys) -> RedisResult<Watch> {
        self.wake.watch(&keys.waiters()).await
    }

    /// Resource counts for leak tests: (runtime connections, watched channels, wake-up
    /// requests waiting to be sent).
    pub(crate) fn resource_counts(&self) -> (usize, usize, usize) {
        let connections = match &self.locks {
            Locks::Single(node) => node.connections().len(),
            Locks::Quorum(quorum) => quorum
                .nodes()
                .iter()
                .map(|node| node.connections().len())
                .sum(),
        };
        (
            connections,
            self.wake.watched_channels(),
            self.wake.pending_requests(),
        )
    }
}
