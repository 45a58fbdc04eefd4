//! When a waiter walks and when it reports, without a clock: time is passed in.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::backend::waits::{Holder, Seen, WaitRecord};

fn waiter(wait_id: &str, since_ms: u64) -> Waiter {
    Waiter {
        wait_id: wait_id.into(),
        since_ms,
        tokens: vec![Arc::from("mine")],
    }
}

fn record(holder: &str, wait_id: &str, since_ms: u64, waits_for: &str) -> WaitRecord {
    WaitRecord {
        holder: holder.into(),
        wait_id: wait_id.into(),
        since_ms,
        waits_for: waits_for.into(),
    }
}

/// A lock held by `holder`, which waits for each of `waits_for` (one wait each).
fn waiting(holder: &str, wait_id: &str, since_ms: u64, waits_for: &[&str]) -> Seen {
    Seen {
        holders: vec![Holder {
            token: holder.into(),
            waits: waits_for
                .iter()
                .map(|lock| record(holder, wait_id, since_ms, lock))
                .collect(),
        }],
    }
}

fn held_by(holder: &str) -> Seen {
    Seen {
        holders: vec![Holder {
            token: holder.into(),
            waits: Vec::new(),
        }],
    }
}

/// Runs a walk from `wanted` over the locks of `graph` (a lock not in it is free): the cycle
/// found, and the locks looked at, in order.
fn walk(me: &Waiter, wanted: &[&str], graph: &[(&str, Seen)]) -> (Option<Vec<Edge>>, Vec<String>) {
    let wanted: Vec<String> = wanted.iter().map(|lock| (*lock).to_owned()).collect();
    let mut walk = Walk::new(&wanted);
    let mut looked = Vec::new();
    while let Some(lock) = walk.next_look() {
        looked.push(lock.clone());
        let seen = graph
            .iter()
            .find(|(name, _)| *name == lock)
            .map(|(_, seen)| seen.clone())
            .unwrap_or_default();
        if let Some(cycle) = walk.looked(me, &lock, &seen) {
            return (Some(cycle), looked);
        }
    }
    (None, looked)
}

/// The walk from `lock:b`, held by `other` (waiting since `since_ms` for `lock:a`), which is
/// held by this waiter.
fn two_cycle(waiter: &Waiter, other_wait: &str, since_ms: u64) -> Vec<Edge> {
    let graph = [
        (
            "lock:b",
            waiting("other", other_wait, since_ms, &["lock:a"]),
        ),
        ("lock:a", held_by("mine")),
    ];
    walk(waiter, &["lock:b"], &graph).0.expect("a cycle")
}

#[test]
fn the_first_walk_waits_for_a_short_wait_to_pass_then_walks_regularly() {
    let start = Instant::now();
    let mut detection = Detection::new(waiter("w", 10), start);
    assert_eq!(detection.walk_at(), start + FIRST_WALK);
    let now = start + FIRST_WALK + Duration::from_millis(5);
    assert_eq!(detection.walked(now, None), Verdict::Wait);
    assert_eq!(detection.walk_at(), now + WALK_EVERY);
}

#[test]
fn a_cycle_is_reported_by_its_youngest_waiter_after_two_matching_walks() {
    let start = Instant::now();
    let me = waiter("w2", 20);
    let mut detection = Detection::new(me.clone(), start);
    let first = Some(two_cycle(&me, "w1", 10));
    assert_eq!(detection.walked(start + FIRST_WALK, first), Verdict::Wait);
    let second = two_cycle(&me, "w1", 10);
    assert_eq!(
        detection.walked(start + FIRST_WALK + WALK_EVERY, Some(second.clone())),
        Verdict::Report(second)
    );
}

#[test]
fn the_older_waiter_of_a_cycle_keeps_waiting() {
    let start = Instant::now();
    let me = waiter("w1", 10);
    let mut detection = Detection::new(me.clone(), start);
    for round in 0..5 {
        let cycle = Some(two_cycle(&me, "w2", 20));
        let now = start + FIRST_WALK + WALK_EVERY * round;
        assert_eq!(detection.walked(now, cycle), Verdict::Wait);
    }
    // Same start: the greater wait id gives up, on both sides alike.
    let mut detection = Detection::new(waiter("w1", 20), start);
    for round in 0..3 {
        let cycle = Some(two_cycle(detection.waiter(), "w2", 20));
        let now = start + FIRST_WALK + WALK_EVERY * round;
        assert_eq!(detection.walked(now, cycle), Verdict::Wait);
    }
}

