//! distlock on a Redis Cluster (3 masters made with `redis-cli --cluster create`): the same
//! attribute and guard as on a standalone server, every key of a lock in the lock key's hash
//! slot (whatever braces the name and prefix have), mutual exclusion with exact counts,
//! wake-ups across nodes, and a run that survives a failover and a slot migration (with ASK
//! redirections) under load.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager, LockOptions};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use test_support::{keys, RedisCluster, RedisServer};
use tokio::time::Instant;

/// The cluster shared by the tests that leave its topology alone (3 masters, no replicas: with
/// nobody to promote, a node starved of CPU on a loaded machine is never failed over).
pub(crate) fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let started = std::time::Instant::now();
        let cluster = RedisCluster::start(3, 0);
        eprintln!("shared 3-master cluster started in {:?}", started.elapsed());
        cluster
    })
}

pub(crate) async fn cluster_manager(seeds: &[String]) -> LockManager {
    LockManager::cluster_builder(seeds)
        .connect()
        .await
        .unwrap_or_else(|error| panic!("cannot connect a cluster lock manager: {error}"))
}

/// A data connection of our own to the cluster (it follows MOVED/ASK and failovers), for the
/// counters that the critical sections update.
async fn data_connection(seeds: &[String]) -> ClusterConnection {
    ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(1))
        .retries(5)
        .build()
        .expect("a cluster client")
        .get_async_connection()
        .await
        .unwrap_or_else(|error| panic!("cannot connect the data connection: {error}"))
}

/// The port of the node that answers a plain (non-following) `EXISTS key` with 1. Every other
/// master must answer MOVED, so exactly one node can have it.
fn exists_on(node: &RedisServer, key: &str) -> redis::RedisResult<bool> {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(&mut node.conn())
        .map(|n| n == 1)
}

/// One lock name per master: `lock:<prefix><i>` for the first `i` whose slot each master owns.
fn names_on_every_master(cluster: &RedisCluster, prefix: &str) -> Vec<String> {
    let mut by_master = BTreeMap::new();
    for i in 0..200 {
        let name = format!("{prefix}{i}");
        let port = cluster.node_for_key(&format!("lock:{name}")).port();
        by_master.entry(port).or_insert(name);
        if by_master.len() == cluster.masters().len() {
            break;
        }
    }
    assert_eq!(by_master.len(), 3, "no name found for some master");
    by_master.into_values().collect()
}

/// GET the counter, let other tasks run, SET it one higher: loses updates unless exclusive.
/// Returns whether the SET was confirmed (a failing GET or SET is an error).
async fn read_modify_write(data: &mut ClusterConnection, counter: &str) -> redis::RedisResult<()> {
    let value: Option<u64> = redis::cmd("GET").arg(counter).query_async(data).await?;
    tokio::time::sleep(Duration::from_millis(1)).await;
    redis::cmd("SET")
        .arg(counter)
        .arg(value.unwrap_or(0) + 1)
        .query_async::<()>(data)
        .await
}

