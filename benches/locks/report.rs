//! The report: rows of figures, the targets, the machine they came from, as text and JSON.

use std::fmt::Write as _;
use std::time::Duration;

use crate::fleet::FleetReport;
use crate::statistics::{CycleRound, PickCycle, Summary, CYCLE_BLOCK};
use crate::{
    Config, ATTRIBUTE, BACKENDS, CLUSTER, DISTLOCK, FLOOR, FLOOR_WORK, MANUAL, REDLOCK, RSLOCK,
    WORKERS,
};

/// What the workloads measured and checked; a workload that did not run leaves its part empty.
#[derive(Default)]
pub(crate) struct Results {
    pub(crate) rows: Vec<Row>,
    /// Sections of workload 2 that started before the previous one ended: a broken lock.
    pub(crate) overlaps: usize,
    /// Keys on the private server after workload 1: every lock released leaves none.
    pub(crate) keys_left: Option<i64>,
    /// Keys on workload 5's servers after it.
    pub(crate) keys_left_backends: Option<i64>,
    /// Idle spinners that ran during workloads 1 and 5 (the larger count).
    pub(crate) spinners_running: usize,
    pub(crate) fleet: Option<FleetReport>,
    pub(crate) family: Option<crate::fleet::family::FamilyReport>,
}

/// Rows of one cycle workload: its main figure, then the client's and Redis's CPU per cycle.
pub(crate) fn push_cycle_rows(
    rows: &mut Vec<Row>,
    (workload, metric, unit): (&'static str, &'static str, &'static str),
    names: &[&'static str],
    results: &[Vec<CycleRound>],
    rslock: &str,
) {
    let summaries = |pick: PickCycle| -> Vec<(&'static str, Summary)> {
        names
            .iter()
            .zip(results)
            .filter_map(|(name, rounds)| {
                let values: Option<Vec<f64>> = rounds.iter().map(pick).collect();
                values.map(|values| (*name, Summary::new(values)))
            })
            .collect()
    };
    let metrics: [(&'static str, &'static str, PickCycle); 3] = [
        (metric, unit, |round| Some(round.0)),
        ("client CPU/cycle", "us", |round| round.1),
        ("redis CPU/cycle", "us", |round| round.2),
    ];
    for (metric, unit, pick) in metrics {
        push_rows(
            rows,
            (workload, metric, unit),
            &summaries(pick),
            Some(FLOOR),
            Some(rslock),
        );
    }
}

/// One line of the report: one figure of one contender in one workload.
pub(crate) struct Row {
    pub(crate) workload: &'static str,
    pub(crate) contender: &'static str,
    pub(crate) metric: &'static str,
    pub(crate) unit: &'static str,
    pub(crate) summary: Summary,
    /// This median over the floor's (same workload and metric).
    pub(crate) vs_floor: Option<f64>,
    /// This median over rslock's (same workload and metric).
    pub(crate) vs_rslock: Option<f64>,
}

/// Adds the rows of one metric of one workload, with ratios to `floor` and `rslock` (contender
/// names) when they ran.
pub(crate) fn push_rows(
    rows: &mut Vec<Row>,
    (workload, metric, unit): (&'static str, &'static str, &'static str),
    figures: &[(&'static str, Summary)],
    floor: Option<&str>,
    rslock: Option<&str>,
) {
    let base = |name: Option<&str>| {
        name.and_then(|name| figures.iter().find(|(contender, _)| *contender == name))
    };
    let (floor, rslock) = (base(floor), base(rslock));
    for (contender, summary) in figures {
        let ratio = |base: Option<&(&str, Summary)>| {
            base.filter(|(name, _)| name != contender)
                .map(|(_, base)| summary.ratio_to(base))
        };
        rows.push(Row {
            workload,
            contender,
            metric,
            unit,
            summary: summary.clone(),
            vs_floor: ratio(floor),
            vs_rslock: ratio(rslock),
        });
    }
}

pub(crate) fn summary<'a>(
    rows: &'a [Row],
    workload: &str,
    contender: &str,
    metric: &str,
) -> Option<&'a Summary> {
    rows.iter()
        .find(|row| row.workload == workload && row.contender == contender && row.metric == metric)
        .map(|row| &row.summary)
}

/// The `op` of a figure shown next to the targets for information, with no limit.
pub(crate) const INFO: &str = "info";

/// A target of the issue; `value` is `None` when its contender could not run.
pub(crate) struct Target {
    pub(crate) name: &'static str,
    pub(crate) value: Option<f64>,
    pub(crate) op: &'static str,
    pub(crate) limit: f64,
}

impl Target {
    pub(crate) fn verdict(&self) -> &'static str {
        match self.value {
            None => "SKIP",
            Some(_) if self.op == INFO => "INFO",
            Some(value)
                if (self.op == "<=" && value <= self.limit)
                    || (self.op == ">=" && value >= self.limit) =>
            {
                "PASS"
            }
            Some(_) => "MISS",
        }
    }
}

/// A figure for the JSON report: rounded to 3 decimals, which is finer than any run repeats;
/// `null` when it could not be computed (an empty or undefined statistic).
pub(crate) fn number(value: f64) -> Option<f64> {
    value.is_finite().then(|| (value * 1000.0).round() / 1000.0)
}

pub(crate) fn format_value(value: f64) -> String {
    if !value.is_finite() {
        "-".to_owned()
    } else if value.abs() >= 1000.0 {
        format!("{value:.0}")
    } else if value.abs() >= 100.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

pub(crate) fn format_ratio(ratio: Option<f64>) -> String {
    ratio.map_or_else(String::new, |ratio| format!("{ratio:.2}x"))
}

/// The machine and software the figures came from.
pub(crate) struct Machine {
    pub(crate) nproc: usize,
    pub(crate) cpu: String,
    pub(crate) os: String,
    pub(crate) redis_version: String,
    pub(crate) rustc: String,
    pub(crate) load_before: String,
    pub(crate) load_after: String,
}

impl Machine {
    pub(crate) fn describe(redis_version: String, load_before: String) -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("model name"))
                    .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
        Machine {
            nproc: std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
            cpu,
            os: command_output("uname", &["-srm"])
                .unwrap_or_else(|| std::env::consts::OS.to_owned()),
            redis_version,
            rustc: command_output(&rustc, &["--version"]).unwrap_or_else(|| "unknown".to_owned()),
            load_before,
            load_after: load_average(),
        }
    }
}

pub(crate) fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let output = std::process::Command::new(program)
        .args(args)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "unknown".to_owned(),
        |text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        },
    )
}

