//! The report: rows of figures, the targets, the machine they came from, as text and JSON.

use crate::statistics::{CycleRound, PickCycle, Summary};
use crate::FLOOR;

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
