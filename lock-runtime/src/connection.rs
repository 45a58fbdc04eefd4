//! Connections to one Redis server, one per tokio runtime that uses them.
//!
//! A redis-rs connection is driven by a task on the runtime that created it and dies with that
//! runtime. A global lock manager outlives runtimes — every `#[tokio::test]` has its own — so
//! each runtime gets its own multiplexed `ConnectionManager`, created on first use there. Keeping
//! the connection's driver on the caller's runtime also keeps every round trip free of
//! cross-thread hand-offs. Connections of runtimes that have shut down are dropped when the next
//! one is added.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Client;
use tokio::runtime::{Handle, Id};

/// Connection and response timeouts of one server's connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

/// The connections to one Redis server, keyed by runtime.
pub(crate) struct Connections {
    client: Client,
    timeouts: Timeouts,
    slots: Mutex<Vec<Slot>>,
}

struct Slot {
    runtime: Id,
    connection: ConnectionManager,
    /// Upgradable while the runtime lives: a task parked on that runtime holds the `Arc`, and a
    /// runtime drops its tasks when it shuts down.
    runtime_alive: Weak<()>,
}

impl Connections {
    pub(crate) fn new(client: Client, timeouts: Timeouts) -> Self {
        Connections {
            client,
            timeouts,
            slots: Mutex::new(Vec::new()),
        }
    }

    /// The connection for the current runtime, connecting first if this runtime has none.
    ///
    /// Must be called from within a tokio runtime (every caller is an `async fn` of ours).
    pub(crate) async fn get(&self) -> redis::RedisResult<ConnectionManager> {
        let runtime = Handle::current();
        let id = runtime.id();
        if let Some(connection) = self.find(id) {
            return Ok(connection);
        }
        let connection =
            ConnectionManager::new_with_config(self.client.clone(), self.config()).await?;
        let alive = Arc::new(());
        let runtime_alive = Arc::downgrade(&alive);
        // Parks forever; dropped (with `alive`) when the runtime shuts down.
        drop(runtime.spawn(async move {
            let _alive = alive;
            std::future::pending::<()>().await;
        }));
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slots.retain(|slot| slot.runtime_alive.strong_count() > 0);
        // Another task of this runtime may have connected meanwhile: keep one connection.
        if let Some(slot) = slots.iter().find(|slot| slot.runtime == id) {
            return Ok(slot.connection.clone());
        }
        slots.push(Slot {
            runtime: id,
            connection: connection.clone(),
            runtime_alive,
        });
        Ok(connection)
    }

    fn find(&self, id: Id) -> Option<ConnectionManager> {
        let slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slots
            .iter()
            .find(|slot| slot.runtime == id)
            .map(|slot| slot.connection.clone())
    }

    /// How many runtimes currently have a connection (for leak tests).
    pub(crate) fn len(&self) -> usize {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    fn config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeouts.connect))
            .set_response_timeout(Some(self.timeouts.response))
            // Our own callers retry until their deadline; a long reconnect loop inside
            // redis-rs would only hide that Redis is down.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500))
    }
}