/// The targets, each judged on the median over the rounds (the longest wait on the worst round).
pub(crate) fn targets(rows: &[Row], config: &Config) -> [Target; 12] {
    let ratio = |a: Option<&Summary>, b: Option<&Summary>| a.zip(b).map(|(a, b)| a.ratio_to(b));
    let cycle = |contender| summary(rows, "1 cycle", contender, "time per cycle");
    let parallel = |contender| summary(rows, "3 parallel", contender, "cycles/s");
    let contend = |metric| summary(rows, "2 contend", DISTLOCK, metric).map(Summary::median);
    let max_wait_ms = 3.0 * config.contend_tasks as f64 * config.critical.as_secs_f64() * 1e3;
    let vs_standalone =
        |contender| summary(rows, BACKENDS, contender, "vs standalone").map(Summary::median);
    [
        Target {
            name: "1 cycle: distlock manual / floor",
            value: ratio(cycle(MANUAL), cycle(FLOOR)),
            op: "<=",
            limit: 1.05,
        },
        Target {
            name: "4 attribute overhead: attribute / manual",
            value: ratio(cycle(ATTRIBUTE), cycle(MANUAL)),
            op: "<=",
            limit: 1.03,
        },
        Target {
            // At least as fast as rslock, which sends the floor's own commands for a cycle.
            name: "1 cycle: rslock / distlock manual",
            value: ratio(cycle(RSLOCK), cycle(MANUAL)),
            op: ">=",
            limit: 1.0,
        },
        Target {
            // What distlock's structure costs: the floor does its per-cycle work without it.
            name: "1 cycle: manual / floor with work (info)",
            value: ratio(cycle(MANUAL), cycle(FLOOR_WORK)),
            op: INFO,
            limit: f64::NAN,
        },
        Target {
            // Whether a lock that keeps distlock's promises, with no structure, reaches rslock.
            name: "1 cycle: rslock / floor with work (info)",
            value: ratio(cycle(RSLOCK), cycle(FLOOR_WORK)),
            op: INFO,
            limit: f64::NAN,
        },
        Target {
            name: "2 contend: hand-off gap p50 (ms)",
            value: contend("hand-off gap p50").map(|us| us / 1e3),
            op: "<=",
            limit: 0.2,
        },
        Target {
            name: "2 contend: hand-off gap p99 (ms)",
            value: contend("hand-off gap p99").map(|us| us / 1e3),
            op: "<=",
            limit: 1.0,
        },
        Target {
            name: "2 contend: longest wait, worst round (ms)",
            value: summary(rows, "2 contend", DISTLOCK, "longest wait").map(Summary::max),
            op: "<=",
            limit: max_wait_ms,
        },
        Target {
            name: "2 contend: changed hands (%)",
            value: contend("changed hands"),
            op: ">=",
            limit: 90.0,
        },
        Target {
            name: "3 parallel: distlock / floor",
            value: ratio(parallel(DISTLOCK), parallel(FLOOR)),
            op: ">=",
            limit: 0.85,
        },
        Target {
            name: "5 backends: redlock / standalone",
            value: vs_standalone(REDLOCK),
            op: "<=",
            limit: 1.5,
        },
        Target {
            name: "5 backends: cluster / standalone (info)",
            value: vs_standalone(CLUSTER),
            op: INFO,
            limit: f64::NAN,
        },
    ]
}

