//! What one run of a lock-family workload measured, from the sections its workers recorded,
//! and the same over the rounds of one contender.
//!
//! A semaphore lets in up to `n` holders, a read-write lock many readers, two-key transfers
//! every pair of disjoint accounts: so the mutex's figures that assume one holder (hand-off
//! between consecutive sections, busy fraction of one lock) are replaced here by a sweep over
//! the run's events in time order, which counts holders and waiters at every moment.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use crate::fleet::stats::{median_of, per_section_by_name, sorted, Section};
use crate::statistics::percentile;

/// Which sections may overlap: what the lock promises, and what the sweep checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// At most `n` holders at once (a mutex and the floors: 1; a semaphore: its permits).
    AtMost(usize),
    /// Readers (`tag` 1) share; a writer (`tag` 0) excludes everyone.
    ReadWrite,
    /// A section holds the accounts whose bits are set in its `tag`; two sections that share
    /// an account never overlap.
    Accounts,
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunFigures {
    pub sections: usize,
    /// Sections per second of the run (first acquired → last release started).
    pub throughput_per_s: f64,
    /// The longest acquire call.
    pub longest_wait_ms: f64,
    /// Permit gaps (ms): from a release made while someone waited to the next entry, each
    /// release paired with the next acquisition in order (see [`analyse`]). `AtMost` only.
    #[serde(skip)]
    pub gaps_ms: Vec<f64>,
    /// Of the time someone waited, the share during which all `n` places were in use.
    /// `AtMost` only.
    pub busy_all: f64,
    /// Of the time someone waited, the mean share of the `n` places in use (the issue's "busy
    /// permits": for the mutex, its busy fraction). `AtMost` only.
    pub busy_mean: f64,
    /// Redis commands of the run per section.
    pub commands_per_section: f64,
    pub commands: BTreeMap<String, u64>,
    /// Sections let in against the rule: a broken lock.
    pub overlaps: usize,
}

fn ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}

/// What happens at one moment of the sweep. Ordered so that at one instant a release comes
/// before an entry (a permit handed over within one clock tick is not an overlap), and a wait
/// ends after its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Release,
    WaitStart,
    Acquire,
    WaitEnd,
}

