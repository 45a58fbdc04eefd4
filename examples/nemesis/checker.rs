//! The checker: a pure function from the histories (and the store's final records) to a report.
//! It trusts nothing the workers concluded; it recomputes everything from the events.

use std::collections::{BTreeMap, HashMap};

use crate::history::{Event, Fault, FaultKind, Outcome, What};

/// A record as the store holds it at the end of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct FinalRecord {
    /// The record's value.
    pub(crate) value: u64,
    /// How many writes the store accepted for it.
    pub(crate) writes: u64,
}

/// Everything the checker reads.
pub(crate) struct Input<'a> {
    pub(crate) events: &'a [Event],
    pub(crate) faults: &'a [Fault],
    /// The final record of each key the workers used.
    pub(crate) finals: &'a BTreeMap<String, FinalRecord>,
    /// When the workers were started and when the last one was done (microseconds).
    pub(crate) started: u64,
    pub(crate) ended: u64,
    /// How long after a fault is over its effects are still put down to it: a lock a killed
    /// worker held stays taken until its ttl runs out.
    pub(crate) settle: u64,
}

/// What one row of the report (one kind of fault, or none) cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Cost {
    /// How many faults of this kind were injected.
    pub(crate) injected: u64,
    /// Sections that did not end with a write the store accepted.
    pub(crate) lost: u64,
    /// ... of which the acquire timed out.
    pub(crate) timed_out: u64,
    /// ... of which the store refused the token (a newer holder had been there).
    pub(crate) stale: u64,
    /// ... of which never ended (their worker was killed).
    pub(crate) cut_short: u64,
    /// Holds overtaken: not ended yet when a hold with a higher token of the same lock began.
    pub(crate) overlaps: u64,
    /// The longest time without an accepted write anywhere, in microseconds.
    pub(crate) longest_stall: u64,
}

/// The checker's findings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Report {
    pub(crate) sections: u64,
    /// Sections whose write the store accepted.
    pub(crate) accepted: u64,
    /// Writes whose worker died before it heard the store's answer.
    pub(crate) unknown_writes: u64,
    /// Accepted writes whose token was not above the previous accepted write's token of the same
    /// record, or that share their place in the store's order with another write. Must be 0.
    pub(crate) out_of_order: u64,
    /// Accepted writes whose value read was not the value of the record's previous accepted
    /// write. Must be 0.
    pub(crate) lost_updates: u64,
    /// Records whose final value is not their number of accepted writes, or whose number of
    /// accepted writes the histories cannot account for. Must be 0.
    pub(crate) final_mismatches: u64,
    /// Per row: one per kind of fault, and `None` for what happened away from every fault.
    pub(crate) costs: BTreeMap<Option<FaultKind>, Cost>,
    /// The totals over every row.
    pub(crate) total: Cost,
}

impl Report {
    /// The number of safety violations: out-of-order writes, lost updates, final mismatches.
    pub(crate) fn violations(&self) -> u64 {
        self.out_of_order + self.lost_updates + self.final_mismatches
    }
}

/// An accepted write: (its place in the store's order, token, value written, value read).
type Accepted = (u64, u64, u64, Option<u64>);

/// One section, put together from its events.
#[derive(Debug, Default)]
struct Section {
    key: String,
    first: u64,
    last: u64,
    token: Option<u64>,
    acquired: Option<u64>,
    releasing: Option<u64>,
    /// The value read; `None` when the read was refused or never made.
    read: Option<u64>,
    writing: Option<(u64, u64)>,
    wrote: Option<(u64, Option<u64>)>,
    outcome: Option<Outcome>,
}

