//! Clock-free tests of the acquisition state machine: time is passed in.

use super::*;

pub(super) const RENEW: Duration = Duration::from_secs(1);
pub(super) const TTL: Duration = Duration::from_secs(30);
pub(super) const CLAIM: Duration = crate::backend::CLAIM;

pub(super) fn terms(deadline: Instant, renew: Option<Duration>) -> Terms {
    Terms {
        deadline,
        one_attempt: false,
        renew,
        ttl: TTL,
        fencing: false,
        messages: Messages::HandOff,
    }
}

pub(super) fn starting(deadline: Instant, renew: Option<Duration>) -> Acquisition {
    Acquisition::new(terms(deadline, renew))
}

pub(super) fn held(ms: u64) -> Outcome {
    Outcome::Held {
        remaining: Some(Duration::from_millis(ms)),
    }
}

pub(super) fn channel() -> Arc<str> {
    Arc::from("distlock:grants:test")
}

pub(super) fn first_try(acquisition: &mut Acquisition, now: Instant) -> Wait {
    acquisition.request(now, || panic!("a first try names no channel"))
}

pub(super) fn look(acquisition: &mut Acquisition, now: Instant) -> Wait {
    acquisition.request(now, || true)
}

/// Held at the first try, subscribed, and the attempt that joins the line sent at `now`.
pub(super) fn in_line(now: Instant) -> Acquisition {
    let mut acquisition = starting(now + Duration::from_secs(10), Some(RENEW));
    assert_eq!(first_try(&mut acquisition, now), Wait::FirstTry);
    assert!(matches!(
        acquisition.attempted(now, held(5000)),
        Step::Subscribe { .. }
    ));
    assert_eq!(
        acquisition.subscribed(Subscribed::Confirmed, channel()),
        Step::Attempt
    );
    assert_eq!(
        look(&mut acquisition, now),
        Wait::InLine {
            channel: Some(channel()),
            renewing: false
        }
    );
    acquisition
}

/// In line, the join found the lock held at `now`: asleep.
pub(super) fn waiting(now: Instant) -> Acquisition {
    let mut acquisition = in_line(now);
    assert!(matches!(
        acquisition.attempted(now, held(5000)),
        Step::Sleep { .. }
    ));
    acquisition
}

/// An acquisition on `terms`, started at `now` as contended (it joins the line at once),
/// subscribed, and its join sent at `now` and answered "held": asleep in line.
pub(super) fn asleep_in_line(terms: Terms, now: Instant) -> Acquisition {
    let mut acquisition = Acquisition::new(terms);
    acquisition.start(now, || true);
    acquisition.subscribed(Subscribed::Confirmed, channel());
    look(&mut acquisition, now);
    acquisition.attempted(now, held(5000));
    acquisition
}

/// `waiting(now)` with replicas to satisfy, woken at `now` by a hand-off it must confirm.
pub(super) fn confirming(now: Instant) -> Acquisition {
    let mut acquisition = waiting(now);
    acquisition.terms.messages = Messages::ReplicatedHandOff;
    assert_eq!(
        acquisition.woke(now, Some(Grant::Granted { fence: 4 })),
        Step::Confirm
    );
    acquisition
}

/// An acquisition with replicas to satisfy and a deadline 100 ms from `now` (returned), woken
/// at `now` by a hand-off it must confirm.
fn confirming_before_a_close_deadline(now: Instant) -> (Acquisition, Instant) {
    let deadline = now + Duration::from_millis(100);
    let mut acquisition = asleep_in_line(
        Terms {
            messages: Messages::ReplicatedHandOff,
            ..terms(deadline, Some(RENEW))
        },
        now,
    );
    assert_eq!(
        acquisition.woke(now, Some(Grant::Granted { fence: 1 })),
        Step::Confirm
    );
    (acquisition, deadline)
}

pub(super) fn won(step: Step) -> Won {
    let Step::Acquired(won) = step else {
        panic!("expected the lock, got {step:?}");
    };
    won
}

#[test]
fn a_free_lock_is_taken_by_the_first_try() {
    let now = Instant::now();
    let mut acquisition = starting(now + Duration::from_secs(1), Some(RENEW));
    assert_eq!(acquisition.start(now, || false), Step::Attempt);
    assert_eq!(first_try(&mut acquisition, now), Wait::FirstTry);
    let acquired = Outcome::Acquired {
        fence: Some(7),
        expires_in: TTL,
    };
    assert_eq!(
        acquisition.attempted(now + Duration::from_millis(1), acquired),
        Step::Acquired(Won {
            fence: Some(7),
            since: now,
            expires_in: TTL,
            via: Via::FirstTry
        })
    );
    assert!(!acquisition.in_line());
    assert!(!acquisition.holds_place());
}