/// The figures of one run from every worker's sections and the run's command counts.
pub(crate) fn analyse(
    sections: &[Section],
    commands: BTreeMap<String, u64>,
    rule: Rule,
) -> RunFigures {
    let mut events: Vec<(u64, Event, usize)> = Vec::with_capacity(sections.len() * 4);
    for (index, section) in sections.iter().enumerate() {
        events.push((section.called, Event::WaitStart, index));
        events.push((section.acquired, Event::Acquire, index));
        events.push((section.acquired, Event::WaitEnd, index));
        events.push((section.release_start, Event::Release, index));
    }
    events.sort_unstable();

    let capacity = match rule {
        Rule::AtMost(n) => n,
        Rule::ReadWrite | Rule::Accounts => usize::MAX,
    };
    let (mut in_use, mut waiting, mut overlaps) = (0_usize, 0_usize, 0_usize);
    let (mut readers, mut writers) = (0_usize, 0_usize);
    let mut accounts = [0_usize; 32];
    // Releases made while someone waited, not yet followed by an entry.
    let mut freed: VecDeque<u64> = VecDeque::new();
    let mut gaps_ms = Vec::new();
    let (mut waited, mut full) = (0_u64, 0_u64);
    // Σ places in use × time, while someone waited.
    let mut used: u128 = 0;
    let mut last = events.first().map_or(0, |event| event.0);
    for &(at, event, index) in &events {
        let span = at - last;
        if waiting > 0 {
            waited += span;
            used += u128::from(span) * in_use.min(capacity) as u128;
            if in_use >= capacity {
                full += span;
            }
        }
        last = at;
        let tag = sections[index].tag;
        match event {
            Event::WaitStart => waiting += 1,
            Event::WaitEnd => waiting -= 1,
            Event::Release => {
                in_use -= 1;
                match rule {
                    Rule::ReadWrite if tag == 1 => readers -= 1,
                    Rule::ReadWrite => writers -= 1,
                    Rule::Accounts => for_bits(tag, |bit| accounts[bit] -= 1),
                    Rule::AtMost(_) => {}
                }
                // The section that just ended may be about to ask again: it is not waiting
                // yet, so only others' waits make this release a hand-off to be timed.
                if waiting > 0 {
                    freed.push_back(at);
                }
            }
            Event::Acquire => {
                in_use += 1;
                let broken = match rule {
                    Rule::AtMost(n) => in_use > n,
                    Rule::ReadWrite if tag == 1 => {
                        readers += 1;
                        writers > 0
                    }
                    Rule::ReadWrite => {
                        writers += 1;
                        writers > 1 || readers > 0
                    }
                    Rule::Accounts => {
                        let mut shared = false;
                        for_bits(tag, |bit| {
                            accounts[bit] += 1;
                            shared |= accounts[bit] > 1;
                        });
                        shared
                    }
                };
                overlaps += usize::from(broken);
                if let Some(released) = freed.pop_front() {
                    gaps_ms.push(ms(at - released));
                }
            }
        }
    }
    gaps_ms.sort_by(f64::total_cmp);

    let first = sections.iter().map(|s| s.acquired).min().unwrap_or(0);
    let end = sections.iter().map(|s| s.release_start).max().unwrap_or(0);
    let longest = sections
        .iter()
        .map(|s| s.acquired.saturating_sub(s.called))
        .max()
        .unwrap_or(0);
    let single = matches!(rule, Rule::AtMost(_));
    RunFigures {
        sections: sections.len(),
        throughput_per_s: sections.len() as f64 / (end.saturating_sub(first) as f64 / 1e9),
        longest_wait_ms: ms(longest),
        gaps_ms: if single { gaps_ms } else { Vec::new() },
        busy_all: if single && waited > 0 {
            full as f64 / waited as f64
        } else {
            f64::NAN
        },
        busy_mean: if single && waited > 0 {
            used as f64 / (waited as f64 * capacity as f64)
        } else {
            f64::NAN
        },
        commands_per_section: commands.values().sum::<u64>() as f64 / sections.len().max(1) as f64,
        commands,
        overlaps,
    }
}

/// Calls `each` with the number of every bit set in `tag`.
fn for_bits(tag: u32, mut each: impl FnMut(usize)) {
    for bit in 0..32 {
        if tag & (1 << bit) != 0 {
            each(bit);
        }
    }
}

/// One contender over its rounds: medians, the worst longest wait, gaps pooled.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Summary {
    pub throughput_per_s: f64,
    pub longest_wait_ms: f64,
    pub gap_p50_ms: f64,
    pub gap_p99_ms: f64,
    pub gaps: usize,
    pub busy_all: f64,
    pub busy_mean: f64,
    pub commands_per_section: f64,
    pub commands_per_section_by_name: BTreeMap<String, f64>,
    pub overlaps: usize,
}

impl Summary {
    pub(crate) fn over(rounds: &[RunFigures]) -> Self {
        let median = |pick: fn(&RunFigures) -> f64| median_of(rounds.iter().map(pick));
        let gaps = sorted(
            rounds
                .iter()
                .flat_map(|round| round.gaps_ms.iter().copied()),
        );
        let by_name = per_section_by_name(
            rounds.iter().map(|round| &round.commands),
            rounds.iter().map(|round| round.sections).sum(),
        );
        Summary {
            throughput_per_s: median(|round| round.throughput_per_s),
            longest_wait_ms: rounds
                .iter()
                .map(|round| round.longest_wait_ms)
                .fold(f64::NAN, f64::max),
            gap_p50_ms: percentile(&gaps, 50.0),
            gap_p99_ms: percentile(&gaps, 99.0),
            gaps: gaps.len(),
            busy_all: median(|round| round.busy_all),
            busy_mean: median(|round| round.busy_mean),
            commands_per_section: median(|round| round.commands_per_section),
            commands_per_section_by_name: by_name,
            overlaps: rounds.iter().map(|round| round.overlaps).sum(),
        }
    }
}
