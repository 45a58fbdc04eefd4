//! [`RedisCluster`]: a throwaway Redis Cluster of [`RedisServer`]s made with
//! `redis-cli --cluster create`, with failover and slot migration on demand;
//! [`ProxiedCluster`]: a one-node cluster reached only through a [`FaultProxy`]; and
//! [`RedisServers`]: independent masters for Redlock.
//!
//! ```ignore
//! let cluster = RedisCluster::start(3, 1); // 3 masters, 1 replica each
//! // ... point the code under test at cluster.urls() ...
//! cluster.set("lock:{42}", "x");
//! cluster.migrate_slot_of("lock:{42}", 1); // clients now get MOVED (and ASK meanwhile)
//! cluster.failover_master_of("lock:{42}"); // SIGKILL its master, wait for the replica
//! ```

use std::collections::BTreeMap;
use std::ops::Deref;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::free_port;
use crate::proxy::FaultProxy;
use crate::server::{Readiness, RedisServer};
use crate::tls::{require_redis_cli, run_bounded};

/// Number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The cluster node timeout: a master that does not answer for this long is failed over.
const NODE_TIMEOUT_MS: u32 = 1000;
/// Bound of `redis-cli --cluster create` (it polls once a second until the nodes agree).
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a new cluster gets to become consistent after `--cluster create`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `failover_master_of` waits for a replica to take over.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(15);
/// How long `migrate_slot_of` may take in all (moving keys, then every node agreeing).
const MIGRATE_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound of one `MIGRATE` (its own timeout argument, in ms).
const MIGRATE_CMD_TIMEOUT_MS: u64 = 5000;
/// How long `sync_replicas_of` waits for a replica to catch up.
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(5);
/// How many MOVED/ASK redirections a routed helper follows before giving up.
const MAX_REDIRECTS: usize = 5;