#[test]
fn a_chain_that_moves_between_walks_is_not_reported() {
    let start = Instant::now();
    let me = waiter("w2", 20);
    let mut detection = Detection::new(me.clone(), start);
    // The other holder's wait ended and a new one began: another wait id.
    assert_eq!(
        detection.walked(start, Some(two_cycle(&me, "w1", 10))),
        Verdict::Wait
    );
    assert_eq!(
        detection.walked(start + WALK_EVERY, Some(two_cycle(&me, "w1b", 10))),
        Verdict::Wait
    );
    // A walk in between that found no cycle resets the count.
    assert_eq!(
        detection.walked(start + WALK_EVERY * 2, None),
        Verdict::Wait
    );
    assert_eq!(
        detection.walked(start + WALK_EVERY * 3, Some(two_cycle(&me, "w1b", 10))),
        Verdict::Wait
    );
}

#[test]
fn a_walk_ends_at_a_free_lock_a_holder_that_does_not_wait_or_another_cycle() {
    let me = waiter("w", 1);
    assert_eq!(walk(&me, &["lock:b"], &[]).0, None);
    assert_eq!(walk(&me, &["lock:b"], &[("lock:b", held_by("x"))]).0, None);
    // b → c → b: a cycle of others, which they report themselves; each lock looked at once.
    let graph = [
        ("lock:b", waiting("x", "1", 1, &["lock:c"])),
        ("lock:c", waiting("y", "2", 1, &["lock:b"])),
    ];
    assert_eq!(
        walk(&me, &["lock:b"], &graph),
        (None, vec!["lock:b".into(), "lock:c".into()])
    );
}

#[test]
fn a_walk_follows_every_wait_of_a_holder_and_every_reader() {
    let me = waiter("w", 1);
    // x's holder waits for two locks at once: b (its holder waits for nothing) and a (held by
    // this waiter). The cycle is found through the second wait.
    let graph = [
        ("lock:x", waiting("t", "1", 1, &["lock:b", "lock:a"])),
        ("lock:b", held_by("v")),
        ("lock:a", held_by("mine")),
    ];
    let (cycle, _) = walk(&me, &["lock:x"], &graph);
    let cycle = cycle.expect("the cycle through the second wait");
    assert_eq!(
        cycle.iter().map(|e| e.lock.as_str()).collect::<Vec<_>>(),
        ["lock:x", "lock:a"]
    );
    // r is read by two readers; the second waits for a lock of this waiter.
    let readers = Seen {
        holders: vec![
            Holder {
                token: "r1".into(),
                waits: Vec::new(),
            },
            Holder {
                token: "r2".into(),
                waits: vec![record("r2", "2", 1, "lock:a")],
            },
        ],
    };
    let graph = [("lock:r", readers), ("lock:a", held_by("mine"))];
    let (cycle, _) = walk(&me, &["lock:r"], &graph);
    assert_eq!(cycle.expect("through the second reader")[0].holder, "r2");
    // Several locks wanted (acquire_all): the cycle through the second is found.
    let graph = [
        ("lock:c", held_by("v")),
        ("lock:d", waiting("u", "3", 1, &["lock:a"])),
        ("lock:a", held_by("mine")),
    ];
    assert!(walk(&me, &["lock:c", "lock:d"], &graph).0.is_some());
}

#[test]
fn a_walk_gives_up_after_the_longest_chain() {
    let me = waiter("w", 1);
    // A chain of `len` locks whose last is this waiter's: a cycle of `len` edges.
    let chain = |len: usize| -> Vec<(String, Seen)> {
        (0..len)
            .map(|hop| {
                let seen = if hop + 1 == len {
                    held_by("mine")
                } else {
                    let next = format!("lock:{}", hop + 1);
                    waiting(&format!("h{hop}"), &format!("w{hop}"), 1, &[next.as_str()])
                };
                (format!("lock:{hop}"), seen)
            })
            .collect()
    };
    let graph = chain(MAX_HOPS);
    let graph: Vec<(&str, Seen)> = graph.iter().map(|(l, s)| (l.as_str(), s.clone())).collect();
    assert_eq!(
        walk(&me, &["lock:0"], &graph).0.map(|c| c.len()),
        Some(MAX_HOPS)
    );
    let graph = chain(MAX_HOPS + 1);
    let graph: Vec<(&str, Seen)> = graph.iter().map(|(l, s)| (l.as_str(), s.clone())).collect();
    assert_eq!(walk(&me, &["lock:0"], &graph).0, None);
}

#[test]
fn a_walk_looks_at_most_max_looks_locks() {
    let me = waiter("w", 1);
    // A holder that waits for many locks, each held by one that waits for nothing.
    let many: Vec<String> = (0..MAX_LOOKS * 2).map(|i| format!("lock:{i}")).collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let graph = [("lock:x", waiting("t", "1", 1, &refs))];
    let (cycle, looked) = walk(&me, &["lock:x"], &graph);
    assert_eq!((cycle, looked.len()), (None, MAX_LOOKS));
}