// ---------------------------------------------------------------------------------------------
// The attribute on a cluster, and where the keys of a lock live
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
enum JobError {
    Lock(#[allow(dead_code)] LockError),
}

impl From<LockError> for JobError {
    fn from(error: LockError) -> Self {
        JobError::Lock(error)
    }
}

/// The same annotated function as on a standalone server; the body reports where the lock is.
#[distributed_lock(key = "job:{id}", ttl = 5)]
async fn job(id: u32, seen: Arc<Mutex<Vec<(u16, bool)>>>) -> Result<u32, JobError> {
    let cluster = shared_cluster();
    let key = format!("lock:job:{id}");
    let owner = cluster.node_for_key(&key);
    let held_on_owner = exists_on(owner, &key).expect("the owner of the slot answers");
    seen.lock().unwrap().push((owner.port(), held_on_owner));
    Ok(id * 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_runs_on_a_cluster_with_every_key_of_a_lock_in_its_slot() {
    if !test_support::in_own_process(
        module_path!(),
        "the_attribute_runs_on_a_cluster_with_every_key_of_a_lock_in_its_slot",
    ) {
        return;
    }
    let cluster = shared_cluster();
    let manager = cluster_manager(&cluster.urls()).await;
    distlock::init_with(manager.clone()).expect("the global manager is installed once");

    let key = "lock:job:1";
    let owner = cluster.node_for_key(key);
    let seen = Arc::new(Mutex::new(Vec::new()));
    assert_eq!(job(1, seen.clone()).await.expect("job(1) runs"), 2);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(owner.port(), true)],
        "during the body the lock key is held on the master of its slot"
    );
    assert!(!cluster.exists(key), "the lock is released after the body");
    for other in cluster.masters() {
        if other.port() != owner.port() {
            let error = exists_on(other, key).expect_err("another master does not serve the slot");
            assert_eq!(
                error.kind(),
                redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
                "{error}"
            );
        }
    }

    // A fenced holder, and the annotated function waiting behind it: the fencing counter and
    // the line live on the same node as the lock, in its slot.
    let fence_key = &keys::named("job:1").fence();
    let line_key = &keys::named("job:1").line();
    let slot = cluster.slot_of(key);
    assert_eq!(cluster.slot_of(fence_key), slot);
    assert_eq!(cluster.slot_of(line_key), slot);
    // The holder is another manager (another "process"): waiters of the same manager queue
    // in the process and never reach Redis.
    let other_process = cluster_manager(&cluster.urls()).await;
    let holder = other_process
        .acquire("job:1", &LockOptions::new().fencing(true))
        .await
        .expect("a fenced acquire on a cluster");
    let first_fence = holder.fencing_token().expect("fencing token on a cluster");
    assert_eq!(holder.key(), key);
    assert!(exists_on(owner, key).unwrap());
    assert!(
        exists_on(owner, fence_key).unwrap(),
        "the fencing counter is on the lock's node"
    );
    assert_eq!(cluster.get(fence_key), Some(first_fence.to_string()));

    // The annotated function, on the global manager, must wait.
    let waiting = tokio::spawn({
        let seen = seen.clone();
        async move { job(1, seen).await }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while !exists_on(owner, line_key).unwrap() {
        assert!(
            Instant::now() < deadline,
            "the waiting call never took its place in line on the lock's node"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !waiting.is_finished(),
        "the body ran while the lock was held"
    );
    holder.release().await.expect("release");
    assert_eq!(waiting.await.unwrap().expect("the waiter then runs"), 2);
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert!(!cluster.exists(key));
    assert!(
        !cluster.exists(line_key),
        "the hand-off took the only waiter out of the line"
    );

    let next = manager
        .acquire("job:1", &LockOptions::new().fencing(true))
        .await
        .unwrap();
    assert!(
        next.fencing_token().unwrap() > first_fence,
        "fencing tokens increase on a cluster"
    );
    next.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Names with braces anywhere: every key of a lock in the lock key's slot
// ---------------------------------------------------------------------------------------------

/// For every generated name (braces in every position, empty and nested tags, a `}` with no
/// `{` before it): a fenced acquire, a contender from another manager that waits and marks its
/// wait, every key of the lock in the lock key's slot (`CLUSTER KEYSLOT`) and on the master of
/// that slot, a release that succeeds and hands the lock over, increasing fencing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_of_a_lock_lies_in_its_slot_whatever_braces_its_name_has() {
    let cluster = shared_cluster();
    let urls = cluster.urls();
    let holder_manager = cluster_manager(&urls).await;
    let contender_manager = cluster_manager(&urls).await;
    let fenced = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20))
        .fencing(true);
    // The keys of one lock: the lock key and the helper keys that name it.
    let keys_of = |lock: &str| -> Vec<String> {
        let mut keys = cluster.keys("*");
        keys.retain(|key| {
            key == lock
                || test_support::names::helper_owner(key).is_some_and(|(_, owner)| owner == lock)
        });
        keys
    };
    for name in test_support::names::lock_names() {
        let key = format!("lock:{name}");
        let slot = cluster.slot_of(&key);
        let holder = holder_manager
            .acquire(&name, &fenced)
            .await
            .unwrap_or_else(|error| panic!("{key:?}: fenced acquire: {error}"));
        let first = holder.fencing_token().expect("a fencing token");
        let contender = tokio::spawn({
            let (manager, name, fenced) = (contender_manager.clone(), name.clone(), fenced.clone());
            async move { manager.acquire(&name, &fenced).await }
        });
        // The lock, its fencing counter and the line the contender waits in.
        test_support::eventually(Duration::from_secs(10), &format!("{key:?}'s line"), || {
            keys_of(&key).len() == 3 || contender.is_finished()
        })
        .await;
        assert!(
            !contender.is_finished(),
            "{key:?}: the contender did not wait: {:?}",
            contender.await.unwrap().map(drop)
        );
        let owner = cluster.master_for_slot(slot);
        for lock_key in keys_of(&key) {
            assert_eq!(
                cluster.slot_of(&lock_key),
                slot,
                "{lock_key:?} is not in the slot of {key:?}"
            );
            assert!(
                exists_on(owner, &lock_key).unwrap(),
                "{lock_key:?} is not on the master of slot {slot}"
            );
        }
        holder
            .release()
            .await
            .unwrap_or_else(|error| panic!("{key:?}: release: {error}"));
        let handed = tokio::time::timeout(Duration::from_secs(10), contender)
            .await
            .unwrap_or_else(|_| panic!("{key:?}: the contender was not handed the lock"))
            .unwrap()
            .unwrap_or_else(|error| panic!("{key:?}: the contender's acquire: {error}"));
        assert!(
            handed.fencing_token().expect("a fencing token") > first,
            "{key:?}: fencing tokens increase"
        );
        let last_token = handed.token().to_owned();
        handed
            .release()
            .await
            .unwrap_or_else(|error| panic!("{key:?}: release: {error}"));
        // The fencing counter, and the marker that recognises a release the cluster connection
        // sends twice: it holds the last release's token, in the lock's slot, and expires.
        let left = keys_of(&key);
        let words: BTreeSet<&str> = left
            .iter()
            .filter_map(|helper| test_support::names::helper_owner(helper).map(|(word, _)| word))
            .collect();
        assert!(
            left.len() == 2 && words == BTreeSet::from(["fence", "released"]),
            "{key:?}: only the fencing counter and the release marker stay: {left:?}"
        );
        for helper in &left {
            assert_eq!(
                cluster.slot_of(helper),
                slot,
                "{helper:?} is not in the slot of {key:?}"
            );
        }
        let marker = left
            .iter()
            .find(|helper| {
                matches!(
                    test_support::names::helper_owner(helper),
                    Some(("released", _))
                )
            })
            .unwrap();
        assert_eq!(cluster.get(marker), Some(last_token), "{marker:?}");
        assert!(cluster.pttl(marker) > 0, "{marker:?} expires");
    }

    // The connect probe and a lock under every prefix, braces included.
    for prefix in test_support::names::PREFIXES
        .into_iter()
        .chain(["a}", "{x}:"])
    {
        let manager = LockManager::cluster_builder(&urls)
            .key_prefix(prefix)
            .connect()
            .await
            .unwrap_or_else(|error| panic!("prefix {prefix:?}: {error}"));
        let guard = manager
            .acquire("prefixed", &fenced)
            .await
            .unwrap_or_else(|error| panic!("prefix {prefix:?}: {error}"));
        guard
            .release()
            .await
            .unwrap_or_else(|error| panic!("prefix {prefix:?}: {error}"));
    }
}

/// Every generated name under every prefix, held at once, contended and fenced, on a cluster
/// of its own (the check counts every key): no two distinct locks share a key, and every
/// helper key lies in its lock's slot (see `test_support::names::no_two_locks_share_a_key`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_locks_share_a_key_on_a_cluster_whatever_their_names_and_prefixes() {
    let cluster = RedisCluster::start(3, 0);
    let mut managers = Vec::new();
    for prefix in test_support::names::PREFIXES {
        let connect = || {
            LockManager::cluster_builder(&cluster.urls())
                .key_prefix(prefix)
                .response_timeout(test_support::names::PATIENT_RESPONSE)
                .connect()
        };
        managers.push((connect().await.unwrap(), connect().await.unwrap()));
    }
    test_support::names::no_two_locks_share_a_key(
        &managers,
        || cluster.keys("*"),
        |key| cluster.get(key),
        Some(&|key| cluster.slot_of(key)),
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Mutual exclusion on keys spread over every master
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_on_a_cluster_counts_exactly_with_increasing_fencing_tokens() {
    const TASKS: usize = 16;
    const SECTIONS: usize = 10;
    let cluster = shared_cluster();
    let names = names_on_every_master(cluster, "mx:");
    let owners: BTreeSet<u16> = names
        .iter()
        .map(|name| cluster.node_for_key(&format!("lock:{name}")).port())
        .collect();
    assert_eq!(owners.len(), 3, "the keys live on three different masters");
    let managers = [
        cluster_manager(&cluster.urls()).await,
        cluster_manager(&cluster.urls()).await,
    ];
    let data = data_connection(&cluster.urls()).await;
    // Per lock name: bodies inside now, the most ever inside, the fencing tokens in order.
    let inside: Arc<Vec<AtomicUsize>> =
        Arc::new(names.iter().map(|_| AtomicUsize::new(0)).collect());
    let max_inside = Arc::new(AtomicUsize::new(0));
    let fences: Arc<Vec<Mutex<Vec<u64>>>> =
        Arc::new(names.iter().map(|_| Mutex::new(Vec::new())).collect());

    let started = Instant::now();
    let mut tasks = Vec::new();
    for manager in &managers {
        for task in 0..TASKS {
            let (manager, mut data, names) = (manager.clone(), data.clone(), names.clone());
            let (inside, max_inside, fences) = (inside.clone(), max_inside.clone(), fences.clone());
            tasks.push(tokio::spawn(async move {
                let options = LockOptions::new()
                    .ttl(Duration::from_secs(10))
                    .timeout(Duration::from_secs(30))
                    .fencing(true);
                for section in 0..SECTIONS {
                    let which = (task + section) % names.len();
                    let name = &names[which];
                    let guard = manager.acquire(name, &options).await.expect("acquire");
                    let now = inside[which].fetch_add(1, Ordering::SeqCst) + 1;
                    max_inside.fetch_max(now, Ordering::SeqCst);
                    fences[which]
                        .lock()
                        .unwrap()
                        .push(guard.fencing_token().expect("a fencing token"));
                    read_modify_write(&mut data, &format!("{{lock:{name}}}:counter"))
                        .await
                        .expect("the counter update");
                    inside[which].fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("a section task failed");
    }
    eprintln!(
        "{} sections on {} keys over 3 masters in {:?}",
        2 * TASKS * SECTIONS,
        names.len(),
        started.elapsed()
    );

    let mut total = 0;
    for (which, name) in names.iter().enumerate() {
        let count: usize = cluster
            .get(&format!("{{lock:{name}}}:counter"))
            .map_or(0, |v| v.parse().unwrap());
        let tokens = fences[which].lock().unwrap().clone();
        assert_eq!(
            count,
            tokens.len(),
            "lost update on {name}: bodies overlapped"
        );
        assert!(
            tokens.windows(2).all(|pair| pair[0] < pair[1]),
            "fencing tokens of {name} must strictly increase in lock order: {tokens:?}"
        );
        total += count;
        assert!(!cluster.exists(&format!("lock:{name}")), "{name} released");
    }
    assert_eq!(total, 2 * TASKS * SECTIONS, "every section ran once");
    assert_eq!(
        max_inside.load(Ordering::SeqCst),
        1,
        "one body per key at a time"
    );
}

// ---------------------------------------------------------------------------------------------
// Wake-ups across nodes
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_connected_through_another_node() {
    let cluster = shared_cluster();
    let masters: Vec<u16> = cluster.masters().iter().map(|m| m.port()).collect();
    let urls = cluster.urls();
    // The lock lives on the third master: neither manager's seed. The waiter's pub/sub
    // connection is on the second master, so the release's PUBLISH must cross the cluster bus.
    let name = (0..500)
        .map(|i| format!("wake:{i}"))
        .find(|name| cluster.node_for_key(&format!("lock:{name}")).port() == masters[2])
        .expect("a name on the third master");
    let holder_manager = cluster_manager(&urls[..1]).await;
    let waiter_manager = cluster_manager(&urls[1..2]).await;

    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(10));
    let holder = holder_manager.acquire(&name, &options).await.unwrap();
    let waiter = tokio::spawn({
        let name = name.clone();
        let options = options.clone();
        async move {
            let started = Instant::now();
            let guard = waiter_manager.acquire(&name, &options).await;
            (guard, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let (guard, waited) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter finished")
        .unwrap();
    let guard = guard.expect("the waiter gets the lock");
    let after_release = released_at.elapsed();
    eprintln!("waiter waited {waited:?}; got it {after_release:?} after the release");
    assert!(
        waited >= Duration::from_millis(250),
        "it really waited: {waited:?}"
    );
    assert!(
        after_release < Duration::from_secs(3),
        "with a 30 s ttl only a wake-up explains a hand-off within 3 s: {after_release:?}"
    );
    guard.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Topology changes during a run
// ---------------------------------------------------------------------------------------------

/// What the looping tasks of a run record.
#[derive(Default)]
struct Run {
    /// Set once the topology change (failover, migration) has settled.
    changed: AtomicBool,
    /// Tells the tasks to finish their section and stop.
    stop: AtomicBool,
    /// Sections whose counter SET was confirmed, by the phase they started in.
    confirmed: [AtomicUsize; 2],
    /// Sections that failed (acquire, data or release), by phase.
    failed: [AtomicUsize; 2],
    /// Sections whose counter write failed, by phase: a write whose answer was lost may still
    /// have been applied, so each can account for one increment more than was confirmed.
    unsure_writes: [AtomicUsize; 2],
    /// Lost locks seen at release, by phase.
    lost: [AtomicUsize; 2],
    /// Sections inside now, and the most ever inside at once: of any phase, and of those that
    /// started after the change.
    inside: AtomicUsize,
    max_inside: AtomicUsize,
    inside_after: AtomicUsize,
    max_inside_after: AtomicUsize,
    /// The first few errors of each phase, for the report.
    errors: Mutex<[Vec<String>; 2]>,
    /// When the last section was confirmed, and the longest gap between two (for the report:
    /// how long the change stalled the run).
    last_confirmed: Mutex<Option<Instant>>,
    longest_gap: Mutex<Duration>,
}

impl Run {
    fn record_error(&self, phase: usize, error: String) {
        self.failed[phase].fetch_add(1, Ordering::SeqCst);
        let mut errors = self.errors.lock().unwrap();
        if errors[phase].len() < 5 {
            errors[phase].push(error);
        }
    }

    fn record_confirmed(&self, phase: usize) {
        self.confirmed[phase].fetch_add(1, Ordering::SeqCst);
        let now = Instant::now();
        if let Some(last) = self.last_confirmed.lock().unwrap().replace(now) {
            let mut longest = self.longest_gap.lock().unwrap();
            *longest = (*longest).max(now - last);
        }
    }

    /// Waits until `sections` sections of `phase` were confirmed, failing after 15 s (the
    /// first sections also connect the clients, which a loaded machine makes slow).
    async fn wait_for_sections(&self, phase: usize, sections: usize, when: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.confirmed[phase].load(Ordering::SeqCst) < sections {
            assert!(
                Instant::now() < deadline,
                "fewer than {sections} sections ran in 15 s {when}: {}",
                self.summary()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn summary(&self) -> String {
        let load =
            |a: &[AtomicUsize; 2]| [a[0].load(Ordering::SeqCst), a[1].load(Ordering::SeqCst)];
        format!(
            "confirmed {:?}, failed {:?} (of which writes {:?}), lost {:?} (before/after the \
             change), at most {} inside at once, longest gap between sections {:?}; errors {:?}",
            load(&self.confirmed),
            load(&self.failed),
            load(&self.unsure_writes),
            load(&self.lost),
            self.max_inside.load(Ordering::SeqCst),
            self.longest_gap.lock().unwrap(),
            self.errors.lock().unwrap()
        )
    }
}

/// `tasks` tasks looping acquire / read-modify-write / release on `name` until `run.stop`. A
/// section that starts after `run.changed` is set counts into phase 1 and its own counter
/// (`counters[1]`); the others into phase 0 (`counters[0]`).
fn spawn_loops(
    manager: &LockManager,
    data: &ClusterConnection,
    tasks: usize,
    name: &str,
    counters: &[String; 2],
    ttl: Duration,
    run: &Arc<Run>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..tasks)
        .map(|_| {
            let (manager, mut data, name) = (manager.clone(), data.clone(), name.to_owned());
            let (run, counters) = (run.clone(), counters.clone());
            tokio::spawn(async move {
                let options = LockOptions::new().ttl(ttl).timeout(Duration::from_secs(10));
                while !run.stop.load(Ordering::SeqCst) {
                    let phase = usize::from(run.changed.load(Ordering::SeqCst));
                    let guard = match manager.acquire(&name, &options).await {
                        Ok(guard) => guard,
                        Err(error) => {
                            run.record_error(phase, format!("acquire: {error}"));
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                    };
                    let now = run.inside.fetch_add(1, Ordering::SeqCst) + 1;
                    run.max_inside.fetch_max(now, Ordering::SeqCst);
                    if phase == 1 {
                        let now = run.inside_after.fetch_add(1, Ordering::SeqCst) + 1;
                        run.max_inside_after.fetch_max(now, Ordering::SeqCst);
                    }
                    let written = read_modify_write(&mut data, &counters[phase]).await;
                    if phase == 1 {
                        run.inside_after.fetch_sub(1, Ordering::SeqCst);
                    }
                    run.inside.fetch_sub(1, Ordering::SeqCst);
                    match written {
                        Ok(()) => run.record_confirmed(phase),
                        Err(error) => {
                            run.unsure_writes[phase].fetch_add(1, Ordering::SeqCst);
                            run.record_error(phase, format!("data: {error}"));
                        }
                    }
                    match guard.release().await {
                        Ok(()) => {}
                        Err(LockError::Lost { .. }) => {
                            run.lost[phase].fetch_add(1, Ordering::SeqCst);
                        }
                        Err(error) => run.record_error(phase, format!("release: {error}")),
                    }
                }
            })
        })
        .collect()
}

/// Waits for every task, failing the test if they do not all finish within `limit` (a hang).
async fn join_within(tasks: Vec<tokio::task::JoinHandle<()>>, limit: Duration) {
    tokio::time::timeout(limit, join_all(tasks))
        .await
        .unwrap_or_else(|_| panic!("the section tasks did not all finish within {limit:?}"));
}

async fn join_all(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for task in tasks {
        task.await.expect("a section task panicked");
    }
}

fn count(cluster: &RedisCluster, key: &str) -> usize {
    cluster.get(key).map_or(0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_survives_a_failover_of_the_locks_master() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
            .await
            .unwrap(),
    );
    let name = "failover";
    let key = format!("lock:{name}");
    // Counters in the lock's slot, so the failover hits the data too.
    let counters = [format!("{{{key}}}:before"), format!("{{{key}}}:after")];
    let urls = cluster.urls();
    let manager = cluster_manager(&urls).await;
    let data = data_connection(&urls).await;
    let old_master = cluster.node_for_key(&key).port();

    let run = Arc::new(Run::default());
    let tasks = spawn_loops(
        &manager,
        &data,
        8,
        name,
        &counters,
        // Long, so that a lock left behind by a failed release would stall the run visibly:
        // twice the gap a failover may cause on a loaded machine.
        Duration::from_secs(20),
        &run,
    );
    run.wait_for_sections(0, 10, "before the failover").await;

    // SIGKILL the master of the lock's slot; returns once a replica serves the slot and every
    // node agrees.
    let failover_started = Instant::now();
    let new_master = {
        let cluster = cluster.clone();
        let key = key.clone();
        tokio::task::spawn_blocking(move || cluster.failover_master_of(&key).port())
            .await
            .expect("the failover completes")
    };
    run.changed.store(true, Ordering::SeqCst);
    let failover_took = failover_started.elapsed();
    assert_ne!(new_master, old_master, "{}", run.summary());

    // Sections keep running on the new master.
    run.wait_for_sections(1, 30, "after the failover").await;
    run.stop.store(true, Ordering::SeqCst);
    let stopping = Instant::now();
    // A task finishes its section: at most one acquire timeout (10 s) plus a release.
    join_within(tasks, Duration::from_secs(25)).await;
    eprintln!(
        "failover took {failover_took:?}; tasks stopped {:?} after the stop; {}",
        stopping.elapsed(),
        run.summary()
    );

    // The holder caught by the crash releases on the promoted replica as soon as it serves
    // the slot (the release retries while the cluster is in flux), so the run resumes right
    // after the failover instead of waiting out that lock's 20 s ttl.
    let longest_gap = *run.longest_gap.lock().unwrap();
    assert!(
        longest_gap < failover_took + Duration::from_secs(8),
        "the run stalled for {longest_gap:?} around a failover of {failover_took:?}: a lock was \
         left to expire; {}",
        run.summary()
    );

    // Replication is asynchronous: a lock (or a counter write) that the old master granted
    // but had not copied to its replica when it was killed is gone on the new master, so
    // another task can take that lock while its first holder still runs, and increments can
    // be lost. Redis Cluster cannot promise exclusion across a failover (Redlock exists for
    // that), so sections that started before the failover settled are held only to "no
    // panic, no hang, no more increments than writes sent" (a write whose answer was lost
    // with the old master may still have been applied and replicated)...
    let before = count(&cluster, &counters[0]);
    let sent = run.confirmed[0].load(Ordering::SeqCst) + run.failed[0].load(Ordering::SeqCst);
    assert!(
        before <= sent,
        "the counter cannot exceed the writes sent: {before}; {}",
        run.summary()
    );
    // ...while every section that started after the failover settled is exclusive and loses
    // no update: the counter holds every confirmed write, and beyond them at most the writes
    // whose answer was lost while the data connection caught up with the new master.
    let after = count(&cluster, &counters[1]);
    let confirmed_after = run.confirmed[1].load(Ordering::SeqCst);
    assert!(
        after >= confirmed_after,
        "an update after the failover was lost: the counter is {after}; {}",
        run.summary()
    );
    assert!(
        after <= confirmed_after + run.unsure_writes[1].load(Ordering::SeqCst),
        "the counter after the failover is {after}, more than the writes sent: {}",
        run.summary()
    );
    assert_eq!(
        run.max_inside_after.load(Ordering::SeqCst),
        1,
        "two sections after the failover overlapped: {}",
        run.summary()
    );
    assert_eq!(
        run.lost[1].load(Ordering::SeqCst),
        0,
        "a lock taken after the failover was lost: {}",
        run.summary()
    );
    assert!(
        !cluster.exists(&key),
        "the last holder released: {}",
        run.summary()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_survives_a_slot_migration_with_ask_redirections() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
            .await
            .unwrap(),
    );
    let name = "migrating";
    let key = format!("lock:{name}");
    // In the lock's slot: the counter moves with the lock and meets the same redirections.
    let counter = format!("{{{key}}}:counter");
    let urls = cluster.urls();
    let manager = cluster_manager(&urls).await;
    let data = data_connection(&urls).await;
    let source = cluster.node_for_key(&key).port();
    let target_index = cluster
        .masters()
        .iter()
        .position(|m| m.port() != source)
        .unwrap();

    let run = Arc::new(Run::default());
    // Both phases count into the same counter: a migration loses nothing, so the total is exact.
    let tasks = spawn_loops(
        &manager,
        &data,
        8,
        name,
        &[counter.clone(), counter.clone()],
        // Long, so that a lock left behind by a failed release would stall the run visibly.
        Duration::from_secs(10),
        &run,
    );
    run.wait_for_sections(0, 10, "before the migration").await;

    // The slot stays half-moved for 1 s: the source answers ASK for the keys already moved.
    let migration_started = Instant::now();
    let target = {
        let cluster = cluster.clone();
        let key = key.clone();
        tokio::task::spawn_blocking(move || {
            cluster
                .migrate_slot_of_holding(&key, target_index, Duration::from_secs(1))
                .port()
        })
        .await
        .expect("the migration completes")
    };
    run.changed.store(true, Ordering::SeqCst);
    let migration_took = migration_started.elapsed();
    assert_ne!(target, source);
    assert_eq!(cluster.node_for_key(&key).port(), target);

    run.wait_for_sections(1, 30, "after the migration").await;
    run.stop.store(true, Ordering::SeqCst);
    join_within(tasks, Duration::from_secs(25)).await;
    eprintln!("migration took {migration_took:?}; {}", run.summary());

    let confirmed =
        run.confirmed[0].load(Ordering::SeqCst) + run.confirmed[1].load(Ordering::SeqCst);
    assert_eq!(
        count(&cluster, &counter),
        confirmed,
        "an update was lost across the migration: {}",
        run.summary()
    );
    assert_eq!(
        run.max_inside.load(Ordering::SeqCst),
        1,
        "two sections overlapped across the migration"
    );
    // While the slot is half-moved, a lock script (several keys of one slot) that meets a key
    // already moved is sent on with ASK, and the importing node answers TRYAGAIN unless every
    // key it names is there: so locks hardly change hands during the hold, acquires retry
    // until it ends, and so does the release of the lock held when it began (rather than
    // leaving it to its 10 s ttl). The run stalls about as long as the hold; nothing fails.
    let longest_gap = *run.longest_gap.lock().unwrap();
    assert!(
        longest_gap < migration_took + Duration::from_secs(3),
        "the run stalled for {longest_gap:?} around a migration of {migration_took:?}: a lock \
         was left to expire; {}",
        run.summary()
    );
    assert_eq!(
        [
            run.failed[0].load(Ordering::SeqCst),
            run.failed[1].load(Ordering::SeqCst)
        ],
        [0, 0],
        "no acquire, update or release may fail across a migration: {}",
        run.summary()
    );
    let lost = run.lost[0].load(Ordering::SeqCst) + run.lost[1].load(Ordering::SeqCst);
    assert_eq!(
        lost,
        0,
        "a lock was lost across the migration: {}",
        run.summary()
    );
    assert!(!cluster.exists(&key), "the last holder released");
    assert!(
        exists_on(cluster.node_for_key(&key), &counter).unwrap(),
        "the counter moved to the new master"
    );
}

/// On a cluster every release is marked (its connection may send it twice), so a forced release
/// that left the holder's token in the `released` marker would have the stuck holder's own
/// release answer `Ok` at once, with no idle second needed: it must answer `Lost` with the cause
/// "force-released", and leave the successor's lock alone — as must the holder's `extend`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_holder_on_a_cluster_is_told_so_and_never_that_it_released() {
    let cluster = shared_cluster();
    let seeds = cluster.urls();
    let (holder, operator, next) = (
        cluster_manager(&seeds).await,
        cluster_manager(&seeds).await,
        cluster_manager(&seeds).await,
    );
    let long = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(5));
    // The `forced` mark shares its lock's slot whatever tag the lock's key gives its helpers:
    // the key itself, the key's own hash tag, or a tag of the slot's for a `}` with no tag.
    for name in ["forced:release", "forced:{hold}", "forced:a}b{extend"] {
        let key = format!("lock:{name}");
        let options = if name == "forced:{hold}" {
            long.clone().hold_at_least(Duration::from_secs(20))
        } else {
            long.clone()
        };
        let stuck = holder.acquire(name, &options).await.unwrap();
        let info = operator.inspect(name).await.unwrap().expect("held");
        assert!(operator.force_release(&info).await.unwrap(), "broke {name}");
        let marks: Vec<String> = cluster
            .keys(&keys::every("forced"))
            .into_iter()
            .filter(|mark| {
                test_support::names::helper_owner(mark) == Some(("forced", key.as_str()))
            })
            .collect();
        assert_eq!(
            marks.len(),
            1,
            "{name}: one forced mark, named for its lock"
        );
        assert_eq!(cluster.slot_of(&marks[0]), cluster.slot_of(&key), "{name}");
        assert_eq!(cluster.get(&marks[0]).as_deref(), Some(stuck.token()));
        let successor = next.acquire(name, &long).await.unwrap();
        let told = if name == "forced:a}b{extend" {
            stuck.extend(Duration::from_secs(30)).await
        } else {
            stuck.release().await
        };
        assert!(
            matches!(
                told,
                Err(LockError::Lost {
                    cause: distlock::LostCause::ForceReleased,
                    ..
                })
            ),
            "{name}: {told:?}"
        );
        assert_eq!(cluster.get(&key).as_deref(), Some(successor.token()));
        successor.release().await.unwrap();
    }
}
