//! When a waiter walks and when it reports, without a clock: time is passed in.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::backend::waits::{Hop, WaitRecord};

fn waiter(wait_id: &str, since_ms: u64) -> Waiter {
    Waiter {
        wait_id: wait_id.into(),
        since_ms,
        tokens: vec![Arc::from("mine")],
    }
}

fn waiting(holder: &str, wait_id: &str, since_ms: u64, waits_for: &str) -> Hop {
    Hop {
        holder: Some(holder.into()),
        wait: Some(WaitRecord {
            holder: holder.into(),
            wait_id: wait_id.into(),
            since_ms,
            waits_for: waits_for.into(),
        }),
    }
}

fn held_by(holder: &str) -> Hop {
    Hop {
        holder: Some(holder.into()),
        wait: None,
    }
}

/// The walk from `lock:b`, held by `other` (waiting since `since_ms` for `lock:a`), which is
/// held by this waiter.
fn two_cycle(waiter: &Waiter, other_wait: &str, since_ms: u64) -> Vec<Edge> {
    let mut walk = Walk::new();
    let next = walk.looked(
        waiter,
        "lock:b",
        waiting("other", other_wait, since_ms, "lock:a"),
    );
    assert_eq!(next, Next::Look("lock:a".into()));
    match walk.looked(waiter, "lock:a", held_by("mine")) {
        Next::Cycle(edges) => edges,
        other => panic!("expected a cycle, got {other:?}"),
    }
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
    assert_eq!(Walk::new().looked(&me, "lock:b", Hop::default()), Next::End);
    assert_eq!(Walk::new().looked(&me, "lock:b", held_by("x")), Next::End);
    // b → c → b: a cycle of others, which they report themselves.
    let mut walk = Walk::new();
    assert_eq!(
        walk.looked(&me, "lock:b", waiting("x", "1", 1, "lock:c")),
        Next::Look("lock:c".into())
    );
    assert_eq!(
        walk.looked(&me, "lock:c", waiting("y", "2", 1, "lock:b")),
        Next::End
    );
}

#[test]
fn a_walk_gives_up_after_the_longest_chain() {
    let me = waiter("w", 1);
    let mut walk = Walk::new();
    let mut ended = None;
    for hop in 0..MAX_HOPS {
        let next = walk.looked(
            &me,
            &format!("lock:{hop}"),
            waiting(
                &format!("h{hop}"),
                &format!("w{hop}"),
                1,
                &format!("lock:{}", hop + 1),
            ),
        );
        if next == Next::End {
            ended = Some(hop + 1);
            break;
        }
    }
    assert_eq!(ended, Some(MAX_HOPS));
}
