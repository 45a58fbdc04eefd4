//! The worker side of the fleet workload: what the bench binary does when it is started as one of
//! the fleet's processes (see [`super::processes`] for the other side).
//!
//! Conversation with the parent, one line each way at a time:
//! 1. the parent starts the binary with [`WORKER_ENV`] set to a [`WorkerSpec`] in JSON;
//! 2. the worker builds its runtime, connects, runs one cycle on a key of its own (so that its
//!    connection is open and the scripts are loaded before anything is counted), then prints
//!    `ready`;
//! 3. the parent prints `go <t>` to every worker's stdin once all are ready, `t` a
//!    [`monotonic_ns`] reading a little ahead; every worker sleeps until `t`, so they start
//!    together however long each took to read the line;
//! 4. the worker runs its tasks and prints one line of JSON, a [`WorkerReport`].
//!
//! The parent keeps the worker's stdin open until the worker has exited, so a worker that sees
//! its stdin close mid-run knows its parent is gone (even one killed by SIGKILL, which runs no
//! drop) and exits instead of running on alone.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Duration;

use distlock::{LockManager, LockOptions};
use serde::{Deserialize, Serialize};

use super::family::{ByHand, Family};
use super::hand_written::HandWritten;
use super::ring::{Ring, Turn};
use super::stats::Section;
use super::{monotonic_ns, Lock, RESPONSE_TIMEOUT, TTL};

/// Set (to a [`WorkerSpec`] in JSON) in the environment of a worker process.
pub(super) const WORKER_ENV: &str = "DISTLOCK_BENCH_FLEET_WORKER";

/// The exit code of a worker whose parent went away mid-run.
const ORPHANED: i32 = 3;

/// Long enough never to fire: a waiter that gives up would end the run with a panic, not with a
/// figure.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(600);

/// What one worker process does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct WorkerSpec {
    pub url: String,
    pub lock: Lock,
    /// The contended lock's name (without [`PREFIX`]), the same for every worker of the run.
    pub name: String,
    /// This worker's number, `0..P`.
    pub process: usize,
    /// Worker processes in the run (P).
    pub processes: usize,
    /// Tasks in this process (T).
    pub tasks: usize,
    /// Sections per task.
    pub sections: usize,
    pub critical_us: u64,
    /// Hold each section by sleeping rather than spinning (see [`critical_section`]).
    #[serde(default)]
    pub sleep: bool,
}

/// What a worker prints when done.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WorkerReport {
    pub process: usize,
    pub sections: Vec<Section>,
}

/// Runs as a fleet worker and returns `true` if this process was started as one; `false` (at
/// once) otherwise.
pub(crate) fn run_if_asked() -> bool {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return false;
    };
    let spec: WorkerSpec = serde_json::from_str(&spec)
        .unwrap_or_else(|error| panic!("fleet worker: bad {WORKER_ENV}: {error}"));
    run(&spec);
    true
}

fn run(spec: &WorkerSpec) {
    // What a service's `#[tokio::main]` builds: a worker thread per CPU.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("fleet worker: cannot build its runtime");
    let lock = Arc::new(runtime.block_on(WorkerLock::connect(spec)));
    runtime.block_on(lock.warm_up(spec));

    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready")
        .and_then(|()| stdout.flush())
        .expect("fleet worker: stdout");
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .expect("fleet worker: cannot read the start line");
    let start: u64 = line
        .strip_prefix("go ")
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("fleet worker: expected `go <t>`, got {line:?}"));
    watch_parent();
    let now = monotonic_ns();
    if start > now {
        std::thread::sleep(Duration::from_nanos(start - now));
    }

    let sections = runtime.block_on(async {
        let tasks: Vec<_> = (0..spec.tasks)
            .map(|task| {
                let lock = Arc::clone(&lock);
                let spec = spec.clone();
                tokio::spawn(async move { lock.sections(&spec, task).await })
            })
            .collect();
        let mut sections = Vec::with_capacity(spec.tasks * spec.sections);
        for task in tasks {
            sections.extend(task.await.expect("fleet worker: a task panicked"));
        }
        sections
    });
    let report = WorkerReport {
        process: spec.process,
        sections,
    };
    let json = serde_json::to_string(&report).expect("fleet worker: cannot encode its report");
    writeln!(stdout, "{json}")
        .and_then(|()| stdout.flush())
        .expect("fleet worker: stdout");
}

