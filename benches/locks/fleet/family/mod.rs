//! The lock family across processes (`cargo bench --bench locks -- semaphore rwlock transfers`):
//! the fleet workload's processes and start (see [`super`]), taking a semaphore, a read-write
//! lock, or two keys at once, next to the mutex, a floor and the same lock written by hand
//! (the poll baseline), measured in the same run.
//!
//! Each workload runs `P`x`T` (default 16x1) worker processes, `S` sections of 1 ms per task,
//! its contenders in rotated order within each of `R` rounds (defaults: 25 sections, 3
//! rounds, 1 with `--quick`; `DISTLOCK_BENCH_FAMILY_SHAPES`, `..._SECTIONS`, `..._ROUNDS`):
//! - **semaphore**: `permits(4)` on one name; the mutex (`distlock`) and the floor
//!   (`floor: script + join per turn`, a ring handing one turn on with a hand-off script) on
//!   one name. Figures: the **permit gap** (a release made while someone waits, to the next
//!   entry, releases and entries paired in time order; for the mutex and the floor it is their
//!   hand-off gap, measured the same way) and **busy permits** (of the time someone waits, the
//!   share during which all `n` permits are in use; for the mutex, the one lock), and the
//!   issue's **busy permits** (of that time, the mean share of the `n` permits in use, against
//!   the mutex's busy fraction measured the same way; all `n` at once is about the per-permit
//!   share to the power `n`, so it is the stricter figure).
//! - **rwlock**: `mode(Read)` for 9 sections in 10 and `mode(Write)` for the others (which
//!   ones is fixed by the task and the section), against the same with every section a
//!   writer, the mutex and the floor: throughput, and commands per section.
//! - **transfers**: `acquire_all` of two accounts out of 8 (which two, and in which order, is
//!   fixed by the task and the section: both orders occur), against the mutex and the floor
//!   on one name: throughput and commands per section.
//!
//! Each workload also runs its **poll baseline**, `SET NX PX + 5 ms poll`: what a user without
//! distlock writes by hand for that lock, as the fleet's mutex poll does (one multiplexed
//! connection per process, `SET key token NX PX ttl`, 5 ms of sleep after a refusal, the
//! compare-and-delete script to give a key back; see `fleet::hand_written` and
//! [`Family::by_hand`]):
//! - semaphore: 4 slot keys `<name>:slot:<i>`, tried in order from the task's own (task
//!   modulo 4), the first that is free taken; when all refuse, a sleep and all again;
//! - rwlock: one key for every section, reader or writer: a hand-written `SET NX` lock has no
//!   shared mode, so the baseline is what a user without a read-write lock does, a mutex (and
//!   it is checked as one);
//! - transfers: both account keys in account order; when the second refuses, the first is
//!   given back, and after a sleep both are asked for again.
//!
//! It reports the figures the other contenders do, and the family lock's over its own come
//! under them for information: throughput, longest wait, permit gap (semaphore), commands per
//! section.
//!
//! Every section is held by sleeping until its 1 ms is up (every contender alike): four
//! permits or many readers spinning at once would take a 2-core machine's cores from the
//! waiters they hand over to, and measure the machine rather than the lock. A sleep ends on the
//! runtime's next timer tick, so sections last 1 to 2 ms.
//!
//! Every run is checked against its lock's promise (at most `n` holders; no reader with a
//! writer; no account in two sections at once; for the rwlock's poll baseline, one holder): a
//! section that breaks it fails the bench after the report, as in the fleet workload.

mod figures;
mod poll_baseline;
mod render;

use serde::{Deserialize, Serialize};

use distlock::{LockMode, LockOptions};

use super::{ring, run_sections, FleetConfig, Lock, Shape, POLL_5, RING_SCRIPT_JOIN};
use crate::DISTLOCK;
use figures::{Rule, RunFigures, Summary};
pub(crate) use poll_baseline::ByHand;