/// Checks a run. See [`Report`] for what is counted.
pub(crate) fn check(input: &Input<'_>) -> Report {
    let sections = sections(input.events);
    let mut report = Report {
        sections: sections.len() as u64,
        ..Report::default()
    };
    let row_of = |from: u64, to: u64| blame(input.faults, input.settle, None, from, to);
    // A killed worker's section ended when its worker died: before its next life's first event.
    let mut lives: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    for event in input.events {
        let first = lives.entry((event.worker, event.life)).or_insert(event.t);
        *first = (*first).min(event.t);
    }
    for kind in FaultKind::ALL {
        report.costs.entry(Some(kind)).or_default();
    }
    report.costs.entry(None).or_default();
    for fault in input.faults {
        report.costs.entry(Some(fault.kind)).or_default().injected += 1;
    }

    // Every section's fate, put down to the fault it ran into, if any.
    for (&(worker, life, _), section) in &sections {
        let accepted = matches!(section.wrote, Some((_, Some(_))));
        if accepted {
            report.accepted += 1;
            continue;
        }
        if section.writing.is_some() && section.wrote.is_none() {
            report.unknown_writes += 1;
        }
        let until = if section.outcome.is_none() {
            lives
                .get(&(worker, life + 1))
                .copied()
                .unwrap_or(input.ended)
        } else {
            section.last
        };
        let row = blame(
            input.faults,
            input.settle,
            Some(worker),
            section.first,
            until,
        );
        let cost = report.costs.entry(row).or_default();
        cost.lost += 1;
        match section.outcome {
            Some(Outcome::Timeout) => cost.timed_out += 1,
            Some(Outcome::Stale) => cost.stale += 1,
            None => cost.cut_short += 1,
            Some(Outcome::Done | Outcome::Error) => {}
        }
    }

    // The store's order of each record's accepted writes, as the histories tell it.
    let mut writes: BTreeMap<&str, Vec<Accepted>> = BTreeMap::new();
    for section in sections.values() {
        if let (Some((_, Some(seq))), Some(token)) = (section.wrote, section.token) {
            let (_, value) = section.writing.unwrap_or_default();
            let read = section.read;
            writes
                .entry(section.key.as_str())
                .or_default()
                .push((seq, token, value, read));
        }
    }
    let mut unknown_by_key: HashMap<&str, u64> = HashMap::new();
    for section in sections.values() {
        if section.writing.is_some() && section.wrote.is_none() {
            *unknown_by_key.entry(section.key.as_str()).or_default() += 1;
        }
    }
    for (key, list) in &mut writes {
        list.sort_unstable();
        for pair in list.windows(2) {
            let (seq_a, token_a, value_a, _) = pair[0];
            let (seq_b, token_b, _, read_b) = pair[1];
            if seq_a == seq_b || token_b <= token_a {
                report.out_of_order += 1;
            }
            // A gap in the order is a write whose worker died before hearing it was accepted:
            // what came before it cannot be compared with what came after.
            if seq_b == seq_a + 1 && read_b != Some(value_a) {
                report.lost_updates += 1;
            }
        }
        if let Some(&(1, _, _, read)) = list.first() {
            if read.unwrap_or(0) != 0 {
                report.lost_updates += 1;
            }
        }
        let record = input.finals.get(*key).copied().unwrap_or_default();
        let logged = list.len() as u64;
        let unknown = unknown_by_key.get(key).copied().unwrap_or(0);
        if record.value != record.writes
            || record.writes < logged
            || record.writes > logged + unknown
        {
            report.final_mismatches += 1;
        }
    }
    for (key, record) in input.finals {
        if !writes.contains_key(key.as_str()) && *record != FinalRecord::default() {
            let unknown = unknown_by_key.get(key.as_str()).copied().unwrap_or(0);
            if record.value != record.writes || record.writes > unknown {
                report.final_mismatches += 1;
            }
        }
    }

    // Overtaken holds: a hold that had not ended when a hold with a higher token of the same
    // lock began (its lock expired under it). Walked from the highest token down, keeping the
    // earliest start of the holds above.
    let mut holds: BTreeMap<&str, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for section in sections.values() {
        if let (Some(token), Some(acquired)) = (section.token, section.acquired) {
            let until = section.releasing.unwrap_or(section.last);
            holds
                .entry(section.key.as_str())
                .or_default()
                .push((token, acquired, until));
        }
    }
    for list in holds.values_mut() {
        list.sort_unstable();
        let mut earliest_above: Option<u64> = None;
        for &(_, acquired, until) in list.iter().rev() {
            if earliest_above.is_some_and(|next| next < until) {
                report
                    .costs
                    .entry(row_of(acquired, until))
                    .or_default()
                    .overlaps += 1;
            }
            earliest_above = Some(earliest_above.map_or(acquired, |next| next.min(acquired)));
        }
    }

    // Stalls: the gaps between consecutive accepted writes of the whole fleet.
    let mut progress: Vec<u64> = sections
        .values()
        .filter_map(|section| match section.wrote {
            Some((t, Some(_))) => Some(t),
            _ => None,
        })
        .collect();
    progress.push(input.started);
    progress.push(input.ended);
    progress.sort_unstable();
    for pair in progress.windows(2) {
        let cost = report.costs.entry(row_of(pair[0], pair[1])).or_default();
        cost.longest_stall = cost.longest_stall.max(pair[1] - pair[0]);
    }

    for cost in report.costs.values() {
        report.total.injected += cost.injected;
        report.total.lost += cost.lost;
        report.total.timed_out += cost.timed_out;
        report.total.stale += cost.stale;
        report.total.cut_short += cost.cut_short;
        report.total.overlaps += cost.overlaps;
        report.total.longest_stall = report.total.longest_stall.max(cost.longest_stall);
    }
    report
}