/// A Redis Cluster on 127.0.0.1: `masters` masters with `replicas_per_master` replicas each,
/// every node a [`RedisServer`] of its own (so each is killed when the cluster is dropped, and
/// by the watchdog if the test process dies).
///
/// Nodes run with `--cluster-enabled yes --cluster-config-file <dir>/nodes.conf
/// --cluster-node-timeout 1000 --cluster-replica-validity-factor 0
/// --repl-diskless-sync-delay 0` besides the usual `--save "" --appendonly no`:
/// - the port P is chosen so that its bus port P + 10000 (where every server version puts
///   it) is a port, and free;
/// - a replica may always take over, however long it was cut off (validity factor 0), so a
///   failover never stalls on a loaded machine;
/// - replicas get their first copy at once, not after Redis's default 5 s delay.
///
/// The topology is read from the nodes every time (`CLUSTER NODES`), so [`masters`],
/// [`node_for_key`] and the routed helpers stay right after [`failover_master_of`] and
/// [`migrate_slot_of`]. Each waits for the cluster to settle before returning, so the
/// views of all nodes agree afterwards; a topology change made behind the harness's back may
/// be seen late.
///
/// With a 1 s node timeout a node that gets no CPU for over a second can be failed over
/// unasked: on a badly overloaded machine a test may see an unplanned failover.
///
/// [`masters`]: RedisCluster::masters
/// [`node_for_key`]: RedisCluster::node_for_key
/// [`failover_master_of`]: RedisCluster::failover_master_of
/// [`migrate_slot_of`]: RedisCluster::migrate_slot_of
pub struct RedisCluster {
    /// Every node in start order, killed ones included. `redis-cli --cluster create` gets them
    /// in this order and makes the first `masters` of them the masters.
    nodes: Vec<RedisServer>,
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NodeLine {
    id: String,
    port: u16,
    flags: Vec<String>,
    /// The master's id for a replica, `None` for a master.
    master_id: Option<String>,
    /// Served slot ranges, inclusive. Migration markers (`[slot->-id]`) are left out.
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn is_master(&self) -> bool {
        self.has_flag("master")
    }

    /// Marked failed (or suspected of it) by the node whose view this is.
    fn is_failing(&self) -> bool {
        self.has_flag("fail") || self.has_flag("fail?")
    }

    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// One node's view of the cluster.
struct View {
    /// The port of the node that answered.
    port: u16,
    lines: Vec<NodeLine>,
}

impl View {
    fn owner_of(&self, slot: u16) -> Option<&NodeLine> {
        self.lines.iter().find(|l| l.is_master() && l.serves(slot))
    }

    /// Slot ranges → owning node id, as one comparable value.
    fn slot_map(&self) -> BTreeMap<(u16, u16), String> {
        self.lines
            .iter()
            .filter(|l| l.is_master())
            .flat_map(|l| l.slots.iter().map(move |&r| (r, l.id.clone())))
            .collect()
    }
}

impl RedisCluster {
    /// Starts `masters * (1 + replicas_per_master)` cluster-enabled servers (in parallel),
    /// joins them with `redis-cli --cluster create ... --cluster-replicas R --cluster-yes`,
    /// and waits until every node reports `cluster_state:ok` with all 16384 slots assigned,
    /// knows every other node, agrees on who serves which slot, and every replica has its
    /// replication link up.
    ///
    /// Takes about 2–3 s (redis-cli polls once a second). Panics if `masters < 3` (Redis
    /// Cluster needs 3), if `redis-cli` is missing, or with the step that did not happen within
    /// its bound (create: 60 s, settling: 30 s).
    pub fn start(masters: usize, replicas_per_master: usize) -> Self {
        assert!(
            masters >= 3,
            "RedisCluster::start({masters}, ..): redis-cli --cluster create needs at least 3 masters"
        );
        require_redis_cli();
        let total = masters * (1 + replicas_per_master);
        let cluster = Self {
            nodes: start_all(total, start_cluster_node),
        };

        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        create
            .args(["--cluster-replicas", &replicas_per_master.to_string()])
            .arg("--cluster-yes");
        let output = run_bounded(&mut create, CREATE_TIMEOUT)
            .unwrap_or_else(|e| panic!("redis-cli --cluster create failed: {e}"));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("All 16384 slots covered"),
            "redis-cli --cluster create did not cover all slots ({}): {create:?}\n{stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );

        cluster.wait_settled(
            READY_TIMEOUT,
            &format!(
                "the new cluster of {masters} masters x {replicas_per_master} replicas to settle"
            ),
            |cluster, views| {
                for view in views {
                    if view.lines.len() != total {
                        return Err(format!(
                            "node {} knows {} of {total} nodes",
                            view.port,
                            view.lines.len()
                        ));
                    }
                    let masters_seen = view.lines.iter().filter(|l| l.is_master()).count();
                    if masters_seen != masters {
                        return Err(format!(
                            "node {} sees {masters_seen} masters, not {masters}",
                            view.port
                        ));
                    }
                    let me = view.lines.iter().find(|l| l.has_flag("myself"));
                    if me.is_some_and(|me| !me.is_master()) {
                        let info = cluster.node_by_port(view.port).info("replication");
                        if !info.contains("master_link_status:up") {
                            return Err(format!(
                                "replica {} has no replication link up yet",
                                view.port
                            ));
                        }
                    }
                }
                Ok(())
            },
        );
        cluster
    }

    /// Every node in start order, including killed ones ([`RedisServer::is_running`]).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The running nodes that are masters now (slot owners, or masters left with no slots),
    /// in start order. Right after [`start`](Self::start) these are the first `masters`
    /// nodes; after a failover the promoted replica takes its place in start order, so
    /// indexes can shift.
    pub fn masters(&self) -> Vec<&RedisServer> {
        let view = self.view();
        let master_ports: Vec<u16> = view
            .lines
            .iter()
            .filter(|l| l.is_master() && !l.is_failing())
            .map(|l| l.port)
            .collect();
        self.nodes
            .iter()
            .filter(|n| n.is_running() && master_ports.contains(&n.port()))
            .collect()
    }

    /// `redis://127.0.0.1:P/` of every running master ([`masters`](Self::masters) order):
    /// seed URLs for a cluster client, which discovers replicas itself.
    pub fn urls(&self) -> Vec<String> {
        self.masters().iter().map(|n| n.url()).collect()
    }

    /// `redis://127.0.0.1:P/` of every running node, masters and replicas, in start order.
    pub fn node_urls(&self) -> Vec<String> {
        self.running()
            .map(super::server::RedisServer::url)
            .collect()
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, so hash tags count as Redis counts them).
    pub fn slot_of(&self, key: &str) -> u16 {
        let node = self.first_running();
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut node.conn())
            .unwrap_or_else(|e| {
                panic!(
                    "CLUSTER KEYSLOT {key:?} on port {} failed: {e}",
                    node.port()
                )
            });
        u16::try_from(slot).unwrap_or_else(|_| panic!("CLUSTER KEYSLOT {key:?} gave {slot}"))
    }

    /// The master serving `slot` now. Panics if no node serves it, or if the one that does is
    /// not running (it was killed and nothing took over).
    pub fn master_for_slot(&self, slot: u16) -> &RedisServer {
        let view = self.view();
        let owner = view.owner_of(slot).unwrap_or_else(|| {
            panic!(
                "no master serves slot {slot} in the view of node {}",
                view.port
            )
        });
        let node = self.node_by_port(owner.port);
        assert!(
            node.is_running(),
            "slot {slot} is served by node {} on port {}, which is not running (killed without failover?)",
            owner.id,
            owner.port
        );
        node
    }

    /// The master serving the slot of `key` now (`CLUSTER KEYSLOT`, then `CLUSTER NODES`).
    /// Any other node answers a command on `key` with `MOVED`.
    pub fn node_for_key(&self, key: &str) -> &RedisServer {
        self.master_for_slot(self.slot_of(key))
    }

    /// The cluster node id of `node` (`CLUSTER MYID`).
    pub fn node_id(&self, node: &RedisServer) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut node.conn())
            .unwrap_or_else(|e| panic!("CLUSTER MYID on port {} failed: {e}", node.port()))
    }

    /// `GET key` on the master of its slot (following MOVED/ASK); `None` if it does not exist.
    pub fn get(&self, key: &str) -> Option<String> {
        self.query_key(key, redis::cmd("GET").arg(key))
    }

    /// `SET key value` (no expiry) on the master of its slot.
    pub fn set(&self, key: &str, value: &str) {
        self.query_key::<()>(key, redis::cmd("SET").arg(key).arg(value));
    }

    /// `DEL key` on the master of its slot; returns whether the key existed.
    pub fn del(&self, key: &str) -> bool {
        self.query_key::<i64>(key, redis::cmd("DEL").arg(key)) == 1
    }

    /// `EXISTS key` on the master of its slot.
    pub fn exists(&self, key: &str) -> bool {
        self.query_key::<i64>(key, redis::cmd("EXISTS").arg(key)) == 1
    }

    /// `PTTL key` on the master of its slot: ms left, `-1` without expiry, `-2` if missing.
    pub fn pttl(&self, key: &str) -> i64 {
        self.query_key(key, redis::cmd("PTTL").arg(key))
    }

    /// Every key matching the glob `pattern` on any running master ([`RedisServer::keys`],
    /// so with `SCAN`), sorted and deduplicated. Replicas are not asked (they hold copies).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .masters()
            .into_iter()
            .flat_map(|m| m.keys(pattern))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// `FLUSHALL` on every running master.
    pub fn flushall(&self) {
        for master in self.masters() {
            master.flushall();
        }
    }

    /// Waits until every running replica of the master of `key`'s slot has every write that
    /// master took so far (its `slave_repl_offset` reaches the master's `master_repl_offset`);
    /// panics if one has not within 5 s. Call it before
    /// [`failover_master_of`](Self::failover_master_of) when the test needs those writes to
    /// survive (replication is asynchronous: a crash loses what was not copied yet).
    ///
    /// (Not `WAIT`: it counts only the writes of its own connection, and every helper here
    /// opens a fresh one.)
    pub fn sync_replicas_of(&self, key: &str) {
        let master = self.node_for_key(key);
        let offset = |node: &RedisServer, field: &str| -> i64 {
            let info = node.info("replication");
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| {
                    panic!(
                        "no {field} in INFO replication of port {}: {info}",
                        node.port()
                    )
                })
        };
        let target = offset(master, "master_repl_offset:");
        for replica in self.replicas_of(master) {
            crate::wait_until(
                REPLICATION_TIMEOUT,
                &format!(
                    "replica {} to reach offset {target} of its master on port {}",
                    replica.port(),
                    master.port()
                ),
                || offset(replica, "slave_repl_offset:") >= target,
            );
        }
    }

    /// The running replicas of `master`, in start order.
    pub fn replicas_of(&self, master: &RedisServer) -> Vec<&RedisServer> {
        let id = self.node_id(master);
        let view = self.view();
        self.running()
            .filter(|n| {
                view.lines.iter().any(|l| {
                    l.port == n.port()
                        && l.master_id.as_deref() == Some(id.as_str())
                        && !l.is_failing()
                })
            })
            .collect()
    }

    /// Kills (SIGKILL) the master serving the slot of `key` and waits until one of its
    /// replicas has been promoted and every running node reports `cluster_state:ok` and agrees
    /// that the new master serves the slot. Returns the new master.
    ///
    /// Writes the replica had not received yet are lost, as in a real crash (see
    /// [`sync_replicas_of`](Self::sync_replicas_of)). The killed node stays in
    /// [`nodes`](Self::nodes); [`RedisServer::restart`] brings it back, empty, and it rejoins
    /// as a replica of the new master.
    ///
    /// Takes about 2–3 s (1 s node timeout, then an election). Panics if the master has no
    /// running replica (start the cluster with `replicas_per_master >= 1`), or if the
    /// takeover has not happened within 15 s.
    pub fn failover_master_of(&self, key: &str) -> &RedisServer {
        let slot = self.slot_of(key);
        let old = self.master_for_slot(slot);
        let old_port = old.port();
        let old_id = self.node_id(old);
        assert!(
            !self.replicas_of(old).is_empty(),
            "failover_master_of({key:?}): the master of slot {slot} on port {old_port} has no running replica to promote; start the cluster with replicas_per_master >= 1"
        );
        old.kill();
        self.wait_settled(
            FAILOVER_TIMEOUT,
            &format!(
                "a replica of the killed master on port {old_port} to be promoted for slot {slot} (key {key:?})"
            ),
            |cluster, views| {
                for view in views {
                    let owner = view
                        .owner_of(slot)
                        .ok_or_else(|| format!("node {} sees no owner of slot {slot}", view.port))?;
                    if owner.id == old_id {
                        return Err(format!(
                            "node {} still sees the killed node {old_port} serving slot {slot}",
                            view.port
                        ));
                    }
                    if !cluster.node_by_port(owner.port).is_running() {
                        return Err(format!(
                            "node {} sees the stopped node {} serving slot {slot}",
                            view.port, owner.port
                        ));
                    }
                }
                Ok(())
            },
        );
        self.master_for_slot(slot)
    }

    /// Moves the slot of `key`, with its keys, to `masters()[to_master_index]`; see
    /// [`migrate_slot_of_holding`](Self::migrate_slot_of_holding), here without holding the
    /// migrating state. Afterwards the old master answers `MOVED` for the slot.
    pub fn migrate_slot_of(&self, key: &str, to_master_index: usize) -> &RedisServer {
        self.migrate_slot_of_holding(key, to_master_index, Duration::ZERO)
    }

    /// The master that serves the slot of `key` by its own account: the one whose own table
    /// (`myself` in its `CLUSTER NODES`) says so. Right after a slot moved, other nodes can
    /// still (or, for a moment, again) name the old owner, which [`node_for_key`](Self::node_for_key)
    /// reports; this is the node that answers for the key. Waits up to 15 s for exactly one
    /// running master to claim the slot.
    pub fn owner_of_key(&self, key: &str) -> &RedisServer {
        self.claimed_owner(self.slot_of(key), Instant::now() + MIGRATE_TIMEOUT)
    }

    /// Sends `CLUSTER SETSLOT <slot> NODE <target>` again to every running master whose view
    /// names another owner (or none); to the target first, after `CLUSTER BUMPEPOCH`, when it
    /// does not claim the slot itself. Best effort: the caller looks at the views again.
    fn tell_owner_again(&self, slot: u16, target: &RedisServer, target_id: &str) {
        let setslot = || {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("SETSLOT").arg(slot).arg("NODE").arg(target_id);
            cmd
        };
        let claims_itself = read_view(target).is_ok_and(|view| {
            view.lines
                .iter()
                .any(|line| line.flags.iter().any(|flag| flag == "myself") && line.serves(slot))
        });
        if !claims_itself {
            let _ = redis::cmd("CLUSTER")
                .arg("BUMPEPOCH")
                .query::<redis::Value>(&mut target.conn());
            let _ = setslot().query::<redis::Value>(&mut target.conn());
        }
        for node in self.running() {
            let disagrees = read_view(node).map_or(true, |view| {
                view.owner_of(slot)
                    .is_none_or(|owner| owner.id != target_id)
            });
            if disagrees && node.port() != target.port() {
                let _ = setslot().query::<redis::Value>(&mut node.conn());
            }
        }
    }

    /// The one running master whose own table (`myself` in its `CLUSTER NODES`) says it
    /// serves `slot`; waits while none or several do, until `deadline`.
    fn claimed_owner(&self, slot: u16, deadline: Instant) -> &RedisServer {
        loop {
            let claimants: Vec<&RedisServer> = self
                .running()
                .filter(|node| {
                    read_view(node).is_ok_and(|view| {
                        view.lines.iter().any(|line| {
                            line.flags.iter().any(|flag| flag == "myself")
                                && line.is_master()
                                && line.serves(slot)
                        })
                    })
                })
                .collect();
            if let [owner] = claimants[..] {
                return owner;
            }
            assert!(
                Instant::now() < deadline,
                "slot {slot}: {} masters claim it, not one (ports {:?})",
                claimants.len(),
                claimants.iter().map(|n| n.port()).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Moves the slot of `key` to `masters()[to_master_index]` the way `redis-cli --cluster
    /// reshard` does: `CLUSTER SETSLOT <slot> IMPORTING` on the target, `MIGRATING` on the
    /// source, `MIGRATE` of every key in it (`CLUSTER GETKEYSINSLOT`, TTLs kept), then — after
    /// keeping the slot in that half-moved state for `hold` — `CLUSTER SETSLOT <slot> NODE
    /// <target>` on the target, the source and every other master; and waits until every
    /// node agrees. Returns the new master.
    ///
    /// While the slot is half-moved the source answers `ASK` for keys it no longer has (all
    /// of them once moved, and new ones), so a `hold` of a few hundred ms lets a concurrent
    /// workload meet ASK redirections; afterwards it answers `MOVED`.
    ///
    /// Panics if the index is out of range, if the slot is already there, or if a step fails
    /// or the nodes do not agree within 15 s.
    pub fn migrate_slot_of_holding(
        &self,
        key: &str,
        to_master_index: usize,
        hold: Duration,
    ) -> &RedisServer {
        let deadline = Instant::now() + MIGRATE_TIMEOUT + hold;
        let slot = self.slot_of(key);
        let masters = self.masters();
        let target = *masters.get(to_master_index).unwrap_or_else(|| {
            panic!(
                "migrate_slot_of({key:?}, {to_master_index}): there are only {} masters (ports {:?})",
                masters.len(),
                masters.iter().map(|m| m.port()).collect::<Vec<_>>()
            )
        });
        let target_id = self.node_id(target);
        let setslot = |state: &str, id: &str| {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("SETSLOT").arg(slot).arg(state);
            if !id.is_empty() {
                cmd.arg(id);
            }
            cmd
        };
        // The owner by its own account, which is what SETSLOT checks: right after an earlier
        // move, a node can still believe in an owner that has given the slot up. If the owner
        // changes between the two commands (it refuses MIGRATING), the move starts over.
        let source = loop {
            let source = self.claimed_owner(slot, deadline);
            assert_ne!(
                source.port(),
                target.port(),
                "migrate_slot_of({key:?}, {to_master_index}): slot {slot} is already served by that master"
            );
            let source_id = self.node_id(source);
            setslot("IMPORTING", &source_id)
                .query::<redis::Value>(&mut target.conn())
                .unwrap_or_else(|e| {
                    panic!(
                        "slot {slot}: IMPORTING on port {} failed: {e}",
                        target.port()
                    )
                });
            match setslot("MIGRATING", &target_id).query::<redis::Value>(&mut source.conn()) {
                Ok(_) => break source,
                Err(e) if e.to_string().contains("not the owner") && Instant::now() < deadline => {
                    setslot("STABLE", "")
                        .query::<redis::Value>(&mut target.conn())
                        .unwrap_or_else(|e| {
                            panic!("slot {slot}: STABLE on port {} failed: {e}", target.port())
                        });
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!(
                    "slot {slot}: MIGRATING on port {} (the owner in the cluster's view) failed: {e}",
                    source.port()
                ),
            }
        };
        let what = format!(
            "moving slot {slot} (key {key:?}) from port {} to port {}",
            source.port(),
            target.port()
        );
        let run = |node: &RedisServer, cmd: &redis::Cmd| -> redis::Value {
            cmd.query(&mut node.conn())
                .unwrap_or_else(|e| panic!("{what}: {cmd:?} on port {} failed: {e}", node.port()))
        };
        let move_keys = || loop {
            let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(1000)
                .query(&mut source.conn())
                .unwrap_or_else(|e| panic!("{what}: CLUSTER GETKEYSINSLOT failed: {e}"));
            if keys.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: slot still had {} keys on the source after {MIGRATE_TIMEOUT:?}",
                keys.len()
            );
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg("127.0.0.1")
                .arg(target.port())
                .arg("")
                .arg(0)
                .arg(MIGRATE_CMD_TIMEOUT_MS)
                .arg("KEYS")
                .arg(&keys);
            run(source, &migrate);
        };
        move_keys();
        if !hold.is_zero() {
            std::thread::sleep(hold);
            // Nothing new can appear on the source meanwhile (it answers ASK), but be sure.
            move_keys();
        }
        // Target first, so that it serves the slot before anyone is sent to it; and with its
        // config epoch bumped first. Nodes judge conflicting claims by config epoch; without
        // the bump a quick series of moves can leave the slot to nobody, the target giving it
        // back on a message the source sent before giving it up.
        run(target, redis::cmd("CLUSTER").arg("BUMPEPOCH"));
        run(target, &setslot("NODE", &target_id));
        run(source, &setslot("NODE", &target_id));
        for master in self.masters() {
            if master.port() != source.port() && master.port() != target.port() {
                run(master, &setslot("NODE", &target_id));
            }
        }
        let agreed = |_: &Self, views: &[View]| {
            for view in views {
                match view.owner_of(slot) {
                    Some(owner) if owner.id == target_id => {}
                    Some(owner) => {
                        return Err(format!(
                            "node {} still sees port {} serving slot {slot}",
                            view.port, owner.port
                        ))
                    }
                    None => return Err(format!("node {} sees no owner of slot {slot}", view.port)),
                }
            }
            Ok(())
        };
        let settle_until = deadline.max(Instant::now() + Duration::from_secs(1));
        let mut told_again = Instant::now();
        while let Err(reason) = self.check_settled(&agreed) {
            assert!(
                Instant::now() < settle_until,
                "timed out waiting for every node to agree after {what}; last: {reason}"
            );
            // A node can keep (or take back) an older view of the slot for a while when the
            // epochs it compares do not favour the target: tell the nodes that disagree again,
            // every half second, the target first and with its epoch bumped when it does not
            // claim the slot itself.
            if told_again.elapsed() >= Duration::from_millis(500) {
                self.tell_owner_again(slot, target, &target_id);
                told_again = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        target
    }

    /// Runs `cmd` (about `key`) on the master of the key's slot, following up to 5 MOVED/ASK
    /// redirections (with `ASKING` before a command sent after ASK).
    fn query_key<T: redis::FromRedisValue>(&self, key: &str, cmd: &redis::Cmd) -> T {
        let mut port = self.node_for_key(key).port();
        let mut asking = false;
        let mut trail = Vec::new();
        for _ in 0..=MAX_REDIRECTS {
            let node = self.node_by_port(port);
            let mut conn = node.conn();
            if asking {
                redis::cmd("ASKING")
                    .query::<()>(&mut conn)
                    .unwrap_or_else(|e| panic!("ASKING on port {port} failed: {e}"));
            }
            let error = match cmd.query(&mut conn) {
                Ok(value) => return value,
                Err(error) => error,
            };
            let Some((addr, _slot)) = error.redirect_node() else {
                panic!("{cmd:?} on port {port} (key {key:?}) failed: {error}");
            };
            trail.push(error.to_string());
            port = addr
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("cannot parse the redirection {error}"));
            asking = error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask);
        }
        panic!("{cmd:?} (key {key:?}) was redirected more than {MAX_REDIRECTS} times: {trail:?}");
    }

    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| n.is_running())
    }

    fn first_running(&self) -> &RedisServer {
        self.running()
            .next()
            .unwrap_or_else(|| panic!("no node of the cluster is running"))
    }

    /// The node listening on `port`; panics if it is not one of ours.
    fn node_by_port(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| {
                panic!(
                    "port {port} is not a node of this cluster (nodes: {:?})",
                    self.nodes
                        .iter()
                        .map(super::server::RedisServer::port)
                        .collect::<Vec<_>>()
                )
            })
    }

    /// The view of the first running node that answers.
    fn view(&self) -> View {
        let mut errors = Vec::new();
        for node in self.running() {
            match read_view(node) {
                Ok(view) => return view,
                Err(e) => errors.push(e),
            }
        }
        panic!("no running node of the cluster answered CLUSTER NODES: {errors:?}");
    }

    /// Waits until every running node reports `cluster_state:ok` with all slots assigned and
    /// the same slot map, and `extra` accepts the views; panics after `timeout` with `what`
    /// and the last reason it was not so.
    fn wait_settled(
        &self,
        timeout: Duration,
        what: &str,
        extra: impl Fn(&Self, &[View]) -> Result<(), String>,
    ) {
        let start = Instant::now();
        loop {
            let last = match self.check_settled(&extra) {
                Ok(()) => return,
                Err(reason) => reason,
            };
            assert!(
                start.elapsed() < timeout,
                "timed out after {timeout:?} waiting for {what}; last: {last}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn check_settled(
        &self,
        extra: &impl Fn(&Self, &[View]) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut views = Vec::new();
        for node in self.running() {
            let info: String = node
                .try_conn()
                .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query(&mut c))
                .map_err(|e| format!("CLUSTER INFO on {} failed: {e}", node.port()))?;
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().to_string())
                    .unwrap_or_default()
            };
            if field("cluster_state:") != "ok" {
                return Err(format!(
                    "node {} reports cluster_state:{}",
                    node.port(),
                    field("cluster_state:")
                ));
            }
            if field("cluster_slots_assigned:") != SLOTS.to_string() {
                return Err(format!(
                    "node {} reports cluster_slots_assigned:{}",
                    node.port(),
                    field("cluster_slots_assigned:")
                ));
            }
            views.push(read_view(node)?);
        }
        let first = views.first().ok_or("no node is running")?;
        let map = first.slot_map();
        if let Some(other) = views.iter().find(|v| v.slot_map() != map) {
            return Err(format!(
                "nodes {} and {} disagree on who serves which slots",
                first.port, other.port
            ));
        }
        extra(self, &views)
    }
}