/// The lock of a family workload, as a worker takes it (see `worker::WorkerLock::Family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Family {
    /// `LockOptions::permits(permits)` on the run's name.
    Semaphore { permits: u32 },
    /// `readers_in_10` sections in 10 are readers, the others writers, on the run's name.
    ReadWrite { readers_in_10: u32 },
    /// `acquire_all` of two accounts out of `accounts` (at most 32).
    Transfers { accounts: u32 },
}

/// What one section takes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SectionPlan {
    /// For the analysis: 1 for a reader (0 a writer), or the accounts' bits.
    pub tag: u32,
    /// The two accounts of a transfer, in the order the caller names them.
    pub accounts: Option<(u32, u32)>,
    family: Family,
}

impl SectionPlan {
    /// `base` with this section's permits or mode.
    pub(crate) fn options(&self, base: LockOptions) -> LockOptions {
        match self.family {
            Family::Semaphore { permits } => base.permits(permits),
            Family::ReadWrite { .. } if self.tag == 1 => base.mode(LockMode::Read),
            Family::ReadWrite { .. } => base.mode(LockMode::Write),
            Family::Transfers { .. } => base,
        }
    }
}

impl Family {
    /// What section `n` of the fleet-wide task `task` takes: the same in every run, so that
    /// contenders and rounds face the same mix.
    pub(crate) fn section(self, task: usize, n: usize) -> SectionPlan {
        let seed = (task as u64) << 32 | n as u64;
        // A fixed scramble (splitmix64's finaliser): neighbouring sections draw apart.
        let mut h = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^= h >> 31;
        let (tag, accounts) = match self {
            Family::Semaphore { .. } => (0, None),
            Family::ReadWrite { readers_in_10 } => {
                (u32::from(h % 10 < u64::from(readers_in_10)), None)
            }
            Family::Transfers { accounts } => {
                let count = u64::from(accounts.clamp(2, 32));
                let from = h % count;
                let to = (from + 1 + (h / count) % (count - 1)) % count;
                // Both below `count`, at most 32.
                let index = |account: u64| u32::try_from(account).expect("an account below 32");
                let (from, to) = (index(from), index(to));
                ((1 << from) | (1 << to), Some((from, to)))
            }
        };
        SectionPlan {
            tag,
            accounts,
            family: self,
        }
    }

    /// The lock name of account `index` of the run whose name is `name`.
    pub(crate) fn account(name: &str, index: u32) -> String {
        format!("{name}:account:{index}")
    }
}

/// The workloads, by the name that selects each.
pub(crate) const WORKLOADS: [&str; 3] = ["semaphore", "rwlock", "transfers"];

pub(crate) const SEMAPHORE: &str = "distlock semaphore, 4 permits";
pub(crate) const READERS_90: &str = "distlock rw, 90 % readers";
pub(crate) const ALL_WRITERS: &str = "distlock rw, all writers";
pub(crate) const TRANSFERS: &str = "distlock acquire_all, 8 accounts";
const FLOOR_LOCK: Lock = Lock::Ring {
    pass: ring::Pass::ScriptThenJoin,
    raw: false,
};

