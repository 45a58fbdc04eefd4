//! Nemesis: every fault at once against fenced read-modify-write sections, then a checker.
//!
//! The parent starts a store (a redis-server it never faults), a lock Redis with its append-only
//! file on (`appendfsync always`), and `--workers` worker processes (this same executable, in
//! worker mode). Each worker reaches the lock Redis through a fault proxy of its own and runs
//! sections one after the other on one of `--keys` records: take the lock (`fencing(true)`, ttl
//! `--ttl`), read the record from the store with its token, hold a few tens of ms, write back
//! the value + 1 with its token, release. The store refuses a token lower than one it has seen.
//! Every step goes to the worker's history (JSON lines).
//!
//! Meanwhile the nemesis injects, at random, one after the other:
//! - `kill`: SIGKILL of a worker, and a new worker in its slot;
//! - `stop`: SIGSTOP of a worker for longer than the ttl, then SIGCONT;
//! - `cut`: every connection between a worker and the lock Redis closed by its proxy;
//! - `restart`: the lock Redis killed and started again (it reloads its append-only file);
//! - `failover`: a Sentinel failover of the lock Redis (with `--faults` naming it, as the
//!   default does, the lock Redis is a Sentinel set whose replica must acknowledge every lock
//!   write, `wait_for_replicas(1, 300 ms)`, and `cut` and `restart` are not available: see USAGE).
//!
//! After `--duration` seconds the checker reads the histories and the store's records and
//! reports, per kind of fault, what it cost; it exits 1 when an accepted write was out of token
//! order, an update was lost, or a record's final value is not its number of accepted writes.
//!
//! ```text
//! cargo run --release --example nemesis -- --duration 60
//! ```

mod checker;
mod history;
mod store;
mod worker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::time::Duration;

use test_support::{send_signal, FaultProxy, RedisServer, SentinelSet};

use checker::{check, FinalRecord, Input, Report};
use history::{now_micros, read_lines, Event, Fault, FaultKind, Log};
use worker::{LockAt, WorkerArgs};

const USAGE: &str = "\
usage: nemesis [--duration SECONDS] [--workers N] [--keys N] [--ttl SECONDS] [--faults LIST]
               [--out DIR]

  --duration SECONDS  how long the workers run sections (default 60)
  --workers N         worker processes (default 4)
  --keys N            records (and locks) the workers share (default 3)
  --ttl SECONDS       the locks' ttl (default 3); a stopped worker stays stopped ttl + 0.5..1.5 s
  --faults LIST       comma-separated, of kill, stop, cut, restart, failover
                      (default kill,stop,failover). With failover the lock Redis is a Sentinel
                      set (the workers wait for its replica's acknowledgement of every lock
                      write), reached through the sentinels with no proxy between them and run
                      without an append-only file: cut and restart cannot be combined with it;
                      run them as kill,stop,cut,restart against a single lock Redis.
  --out DIR           where the histories go (default: a new temporary directory)

Needs redis-server on PATH. Exits 1 when the checker finds a violation, 64 on a bad argument.";

/// Workers get this long past the end of the run to finish their last section.
const GRACE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
struct Args {
    duration: Duration,
    workers: u32,
    keys: u32,
    ttl: Duration,
    faults: Vec<FaultKind>,
    out: Option<PathBuf>,
}

fn main() -> ExitCode {
    let mut raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.first().map(String::as_str) == Some("--worker") {
        return match parse_worker(&raw[1..]) {
            Ok(args) => worker::run(&args),
            Err(message) => {
                eprintln!("worker: {message}");
                ExitCode::from(64)
            }
        };
    }
    match parse(&mut raw) {
        Ok(args) => parent(&args),
        Err(message) => {
            eprintln!("error: {message}\n\n{USAGE}");
            ExitCode::from(64)
        }
    }
}