impl std::fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCluster")
            .field("nodes", &self.nodes)
            .finish()
    }
}

/// Starts one cluster-enabled node with a bus port of its own.
fn start_cluster_node() -> RedisServer {
    start_cluster_node_on(free_port_with_bus, &[])
}

/// Starts one cluster-enabled node on ports from `pick_port`, with `extra_args` after the
/// cluster's own.
fn start_cluster_node_on(pick_port: impl FnMut() -> u16, extra_args: &[String]) -> RedisServer {
    let dir = crate::unique_temp_dir("redis-cluster");
    let nodes_conf: PathBuf = dir.join("nodes.conf");
    let extra_args = extra_args.to_vec();
    RedisServer::start_custom_on(dir, Readiness::Plain, pick_port, move |_port| {
        // An attempt that lost its port may have written nodes.conf already: start afresh.
        let _ = std::fs::remove_file(&nodes_conf);
        let conf = nodes_conf.to_string_lossy().into_owned();
        let node_timeout = NODE_TIMEOUT_MS.to_string();
        [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &conf,
            "--cluster-node-timeout",
            &node_timeout,
            "--cluster-replica-validity-factor",
            "0",
            "--repl-diskless-sync-delay",
            "0",
        ]
        .iter()
        .map(std::string::ToString::to_string)
        .chain(extra_args.iter().cloned())
        .collect()
    })
}