/// Exits this process once its stdin reaches end-of-file: the parent holds it open until this
/// worker has exited, so an end-of-file before then means the parent is gone.
fn watch_parent() {
    std::thread::Builder::new()
        .name("parent-watch".to_owned())
        .spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            eprintln!(
                "fleet worker {}: the bench went away; exiting",
                std::process::id()
            );
            std::process::exit(ORPHANED);
        })
        .expect("fleet worker: cannot start the parent watch");
}

/// Holds the lock until `acquired + critical` by spinning, yielding to the runtime between checks
/// (a `tokio::time::sleep` would round up to the next 1 ms timer tick); or, with `sleep`, by
/// sleeping, for workloads where several holders at once (permits, readers, transfers) would
/// otherwise keep the machine's cores from the waiters they hand over to.
async fn critical_section(acquired: u64, critical_us: u64, sleep: bool) {
    let end = acquired + critical_us * 1_000;
    if sleep {
        let left = end.saturating_sub(monotonic_ns());
        tokio::time::sleep(Duration::from_nanos(left)).await;
        return;
    }
    while monotonic_ns() < end {
        tokio::task::yield_now().await;
        std::hint::spin_loop();
    }
}

/// A lock taken by [`WorkerLock::acquire`].
enum Held {
    Guard(distlock::LockGuard),
    /// The hand-written lock's keys, given back by the token they were taken with.
    Keys(Vec<String>),
    /// A ring floor's turn, handed on by [`Ring::pass`].
    Turn,
}

/// The lock as one worker process takes it; its tasks share it (and so its connections).
enum WorkerLock {
    Distlock {
        manager: LockManager,
        options: LockOptions,
    },
    /// [`Lock::Poll`]: what users write by hand, `SET key token NX PX ttl` until it answers
    /// OK, sleeping after each refusal.
    Poll(HandWritten),
    /// [`Lock::Ring`]: no lock, the floors' ring.
    Ring(Ring),
    /// [`Lock::Family`]: a semaphore, a read-write lock or two keys at once, each section
    /// taking what [`Family::section`] says for it.
    Family {
        manager: LockManager,
        family: Family,
        /// [`WorkerSpec::process`]: with the task and the section, it picks each section's
        /// mode or accounts.
        process: usize,
        tasks: usize,
    },
    /// [`Lock::FamilyPoll`]: the keys [`Family::by_hand`] names for each section, taken by
    /// hand.
    FamilyPoll {
        lock: HandWritten,
        family: Family,
        process: usize,
        tasks: usize,
    },
}

impl WorkerLock {
    async fn connect(spec: &WorkerSpec) -> Self {
        match spec.lock {
            Lock::Distlock => WorkerLock::Distlock {
                manager: LockManager::builder(spec.url.as_str())
                    .response_timeout(RESPONSE_TIMEOUT)
                    .connect()
                    .await
                    .expect("fleet worker: cannot connect distlock"),
                options: LockOptions::new().ttl(TTL).timeout(ACQUIRE_TIMEOUT),
            },
            Lock::Family(family) => WorkerLock::Family {
                manager: LockManager::builder(spec.url.as_str())
                    .response_timeout(RESPONSE_TIMEOUT)
                    .connect()
                    .await
                    .expect("fleet worker: cannot connect distlock"),
                family,
                process: spec.process,
                tasks: spec.tasks,
            },
            Lock::Ring { pass, raw } => WorkerLock::Ring(
                Ring::connect(
                    &spec.url,
                    &spec.name,
                    (spec.process, spec.processes, spec.tasks),
                    pass,
                    raw,
                )
                .await,
            ),
            Lock::Poll { interval_ms } => WorkerLock::Poll(
                HandWritten::connect(&spec.url, Duration::from_millis(interval_ms)).await,
            ),
            Lock::FamilyPoll {
                family,
                interval_ms,
            } => WorkerLock::FamilyPoll {
                lock: HandWritten::connect(&spec.url, Duration::from_millis(interval_ms)).await,
                family,
                process: spec.process,
                tasks: spec.tasks,
            },
        }
    }

