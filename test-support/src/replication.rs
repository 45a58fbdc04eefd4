//! [`Replicated`]: a master and one replica of its own for one test, the replica replicating
//! through a [`FaultProxy`] so that a test can slow replication down or hold it back while
//! both servers keep answering; and [`hold_back_replication`], which cuts a master off from
//! its replicas (a Sentinel set's, say) without stopping anything.

use std::time::Duration;

use super::{wait_until, FaultProxy, RedisServer};

/// How long a new replica gets to finish its first sync.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// A master and one replica (`--replicaof` the proxy in front of the master). Dropping it kills
/// both and the proxy.
pub struct Replicated {
    // Field order is drop order: the replica first, so it never reconnects to a proxy that is
    // gone towards a master that is gone.
    replica: RedisServer,
    link: FaultProxy,
    master: RedisServer,
}

impl Replicated {
    /// Starts the master, the proxy and the replica, and waits until the replica is in sync.
    pub fn start() -> Self {
        let master = RedisServer::start();
        let link = FaultProxy::start(master.port());
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &link.port().to_string()]);
        let pair = Replicated {
            replica,
            link,
            master,
        };
        pair.wait_synced();
        pair
    }

    /// The master: where locks are taken.
    pub fn master(&self) -> &RedisServer {
        &self.master
    }

    /// The replica, which reads what the master wrote once replication carried it.
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// The proxy the replication stream goes through: [`FaultProxy::set_delay`] makes the
    /// replica lag, [`FaultProxy::stall`] holds every write back from it.
    pub fn link(&self) -> &FaultProxy {
        &self.link
    }

    /// Waits until the replica's link to the master is up and the master counts it.
    pub fn wait_synced(&self) {
        wait_until(SYNC_TIMEOUT, "the replica to sync with its master", || {
            self.replica
                .info("replication")
                .contains("master_link_status:up")
                && self
                    .master
                    .info("replication")
                    .contains("connected_slaves:1")
        });
    }

    /// Makes the replica a master of its own (`REPLICAOF NO ONE`), with whatever it received.
    pub fn promote_replica(&self) {
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query(&mut self.replica.conn())
            .unwrap_or_else(|error| panic!("REPLICAOF NO ONE failed: {error}"));
        wait_until(SYNC_TIMEOUT, "the replica to be a master", || {
            self.replica.info("replication").contains("role:master")
        });
    }
}

/// Cuts `master` off from its replicas while every server keeps running and answering: the
/// default user may no longer `SYNC`/`PSYNC` (an ACL change, which is not replicated), and the
/// replicas' connections are closed, so they cannot reconnect. Every write from then on stays
/// on `master` alone, as when replication lags behind.
pub fn hold_back_replication(master: &RedisServer) {
    let mut conn = master.conn();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-sync")
        .arg("-psync")
        .query(&mut conn)
        .unwrap_or_else(|error| panic!("ACL SETUSER default -sync -psync failed: {error}"));
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut conn)
        .unwrap_or_else(|error| panic!("CLIENT KILL TYPE replica failed: {error}"));
    wait_until(SYNC_TIMEOUT, "the master to count no replica", || {
        master.info("replication").contains("connected_slaves:0")
    });
}