/// The sections of every worker, keyed by (worker, life, section).
fn sections(events: &[Event]) -> BTreeMap<(u32, u32, u64), Section> {
    let mut sections: BTreeMap<(u32, u32, u64), Section> = BTreeMap::new();
    for event in events {
        let section = sections
            .entry((event.worker, event.life, event.section))
            .or_insert_with(|| Section {
                first: event.t,
                last: event.t,
                ..Section::default()
            });
        section.first = section.first.min(event.t);
        section.last = section.last.max(event.t);
        match &event.what {
            What::Start { key } => section.key.clone_from(key),
            What::Acquired { token } => {
                section.token = Some(*token);
                section.acquired = Some(event.t);
            }
            What::Read { value } => section.read = *value,
            What::Writing { value } => section.writing = Some((event.t, *value)),
            What::Wrote { seq } => section.wrote = Some((event.t, *seq)),
            What::Releasing => section.releasing = Some(event.t),
            What::End { outcome, .. } => section.outcome = Some(*outcome),
        }
    }
    sections
}

/// The row a span of time `from..=to` is put down to: the kind of the latest fault that began
/// before `to` and whose effects (`start..=end + settle`) reach into the span; `None` if none.
/// For a span of one `worker`'s, a fault aimed at that worker comes first.
fn blame(
    faults: &[Fault],
    settle: u64,
    worker: Option<u32>,
    from: u64,
    to: u64,
) -> Option<FaultKind> {
    let reaching = || {
        faults
            .iter()
            .filter(move |fault| fault.start <= to && fault.end + settle >= from)
    };
    reaching()
        .filter(|fault| worker.is_some() && fault.worker == worker)
        .max_by_key(|fault| fault.start)
        .or_else(|| reaching().max_by_key(|fault| fault.start))
        .map(|fault| fault.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of one section of worker 0, life 0, at times from `t` on.
    fn section(
        id: u64,
        t: u64,
        key: &str,
        token: u64,
        read: Option<u64>,
        seq: Option<u64>,
    ) -> Vec<Event> {
        let event = |dt: u64, what: What| Event {
            t: t + dt,
            worker: 0,
            life: 0,
            section: id,
            what,
        };
        let mut events = vec![
            event(0, What::Start { key: key.into() }),
            event(1, What::Acquired { token }),
            event(2, What::Read { value: read }),
        ];
        if let Some(value) = read {
            events.push(event(3, What::Writing { value: value + 1 }));
            events.push(event(4, What::Wrote { seq }));
        }
        events.push(event(5, What::Releasing));
        let outcome = if seq.is_some() {
            Outcome::Done
        } else {
            Outcome::Stale
        };
        events.push(event(
            6,
            What::End {
                outcome,
                error: None,
            },
        ));
        events
    }

    fn run(events: &[Event], finals: &[(&str, u64, u64)], faults: &[Fault]) -> Report {
        let finals: BTreeMap<String, FinalRecord> = finals
            .iter()
            .map(|&(key, value, writes)| (key.to_owned(), FinalRecord { value, writes }))
            .collect();
        check(&Input {
            events,
            faults,
            finals: &finals,
            started: 0,
            ended: 1_000,
            settle: 10,
        })
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let events: Vec<Event> = [
            section(1, 100, "a", 1, Some(0), Some(1)),
            section(2, 200, "a", 2, Some(1), Some(2)),
            section(3, 300, "a", 3, Some(2), Some(3)),
        ]
        .concat();
        let report = run(&events, &[("a", 3, 3)], &[]);
        assert_eq!(report.violations(), 0, "{report:?}");
        assert_eq!(report.accepted, 3);
        assert_eq!(report.total.lost, 0);
        assert_eq!(report.total.overlaps, 0);
        assert_eq!(
            report.total.longest_stall, 696,
            "from the last write at 304 to 1000"
        );
    }

    #[test]
    fn an_accepted_write_out_of_token_order_is_counted() {
        // The store's second accepted write carries a lower token than its first.
        let events: Vec<Event> = [
            section(1, 100, "a", 5, Some(0), Some(1)),
            section(2, 200, "a", 4, Some(1), Some(2)),
        ]
        .concat();
        let report = run(&events, &[("a", 2, 2)], &[]);
        assert_eq!(report.out_of_order, 1, "{report:?}");
        assert_eq!(report.lost_updates, 0);
        assert_eq!(report.violations(), 1);
    }

    #[test]
    fn a_lost_update_is_counted_and_the_final_value_falls_short() {
        // Both sections read 0 and wrote 1: the second write lost the first one's increment.
        let events: Vec<Event> = [
            section(1, 100, "a", 1, Some(0), Some(1)),
            section(2, 200, "a", 2, Some(0), Some(2)),
        ]
        .concat();
        let report = run(&events, &[("a", 1, 2)], &[]);
        assert_eq!(report.lost_updates, 1, "{report:?}");
        assert_eq!(report.final_mismatches, 1);
        assert_eq!(report.out_of_order, 0);
        assert_eq!(report.violations(), 2);
    }

    #[test]
    fn an_overlap_is_put_down_to_the_fault_it_happened_in_and_its_stale_write_is_lost() {
        // Token 1 holds from 101 to 505 (its worker was stopped); token 2 acquires at 201.
        let mut events = section(1, 100, "a", 1, Some(0), None);
        for event in &mut events {
            if event.what == What::Releasing {
                event.t = 505;
            }
        }
        events.extend(section(2, 200, "a", 2, Some(0), Some(1)));
        let stop = Fault {
            kind: FaultKind::Stop,
            worker: Some(0),
            start: 150,
            end: 500,
        };
        let report = run(&events, &[("a", 1, 1)], &[stop]);
        assert_eq!(report.violations(), 0, "{report:?}");
        let cost = report.costs[&Some(FaultKind::Stop)];
        assert_eq!(cost.injected, 1);
        assert_eq!(cost.overlaps, 1);
        assert_eq!(cost.lost, 1);
        assert_eq!(cost.stale, 1);
        assert_eq!(report.costs[&None].lost, 0);
    }

    #[test]
    fn a_write_whose_answer_was_never_heard_accounts_for_the_store_count() {
        // Section 2 was killed after asking for its write: the store counted it (3 writes),
        // the histories know 2 answers and 1 unknown.
        let mut events: Vec<Event> = [
            section(1, 100, "a", 1, Some(0), Some(1)),
            section(3, 300, "a", 3, Some(2), Some(3)),
        ]
        .concat();
        events.extend(
            section(2, 200, "a", 2, Some(1), Some(2))
                .into_iter()
                .filter(|event| {
                    !matches!(
                        event.what,
                        What::Wrote { .. } | What::Releasing | What::End { .. }
                    )
                }),
        );
        let report = run(&events, &[("a", 3, 3)], &[]);
        assert_eq!(report.violations(), 0, "{report:?}");
        assert_eq!(report.unknown_writes, 1);
        assert_eq!(report.costs[&None].cut_short, 1);
        // A store that counts more writes than anybody asked for is caught.
        let report = run(&events, &[("a", 4, 4)], &[]);
        assert_eq!(report.final_mismatches, 1, "{report:?}");
    }
}