/// Where every server version puts a node's cluster bus: its port + 10000. (Redis 7 can be told
/// another with `--cluster-port`; Redis 6.2 refuses that option.)
const BUS_PORT_OFFSET: u16 = 10000;

/// A port P that was free a moment ago, and whose bus port P + 10000 exists and was free too.
fn free_port_with_bus() -> u16 {
    for _ in 0..1000 {
        let port = free_port();
        let Some(bus) = port.checked_add(BUS_PORT_OFFSET) else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", bus)).is_ok() {
            return port;
        }
    }
    panic!("no free port P with a free cluster bus port P + {BUS_PORT_OFFSET} in 1000 tries");
}

/// `CLUSTER NODES` of `node`, parsed.
fn read_view(node: &RedisServer) -> Result<View, String> {
    let text: String = node
        .try_conn()
        .and_then(|mut c| redis::cmd("CLUSTER").arg("NODES").query(&mut c))
        .map_err(|e| format!("CLUSTER NODES on {} failed: {e}", node.port()))?;
    let lines = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| parse_node_line(l).ok_or_else(|| format!("cannot parse CLUSTER NODES line {l:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(View {
        port: node.port(),
        lines,
    })
}

/// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`
fn parse_node_line(line: &str) -> Option<NodeLine> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 8 {
        return None;
    }
    let addr = fields[1].split(['@', ',']).next()?;
    let port = addr.rsplit(':').next()?.parse().ok()?;
    let mut slots = Vec::new();
    for slot in &fields[8..] {
        if slot.starts_with('[') {
            continue; // [slot->-id] / [slot-<-id]: a migration in progress
        }
        let range = match slot.split_once('-') {
            Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
            None => {
                let s = slot.parse().ok()?;
                (s, s)
            }
        };
        slots.push(range);
    }
    Some(NodeLine {
        id: fields[0].to_string(),
        port,
        flags: fields[2].split(',').map(String::from).collect(),
        master_id: (fields[3] != "-").then(|| fields[3].to_string()),
        slots,
    })
}

