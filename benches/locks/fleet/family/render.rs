//! The family workloads' tables, as text.

use std::fmt::Write as _;

use super::FamilyReport;
use crate::fleet::render::figure;
use crate::fleet::POLL_5;

impl FamilyReport {
    /// One table per workload and shape, its ratios under it, and the load of the machine.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nlock family across processes: {} sections of 1 ms per task, {} round(s); medians \
             over rounds, longest wait of the worst round, gaps pooled over rounds; load average \
             {} before, {} after (a shared machine: figures are noisy)",
            self.sections_per_task, self.rounds, self.load_before, self.load_after
        );
        for workload in &self.workloads {
            let _ = writeln!(
                out,
                "\n{} {}  {:>9} {:>9} {:>8} {:>8} {:>6} {:>6} {:>8} {:>8}",
                workload.workload,
                workload.configuration,
                "sections/s",
                "max wait",
                "gap p50",
                "gap p99",
                "all n",
                "busy",
                "cmds/sec",
                "overlaps"
            );
            let _ = writeln!(out, "{}", "-".repeat(100));
            for (contender, s) in &workload.results {
                let _ = writeln!(
                    out,
                    "  {:<34} {:>9} {:>9} {:>8} {:>8} {:>6} {:>6} {:>8} {:>8}",
                    contender,
                    figure(s.throughput_per_s, 0),
                    figure(s.longest_wait_ms, 1),
                    figure(s.gap_p50_ms, 3),
                    figure(s.gap_p99_ms, 3),
                    figure(s.busy_all, 2),
                    figure(s.busy_mean, 2),
                    figure(s.commands_per_section, 2),
                    s.overlaps
                );
            }
            for (contender, s) in &workload.results {
                let by_name: Vec<String> = s
                    .commands_per_section_by_name
                    .iter()
                    .map(|(name, calls)| format!("{name} {calls:.2}"))
                    .collect();
                let _ = writeln!(out, "  {contender:<34} {}", by_name.join(", "));
            }
            for ratio in &workload.ratios {
                let limit = ratio
                    .limit
                    .map_or_else(|| "-".to_owned(), |limit| format!("{} {limit}", ratio.op));
                let _ = writeln!(
                    out,
                    "  {:<72} {:>8} {:>8}  {}",
                    ratio.name,
                    figure(ratio.value, 3),
                    limit,
                    ratio.result
                );
            }
        }
        let _ = writeln!(
            out,
            "family: gap = a release made while someone waited -> the next entry (releases and \
             entries paired in time order); all n = of the time someone waited, the share with \
             every permit (the one lock) in use; busy = of that time, the mean share of the \
             permits in use; cmds/sec = Redis commands per section (INFO \
             commandstats, scripts' own calls included); {POLL_5} = the family lock by hand: \
             one of 4 slot keys, one key for readers and writers alike (no shared mode: the \
             read-write lock of a user without one), or both account keys in order, giving the \
             first back when the second is refused; sections let in against their lock's rule \
             {} (must be 0)",
            self.overlaps
        );
        out
    }
}