#[test]
fn a_contended_key_skips_the_first_try_and_joins_once_subscribed() {
    let now = Instant::now();
    let mut acquisition = starting(now + Duration::from_secs(10), Some(RENEW));
    assert_eq!(
        acquisition.start(now, || true),
        Step::Subscribe { until: now + RENEW }
    );
    assert_eq!(
        acquisition.subscribed(Subscribed::Confirmed, channel()),
        Step::Attempt
    );
    assert!(matches!(
        look(&mut acquisition, now),
        Wait::InLine {
            renewing: false,
            ..
        }
    ));
    let acquired = Outcome::Acquired {
        fence: None,
        expires_in: TTL,
    };
    assert_eq!(
        won(acquisition.attempted(now, acquired)).via,
        Via::Line,
        "the join takes a free lock"
    );
}

#[test]
fn a_single_attempt_never_starts_in_line() {
    let now = Instant::now();
    let mut acquisition = Acquisition::new(Terms {
        one_attempt: true,
        ..terms(now, Some(RENEW))
    });
    assert_eq!(acquisition.start(now, || true), Step::Attempt);
    assert_eq!(first_try(&mut acquisition, now), Wait::FirstTry);
}

#[test]
fn a_held_lock_subscribes_then_takes_a_place_in_line() {
    let now = Instant::now();
    let mut acquisition = in_line(now);
    assert!(acquisition.in_line() && acquisition.listening());
    // In line: sleep until the place must be renewed, the holder's 5 s being further off.
    assert_eq!(
        acquisition.attempted(now, held(5000)),
        Step::Sleep {
            until: now + RENEW,
            spread: Duration::ZERO
        }
    );
    assert_eq!(acquisition.woke(now + RENEW, None), Step::Attempt);
    assert_eq!(
        look(&mut acquisition, now + RENEW),
        Wait::InLine {
            channel: Some(channel()),
            renewing: true
        },
        "the next look renews the place"
    );
}

#[test]
fn a_place_names_the_channel_only_while_it_is_subscribed() {
    let now = Instant::now();
    let mut acquisition = waiting(now);
    acquisition.woke(now + RENEW, None);
    assert_eq!(
        acquisition.request(now + RENEW, || false),
        Wait::InLine {
            channel: None,
            renewing: true
        }
    );
}

#[test]
fn a_holder_about_to_expire_is_looked_at_when_it_does_with_jitter() {
    let now = Instant::now();
    let mut acquisition = in_line(now);
    assert_eq!(
        acquisition.attempted(now, held(300)),
        Step::Sleep {
            until: now + Duration::from_millis(300),
            spread: EXPIRY_JITTER
        }
    );
}

#[test]
fn without_a_subscription_it_polls() {
    let now = Instant::now();
    let mut acquisition = starting(now + Duration::from_secs(10), Some(RENEW));
    first_try(&mut acquisition, now);
    assert!(matches!(
        acquisition.attempted(now, held(5000)),
        Step::Subscribe { .. }
    ));
    assert_eq!(
        acquisition.subscribed(Subscribed::Failed, channel()),
        Step::Attempt
    );
    assert!(!acquisition.listening());
    assert_eq!(
        look(&mut acquisition, now),
        Wait::InLine {
            channel: None,
            renewing: false
        }
    );
    let Step::Sleep { until, .. } = acquisition.attempted(now, held(5000)) else {
        panic!("a held lock is waited for");
    };
    assert_eq!(until, now + UNSUBSCRIBED_POLL);
}

#[test]
fn an_unconfirmed_subscription_listens_unless_its_wait_ended_at_the_deadline() {
    let now = Instant::now();
    let mut early = starting(now + Duration::from_secs(10), Some(RENEW));
    early.start(now, || true);
    early.subscribed(Subscribed::Unconfirmed, channel());
    assert!(early.listening());
    let mut late = starting(now + Duration::from_millis(100), Some(RENEW));
    assert_eq!(
        late.start(now, || true),
        Step::Subscribe {
            until: now + Duration::from_millis(100)
        }
    );
    assert_eq!(
        late.subscribed(Subscribed::Unconfirmed, channel()),
        Step::Attempt,
        "one look still"
    );
    assert!(!late.listening());
}

#[test]
fn sleeps_end_at_the_deadline_and_a_held_lock_then_times_out() {
    let now = Instant::now();
    let deadline = now + Duration::from_millis(100);
    let mut acquisition = starting(deadline, Some(RENEW));
    first_try(&mut acquisition, now);
    assert!(matches!(
        acquisition.attempted(now, held(5000)),
        Step::Subscribe { .. }
    ));
    acquisition.subscribed(Subscribed::Confirmed, channel());
    look(&mut acquisition, now);
    assert_eq!(
        acquisition.attempted(now, held(5000)),
        Step::Sleep {
            until: deadline,
            spread: Duration::ZERO
        }
    );
    // The last look at the deadline finds it held.
    assert_eq!(acquisition.woke(deadline, None), Step::Attempt);
    look(&mut acquisition, deadline);
    assert_eq!(acquisition.attempted(deadline, held(4900)), Step::TimedOut);
}