/// Starts `n` servers with `start`, in parallel. If one start panics, the others are stopped
/// and the first panic is resumed (its message was printed by the thread).
fn start_all(n: usize, start: impl Fn() -> RedisServer + Sync) -> Vec<RedisServer> {
    let results: Vec<std::thread::Result<RedisServer>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n).map(|_| scope.spawn(&start)).collect();
        handles
            .into_iter()
            .map(std::thread::ScopedJoinHandle::join)
            .collect()
    });
    let mut servers = Vec::with_capacity(n);
    let mut first_panic = None;
    for result in results {
        match result {
            Ok(server) => servers.push(server),
            Err(panic) => {
                first_panic.get_or_insert(panic);
            }
        }
    }
    if let Some(panic) = first_panic {
        drop(servers);
        std::panic::resume_unwind(panic);
    }
    servers
}

/// A one-node Redis Cluster that clients reach only through a [`FaultProxy`]: a
/// cluster-enabled server that owns all 16 384 slots and announces the proxy's address
/// (`cluster-announce-ip 127.0.0.1`, `cluster-announce-port <proxy port>`), so `CLUSTER
/// SLOTS`, `SHARDS` and `NODES` send a cluster client back to the proxy and every connection
/// it makes — to the seed, to the slot owner, to reconnect — goes through it.
///
/// For faults that a cluster client meets differently from a standalone one: a redis-rs
/// cluster connection sends a command again when its connection drops
/// ([`FaultProxy::lose_next_reply`] makes it run twice). One node is enough for that, and
/// starts in about 2 s (a new master waits that long before it reports `cluster_state:ok`).
///
/// The helpers of [`node`](Self::node) (`get`, `pttl`, ...) talk to the server directly,
/// bypassing the proxy and its faults. Dropping the cluster stops the proxy and the server.
pub struct ProxiedCluster {
    proxy: FaultProxy,
    node: RedisServer,
}