/// The report as text: the table, the targets, the notes, the fleet's tables, the checks and the
/// machine.
pub(crate) fn render(
    config: &Config,
    results: &Results,
    targets: &[Target],
    machine: &Machine,
    total: Duration,
) -> String {
    let Results {
        rows,
        overlaps,
        keys_left,
        keys_left_backends,
        spinners_running,
        fleet,
        family,
    } = results;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{:<10} {:<32} {:<16} {:>10} {:>19} {:>7} {:>8}",
        "workload", "contender", "metric", "median", "min..max", "/floor", "/rslock"
    );
    let _ = writeln!(out, "{}", "-".repeat(108));
    for row in rows {
        let _ = writeln!(
            out,
            "{:<10} {:<32} {:<16} {:>7} {:<2} {:>19} {:>7} {:>8}",
            row.workload,
            row.contender,
            row.metric,
            format_value(row.summary.median()),
            row.unit,
            format!(
                "{}..{}",
                format_value(row.summary.min()),
                format_value(row.summary.max())
            ),
            format_ratio(row.vs_floor),
            format_ratio(row.vs_rslock),
        );
    }
    let _ = writeln!(
        out,
        "\n{:<44} {:>8} {:>9}  result",
        "target (distlock)", "value", "limit"
    );
    let _ = writeln!(out, "{}", "-".repeat(72));
    for target in targets {
        let (op, limit) = if target.op == INFO {
            ("", "-".to_owned())
        } else {
            (target.op, format!("{:.2}", target.limit))
        };
        let _ = writeln!(
            out,
            "{:<44} {:>8} {:>2} {:>6}  {}",
            target.name,
            target
                .value
                .map_or_else(|| "-".to_owned(), |value| format!("{value:.3}")),
            op,
            limit,
            target.verdict()
        );
    }
    let _ = writeln!(
        out,
        "note: rslock sends the floor's own two commands for an uncontended cycle, so it can only \
         be ~1.0 x distlock there (a cycle is two round trips for any lock whose release is \
         awaited); the two differ under contention (workload 2)"
    );
    let _ = writeln!(
        out,
        "note: the floor with distlock's work does, with raw redis-rs, the cheapest way and no \
         structure, what distlock's promises make it do on every cycle (a reconnecting \
         connection per runtime, a value naming the holder, the in-process line, the fork check, \
         cancel safety's bookkeeping, the release that reads the fleet's line): distlock / it is \
         what distlock's structure costs; rslock / it says whether any lock keeping those \
         promises could be as fast as rslock here"
    );
    let _ = writeln!(
        out,
        "\ncycle: {} cycles per round; contend: {} tasks x {} sections, {} ms critical section (spin \
         until acquired + 1 ms, yield_now between checks); parallel: {} tasks x {} cycles; {} rounds \
         after a warm-up, every contender once per round in rotated order (workload 1: in turns of \
         {CYCLE_BLOCK} cycles); median and min..max over rounds, ratios are medians of per-round \
         ratios; the longest-wait target is judged on the worst round",
        config.cycle_n,
        config.contend_tasks,
        config.contend_m,
        config.critical.as_secs_f64() * 1e3,
        config.parallel_tasks,
        config.parallel_k,
        config.rounds
    );
    let _ = writeln!(
        out,
        "backends: {} cycles per round per backend (manual API, one task); standalone = the private \
         server, cluster = 3 masters without replicas, redlock = 5 independent masters, all started \
         by the bench; redis CPU summed over every node; vs standalone = median of per-round ratios \
         of time per cycle",
        config.backends_n
    );
    let _ = writeln!(
        out,
        "runtimes: tokio current_thread for 1, 4 and 5, tokio multi_thread with {WORKERS} workers for 2 and 3; \
         idle spinners: {spinners_running} SCHED_IDLE threads keep the CPUs from halting during 1 and 5 \
         (DISTLOCK_BENCH_IDLE_SPIN=0 turns them off)"
    );
    let _ = writeln!(
        out,
        "hand-off gap: next holder's acquired-at - previous holder's release-start, for consecutive \
         sections of different holders"
    );
    if rows.is_empty() {
        // Only the fleet ran (`-- fleet`): an empty table, its skipped targets and notes on
        // workloads that did not run would only hide its own tables.
        out.clear();
    }
    if let Some(fleet) = fleet {
        out.push_str(&fleet.render());
    }
    if let Some(family) = family {
        out.push_str(&family.render());
    }
    let _ = writeln!(
        out,
        "checks: overlapping sections {overlaps} (must be 0); keys without expiry left after \
         cycle {}; after backends {}",
        keys_left.map_or_else(|| "not checked".to_owned(), |keys| keys.to_string()),
        keys_left_backends.map_or_else(|| "not checked".to_owned(), |keys| keys.to_string())
    );
    let _ = writeln!(
        out,
        "machine: {} cpus ({}), {}, redis {}, {}; load average {} before, {} after; total {:.1} s",
        machine.nproc,
        machine.cpu,
        machine.os,
        machine.redis_version,
        machine.rustc,
        machine.load_before,
        machine.load_after,
        total.as_secs_f64()
    );
    out
}