    /// One uncontended cycle on a key of this worker's own, so that the run itself starts with
    /// open connections and loaded scripts, and counts only the commands of its sections.
    async fn warm_up(&self, spec: &WorkerSpec) {
        let name = format!("{}:warm-up:{}", spec.name, spec.process);
        let token = format!("warm-up-{}", std::process::id());
        if let WorkerLock::Ring(ring) = self {
            ring.warm_up(&name).await;
            return;
        }
        let turn = Turn { task: 0, n: 0 };
        let held = self.acquire(&name, &token, turn).await;
        self.release(held, &name, &token, turn).await;
    }

    /// One task's sections on the contended lock.
    async fn sections(&self, spec: &WorkerSpec, task: usize) -> Vec<Section> {
        let pid = std::process::id();
        let mut sections = Vec::with_capacity(spec.sections);
        for n in 0..spec.sections {
            // Unique in the run: no task can ever release another's hold.
            let token = format!("fleet-{pid}-{task}-{n}");
            let turn = Turn { task, n };
            let called = monotonic_ns();
            let held = self.acquire(&spec.name, &token, turn).await;
            let acquired = monotonic_ns();
            critical_section(acquired, spec.critical_us, spec.sleep).await;
            let release_start = monotonic_ns();
            self.release(held, &spec.name, &token, turn).await;
            sections.push(Section {
                process: spec.process,
                task: spec.process * spec.tasks + task,
                called,
                acquired,
                release_start,
                released: monotonic_ns(),
                tag: self.tag(turn),
            });
        }
        sections
    }

    /// What the section `turn` takes, for the analysis (see [`Family::section`]); 0 for a
    /// mutex.
    fn tag(&self, turn: Turn) -> u32 {
        match self {
            WorkerLock::Family {
                family,
                process,
                tasks,
                ..
            }
            | WorkerLock::FamilyPoll {
                family,
                process,
                tasks,
                ..
            } => family.section(process * tasks + turn.task, turn.n).tag,
            _ => 0,
        }
    }

    async fn acquire(&self, name: &str, token: &str, turn: Turn) -> Held {
        match self {
            WorkerLock::Family {
                manager,
                family,
                process,
                tasks,
            } => {
                let section = family.section(process * tasks + turn.task, turn.n);
                let options = section.options(LockOptions::new().ttl(TTL).timeout(ACQUIRE_TIMEOUT));
                let guard = match section.accounts {
                    Some((from, to)) => {
                        let names = [Family::account(name, from), Family::account(name, to)];
                        manager.acquire_all(&names, &options).await
                    }
                    None => manager.acquire(name, &options).await,
                };
                Held::Guard(guard.expect("fleet worker: distlock acquire failed"))
            }
            WorkerLock::Ring(ring) => {
                ring.wait(name, token, turn).await;
                Held::Turn
            }
            WorkerLock::Distlock { manager, options } => Held::Guard(
                manager
                    .acquire(name, options)
                    .await
                    .expect("fleet worker: distlock acquire failed"),
            ),
            WorkerLock::Poll(lock) => Held::Keys(lock.take_all(&[name.to_owned()], token).await),
            WorkerLock::FamilyPoll {
                lock,
                family,
                process,
                tasks,
            } => Held::Keys(
                match family.by_hand(name, process * tasks + turn.task, turn.n) {
                    ByHand::AnyOf { names, first } => {
                        vec![lock.take_any(&names, first, token).await]
                    }
                    ByHand::AllOf(names) => lock.take_all(&names, token).await,
                },
            ),
        }
    }

    /// Releases what [`acquire`](Self::acquire) took: distlock's guard, or the hand-written lock
    /// by its token; either must find the lock still ours (the ttl is far longer than the run).
    /// A ring floor hands the turn to the next task.
    async fn release(&self, held: Held, name: &str, token: &str, turn: Turn) {
        match (self, held) {
            (WorkerLock::Ring(ring), Held::Turn) => ring.pass(name, token, turn).await,
            (WorkerLock::Distlock { .. } | WorkerLock::Family { .. }, Held::Guard(guard)) => guard
                .release()
                .await
                .expect("fleet worker: distlock release failed"),
            (WorkerLock::Poll(lock) | WorkerLock::FamilyPoll { lock, .. }, Held::Keys(keys)) => {
                lock.release(&keys, token).await;
            }
            _ => unreachable!("what a lock takes, that lock and only it gives back"),
        }
    }
}