impl ProxiedCluster {
    /// Starts the node and its proxy, gives the node every slot and the proxy's address, and
    /// waits until it reports `cluster_state:ok` and announces the proxy's port; panics if that
    /// has not happened within 30 s.
    pub fn start() -> Self {
        // The proxy first, so that the node can announce its port from the start: Redis 6.2
        // takes `cluster-announce-port` into its own entry only when it starts, not from a
        // later CONFIG SET. The proxy needs no upstream until a client connects.
        let port = free_port_with_bus();
        let proxy = FaultProxy::start(port);
        let announce = [
            "--cluster-announce-ip".to_owned(),
            "127.0.0.1".to_owned(),
            "--cluster-announce-port".to_owned(),
            proxy.port().to_string(),
        ];
        let node = start_cluster_node_on(|| port, &announce);
        let run = |cmd: &mut redis::Cmd| {
            cmd.query::<()>(&mut node.conn()).unwrap_or_else(|e| {
                panic!(
                    "ProxiedCluster: {cmd:?} on port {} failed: {e}",
                    node.port()
                )
            });
        };
        // ADDSLOTS with every slot, not ADDSLOTSRANGE, which Redis 6.2 does not know.
        run(redis::cmd("CLUSTER")
            .arg("ADDSLOTS")
            .arg((0..SLOTS).collect::<Vec<u16>>()));
        let cluster = Self { proxy, node };
        let start = Instant::now();
        loop {
            let last = match cluster.check_ready() {
                Ok(()) => return cluster,
                Err(reason) => reason,
            };
            assert!(
                start.elapsed() < READY_TIMEOUT,
                "timed out after {READY_TIMEOUT:?} waiting for the one-node cluster on port {} \
                 to serve every slot behind proxy port {}; last: {last}",
                cluster.node.port(),
                cluster.proxy.port()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn check_ready(&self) -> Result<(), String> {
        let info: String = self
            .node
            .try_conn()
            .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query(&mut c))
            .map_err(|e| format!("CLUSTER INFO failed: {e}"))?;
        if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
            return Err("cluster_state is not ok".to_string());
        }
        let view = read_view(&self.node)?;
        match view.lines.as_slice() {
            [me] if me.port == self.proxy.port() && me.slots == [(0, SLOTS - 1)] => Ok(()),
            lines => Err(format!("CLUSTER NODES shows {lines:?}")),
        }
    }

    /// The proxy every client connection goes through.
    pub fn proxy(&self) -> &FaultProxy {
        &self.proxy
    }

    /// The server itself, for checks that must not go through the proxy.
    pub fn node(&self) -> &RedisServer {
        &self.node
    }

    /// The seed URLs for a cluster client: the proxy's.
    pub fn urls(&self) -> Vec<String> {
        vec![self.proxy.url()]
    }
}

impl std::fmt::Debug for ProxiedCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxiedCluster")
            .field("proxy", &self.proxy)
            .field("node", &self.node)
            .finish()
    }
}