/// The contenders of `workload`: name, lock, and the rule its sections must keep.
fn contenders(workload: &str) -> Vec<(&'static str, Lock, Rule)> {
    let mutex = (DISTLOCK, Lock::Distlock, Rule::AtMost(1));
    let floor = (RING_SCRIPT_JOIN, FLOOR_LOCK, Rule::AtMost(1));
    // The family lock's sections taken by hand (see `Family::by_hand`), under the rule of what
    // it takes: a read-write lock written by hand is a mutex, which is stricter than "a writer
    // is alone".
    let poll = |family, rule| {
        (
            POLL_5,
            Lock::FamilyPoll {
                family,
                interval_ms: 5,
            },
            rule,
        )
    };
    match workload {
        "semaphore" => {
            let semaphore = Family::Semaphore { permits: 4 };
            vec![
                (SEMAPHORE, Lock::Family(semaphore), Rule::AtMost(4)),
                mutex,
                floor,
                poll(semaphore, Rule::AtMost(4)),
            ]
        }
        "rwlock" => {
            let readers_90 = Family::ReadWrite { readers_in_10: 9 };
            vec![
                (READERS_90, Lock::Family(readers_90), Rule::ReadWrite),
                (
                    ALL_WRITERS,
                    Lock::Family(Family::ReadWrite { readers_in_10: 0 }),
                    Rule::ReadWrite,
                ),
                mutex,
                floor,
                poll(readers_90, Rule::AtMost(1)),
            ]
        }
        "transfers" => {
            let transfers = Family::Transfers { accounts: 8 };
            vec![
                (TRANSFERS, Lock::Family(transfers), Rule::Accounts),
                mutex,
                floor,
                poll(transfers, Rule::Accounts),
            ]
        }
        other => panic!("no lock-family workload named {other:?}"),
    }
}

/// Counts of the family workloads.
#[derive(Debug, Clone)]
pub(crate) struct FamilyConfig {
    pub shapes: Vec<Shape>,
    pub sections: usize,
    pub rounds: usize,
}

impl FamilyConfig {
    /// `DISTLOCK_BENCH_FAMILY_SHAPES` (`16x1`), `DISTLOCK_BENCH_FAMILY_SECTIONS` (25),
    /// `DISTLOCK_BENCH_FAMILY_ROUNDS` (3, or 1 when `quick`).
    pub(crate) fn from_env(quick: bool) -> Self {
        let var = |name: &str| std::env::var(name).ok();
        let number = |name: &str, default: usize| {
            var(name).map_or(default, |text| {
                text.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={text:?} is not a number"))
            })
        };
        FamilyConfig {
            shapes: var("DISTLOCK_BENCH_FAMILY_SHAPES")
                .unwrap_or_else(|| "16x1".to_owned())
                .split(',')
                .map(|shape| shape.parse().unwrap_or_else(|error| panic!("{error}")))
                .collect(),
            sections: number("DISTLOCK_BENCH_FAMILY_SECTIONS", 25),
            rounds: number("DISTLOCK_BENCH_FAMILY_ROUNDS", if quick { 1 } else { 3 }),
        }
    }
}

/// Everything the family workloads measured: printed by [`FamilyReport::render`], and the
/// `family` member of the bench's JSON.
#[derive(Debug, Serialize)]
pub(crate) struct FamilyReport {
    pub sections_per_task: usize,
    pub rounds: usize,
    /// `/proc/loadavg` before and after the workloads: the machine is shared.
    pub load_before: String,
    pub load_after: String,
    pub workloads: Vec<WorkloadReport>,
    /// Sections let in against their lock's rule, over every run.
    pub overlaps: usize,
}

