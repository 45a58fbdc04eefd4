//! What one fleet run measured, computed from the sections every worker process recorded, and
//! the same figures over the rounds of one configuration.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::statistics::percentile;

/// One critical section, as its holder saw it. Times are [`super::monotonic_ns`] readings,
/// comparable between the processes of one machine.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(super) struct Section {
    /// The worker process, `0..P`.
    pub process: usize,
    /// The task, fleet-wide: `process * T + task`, so that two processes never share a number.
    pub task: usize,
    /// The acquire call started.
    pub called: u64,
    /// The acquire call returned: the holder has the lock in hand.
    pub acquired: u64,
    /// Just before the release call: the holder is done with the lock.
    pub release_start: u64,
    /// The release call returned.
    pub released: u64,
    /// What a section of the lock family took (see `family::Section::tag`); 0 for a mutex.
    #[serde(default)]
    pub tag: u32,
}

/// The figures of one run (one configuration, one contender, one round).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RoundFigures {
    pub sections: usize,
    /// Consecutive sections (in the order of acquisition) held by different tasks, in % of the
    /// `sections - 1` pairs.
    pub holder_changes_pct: f64,
    /// Consecutive sections held by different processes, in % of the pairs.
    pub process_changes_pct: f64,
    /// The longest acquire call (started → returned).
    pub longest_wait_ms: f64,
    /// How many consecutive pairs changed process: the samples of the gap percentiles.
    pub cross_process_handoffs: usize,
    /// `next.acquired - previous.release_start` over the pairs that changed process.
    pub gap_p50_ms: f64,
    pub gap_p99_ms: f64,
    /// Redis commands of the run (`INFO commandstats` delta) per section.
    pub commands_per_section: f64,
    /// The same delta, by command (`evalsha`, `set`, `publish`, ...).
    pub commands: BTreeMap<String, u64>,
    /// `held_ms / span_ms`.
    pub busy_fraction: f64,
    /// Sum over the sections of `release_start - acquired`.
    pub held_ms: f64,
    /// Last `release_start` − first `acquired`: held time plus every gap between holders.
    pub span_ms: f64,
    /// Between the first and the last task's first acquire call: how well the start barrier
    /// lined the workers up.
    pub start_spread_ms: f64,
    /// Sections acquired before the one before them was done with the lock: must be 0.
    pub overlaps: usize,
    /// What the first overlaps were, for the report.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overlap_details: Vec<String>,
    /// The cross-process gaps themselves (ms), pooled over the rounds by [`Aggregate`].
    #[serde(skip)]
    pub gaps_ms: Vec<f64>,
}

/// How many overlaps a round describes in words (the count covers them all).
const OVERLAP_DETAILS: usize = 5;

fn ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}

/// The figures of one run from every section of every worker and the run's command counts.
pub(super) fn analyse(mut sections: Vec<Section>, commands: BTreeMap<String, u64>) -> RoundFigures {
    sections.sort_by_key(|section| section.acquired);
    let pairs = sections.len().saturating_sub(1).max(1) as f64;
    let first = sections.first().map_or(0, |section| section.acquired);

    let mut holder_changes = 0;
    let mut process_changes = 0;
    let mut gaps_ms = Vec::new();
    for pair in sections.windows(2) {
        let (previous, next) = (pair[0], pair[1]);
        if next.task != previous.task {
            holder_changes += 1;
        }
        if next.process != previous.process {
            process_changes += 1;
            gaps_ms.push(ms(next.acquired.saturating_sub(previous.release_start)));
        }
    }
    gaps_ms.sort_by(f64::total_cmp);

    // A section must start after every earlier one is done with the lock, not only the one just
    // before it: the latest `release_start` so far is the bound.
    let mut overlaps = 0;
    let mut overlap_details = Vec::new();
    let mut busy_until: Option<Section> = None;
    for section in &sections {
        if let Some(holder) = busy_until {
            if section.acquired < holder.release_start {
                overlaps += 1;
                if overlap_details.len() < OVERLAP_DETAILS {
                    overlap_details.push(format!(
                        "task {} (process {}) acquired at +{:.3} ms while task {} (process {}) \
                         held the lock from +{:.3} to +{:.3} ms",
                        section.task,
                        section.process,
                        ms(section.acquired - first),
                        holder.task,
                        holder.process,
                        ms(holder.acquired - first),
                        ms(holder.release_start - first),
                    ));
                }
            }
        }
        if busy_until.is_none_or(|holder| section.release_start > holder.release_start) {
            busy_until = Some(*section);
        }
    }

    let longest_wait = sections
        .iter()
        .map(|section| section.acquired.saturating_sub(section.called))
        .max()
        .unwrap_or_default();
    let held: u64 = sections
        .iter()
        .map(|section| section.release_start.saturating_sub(section.acquired))
        .sum();
    let span = busy_until.map_or(0, |last| last.release_start.saturating_sub(first));
    let total_commands: u64 = commands.values().sum();
    let mut first_calls: BTreeMap<usize, u64> = BTreeMap::new();
    for section in &sections {
        let first_call = first_calls.entry(section.task).or_insert(section.called);
        *first_call = (*first_call).min(section.called);
    }
    let start_spread =
        first_calls.values().max().unwrap_or(&0) - first_calls.values().min().unwrap_or(&0);
    RoundFigures {
        sections: sections.len(),
        holder_changes_pct: 100.0 * f64::from(holder_changes) / pairs,
        process_changes_pct: 100.0 * f64::from(process_changes) / pairs,
        longest_wait_ms: ms(longest_wait),
        cross_process_handoffs: gaps_ms.len(),
        gap_p50_ms: percentile(&gaps_ms, 50.0),
        gap_p99_ms: percentile(&gaps_ms, 99.0),
        commands_per_section: total_commands as f64 / sections.len().max(1) as f64,
        commands,
        busy_fraction: if span == 0 {
            f64::NAN
        } else {
            held as f64 / span as f64
        },
        held_ms: ms(held),
        span_ms: ms(span),
        start_spread_ms: ms(start_spread),
        overlaps,
        overlap_details,
        gaps_ms,
    }
}