/// `n` independent standalone masters (no replication, no cluster), e.g. for Redlock.
///
/// Dereferences to `[RedisServer]`, so `servers[2].kill()`, `servers.iter()` and
/// `servers.len()` work; each server is a plain [`RedisServer`] with all its fault controls.
#[derive(Debug)]
pub struct RedisServers {
    servers: Vec<RedisServer>,
}

impl RedisServers {
    /// Starts `n` servers in parallel with default arguments.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, &[])
    }

    /// Starts `n` servers in parallel, each with [`RedisServer::start_with`]`(extra_args)`.
    pub fn start_with(n: usize, extra_args: &[&str]) -> Self {
        Self {
            servers: start_all(n, || RedisServer::start_with(extra_args)),
        }
    }

    /// `redis://127.0.0.1:P/` of each server, in order (killed ones included: a Redlock
    /// client is configured with every master, up or not).
    pub fn urls(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(super::server::RedisServer::url)
            .collect()
    }

    /// The indexes of the servers on which `key` exists (a Redlock lock is held when this is a
    /// majority). Killed servers are skipped; a server that does not answer (paused) counts as
    /// not holding it, after the helpers' 5 s timeout.
    pub fn holders(&self, key: &str) -> Vec<usize> {
        self.servers
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.is_running()
                    && s.try_conn()
                        .and_then(|mut c| redis::cmd("EXISTS").arg(key).query::<i64>(&mut c))
                        .is_ok_and(|n| n == 1)
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Consumes the set, giving the servers back.
    pub fn into_vec(self) -> Vec<RedisServer> {
        self.servers
    }
}

impl Deref for RedisServers {
    type Target = [RedisServer];

    fn deref(&self) -> &[RedisServer] {
        &self.servers
    }
}