#[test]
fn a_zero_timeout_is_one_attempt() {
    let now = Instant::now();
    let mut acquisition = starting(now, Some(RENEW));
    assert_eq!(acquisition.start(now, || false), Step::Attempt);
    first_try(&mut acquisition, now);
    assert_eq!(acquisition.attempted(now, held(5000)), Step::TimedOut);
    assert!(!acquisition.in_line(), "it never took a place in line");
    assert!(!acquisition.holds_place());
}

#[test]
fn errors_back_off_then_start_over_under_a_new_token() {
    let now = Instant::now();
    let mut acquisition = in_line(now);
    let transient = Outcome::Failed { permanent: false };
    assert_eq!(acquisition.attempted(now, transient), Step::NewToken);
    assert!(!acquisition.holds_place(), "the old token's place is left");
    assert!(!acquisition.listening(), "the new token registers anew");
    let Step::Sleep { until, .. } = acquisition.rotated(now) else {
        panic!("a transient error is retried");
    };
    assert!(until > now && until <= now + Duration::from_millis(15));
    assert!(!acquisition.in_line());
    assert_eq!(acquisition.woke(until, None), Step::Attempt);
    assert_eq!(first_try(&mut acquisition, until), Wait::FirstTry);
    assert!(matches!(
        acquisition.attempted(until, held(100)),
        Step::Subscribe { .. }
    ));
}

#[test]
fn backoff_grows_with_errors_and_starts_over_once_redis_answers() {
    let now = Instant::now();
    let mut acquisition = starting(now + Duration::from_secs(60), Some(RENEW));
    let mut pauses = Vec::new();
    for _ in 0..3 {
        first_try(&mut acquisition, now);
        let transient = Outcome::Failed { permanent: false };
        assert_eq!(acquisition.attempted(now, transient), Step::NewToken);
        let Step::Sleep { until, .. } = acquisition.rotated(now) else {
            panic!("a transient error is retried");
        };
        pauses.push(until - now);
    }
    assert!(pauses[2] >= Duration::from_millis(40), "{pauses:?}");
    first_try(&mut acquisition, now);
    acquisition.attempted(now, held(5000));
    first_try(&mut acquisition, now);
    acquisition.attempted(now, Outcome::Failed { permanent: false });
    let Step::Sleep { until, .. } = acquisition.rotated(now) else {
        panic!("a transient error is retried");
    };
    assert!(until - now <= Duration::from_millis(15));
}

#[test]
fn a_waiter_interrupted_in_line_keeps_its_place_and_looks_again() {
    let now = Instant::now();
    let mut acquisition = in_line(now);
    let Step::Sleep { until, .. } = acquisition.attempted(now, Outcome::Interrupted) else {
        panic!("an interrupted look is retried");
    };
    assert!(until > now && until <= now + Duration::from_millis(15));
    assert!(acquisition.in_line());
    assert!(acquisition.holds_place());
    assert_eq!(acquisition.woke(until, None), Step::Attempt);
    assert!(matches!(
        look(&mut acquisition, until),
        Wait::InLine { renewing: true, .. }
    ));
    let late = now + Duration::from_secs(10);
    assert_eq!(
        acquisition.attempted(late, Outcome::Interrupted),
        Step::Failed
    );
}

#[test]
fn an_interrupted_first_try_starts_over_like_any_error() {
    let now = Instant::now();
    let mut acquisition = starting(now + Duration::from_secs(10), Some(RENEW));
    first_try(&mut acquisition, now);
    assert_eq!(
        acquisition.attempted(now, Outcome::Interrupted),
        Step::NewToken
    );
}

#[test]
fn permanent_errors_and_errors_at_the_deadline_fail() {
    let now = Instant::now();
    let mut acquisition = starting(now + Duration::from_secs(1), Some(RENEW));
    first_try(&mut acquisition, now);
    assert_eq!(
        acquisition.attempted(now, Outcome::Failed { permanent: true }),
        Step::Failed
    );
    let mut late = starting(now, Some(RENEW));
    first_try(&mut late, now);
    assert_eq!(
        late.attempted(now, Outcome::Failed { permanent: false }),
        Step::Failed
    );
}

#[test]
fn without_renewal_a_waiter_sleeps_until_the_holder_expires() {
    let now = Instant::now();
    let mut acquisition = starting(now + Duration::from_secs(60), None);
    first_try(&mut acquisition, now);
    acquisition.attempted(now, held(5000));
    acquisition.subscribed(Subscribed::Confirmed, channel());
    look(&mut acquisition, now);
    let Step::Sleep { until, .. } = acquisition.attempted(now, held(5000)) else {
        panic!("a held lock is waited for");
    };
    assert_eq!(until, now + Duration::from_secs(5));
}

