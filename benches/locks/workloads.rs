//! The workloads, one function each, and what they share beyond their contenders: the server,
//! runtimes and clients every workload runs against ([`Bench`]), the deployments of workload 5
//! and the critical section of workload 2.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{LockManager, LockManagerBuilder, LockOptions};

use crate::contenders::{next_keys, Contender, Cycler, Floor, WorkFloor, NEXT_KEY};
use crate::cpu::{client_cpu_seconds, redis_cpu_seconds, CpuMeter};
use crate::fleet::{self, FleetReport};
use crate::idle::IdleSpinners;
use crate::report::{push_cycle_rows, push_rows, Results, Row};
use crate::rslock::Rslock;
use crate::statistics::{analyse, interleaved_rounds, micros, rounds, PickContend, Summary};
use crate::{
    Config, ATTRIBUTE, BACKENDS, CLUSTER, DISTLOCK, FLOOR, FLOOR_SCRIPTS, FLOOR_WAIT, FLOOR_WORK,
    IN_PROCESS, MANUAL, REDLOCK, REPLICAS, REPLICAS_NO_WAIT, REPLICAS_WAIT, RESPONSE_TIMEOUT,
    RSLOCK, RSLOCK_DEFAULT, RSLOCK_TUNED, STANDALONE, TTL, WORKERS,
};

/// What every workload runs against: the Redis server and a client of it, the two runtimes, the
/// global manager, and the CPU meter.
pub(crate) struct Bench {
    pub(crate) started: Instant,
    pub(crate) url: String,
    /// The private server, unless `REDIS_URL` named one.
    pub(crate) server: Option<test_support::RedisServer>,
    pub(crate) client: redis::Client,
    pub(crate) redis_version: String,
    /// Workloads 1, 4 and 5 run on a `current_thread` runtime, 2 and 3 on a `multi_thread` one.
    /// Every contender has a connection of its own on each runtime (a redis-rs connection is
    /// driven by a task of the runtime that made it); distlock's global manager makes one per
    /// runtime.
    single: tokio::runtime::Runtime,
    multi: tokio::runtime::Runtime,
    /// The global manager, which the manual API uses too, so that it differs from the attribute
    /// only in what the attribute adds.
    manager: LockManager,
    options: LockOptions,
    meter: CpuMeter,
    /// Idle spinners (see `idle`) during workloads 1 and 5 only: one task waiting on one round
    /// trip after another leaves the CPUs idle, and a halted vCPU costs 100+ us per wake-up on
    /// some VMs. Workloads 2 and 3 keep a CPU busy by themselves, and there, on the VM this was
    /// written on, spinners made the tail worse (hand-off gap p99 1.5-2.7 ms with them, 0.7-1.1
    /// ms without, 3 A/B pairs): a vCPU that never idles gets preempted by the host instead.
    /// `DISTLOCK_BENCH_IDLE_SPIN=0` turns them off.
    spin: bool,
    nproc: usize,
    /// Workload 5's servers: they stay up until the end, after the runtime that drives the
    /// managers' connections (like `server`).
    backend_cluster: Option<test_support::RedisCluster>,
    backend_masters: Option<test_support::RedisServers>,
    /// Workload 8's master and replica, kept up as workload 5's servers are.
    replicated: Option<[test_support::RedisServer; 2]>,
}

