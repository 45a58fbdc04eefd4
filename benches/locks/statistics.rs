//! Summaries over rounds, percentiles, the rotated rounds the workloads run in, and the
//! hand-off figures of a contended run.

use std::time::{Duration, Instant};

/// One figure over the rounds.
#[derive(Debug, Clone)]
pub(crate) struct Summary {
    /// In the order of the rounds.
    pub(crate) by_round: Vec<f64>,
    pub(crate) sorted: Vec<f64>,
}

impl Summary {
    pub(crate) fn new(by_round: Vec<f64>) -> Self {
        let mut sorted = by_round.clone();
        sorted.sort_by(f64::total_cmp);
        Summary { by_round, sorted }
    }
    /// The median over the rounds of `self / base`, round by round: contenders of one round
    /// run within a second or two of each other, so a paired ratio cancels most of the drift
    /// of a shared machine that a ratio of medians would keep.
    pub(crate) fn ratio_to(&self, base: &Summary) -> f64 {
        let mut ratios: Vec<f64> = self
            .by_round
            .iter()
            .zip(&base.by_round)
            .map(|(value, base)| value / base)
            .collect();
        ratios.sort_by(f64::total_cmp);
        percentile(&ratios, 50.0)
    }
    pub(crate) fn median(&self) -> f64 {
        percentile(&self.sorted, 50.0)
    }
    pub(crate) fn min(&self) -> f64 {
        self.sorted.first().copied().unwrap_or(f64::NAN)
    }
    pub(crate) fn max(&self) -> f64 {
        self.sorted.last().copied().unwrap_or(f64::NAN)
    }
}

/// Percentile of sorted values, interpolating linearly between the closest ranks.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        len => {
            let rank = p / 100.0 * (len - 1) as f64;
            // `p` is a percentage, so `rank` lies in 0..=len - 1: the casts are exact.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let (low, high) = (rank.floor() as usize, rank.ceil() as usize);
            sorted[low] + (sorted[high] - sorted[low]) * (rank - low as f64)
        }
    }
}

pub(crate) fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

/// Runs a warm-up round and then `rounds` rounds; in each, `run(contender, warm_up)` once per
/// contender, in an order rotated by one from round to round. Returns, per contender, the
/// results of the counted rounds.
pub(crate) fn rounds<T>(
    contenders: usize,
    rounds: usize,
    mut run: impl FnMut(usize, bool) -> T,
) -> Vec<Vec<T>> {
    let mut results: Vec<Vec<T>> = (0..contenders).map(|_| Vec::new()).collect();
    for round in 0..=rounds {
        let warm_up = round == 0;
        for step in 0..contenders {
            let contender = (round + step) % contenders;
            let result = run(contender, warm_up);
            if !warm_up {
                results[contender].push(result);
            }
        }
    }
    results
}

/// One contender's round of workload 1: time, client CPU and Redis CPU per cycle
/// (microseconds; CPU when it could be read).
pub(crate) type CycleRound = (f64, Option<f64>, Option<f64>);

/// Reads one figure of a cycle round, if it was measured.
pub(crate) type PickCycle = fn(&CycleRound) -> Option<f64>;

/// Cycles per turn in [`interleaved_rounds`]: about 20 ms of workload 1, short enough that the
/// machine's drift barely changes from one contender's turn to the next.
pub(crate) const CYCLE_BLOCK: u64 = 250;

/// Like [`rounds`], for workload 1, whose contenders differ by a few percent at most: each
/// round's `n` cycles per contender run in turns of [`CYCLE_BLOCK`] cycles, the contenders
/// taking turns in an order rotated from turn to turn, so that every contender samples the
/// same moments of the round. `run(contender, count)` runs `count` cycles and returns
/// per-cycle figures; a contender's round is the cycle-weighted mean of its turns.
pub(crate) fn interleaved_rounds(
    contenders: usize,
    rounds: usize,
    n: usize,
    mut run: impl FnMut(usize, u64) -> CycleRound,
) -> Vec<Vec<CycleRound>> {
    let mut results: Vec<Vec<CycleRound>> = (0..contenders).map(|_| Vec::new()).collect();
    let add = |sum: Option<f64>, value: Option<f64>, weight: f64| {
        sum.zip(value).map(|(sum, value)| sum + value * weight)
    };
    for round in 0..=rounds {
        let warm_up = round == 0;
        let n = if warm_up { n.div_ceil(10) } else { n } as u64;
        let mut sums = vec![(0.0, Some(0.0), Some(0.0)); contenders];
        let mut done = 0;
        for turn in 0.. {
            if done >= n {
                break;
            }
            let count = CYCLE_BLOCK.min(n - done);
            for step in 0..contenders {
                let contender = (round + turn + step) % contenders;
                let (time, client, redis) = run(contender, count);
                let weight = count as f64;
                let sum = &mut sums[contender];
                *sum = (
                    sum.0 + time * weight,
                    add(sum.1, client, weight),
                    add(sum.2, redis, weight),
                );
            }
            done += count;
        }
        if !warm_up {
            let mean = |sum: f64| sum / n as f64;
            for (contender, sum) in sums.into_iter().enumerate() {
                results[contender].push((mean(sum.0), sum.1.map(mean), sum.2.map(mean)));
            }
        }
    }
    results
}

/// One critical section, as its holder saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Section {
    pub(crate) holder: usize,
    /// The acquire call started.
    pub(crate) called: Instant,
    /// The acquire call returned.
    pub(crate) acquired: Instant,
    /// Just before the release call.
    pub(crate) release_start: Instant,
}

/// What one contention round measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ContendRound {
    pub(crate) sections_per_s: f64,
    pub(crate) gap_p50_us: f64,
    pub(crate) gap_p99_us: f64,
    pub(crate) longest_wait_ms: f64,
    pub(crate) changed_hands_pct: f64,
    /// Sections that began before the previous one ended (a broken lock): must be 0.
    pub(crate) overlaps: usize,
}

/// Reads one figure of a contend round.
pub(crate) type PickContend = fn(&ContendRound) -> f64;

pub(crate) fn analyse(mut sections: Vec<Section>, wall: Duration) -> ContendRound {
    sections.sort_by_key(|section| section.acquired);
    let mut gaps = Vec::new();
    let mut changes = 0;
    let mut overlaps = 0;
    for pair in sections.windows(2) {
        let (previous, next) = (pair[0], pair[1]);
        if next.acquired < previous.release_start {
            overlaps += 1;
        }
        if next.holder != previous.holder {
            changes += 1;
            gaps.push(micros(
                next.acquired
                    .saturating_duration_since(previous.release_start),
            ));
        }
    }
    gaps.sort_by(f64::total_cmp);
    let longest_wait = sections
        .iter()
        .map(|section| section.acquired - section.called)
        .max()
        .unwrap_or_default();
    ContendRound {
        sections_per_s: sections.len() as f64 / wall.as_secs_f64(),
        gap_p50_us: percentile(&gaps, 50.0),
        gap_p99_us: percentile(&gaps, 99.0),
        longest_wait_ms: longest_wait.as_secs_f64() * 1e3,
        changed_hands_pct: 100.0 * f64::from(changes)
            / sections.len().saturating_sub(1).max(1) as f64,
        overlaps,
    }
}