/// One configuration's contender over all its rounds: what the report prints and the targets
/// judge.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Aggregate {
    /// Medians over the rounds.
    pub holder_changes_pct: f64,
    pub process_changes_pct: f64,
    pub commands_per_section: f64,
    pub busy_fraction: f64,
    /// The worst round's: a wait is a promise about every acquisition, not a typical one.
    pub longest_wait_ms: f64,
    /// Over the hand-offs of all rounds pooled: a round of a contender that rarely changes
    /// process has only a handful of them, too few for a p99 of its own.
    pub gap_p50_ms: f64,
    pub gap_p99_ms: f64,
    pub cross_process_handoffs: usize,
    /// Redis commands by name per section, over all rounds.
    pub commands_per_section_by_name: BTreeMap<String, f64>,
    /// The worst round's.
    pub start_spread_ms: f64,
    /// Summed over the rounds.
    pub overlaps: usize,
}

impl Aggregate {
    pub(crate) fn over(rounds: &[RoundFigures]) -> Self {
        let median = |pick: fn(&RoundFigures) -> f64| median_of(rounds.iter().map(pick));
        let gaps = sorted(
            rounds
                .iter()
                .flat_map(|round| round.gaps_ms.iter().copied()),
        );
        let by_name = per_section_by_name(
            rounds.iter().map(|round| &round.commands),
            rounds.iter().map(|round| round.sections).sum(),
        );
        Aggregate {
            holder_changes_pct: median(|round| round.holder_changes_pct),
            process_changes_pct: median(|round| round.process_changes_pct),
            commands_per_section: median(|round| round.commands_per_section),
            busy_fraction: median(|round| round.busy_fraction),
            longest_wait_ms: rounds
                .iter()
                .map(|round| round.longest_wait_ms)
                .fold(f64::NAN, f64::max),
            gap_p50_ms: percentile(&gaps, 50.0),
            gap_p99_ms: percentile(&gaps, 99.0),
            cross_process_handoffs: gaps.len(),
            commands_per_section_by_name: by_name,
            start_spread_ms: rounds
                .iter()
                .map(|round| round.start_spread_ms)
                .fold(f64::NAN, f64::max),
            overlaps: rounds.iter().map(|round| round.overlaps).sum(),
        }
    }
}

/// `values`, smallest first.
pub(crate) fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values
}

/// The median of `values` (one figure per round).
pub(crate) fn median_of(values: impl Iterator<Item = f64>) -> f64 {
    percentile(&sorted(values), 50.0)
}

/// Redis commands by name, summed over the rounds' counts, per section of `sections` in all.
pub(crate) fn per_section_by_name<'a>(
    counts: impl Iterator<Item = &'a BTreeMap<String, u64>>,
    sections: usize,
) -> BTreeMap<String, f64> {
    let mut by_name = BTreeMap::new();
    for count in counts {
        for (name, calls) in count {
            *by_name.entry(name.clone()).or_insert(0.0) += *calls as f64;
        }
    }
    for calls in by_name.values_mut() {
        *calls /= sections.max(1) as f64;
    }
    by_name
}