impl Bench {
    /// Starts a private server on a free port (killed at [`Bench::shut_down`]) unless
    /// `REDIS_URL` is set, builds the runtimes, installs the global manager, and prints the
    /// report's first line.
    pub(crate) fn start(config: &Config, started: Instant) -> Self {
        let nproc = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let spin = std::env::var_os("DISTLOCK_BENCH_IDLE_SPIN").is_none_or(|v| v != "0");
        let (server, url) = match std::env::var("REDIS_URL") {
            Ok(url) if !url.is_empty() => (None, url),
            _ => {
                let server = test_support::RedisServer::start();
                let url = server.url();
                (Some(server), url)
            }
        };
        NEXT_KEY.store(u64::from(std::process::id()) << 32, Ordering::Relaxed);
        let client = redis::Client::open(url.as_str()).expect("bad Redis URL");
        let single = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("cannot build the current_thread runtime");
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .enable_all()
            .build()
            .expect("cannot build the multi_thread runtime");

        let redis_version = single.block_on(async {
            let mut connection = client
                .get_multiplexed_async_connection()
                .await
                .expect("cannot connect to Redis");
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut connection)
                .await
                .expect("INFO failed");
            info.lines()
                .find_map(|line| line.strip_prefix("redis_version:"))
                .unwrap_or("unknown")
                .trim()
                .to_owned()
        });
        // `distlock::init(url)` with a longer response timeout (see RESPONSE_TIMEOUT).
        let global = single
            .block_on(
                LockManager::builder(url.as_str())
                    .response_timeout(RESPONSE_TIMEOUT)
                    .connect(),
            )
            .expect("cannot connect distlock");
        distlock::init_with(global).expect("distlock::init_with failed");
        // `connect` has just loaded distlock's release scripts: the diagnostic floor sends the
        // one of a lock held alone by its SHA.
        let copy_is_current: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(redis::Script::new(crate::contenders::distlock_release_source()).get_hash())
            .query(&mut client.get_connection().expect("cannot connect to Redis"))
            .expect("SCRIPT EXISTS failed");
        assert_eq!(
            copy_is_current,
            [true],
            "the benchmark's floor does not send the release script distlock loads"
        );
        let manager = distlock::global().expect("initialised above").clone();
        println!(
            "distlock bench: redis {redis_version} at {url} ({}), {} rounds after a warm-up round",
            if server.is_some() {
                "private server"
            } else {
                "REDIS_URL"
            },
            config.rounds
        );
        let meter = CpuMeter::new(&client);
        Bench {
            started,
            url,
            server,
            client,
            redis_version,
            single,
            multi,
            manager,
            options: LockOptions::new().ttl(TTL),
            meter,
            spin,
            nproc,
            backend_cluster: None,
            backend_masters: None,
            replicated: None,
        }
    }

    /// Stops everything in order: the runtimes (and their connections) go before the servers do.
    pub(crate) fn shut_down(self) {
        let Bench {
            single,
            multi,
            backend_cluster,
            backend_masters,
            replicated,
            server,
            ..
        } = self;
        drop(multi);
        drop(single);
        drop(backend_cluster);
        drop(backend_masters);
        drop(replicated);
        drop(server);
    }
}

/// Workload 1, cycle (and so 4, attribute overhead): one task, uncontended cycles on new keys,
/// with the idle spinners running.
pub(crate) fn cycle(bench: &mut Bench, config: &Config, results: &mut Results) {
    let Bench {
        started,
        server,
        client,
        single,
        manager,
        options,
        meter,
        spin,
        nproc,
        ..
    } = bench;
    if *spin {
        let spinners = IdleSpinners::start(*nproc);
        results.spinners_running = spinners.running();
        meter.spinners = Some(spinners);
    }
    let floor = single.block_on(Floor::connect(client));
    let work_floor = single.block_on(WorkFloor::connect(client));
    let mut cyclers: Vec<(&'static str, Cycler)> = vec![
        (FLOOR, Cycler::Floor(floor.clone())),
        (FLOOR_SCRIPTS, Cycler::FloorScripts(floor)),
        (FLOOR_WORK, Cycler::FloorWork(work_floor)),
        (MANUAL, Cycler::Manual(manager.clone(), options.clone())),
        (ATTRIBUTE, Cycler::Attribute),
    ];
    cyclers.push((RSLOCK, Cycler::Rslock(Rslock::new(client, None))));
    cyclers.retain(|(name, _)| config.includes(name));
    let n = config.cycle_n;
    let rounds = interleaved_rounds(cyclers.len(), config.rounds, n, |contender, count| {
        let first = next_keys(count);
        let cycler = &mut cyclers[contender].1;
        let (elapsed, client_cpu, redis_cpu) = meter.measure(count, || {
            single.block_on(async {
                let start = Instant::now();
                cycler.run(first..first + count).await;
                start.elapsed()
            })
        });
        (micros(elapsed) / count as f64, client_cpu, redis_cpu)
    });
    let names: Vec<_> = cyclers.iter().map(|(name, _)| *name).collect();
    push_cycle_rows(
        &mut results.rows,
        ("1 cycle", "time per cycle", "us"),
        &names,
        &rounds,
        RSLOCK,
    );
    results.keys_left = server
        .as_ref()
        .map(|server| keys_without_expiry(&mut server.conn()));
    meter.spinners = None; // stops them
    eprintln!("cycle done after {:.1} s", started.elapsed().as_secs_f64());
}

