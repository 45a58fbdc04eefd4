//! The fleet workload's tables, as text: figures, commands by name, targets.

use std::fmt::Write as _;

use super::FleetReport;
use crate::DISTLOCK;

/// `value` with `decimals` decimals, or `-` when there is no figure.
pub(crate) fn figure(value: f64, decimals: usize) -> String {
    if value.is_finite() {
        format!("{value:.decimals$}")
    } else {
        "-".to_owned()
    }
}

impl FleetReport {
    /// The fleet tables: figures, commands by name, targets.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nfleet: P processes x T tasks on one key, {} sections of {} ms per task, {} round(s); \
             medians over rounds, longest wait of the worst round, gap percentiles over all \
             rounds' cross-process hand-offs",
            self.sections_per_task,
            self.critical_section_us as f64 / 1e3,
            self.rounds
        );
        let _ = writeln!(
            out,
            "{:<6} {:<24} {:>8} {:>8} {:>10} {:>9} {:>9} {:>9} {:>6} {:>8}",
            "PxT",
            "contender",
            "chg task",
            "chg proc",
            "max wait",
            "gap p50",
            "gap p99",
            "cmds/",
            "busy",
            "overlaps"
        );
        let _ = writeln!(
            out,
            "{:<6} {:<24} {:>8} {:>8} {:>10} {:>9} {:>9} {:>9} {:>6} {:>8}",
            "", "", "%", "%", "ms", "ms", "ms", "section", "", ""
        );
        let _ = writeln!(out, "{}", "-".repeat(106));
        for result in &self.results {
            let s = &result.summary;
            let _ = writeln!(
                out,
                "{:<6} {:<24} {:>8} {:>8} {:>10} {:>9} {:>9} {:>9} {:>6} {:>8}",
                result.configuration,
                result.contender,
                figure(s.holder_changes_pct, 1),
                figure(s.process_changes_pct, 1),
                figure(s.longest_wait_ms, 1),
                figure(s.gap_p50_ms, 3),
                figure(s.gap_p99_ms, 3),
                figure(s.commands_per_section, 2),
                figure(s.busy_fraction, 2),
                s.overlaps
            );
        }
        let _ = writeln!(out, "\nfleet: Redis commands per section, by command");
        for result in &self.results {
            let by_name: Vec<String> = result
                .summary
                .commands_per_section_by_name
                .iter()
                .map(|(name, calls)| format!("{name} {calls:.2}"))
                .collect();
            let _ = writeln!(
                out,
                "{:<6} {:<24} {} ({} cross-process hand-offs)",
                result.configuration,
                result.contender,
                by_name.join(", "),
                result.summary.cross_process_handoffs
            );
        }
        let others: Vec<&'static str> = self
            .results
            .iter()
            .map(|result| result.contender)
            .filter(|contender| *contender != DISTLOCK)
            .fold(Vec::new(), |mut names, name| {
                if !names.contains(&name) {
                    names.push(name);
                }
                names
            });
        let mut header = format!(
            "\n{:<48} {:>8} {:>9}  {:<6}",
            "fleet target (distlock)", "value", "limit", "result"
        );
        for other in &others {
            let _ = write!(header, " {other:>24}");
        }
        let _ = writeln!(out, "{header}");
        let _ = writeln!(out, "{}", "-".repeat(76 + 25 * others.len()));
        for target in &self.targets {
            let name = if target.unit.is_empty() {
                format!("{}: {}", target.configuration, target.name)
            } else {
                format!(
                    "{}: {} ({})",
                    target.configuration, target.name, target.unit
                )
            };
            let limit = match target.limit {
                Some(limit) => format!("{} {limit}", target.op),
                None => "-".to_owned(),
            };
            let mut line = format!(
                "{name:<48} {:>8} {limit:>9}  {:<6}",
                target
                    .value
                    .map_or_else(|| "-".to_owned(), |v| figure(v, 3)),
                target.result
            );
            for other in &others {
                let value = target
                    .others
                    .get(other)
                    .map_or_else(|| "-".to_owned(), |v| figure(*v, 3));
                let _ = write!(line, " {value:>24}");
            }
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(
            out,
            "fleet: each worker is this binary run again, with its own tokio runtime and client; \
             all start together at one CLOCK_MONOTONIC time; hand-off gap = next acquired - \
             previous release_start (different processes); busy = held / (last release_start - \
             first acquired); commands from INFO commandstats over the run, the bench's own INFO \
             excluded (commands a script runs count too: an EVALSHA whose script calls GET and DEL \
             is 3); tasks' first acquire calls within {} ms of each other; overlapping sections {} \
             (must be 0)",
            figure(
                self.results
                    .iter()
                    .map(|result| result.summary.start_spread_ms)
                    .fold(f64::NAN, f64::max),
                1
            ),
            self.overlaps
        );
        out
    }
}