// Cancellation: what a driver dropped in each state must leave behind.

#[test]
fn cancelled_before_joining_leaves_no_place() {
    let now = Instant::now();
    let mut acquisition = starting(now + Duration::from_secs(10), Some(RENEW));
    acquisition.start(now, || false);
    assert!(!acquisition.holds_place(), "before the first try");
    first_try(&mut acquisition, now);
    assert!(!acquisition.holds_place(), "first try in flight");
    acquisition.attempted(now, held(5000));
    assert!(!acquisition.holds_place(), "subscribing");
    acquisition.subscribed(Subscribed::Confirmed, channel());
    assert!(!acquisition.holds_place(), "about to join");
}

#[test]
fn cancelled_in_line_leaves_its_place() {
    let now = Instant::now();
    let mut acquisition = in_line(now);
    assert!(
        acquisition.holds_place(),
        "join in flight: it may take a place"
    );
    acquisition.attempted(now, held(5000));
    assert!(acquisition.holds_place(), "asleep in line");
    acquisition.woke(now + RENEW, None);
    look(&mut acquisition, now + RENEW);
    assert!(acquisition.holds_place(), "renewal in flight");
    acquisition.attempted(now + RENEW, Outcome::Interrupted);
    assert!(
        acquisition.holds_place(),
        "backing off after an interruption"
    );
}

#[test]
fn cancelled_while_confirming_leaves_its_place() {
    let now = Instant::now();
    let mut acquisition = waiting(now);
    acquisition.terms.messages = Messages::ReplicatedHandOff;
    assert_eq!(
        acquisition.woke(now, Some(Grant::Granted { fence: 1 })),
        Step::Confirm
    );
    assert!(
        acquisition.holds_place(),
        "the lock handed over is passed on"
    );
}

#[test]
fn cancelled_after_an_error_or_once_acquired_leaves_nothing() {
    let now = Instant::now();
    let mut acquisition = in_line(now);
    acquisition.attempted(now, Outcome::Failed { permanent: false });
    assert!(
        !acquisition.holds_place(),
        "the failed token is cleaned up by itself"
    );
    let mut acquired = waiting(now);
    acquired.woke(now, Some(Grant::Granted { fence: 1 }));
    assert!(!acquired.holds_place(), "a guard owns the lock");
}

// Timeout in each state.

#[test]
fn a_first_try_at_the_deadline_times_out() {
    let now = Instant::now();
    let deadline = now + Duration::from_millis(10);
    let mut acquisition = starting(deadline, Some(RENEW));
    first_try(&mut acquisition, deadline);
    assert_eq!(acquisition.attempted(deadline, held(5000)), Step::TimedOut);
}

#[test]
fn a_subscription_is_waited_for_until_the_deadline_at_most() {
    let now = Instant::now();
    let deadline = now + Duration::from_millis(10);
    let mut acquisition = starting(deadline, Some(RENEW));
    first_try(&mut acquisition, now);
    assert_eq!(
        acquisition.attempted(now, held(5000)),
        Step::Subscribe { until: deadline }
    );
    acquisition.subscribed(Subscribed::Unconfirmed, channel());
    look(&mut acquisition, deadline);
    assert_eq!(acquisition.attempted(deadline, held(5000)), Step::TimedOut);
}

#[test]
fn an_error_backoff_ends_at_the_deadline() {
    let now = Instant::now();
    let deadline = now + Duration::from_millis(1);
    let mut acquisition = starting(deadline, Some(RENEW));
    first_try(&mut acquisition, now);
    acquisition.attempted(now, Outcome::Failed { permanent: false });
    assert_eq!(
        acquisition.rotated(now),
        Step::Sleep {
            until: deadline,
            spread: Duration::ZERO
        }
    );
}

#[test]
fn an_unconfirmed_hand_off_at_the_deadline_looks_once_more() {
    let now = Instant::now();
    let (mut acquisition, deadline) = confirming_before_a_close_deadline(now);
    assert_eq!(
        acquisition.confirmed(deadline, deadline, Confirmation::Doubtful),
        Step::Attempt
    );
    look(&mut acquisition, deadline);
    assert_eq!(acquisition.attempted(deadline, held(5000)), Step::TimedOut);
}

#[test]
fn a_hand_off_given_back_at_the_deadline_fails_with_its_error() {
    let now = Instant::now();
    let (mut acquisition, deadline) = confirming_before_a_close_deadline(now);
    assert_eq!(
        acquisition.confirmed(now, deadline, Confirmation::GivenBack),
        Step::Failed,
        "given back at the deadline: no new token, the error that made it give the lock back"
    );
}