/// One workload in one shape.
#[derive(Debug, Serialize)]
pub(crate) struct WorkloadReport {
    pub workload: &'static str,
    pub configuration: String,
    pub results: Vec<(&'static str, Summary)>,
    pub ratios: Vec<Ratio>,
}

/// A ratio of two contenders' figures of one run, with its target when the issue sets one.
#[derive(Debug, Serialize)]
pub(crate) struct Ratio {
    pub name: String,
    pub value: f64,
    /// `">="`, `"<="` or `"info"`.
    pub op: &'static str,
    pub limit: Option<f64>,
    pub result: &'static str,
}

/// Runs `workloads` (names of [`WORKLOADS`]) against the Redis at `url`.
pub(crate) fn run(
    url: &str,
    fleet: &FleetConfig,
    config: &FamilyConfig,
    workloads: &[&'static str],
) -> FamilyReport {
    let client = redis::Client::open(url).expect("bad Redis URL");
    let mut info = client
        .get_connection()
        .expect("family: cannot connect to Redis");
    let load_before = crate::report::load_average();
    let mut reports = Vec::new();
    let mut overlaps = 0;
    let pid = std::process::id();
    for &workload in workloads {
        let contenders = contenders(workload);
        // Not counted: loads every script the contenders use (see the fleet's warm-up).
        let warm_up = Shape {
            processes: 2,
            tasks: 1,
        };
        for (index, (_, lock, _)) in contenders.iter().enumerate() {
            let name = format!("bench:family:{pid}:{workload}:warm-up:{index}");
            run_sections(url, &mut info, (warm_up, *lock, true), &name, 5, fleet);
        }
        for &shape in &config.shapes {
            let started = std::time::Instant::now();
            let mut rounds: Vec<Vec<RunFigures>> = contenders.iter().map(|_| Vec::new()).collect();
            for round in 0..config.rounds {
                for step in 0..contenders.len() {
                    let index = (round + step) % contenders.len();
                    let (contender, lock, rule) = contenders[index];
                    let name = format!("bench:family:{pid}:{workload}:{shape}:{index}:{round}");
                    let (sections, commands) = run_sections(
                        url,
                        &mut info,
                        (shape, lock, true),
                        &name,
                        config.sections,
                        fleet,
                    );
                    let figures = figures::analyse(&sections, commands, rule);
                    if figures.overlaps > 0 {
                        eprintln!(
                            "family {workload} {shape} {contender}: {} sections OVERLAP",
                            figures.overlaps
                        );
                    }
                    rounds[index].push(figures);
                }
            }
            eprintln!(
                "family {workload} {shape} done in {:.1} s (load {})",
                started.elapsed().as_secs_f64(),
                crate::report::load_average()
            );
            let results: Vec<(&'static str, Summary)> = contenders
                .iter()
                .zip(&rounds)
                .map(|((name, _, _), rounds)| (*name, Summary::over(rounds)))
                .collect();
            overlaps += results.iter().map(|(_, s)| s.overlaps).sum::<usize>();
            reports.push(WorkloadReport {
                workload,
                configuration: shape.to_string(),
                ratios: ratios(workload, &results),
                results,
            });
        }
        if let Some(growth) = growth(workload, &reports) {
            if let Some(last) = reports.last_mut() {
                last.ratios.push(growth);
            }
        }
    }
    FamilyReport {
        sections_per_task: config.sections,
        rounds: config.rounds,
        load_before,
        load_after: crate::report::load_average(),
        workloads: reports,
        overlaps,
    }
}

/// Whether the family lock's commands per section grow with the number of waiters: its figure
/// at the largest shape of `workload` over its figure at the smallest, when more than one ran.
/// "Not growing" is judged as at most 1.2 (one run against another on a noisy machine).
fn growth(workload: &str, reports: &[WorkloadReport]) -> Option<Ratio> {
    let lock = family_lock(workload);
    let of_workload: Vec<(&WorkloadReport, &Summary)> = reports
        .iter()
        .filter(|report| report.workload == workload)
        .filter_map(|report| {
            let summary = report.results.iter().find(|(name, _)| *name == lock)?;
            Some((report, &summary.1))
        })
        .collect();
    let ([(small, small_figures), ..], [.., (large, large_figures)]) =
        (of_workload.as_slice(), of_workload.as_slice())
    else {
        return None;
    };
    if of_workload.len() < 2 {
        return None;
    }
    let value = large_figures.commands_per_section / small_figures.commands_per_section;
    Some(Ratio {
        name: format!(
            "commands per section, {} / {} (more waiters)",
            large.configuration, small.configuration
        ),
        value,
        op: "<=",
        limit: Some(1.2),
        result: if value <= 1.2 { "PASS" } else { "MISS" },
    })
}

/// The contender of `workload` that is the family's lock.
fn family_lock(workload: &str) -> &'static str {
    match workload {
        "semaphore" => SEMAPHORE,
        "rwlock" => READERS_90,
        _ => TRANSFERS,
    }
}

/// The ratios of `workload` between its contenders, each judged on its target (the issue's).
fn ratios(workload: &str, results: &[(&'static str, Summary)]) -> Vec<Ratio> {
    let of = |name: &str| results.iter().find(|(n, _)| *n == name).map(|(_, s)| s);
    let (Some(mutex), Some(floor)) = (of(DISTLOCK), of(RING_SCRIPT_JOIN)) else {
        return Vec::new();
    };
    let ratio = |name: String, value: f64, op: &'static str, limit: Option<f64>| {
        let result = match limit {
            None => "INFO",
            Some(limit) if (op == ">=" && value >= limit) || (op == "<=" && value <= limit) => {
                "PASS"
            }
            Some(_) => "MISS",
        };
        Ratio {
            name,
            value,
            op: if limit.is_some() { op } else { "info" },
            limit,
            result,
        }
    };
    let mut out = Vec::new();
    let lock = family_lock(workload);
    let Some(family) = of(lock) else {
        return out;
    };
    if workload == "semaphore" {
        out.push(ratio(
            "permit gap p50 / mutex's hand-off gap p50".to_owned(),
            family.gap_p50_ms / mutex.gap_p50_ms,
            "<=",
            Some(1.3),
        ));
        out.push(ratio(
            "all 4 permits in use, share of the time someone waits".to_owned(),
            family.busy_all,
            ">=",
            Some(0.9),
        ));
        out.push(ratio(
            "busy permits (mean in use / 4) / mutex's busy fraction".to_owned(),
            family.busy_mean / mutex.busy_mean,
            ">=",
            Some(0.9),
        ));
        out.push(ratio(
            "permit gap p50 / floor's gap p50".to_owned(),
            family.gap_p50_ms / floor.gap_p50_ms,
            "info",
            None,
        ));
    }
    if workload == "rwlock" {
        if let Some(writers) = of(ALL_WRITERS) {
            out.push(ratio(
                "throughput, 90 % readers / all writers".to_owned(),
                family.throughput_per_s / writers.throughput_per_s,
                ">=",
                Some(3.0),
            ));
            out.push(ratio(
                "commands per section, all writers / mutex's".to_owned(),
                writers.commands_per_section / mutex.commands_per_section,
                "info",
                None,
            ));
        }
    }
    out.push(ratio(
        format!("commands per section, {lock} / mutex's"),
        family.commands_per_section / mutex.commands_per_section,
        "info",
        None,
    ));
    out.push(ratio(
        format!("commands per section, {lock} / floor's"),
        family.commands_per_section / floor.commands_per_section,
        "info",
        None,
    ));
    out.push(ratio(
        format!("throughput, {lock} / mutex's"),
        family.throughput_per_s / mutex.throughput_per_s,
        "info",
        None,
    ));
    if let Some(poll) = of(POLL_5) {
        out.extend(
            poll_baseline_ratios(workload, family, poll)
                .into_iter()
                .map(|(name, value)| {
                    ratio(
                        format!("{name}, {lock} / poll baseline's"),
                        value,
                        "info",
                        None,
                    )
                }),
        );
    }
    out
}

/// The family lock's figures over the poll baseline's (`SET NX PX + 5 ms poll`, what a user
/// writes without distlock), for information: the issue sets no target on them.
fn poll_baseline_ratios(
    workload: &str,
    family: &Summary,
    poll: &Summary,
) -> Vec<(&'static str, f64)> {
    let mut ratios = vec![
        (
            "throughput",
            family.throughput_per_s / poll.throughput_per_s,
        ),
        (
            "longest wait",
            family.longest_wait_ms / poll.longest_wait_ms,
        ),
        (
            "commands per section",
            family.commands_per_section / poll.commands_per_section,
        ),
    ];
    if workload == "semaphore" {
        ratios.push(("permit gap p50", family.gap_p50_ms / poll.gap_p50_ms));
    }
    ratios
}