#[test]
fn a_wanted_lock_the_waiter_holds_already_is_no_cycle_and_the_walk_goes_on() {
    let me = waiter("w2", 20);
    // A multi-key waiter wants a and b and holds a (handed to it meanwhile); b's holder waits
    // for a: a cycle through b, not a cycle of a alone.
    let graph = [
        ("lock:a", held_by("mine")),
        ("lock:b", waiting("other", "w1", 10, &["lock:a"])),
    ];
    let (cycle, looked) = walk(&me, &["lock:a", "lock:b"], &graph);
    let cycle = cycle.expect("the cycle through b");
    let locks: Vec<&str> = cycle.iter().map(|edge| edge.lock.as_str()).collect();
    assert_eq!(locks, ["lock:b", "lock:a"]);
    // a is looked at again at the end of the path through b.
    assert_eq!(looked, ["lock:a", "lock:b", "lock:a"]);
    // Holding a and wanting b, free: no cycle.
    let (cycle, _) = walk(&me, &["lock:a", "lock:b"], &[("lock:a", held_by("mine"))]);
    assert_eq!(cycle, None);
}

#[test]
fn a_waiter_that_takes_a_lock_meanwhile_closes_a_cycle_through_it() {
    let mut me = waiter("w2", 20);
    me.tokens = Vec::new();
    let graph = [
        ("lock:b", waiting("other", "w1", 10, &["lock:a"])),
        ("lock:a", held_by("taken")),
    ];
    assert_eq!(walk(&me, &["lock:b"], &graph).0, None, "holding nothing");
    let mut detection = Detection::new(me, Instant::now());
    detection.holds(vec![Arc::from("taken")]);
    let cycle = walk(detection.waiter(), &["lock:b"], &graph).0;
    assert!(cycle.is_some(), "the lock taken meanwhile is the waiter's");
}

/// A multi-key acquisition `t` taken by one script (one server, or one slot) waits for
/// `lock:3b`, holding `lock:2k` (handed to it in k's line while `lock:1n`, the first of its
/// names, was free); its record at k names each of its locks. Then `z` takes n and waits for
/// k. `t`'s record says it waits for n, but it does not: at its next look (within a renewal,
/// 1 s) it finds n busy, gives k back — to `z`, first in k's line — and waits in n's line. The
/// chain moves; the walk must not find a cycle k → n through `t`'s hold of k. (Taken one by
/// one, `t` would hold n before k: a name before a held one is its own, never a wait either.)
#[test]
fn a_multi_key_hold_does_not_wait_for_a_name_that_sorts_before_it() {
    let mut z = waiter("wz", 30);
    z.tokens = vec![Arc::from("z-n")];
    let graph = [
        (
            "lock:2k",
            waiting("t", "wt", 10, &["lock:1n", "lock:2k", "lock:3b"]),
        ),
        ("lock:3b", held_by("v")),
        ("lock:1n", held_by("z-n")),
    ];
    let (cycle, _) = walk(&z, &["lock:2k"], &graph);
    assert_eq!(cycle, None, "t gives k back once n is busy: no wait k → n");
    // Its wait for a name after the held key is followed: holding k, it needs 3b.
    let graph = [
        (
            "lock:2k",
            waiting("t", "wt", 10, &["lock:1n", "lock:2k", "lock:3b"]),
        ),
        ("lock:3b", held_by("z-n")),
    ];
    assert!(walk(&z, &["lock:2k"], &graph).0.is_some());
    // A lock held before the wait began (a scope's), not one of the wait's names, waits for
    // every name: once n is busy, t waits for it holding that lock.
    let graph = [
        ("lock:9s", waiting("t", "wt", 10, &["lock:1n", "lock:2k"])),
        ("lock:1n", held_by("z-n")),
    ];
    assert!(walk(&z, &["lock:9s"], &graph).0.is_some());
}

/// The same from the multi-key waiter's own walk: it holds `lock:2k` meanwhile, and `lock:1n`,
/// the first of its names, free at its last look, is taken since by `z`, which waits for k.
/// The waiter does not wait for n holding k (its next look gives k to `z`): no cycle through
/// its walk from n. From a name after k (`lock:3b`) the cycle is real.
#[test]
fn a_multi_key_waiter_holding_a_name_meanwhile_does_not_wait_for_the_names_before_it() {
    let mut t = waiter("wt", 30);
    t.tokens = vec![Arc::from("t")];
    let wanted = ["lock:1n", "lock:2k", "lock:3b"];
    let graph = [
        ("lock:1n", waiting("z", "wz", 10, &["lock:2k"])),
        ("lock:2k", held_by("t")),
        ("lock:3b", held_by("v")),
    ];
    assert_eq!(walk(&t, &wanted, &graph).0, None);
    let graph = [
        ("lock:1n", held_by("v")),
        ("lock:2k", held_by("t")),
        ("lock:3b", waiting("z", "wz", 10, &["lock:2k"])),
    ];
    let cycle = walk(&t, &wanted, &graph).0.expect("the cycle through 3b");
    let locks: Vec<&str> = cycle.iter().map(|edge| edge.lock.as_str()).collect();
    assert_eq!(locks, ["lock:3b", "lock:2k"]);
}