fn parse(raw: &mut [String]) -> Result<Args, String> {
    let mut args = Args {
        duration: Duration::from_secs(60),
        workers: 4,
        keys: 3,
        ttl: Duration::from_secs(3),
        faults: vec![FaultKind::Kill, FaultKind::Stop, FaultKind::Failover],
        out: None,
    };
    let mut it = raw.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let number = |text: String| {
            text.parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag}: `{text}` is not a whole number above 0"))
        };
        match flag.as_str() {
            "--duration" => args.duration = Duration::from_secs(number(value()?)?.into()),
            "--workers" => args.workers = number(value()?)?,
            "--keys" => args.keys = number(value()?)?,
            "--ttl" => args.ttl = Duration::from_secs(number(value()?)?.into()),
            "--out" => args.out = Some(PathBuf::from(value()?)),
            "--faults" => {
                let list = value()?;
                args.faults = list
                    .split(',')
                    .filter(|name| !name.is_empty())
                    .map(|name| {
                        FaultKind::ALL
                            .into_iter()
                            .find(|kind| kind.name() == name)
                            .ok_or_else(|| format!("--faults: no fault called `{name}`"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            "-h" | "--help" => return Err("help".into()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if args.faults.contains(&FaultKind::Failover)
        && (args.faults.contains(&FaultKind::Cut) || args.faults.contains(&FaultKind::Restart))
    {
        return Err(
            "--faults: failover runs against a Sentinel set, without a proxy or an append-only \
             file: leave cut and restart out of the list"
                .into(),
        );
    }
    Ok(args)
}

// ---------------------------------------------------------------------------------------------
// The parent: servers, workers, the nemesis, then the checker.

/// The lock Redis and how each worker reaches it.
enum LockRedis {
    /// One server with its append-only file; one fault proxy per worker slot.
    Single {
        server: RedisServer,
        proxies: Vec<FaultProxy>,
    },
    /// A master, a replica and three sentinels (boxed: the set is much larger than a server).
    Sentinel(Box<SentinelSet>),
}

impl LockRedis {
    fn start(args: &Args) -> LockRedis {
        if args.faults.contains(&FaultKind::Failover) {
            return LockRedis::Sentinel(Box::new(SentinelSet::start()));
        }
        // `always`: a fencing counter that went back after a restart would hand out tokens the
        // store has seen, and every section after it would be refused.
        let server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
        let proxies = (0..args.workers)
            .map(|_| FaultProxy::start(server.port()))
            .collect();
        LockRedis::Single { server, proxies }
    }

    fn reach(&self, slot: u32) -> LockAt {
        match self {
            LockRedis::Single { proxies, .. } => LockAt::Url(proxies[slot as usize].url()),
            LockRedis::Sentinel(set) => LockAt::Sentinels(set.sentinel_urls()),
        }
    }
}

/// The worker processes, by slot, and how to start one again.
struct Fleet<'a> {
    args: &'a Args,
    lock: &'a LockRedis,
    store_url: String,
    dir: PathBuf,
    until: u64,
    children: Vec<(Child, u32)>,
}

impl Fleet<'_> {
    fn spawn(&self, slot: u32, life: u32) -> std::io::Result<Child> {
        let exe = std::env::current_exe()?;
        let mut command = Command::new(exe);
        command
            .arg("--worker")
            .args(["--slot", &slot.to_string(), "--life", &life.to_string()])
            .args(["--store-url", &self.store_url])
            .arg("--history")
            .arg(history_path(&self.dir, slot))
            .args(["--until", &self.until.to_string()])
            .args(["--keys", &self.args.keys.to_string()])
            .args(["--ttl-ms", &self.args.ttl.as_millis().to_string()]);
        match self.lock.reach(slot) {
            LockAt::Url(url) => command.args(["--lock-url", &url]),
            LockAt::Sentinels(urls) => command.args(["--sentinels", &urls.join(",")]),
        };
        command.spawn()
    }

    fn pid(&self, slot: u32) -> u32 {
        self.children[slot as usize].0.id()
    }

    /// SIGKILL, reaped, and a new worker in the slot.
    fn kill_and_restart(&mut self, slot: u32) -> std::io::Result<()> {
        let (child, life) = &mut self.children[slot as usize];
        child.kill()?;
        child.wait()?;
        let next = *life + 1;
        let fresh = self.spawn(slot, next)?;
        self.children[slot as usize] = (fresh, next);
        Ok(())
    }

    /// Waits for every worker until `deadline` (microseconds), then kills what is left.
    /// Returns how many did not exit successfully.
    fn wait(&mut self, deadline: u64) -> u32 {
        let mut failed = 0;
        for (slot, (child, _)) in self.children.iter_mut().enumerate() {
            let status = loop {
                match child.try_wait() {
                    Ok(Some(status)) => break Some(status),
                    Ok(None) if now_micros() < deadline => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Ok(None) | Err(_) => break None,
                }
            };
            match status {
                Some(status) if status.success() => {}
                Some(status) => {
                    eprintln!("worker {slot} failed ({status})");
                    failed += 1;
                }
                None => {
                    eprintln!("worker {slot} overran the run; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    failed += 1;
                }
            }
        }
        failed
    }
}

fn history_path(dir: &Path, slot: u32) -> PathBuf {
    dir.join(format!("worker-{slot}.jsonl"))
}

fn parent(args: &Args) -> ExitCode {
    let dir = match &args.out {
        Some(dir) => {
            if let Err(error) = std::fs::create_dir_all(dir) {
                eprintln!("error: cannot create {}: {error}", dir.display());
                return ExitCode::FAILURE;
            }
            dir.clone()
        }
        None => test_support::unique_temp_dir("nemesis"),
    };
    let names: Vec<&str> = args.faults.iter().map(|kind| kind.name()).collect();
    println!(
        "nemesis: {} workers, {} records, ttl {:?}, {} s, faults {}",
        args.workers,
        args.keys,
        args.ttl,
        args.duration.as_secs(),
        names.join(",")
    );
    println!("histories in {}", dir.display());

    let store = RedisServer::start();
    let lock = LockRedis::start(args);
    let started = now_micros();
    let until = started + micros(args.duration);
    let mut fleet = Fleet {
        args,
        lock: &lock,
        store_url: store.url(),
        dir: dir.clone(),
        until,
        children: Vec::new(),
    };
    for slot in 0..args.workers {
        match fleet.spawn(slot, 0) {
            Ok(child) => fleet.children.push((child, 0)),
            Err(error) => {
                eprintln!("error: cannot start worker {slot}: {error}");
                return ExitCode::FAILURE;
            }
        }
    }

    let faults = match nemesis(args, &lock, &mut fleet, &dir.join("faults.jsonl")) {
        Ok(faults) => faults,
        Err(error) => {
            eprintln!("error: the nemesis failed: {error}");
            return ExitCode::FAILURE;
        }
    };
    let failed_workers = fleet.wait(until + micros(GRACE));
    let ended = now_micros();

    let mut events: Vec<Event> = Vec::new();
    for slot in 0..args.workers {
        match read_lines(&history_path(&dir, slot)) {
            Ok(lines) => events.extend(lines),
            Err(error) => {
                eprintln!("error: cannot read worker {slot}'s history: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    let finals = match finals(&store, args.keys) {
        Ok(finals) => finals,
        Err(error) => {
            eprintln!("error: cannot read the store: {error}");
            return ExitCode::FAILURE;
        }
    };
    let report = check(&Input {
        events: &events,
        faults: &faults,
        finals: &finals,
        started,
        ended,
        settle: micros(args.ttl),
    });
    print_report(&report, &finals, failed_workers);
    if report.violations() > 0 || report.accepted == 0 || failed_workers > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Injects faults at random, one after the other, until the run's end. Returns what it did, also
/// written to `log_path`.
fn nemesis(
    args: &Args,
    lock: &LockRedis,
    fleet: &mut Fleet<'_>,
    log_path: &Path,
) -> std::io::Result<Vec<Fault>> {
    let mut log = Log::open(log_path)?;
    let mut faults = Vec::new();
    let ttl = micros(args.ttl);
    loop {
        std::thread::sleep(Duration::from_millis(fastrand::u64(300..1500)));
        // A stop lasts past the ttl: none starts so late that it would outlast the run.
        if now_micros() + ttl * 2 > fleet.until {
            return Ok(faults);
        }
        let kind = args.faults[fastrand::usize(..args.faults.len())];
        let slot = fastrand::u32(0..args.workers);
        let start = now_micros();
        let worker = match kind {
            FaultKind::Kill => {
                fleet.kill_and_restart(slot)?;
                Some(slot)
            }
            FaultKind::Stop => {
                // Aimed at a holder: a worker frozen while it waits in line costs a stall, one
                // frozen between its read and its write is what fencing is for.
                wait_holding(&history_path(&fleet.dir, slot), Duration::from_secs(1));
                let pid = fleet.pid(slot);
                send_signal(pid, "STOP");
                let frozen = args.ttl + Duration::from_millis(fastrand::u64(500..1500));
                std::thread::sleep(frozen);
                send_signal(pid, "CONT");
                Some(slot)
            }
            FaultKind::Cut => match lock {
                LockRedis::Single { proxies, .. } => {
                    proxies[slot as usize].cut();
                    Some(slot)
                }
                LockRedis::Sentinel(_) => unreachable!("refused by parse"),
            },
            FaultKind::Restart => match lock {
                LockRedis::Single { server, .. } => {
                    server.restart();
                    None
                }
                LockRedis::Sentinel(_) => unreachable!("refused by parse"),
            },
            FaultKind::Failover => match lock {
                LockRedis::Sentinel(set) => {
                    let old = set.master();
                    let new = set.failover();
                    // Until the old master is a replica in sync, the set has no replica to fail
                    // over to and no lock write can be acknowledged: the next fault waits for it.
                    set.wait_demoted(old);
                    wait_replica_online(new, Duration::from_secs(60));
                    None
                }
                LockRedis::Single { .. } => unreachable!("failover starts a Sentinel set"),
            },
        };
        let fault = Fault {
            kind,
            worker,
            start,
            end: now_micros(),
        };
        log.write(&fault)?;
        faults.push(fault);
    }
}

/// Waits until `master` reports a replica whose link is up and in sync, or until `timeout`.
fn wait_replica_online(master: &RedisServer, timeout: Duration) {
    let deadline = now_micros() + micros(timeout);
    while now_micros() < deadline {
        let info: Option<String> = master
            .try_conn()
            .and_then(|mut connection| redis::cmd("INFO").arg("replication").query(&mut connection))
            .ok();
        if info.is_some_and(|info| info.contains("state=online")) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the last line of the history at `path` is a successful read (the worker holds a
/// lock and is about to write), or until `timeout`.
fn wait_holding(path: &Path, timeout: Duration) {
    use std::io::{Read, Seek, SeekFrom};
    let deadline = now_micros() + micros(timeout);
    while now_micros() < deadline {
        if let Ok(mut file) = std::fs::File::open(path) {
            let length = file.metadata().map_or(0, |meta| meta.len());
            let mut tail = String::new();
            if file
                .seek(SeekFrom::Start(length.saturating_sub(256)))
                .is_ok()
                && file.read_to_string(&mut tail).is_ok()
            {
                let last = tail.trim_end().rsplit('\n').next().unwrap_or("");
                if last.contains("\"ev\":\"read\"") && !last.contains("null") {
                    return;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Every record's final value and number of accepted writes, read from the store.
fn finals(store: &RedisServer, keys: u32) -> redis::RedisResult<BTreeMap<String, FinalRecord>> {
    let mut connection = store.try_conn()?;
    let mut finals = BTreeMap::new();
    for n in 0..keys {
        let key = format!("record-{n}");
        let (value, writes): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(store::record_key(&key))
            .arg("value")
            .arg("writes")
            .query(&mut connection)?;
        finals.insert(
            key,
            FinalRecord {
                value: value.unwrap_or(0),
                writes: writes.unwrap_or(0),
            },
        );
    }
    Ok(finals)
}

fn print_report(report: &Report, finals: &BTreeMap<String, FinalRecord>, failed_workers: u32) {
    println!();
    println!(
        "{:<10} {:>8} {:>13} {:>9} {:>6} {:>9} {:>9} {:>13}",
        "fault",
        "injected",
        "sections lost",
        "timed out",
        "stale",
        "cut short",
        "overtaken",
        "longest stall"
    );
    let row = |name: &str, cost: &checker::Cost| {
        println!(
            "{:<10} {:>8} {:>13} {:>9} {:>6} {:>9} {:>9} {:>11.1} s",
            name,
            cost.injected,
            cost.lost,
            cost.timed_out,
            cost.stale,
            cost.cut_short,
            cost.overlaps,
            cost.longest_stall as f64 / 1e6
        );
    };
    for (kind, cost) in &report.costs {
        if let Some(kind) = kind {
            if cost.injected > 0 {
                row(kind.name(), cost);
            }
        }
    }
    if let Some(cost) = report.costs.get(&None) {
        row("no fault", cost);
    }
    row("total", &report.total);
    println!();
    println!(
        "sections {}, accepted writes {}, writes never answered (worker killed) {}",
        report.sections, report.accepted, report.unknown_writes
    );
    for (key, record) in finals {
        println!(
            "  {key}: value {}, accepted writes {}",
            record.value, record.writes
        );
    }
    println!(
        "checker: writes out of token order {}, lost updates {}, records off {}",
        report.out_of_order, report.lost_updates, report.final_mismatches
    );
    if failed_workers > 0 {
        println!("workers that failed: {failed_workers}");
    }
    if report.violations() > 0 {
        println!("VIOLATION: the store accepted what fencing should have kept out");
    } else if report.accepted == 0 {
        println!("FAILED: no write was accepted, the run shows nothing");
    } else {
        println!("OK: no violation");
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------------------
// Worker mode: the parent's command line for one worker.

fn parse_worker(raw: &[String]) -> Result<WorkerArgs, String> {
    let mut named: BTreeMap<&str, &str> = BTreeMap::new();
    for pair in raw.chunks(2) {
        match pair {
            [flag, value] => {
                named.insert(flag.as_str(), value.as_str());
            }
            [flag] => return Err(format!("{flag} needs a value")),
            _ => {}
        }
    }
    let text = |flag: &str| {
        named
            .get(flag)
            .copied()
            .ok_or_else(|| format!("missing {flag}"))
    };
    let number = |flag: &str| {
        text(flag)?
            .parse::<u64>()
            .map_err(|error| format!("{flag}: {error}"))
    };
    let lock = match (named.get("--lock-url"), named.get("--sentinels")) {
        (Some(url), None) => LockAt::Url((*url).to_owned()),
        (None, Some(urls)) => LockAt::Sentinels(urls.split(',').map(str::to_owned).collect()),
        _ => return Err("give one of --lock-url and --sentinels".into()),
    };
    let small = |flag: &str| {
        number(flag).and_then(|n| u32::try_from(n).map_err(|error| format!("{flag}: {error}")))
    };
    Ok(WorkerArgs {
        slot: small("--slot")?,
        life: small("--life")?,
        lock,
        store_url: text("--store-url")?.to_owned(),
        history: PathBuf::from(text("--history")?),
        until: number("--until")?,
        keys: small("--keys")?,
        ttl: Duration::from_millis(number("--ttl-ms")?),
    })
}