/// Workload 2, contend: `W` tasks on one key, `M` sections each, on the `multi_thread` runtime.
pub(crate) fn contend(bench: &Bench, config: &Config, results: &mut Results) {
    let Bench {
        started,
        client,
        multi,
        manager,
        ..
    } = bench;
    let mut contenders: Vec<(&'static str, Contender)> = vec![
        (DISTLOCK, Contender::Distlock(manager.clone())),
        (
            IN_PROCESS,
            Contender::InProcess(Arc::new(tokio::sync::Mutex::new(()))),
        ),
    ];
    for (name, retry) in [
        (RSLOCK_DEFAULT, None),
        (RSLOCK_TUNED, Some((3, Duration::from_millis(2)))),
    ] {
        contenders.push((name, Contender::Rslock(Rslock::new(client, retry))));
    }
    contenders.retain(|(name, _)| config.includes(name));
    let mut contend_round = 0u64;
    let rounds = rounds(contenders.len(), config.rounds, |contender, warm_up| {
        contend_round += 1;
        let name = format!("bench:contend:{}:{contend_round}", std::process::id());
        let m = if warm_up {
            config.contend_m.div_ceil(4)
        } else {
            config.contend_m
        };
        let contender = &contenders[contender].1;
        let (sections, wall) = multi.block_on(async {
            let start = Instant::now();
            let tasks: Vec<_> = (0..config.contend_tasks)
                .map(|holder| {
                    tokio::spawn(contender.clone().sections(
                        holder,
                        name.clone(),
                        m,
                        config.critical,
                    ))
                })
                .collect();
            let mut sections = Vec::new();
            for task in tasks {
                sections.extend(task.await.expect("a contending task panicked"));
            }
            (sections, start.elapsed())
        });
        analyse(sections, wall)
    });
    results.overlaps = rounds.iter().flatten().map(|round| round.overlaps).sum();
    let metrics: [(&'static str, &'static str, PickContend); 5] = [
        ("sections/s", "1/s", |round| round.sections_per_s),
        ("hand-off gap p50", "us", |round| round.gap_p50_us),
        ("hand-off gap p99", "us", |round| round.gap_p99_us),
        ("longest wait", "ms", |round| round.longest_wait_ms),
        ("changed hands", "%", |round| round.changed_hands_pct),
    ];
    for (metric, unit, pick) in metrics {
        let figures: Vec<_> = contenders
            .iter()
            .zip(&rounds)
            .map(|((name, _), rounds)| (*name, Summary::new(rounds.iter().map(pick).collect())))
            .collect();
        push_rows(
            &mut results.rows,
            ("2 contend", metric, unit),
            &figures,
            None,
            Some(RSLOCK_DEFAULT),
        );
    }
    eprintln!(
        "contend done after {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Workload 3, parallel: many tasks, each cycling on keys of its own, on the
/// `multi_thread` runtime.
pub(crate) fn parallel(bench: &mut Bench, config: &Config, results: &mut Results) {
    let Bench {
        started,
        client,
        multi,
        manager,
        options,
        meter,
        ..
    } = bench;
    let floor = multi.block_on(Floor::connect(client));
    let mut cyclers: Vec<(&'static str, Cycler)> = vec![
        (FLOOR, Cycler::Floor(floor.clone())),
        (FLOOR_SCRIPTS, Cycler::FloorScripts(floor)),
        (DISTLOCK, Cycler::Manual(manager.clone(), options.clone())),
    ];
    cyclers.push((RSLOCK, Cycler::Rslock(Rslock::new(client, None))));
    cyclers.retain(|(name, _)| config.includes(name));
    let (tasks, k) = (config.parallel_tasks, config.parallel_k);
    let rounds = rounds(cyclers.len(), config.rounds, |contender, warm_up| {
        let k = if warm_up { k.div_ceil(5) } else { k } as u64;
        let cycler = &cyclers[contender].1;
        let (elapsed, client_cpu, redis_cpu) = meter.measure(tasks as u64 * k, || {
            multi.block_on(async {
                let start = Instant::now();
                let handles: Vec<_> = (0..tasks)
                    .map(|_| {
                        let first = next_keys(k);
                        let mut cycler = cycler.clone();
                        tokio::spawn(async move { cycler.run(first..first + k).await })
                    })
                    .collect();
                for handle in handles {
                    handle.await.expect("a parallel task panicked");
                }
                start.elapsed()
            })
        });
        (
            (tasks as u64 * k) as f64 / elapsed.as_secs_f64(),
            client_cpu,
            redis_cpu,
        )
    });
    let names: Vec<_> = cyclers.iter().map(|(name, _)| *name).collect();
    push_cycle_rows(
        &mut results.rows,
        ("3 parallel", "cycles/s", "1/s"),
        &names,
        &rounds,
        RSLOCK,
    );
    eprintln!(
        "parallel done after {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Workload 5, backends: workload 1's manual cycle through a manager on the private server, on
/// a cluster and on Redlock masters the bench starts. Skipped under `REDIS_URL`.
pub(crate) fn backends(bench: &mut Bench, config: &Config, results: &mut Results) {
    let Bench {
        started,
        url,
        server,
        single,
        spin,
        nproc,
        backend_cluster,
        backend_masters,
        ..
    } = bench;
    let Some(standalone) = server.as_ref() else {
        println!(
            "{BACKENDS} skipped: REDIS_URL is set, and this workload compares servers the bench starts itself"
        );
        return;
    };
    let backends_started = Instant::now();
    let mut backends = Vec::new();
    if config.includes(STANDALONE) {
        let builder = LockManager::builder(url.as_str());
        let nodes = std::slice::from_ref(standalone);
        backends.push(Backend::connect(STANDALONE, single, builder, nodes));
    }
    if config.includes(CLUSTER) {
        let cluster = backend_cluster.insert(test_support::RedisCluster::start(3, 0));
        let builder = LockManager::cluster_builder(&cluster.urls());
        backends.push(Backend::connect(CLUSTER, single, builder, cluster.nodes()));
    }
    if config.includes(REDLOCK) {
        let masters = backend_masters.insert(test_support::RedisServers::start(5));
        let builder = LockManager::redlock_builder(&masters.urls());
        backends.push(Backend::connect(REDLOCK, single, builder, masters));
    }
    eprintln!(
        "backends: servers up and managers connected in {:.1} s",
        backends_started.elapsed().as_secs_f64()
    );
    let spinners = spin.then(|| IdleSpinners::start(*nproc));
    results.spinners_running = results
        .spinners_running
        .max(spinners.as_ref().map_or(0, IdleSpinners::running));
    let n = config.backends_n;
    let rounds = rounds(backends.len(), config.rounds, |backend, warm_up| {
        let n = if warm_up { n.div_ceil(10) } else { n } as u64;
        let first = next_keys(n);
        let backend = &mut backends[backend];
        let client_before = client_cpu_seconds(spinners.as_ref());
        let redis_before = backend.redis_cpu_seconds();
        let elapsed = single.block_on(async {
            let start = Instant::now();
            backend.cycler.run(first..first + n).await;
            start.elapsed()
        });
        let client_after = client_cpu_seconds(spinners.as_ref());
        let redis_after = backend.redis_cpu_seconds();
        let per_cycle =
            |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (b - a) * 1e6 / n as f64);
        (
            micros(elapsed) / n as f64,
            per_cycle(client_before, client_after),
            per_cycle(redis_before, redis_after),
        )
    });
    drop(spinners);
    results.keys_left_backends = Some(backends.iter_mut().map(Backend::keys).sum::<i64>());
    let names: Vec<_> = backends.iter().map(|backend| backend.name).collect();
    // Paired ratios: each round's time per cycle over standalone's in the same round.
    let times: Vec<Vec<f64>> = rounds
        .iter()
        .map(|rounds| rounds.iter().map(|round| round.0).collect())
        .collect();
    let mut ratio_rows = Vec::new();
    if let Some(base) = names.iter().position(|name| *name == STANDALONE) {
        for (index, name) in names.iter().enumerate().filter(|(i, _)| *i != base) {
            let ratios = times[index]
                .iter()
                .zip(&times[base])
                .map(|(time, base)| time / base)
                .collect();
            ratio_rows.push(Row {
                workload: BACKENDS,
                contender: name,
                metric: "vs standalone",
                unit: "x",
                summary: Summary::new(ratios),
                vs_floor: None,
                vs_rslock: None,
            });
        }
    }
    push_cycle_rows(
        &mut results.rows,
        (BACKENDS, "time per cycle", "us"),
        &names,
        &rounds,
        RSLOCK,
    );
    results.rows.extend(ratio_rows);
    // The managers go now; their connections' tasks stay idle in `single` until it drops.
    drop(backends);
    eprintln!(
        "backends done after {:.1} s ({:.1} s for this workload)",
        started.elapsed().as_secs_f64(),
        backends_started.elapsed().as_secs_f64()
    );
}

/// Workload 8, replicas: workload 1's manual cycle against a master with one replica, without
/// and with `wait_for_replicas(1, ..)`, next to the floor (`SET NX PX` and the compare-and-delete
/// script by hand) and the floor with `WAIT 1` pipelined after its `SET`: what acknowledged
/// locks cost over the replica's acknowledgement itself. Skipped under `REDIS_URL`.
pub(crate) fn replicas(bench: &mut Bench, config: &Config, results: &mut Results) {
    let Bench {
        started,
        server,
        single,
        spin,
        nproc,
        replicated,
        ..
    } = bench;
    if server.is_none() {
        println!("{REPLICAS} skipped: REDIS_URL is set, and this workload starts a master and a replica of its own");
        return;
    }
    let workload_started = Instant::now();
    let master = test_support::RedisServer::start();
    let replica = test_support::RedisServer::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &master.port().to_string(),
    ]);
    test_support::wait_until(Duration::from_secs(30), "the replica to sync", || {
        master.info("replication").contains("connected_slaves:1")
            && replica
                .info("replication")
                .contains("master_link_status:up")
    });
    let client = master.client();
    let url = master.url();
    let [master, _] = &*replicated.insert([master, replica]);
    let connect = |builder: LockManagerBuilder| {
        single.block_on(async {
            builder
                .response_timeout(RESPONSE_TIMEOUT)
                .connect()
                .await
                .expect("replicas: cannot connect")
        })
    };
    let plain = connect(LockManager::builder(url.as_str()));
    let waiting = connect(LockManager::builder(url.as_str()).wait_for_replicas(1, REPLICA_ACK));
    let floor = single.block_on(Floor::connect(&client));
    let options = LockOptions::new().ttl(TTL);
    let mut cyclers: Vec<(&'static str, Cycler)> = vec![
        (FLOOR, Cycler::Floor(floor.clone())),
        (FLOOR_WAIT, Cycler::FloorWait(floor)),
        (REPLICAS_NO_WAIT, Cycler::Manual(plain, options.clone())),
        (REPLICAS_WAIT, Cycler::Manual(waiting, options)),
    ];
    cyclers.retain(|(name, _)| config.includes(name));
    eprintln!(
        "replicas: master, replica and managers up in {:.1} s",
        workload_started.elapsed().as_secs_f64()
    );
    let spinners = spin.then(|| IdleSpinners::start(*nproc));
    results.spinners_running = results
        .spinners_running
        .max(spinners.as_ref().map_or(0, IdleSpinners::running));
    let n = config.backends_n;
    let rounds = interleaved_rounds(cyclers.len(), config.rounds, n, |contender, count| {
        let first = next_keys(count);
        let cycler = &mut cyclers[contender].1;
        let elapsed = single.block_on(async {
            let start = Instant::now();
            cycler.run(first..first + count).await;
            start.elapsed()
        });
        (micros(elapsed) / count as f64, None, None)
    });
    drop(spinners);
    let names: Vec<_> = cyclers.iter().map(|(name, _)| *name).collect();
    // Paired ratios, each round's time per cycle over the base's in the same round.
    let times: Vec<Vec<f64>> = rounds
        .iter()
        .map(|rounds| rounds.iter().map(|round| round.0).collect())
        .collect();
    let position = |name: &str| names.iter().position(|candidate| *candidate == name);
    for (contender, base, metric) in [
        (REPLICAS_WAIT, FLOOR_WAIT, "vs floor + WAIT"),
        (REPLICAS_WAIT, REPLICAS_NO_WAIT, "vs no wait"),
        (FLOOR_WAIT, FLOOR, "vs floor"),
    ] {
        if let (Some(index), Some(base)) = (position(contender), position(base)) {
            let ratios = times[index]
                .iter()
                .zip(&times[base])
                .map(|(time, base)| time / base)
                .collect();
            results.rows.push(Row {
                workload: REPLICAS,
                contender,
                metric,
                unit: "x",
                summary: Summary::new(ratios),
                vs_floor: None,
                vs_rslock: None,
            });
        }
    }
    push_cycle_rows(
        &mut results.rows,
        (REPLICAS, "time per cycle", "us"),
        &names,
        &rounds,
        RSLOCK,
    );
    drop(cyclers);
    let left = keys_without_expiry(&mut master.conn());
    assert_eq!(
        left, 0,
        "replicas: {left} lock keys were left without expiry"
    );
    eprintln!(
        "replicas done after {:.1} s ({:.1} s for this workload)",
        started.elapsed().as_secs_f64(),
        workload_started.elapsed().as_secs_f64()
    );
}

/// How long workload 8's `WAIT` waits for the replica: far above its acknowledgement on one
/// machine, so a `WAIT` that runs out is a fault, not a figure.
const REPLICA_ACK: Duration = Duration::from_millis(500);

/// Workload 6, fleet: one key contended by several OS processes (see `fleet`).
pub(crate) fn fleet(bench: &Bench, config: &Config) -> FleetReport {
    let report = fleet::run(&bench.url, &config.fleet, |name| config.includes(name));
    eprintln!(
        "fleet done after {:.1} s",
        bench.started.elapsed().as_secs_f64()
    );
    report
}

/// One deployment of workload 5: a manager on it, and a connection to each of its Redis nodes.
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    pub(crate) cycler: Cycler,
    pub(crate) nodes: Vec<redis::Connection>,
}