/// The report as JSON: the same figures as the text, with every round's, and the fleet's.
pub(crate) fn json(
    config: &Config,
    results: &Results,
    targets: &[Target],
    machine: &Machine,
    private_server: bool,
    total: Duration,
) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = results
        .rows
        .iter()
        .map(|row| {
            serde_json::json!({
                "workload": row.workload,
                "contender": row.contender,
                "metric": row.metric,
                "unit": row.unit,
                "median": number(row.summary.median()),
                "min": number(row.summary.min()),
                "max": number(row.summary.max()),
                "ratio_to_floor": row.vs_floor.map(number),
                "ratio_to_rslock": row.vs_rslock.map(number),
                "rounds": row.summary.by_round.iter().copied().map(number).collect::<Vec<_>>(),
            })
        })
        .collect();
    let targets: Vec<serde_json::Value> = targets
        .iter()
        .map(|target| {
            serde_json::json!({
                "name": target.name,
                "value": target.value.map(number),
                "op": target.op,
                "limit": number(target.limit),
                "result": target.verdict(),
            })
        })
        .collect();
    serde_json::json!({
        "command": "cargo bench --bench locks",
        "machine": {
            "nproc": machine.nproc,
            "cpu": machine.cpu,
            "os": machine.os,
            "redis_server": machine.redis_version,
            "rustc": machine.rustc,
            "load_average_before": machine.load_before,
            "load_average_after": machine.load_after,
        },
        "runtime": {
            "cycle": "tokio current_thread",
            "contend": format!("tokio multi_thread, {WORKERS} workers"),
            "parallel": format!("tokio multi_thread, {WORKERS} workers"),
            "backends": "tokio current_thread",
        },
        "config": {
            "rounds": config.rounds,
            "warm_up_rounds": 1,
            "cycle_n": config.cycle_n,
            "contend_tasks": config.contend_tasks,
            "contend_m": config.contend_m,
            "critical_section_us": u64::try_from(config.critical.as_micros()).unwrap_or(u64::MAX),
            "critical_section": "spin until acquired_at + 1 ms, yield_now between checks",
            "hand_off_gap": "next acquired_at - previous release_start, consecutive sections of different holders",
            "parallel_tasks": config.parallel_tasks,
            "parallel_k": config.parallel_k,
            "backends_n": config.backends_n,
            "backends": "standalone: the private server; cluster: 3 masters, no replicas; redlock: 5 independent masters",
            "redis": if private_server { "private redis-server on a free port" } else { "REDIS_URL" },
            "rslock": true,
            "idle_spinners_during_cycle_and_backends": results.spinners_running,
        },
        "results": rows,
        "targets": targets,
        "checks": {
            "overlapping_sections": results.overlaps,
            "keys_left_after_cycle": results.keys_left,
            "keys_left_after_backends": results.keys_left_backends,
        },
        "fleet": results.fleet,
        "family": results.family,
        "total_seconds": number(total.as_secs_f64()),
    })
}

/// Writes `json` to `distlock-bench.json` in the target directory (`$CARGO_TARGET_DIR`, or
/// `target/` of the package), saying where; a failure to write is reported, not fatal.
pub(crate) fn write_json(json: &serde_json::Value) {
    let json = serde_json::to_string_pretty(json).expect("the report is plain data");
    let target_dir = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
        std::path::PathBuf::from,
    );
    let path = target_dir.join("distlock-bench.json");
    match std::fs::create_dir_all(&target_dir).and_then(|()| std::fs::write(&path, json)) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(error) => eprintln!("could not write {}: {error}", path.display()),
    }
}