impl Backend {
    /// `builder` with the bench's response timeout, connected on `runtime` (whose tasks then
    /// drive its connections).
    pub(crate) fn connect(
        name: &'static str,
        runtime: &tokio::runtime::Runtime,
        builder: LockManagerBuilder,
        nodes: &[test_support::RedisServer],
    ) -> Self {
        let manager = runtime
            .block_on(builder.response_timeout(RESPONSE_TIMEOUT).connect())
            .unwrap_or_else(|error| panic!("{name}: cannot connect distlock: {error}"));
        Backend {
            name,
            cycler: Cycler::Manual(manager, LockOptions::new().ttl(TTL)),
            nodes: nodes.iter().map(test_support::RedisServer::conn).collect(),
        }
    }

    /// Redis's CPU seconds so far, summed over every node of the backend.
    pub(crate) fn redis_cpu_seconds(&mut self) -> Option<f64> {
        self.nodes.iter_mut().map(redis_cpu_seconds).sum()
    }

    /// Keys that will never expire, on all its nodes together.
    pub(crate) fn keys(&mut self) -> i64 {
        self.nodes.iter_mut().map(keys_without_expiry).sum()
    }
}

/// The keys on one node that will never expire: what a lock that failed to clean up leaves.
/// Keys with a ttl are left out: a cluster release leaves a marker that lives for as long as the
/// connection may send the release again (a few seconds), by design.
pub(crate) fn keys_without_expiry(node: &mut redis::Connection) -> i64 {
    let mut cursor = 0u64;
    let mut count = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query(node)
            .expect("SCAN failed");
        if !keys.is_empty() {
            let mut ttls = redis::pipe();
            for key in &keys {
                ttls.cmd("PTTL").arg(key);
            }
            let ttls: Vec<i64> = ttls.query(node).expect("PTTL failed");
            count += ttls.iter().filter(|&&ttl| ttl == -1).count();
        }
        if next == 0 {
            return i64::try_from(count).unwrap_or(i64::MAX);
        }
        cursor = next;
    }
}

/// Holds the lock until exactly `acquired + critical`, yielding to the runtime between checks
/// (a `tokio::time::sleep` would round up to the next 1 ms timer tick).
pub(crate) async fn critical_section(acquired: Instant, critical: Duration) {
    let end = acquired + critical;
    while Instant::now() < end {
        tokio::task::yield_now().await;
        std::hint::spin_loop();
    }
}
