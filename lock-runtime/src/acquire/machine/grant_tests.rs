//! Clock-free tests of when the acquisition state machine trusts a hand-off message, and of
//! the token it goes on under after an error: time is passed in.

use super::tests::{
    asleep_in_line, channel, confirming, first_try, held, in_line, look, starting, terms, waiting,
    won, CLAIM, RENEW, TTL,
};
use super::*;

// Grant trust.

#[test]
fn a_message_after_the_join_is_trusted_for_the_claim_from_the_join() {
    let now = Instant::now();
    let mut acquisition = waiting(now);
    let read = now + Duration::from_millis(50);
    assert_eq!(
        acquisition.woke(read, Some(Grant::Granted { fence: 9 })),
        Step::Acquired(Won {
            fence: None,
            since: now,
            expires_in: CLAIM,
            via: Via::HandOff
        }),
        "ours from the join's send time, for the claim, without asking Redis"
    );
    assert!(!acquisition.holds_place(), "the place became the lock");
}

#[test]
fn a_trusted_message_carries_the_fence_when_one_was_asked_for() {
    let now = Instant::now();
    let mut acquisition = asleep_in_line(
        Terms {
            fencing: true,
            ..terms(now + Duration::from_secs(10), Some(RENEW))
        },
        now,
    );
    assert_eq!(
        won(acquisition.woke(now, Some(Grant::Granted { fence: 9 }))).fence,
        Some(9)
    );
}

#[test]
fn the_claim_is_the_ttl_when_that_is_shorter() {
    let now = Instant::now();
    let ttl = Duration::from_secs(1);
    let mut acquisition = asleep_in_line(
        Terms {
            ttl,
            ..terms(now + Duration::from_secs(10), Some(RENEW))
        },
        now,
    );
    assert_eq!(
        won(acquisition.woke(now, Some(Grant::Granted { fence: 1 }))).expires_in,
        ttl
    );
    let mut late = asleep_in_line(
        Terms {
            ttl,
            ..terms(now + Duration::from_secs(10), Some(RENEW))
        },
        now,
    );
    assert_eq!(
        late.woke(now + ttl - GRANT_MARGIN, Some(Grant::Granted { fence: 1 })),
        Step::Attempt,
        "within the margin of a 1 s claim"
    );
}

#[test]
fn a_message_read_too_late_is_checked_with_redis() {
    let now = Instant::now();
    let mut acquisition = waiting(now);
    // Read exactly when the claim has only the margin left: no longer trusted.
    let read = now + CLAIM - GRANT_MARGIN;
    assert_eq!(
        acquisition.woke(read, Some(Grant::Granted { fence: 1 })),
        Step::Attempt
    );
    assert!(acquisition.holds_place(), "still in line until Redis says");
    let mut just_in_time = waiting(now);
    let read = now + CLAIM - GRANT_MARGIN - Duration::from_millis(1);
    assert_eq!(
        won(just_in_time.woke(read, Some(Grant::Granted { fence: 1 }))).via,
        Via::HandOff
    );
}

#[test]
fn a_message_after_a_look_that_found_the_lock_held_is_stale() {
    let now = Instant::now();
    let mut acquisition = waiting(now);
    // The renewal found the lock held: a message read since may predate it.
    acquisition.woke(now + RENEW, None);
    look(&mut acquisition, now + RENEW);
    acquisition.attempted(now + RENEW, held(3000));
    let read = now + RENEW + Duration::from_millis(10);
    assert_eq!(
        acquisition.woke(read, Some(Grant::Granted { fence: 1 })),
        Step::Attempt
    );
}

#[test]
fn a_message_before_the_join_is_answered_is_trusted_once_it_is() {
    // The release may hand the lock over while the join is in flight; the message is read
    // at the sleep after the join's answer ("held", as the join ran before the release).
    let now = Instant::now();
    let mut acquisition = in_line(now);
    let answered = now + Duration::from_millis(5);
    assert!(matches!(
        acquisition.attempted(answered, held(100)),
        Step::Sleep { .. }
    ));
    assert_eq!(
        won(acquisition.woke(answered, Some(Grant::Granted { fence: 3 }))).since,
        now,
        "counted from the join's send time"
    );
}

#[test]
fn a_lost_message_is_made_up_for_by_the_next_look() {
    let now = Instant::now();
    let mut acquisition = waiting(now);
    // No message: the renewal's timer ends the sleep, or a dropped connection says
    // messages may be lost. Either way the waiter looks, and the look finds the lock ours.
    assert_eq!(acquisition.woke(now + RENEW, None), Step::Attempt);
    look(&mut acquisition, now + RENEW);
    let acquired = Outcome::Acquired {
        fence: None,
        expires_in: Duration::from_millis(2500),
    };
    assert_eq!(
        acquisition.attempted(now + RENEW, acquired),
        Step::Acquired(Won {
            fence: None,
            since: now + RENEW,
            expires_in: Duration::from_millis(2500),
            via: Via::Line
        })
    );
}

#[test]
fn a_message_without_a_join_is_never_trusted() {
    // Polling after a failed subscription: no message comes; a stray one is not trusted
    // before a join was answered.
    let now = Instant::now();
    let mut acquisition = starting(now + Duration::from_secs(10), Some(RENEW));
    acquisition.start(now, || true);
    acquisition.subscribed(Subscribed::Confirmed, channel());
    assert_eq!(
        acquisition.woke(now, Some(Grant::Granted { fence: 1 })),
        Step::Attempt
    );
}

#[test]
fn on_redlock_a_message_only_wakes() {
    let now = Instant::now();
    let mut acquisition = asleep_in_line(
        Terms {
            messages: Messages::WakeUp,
            ..terms(now + Duration::from_secs(10), Some(RENEW))
        },
        now,
    );
    assert_eq!(
        acquisition.woke(now, Some(Grant::Granted { fence: 1 })),
        Step::Attempt
    );
    assert_eq!(
        acquisition.woke(now, Some(Grant::FenceFailed)),
        Step::Attempt
    );
}

#[test]
fn a_failed_fence_fails_the_acquisition() {
    let now = Instant::now();
    let mut acquisition = waiting(now);
    assert_eq!(
        acquisition.woke(now + CLAIM, Some(Grant::FenceFailed)),
        Step::FenceFailed
    );
}

#[test]
fn with_replicas_a_trusted_message_is_confirmed_first() {
    let now = Instant::now();
    let mut acquisition = asleep_in_line(
        Terms {
            messages: Messages::ReplicatedHandOff,
            fencing: true,
            ..terms(now + Duration::from_secs(10), Some(RENEW))
        },
        now,
    );
    assert_eq!(
        acquisition.woke(now, Some(Grant::Granted { fence: 4 })),
        Step::Confirm
    );
    assert!(acquisition.holds_place());
    let sent = now + Duration::from_millis(1);
    assert_eq!(
        acquisition.confirmed(sent, sent, Confirmation::Ours),
        Step::Acquired(Won {
            fence: Some(4),
            since: sent,
            expires_in: TTL,
            via: Via::Confirmed
        })
    );
    let mut refused = confirming(now);
    assert_eq!(
        refused.confirmed(now, now, Confirmation::Doubtful),
        Step::Attempt
    );
}

// Token rotation.

#[test]
fn a_hand_off_given_back_for_want_of_replicas_goes_on_under_a_new_token() {
    let now = Instant::now();
    let mut acquisition = confirming(now);
    assert_eq!(
        acquisition.confirmed(now, now, Confirmation::GivenBack),
        Step::NewToken
    );
    assert!(!acquisition.holds_place(), "the place went with the lock");
    assert_eq!(
        acquisition.woke(now, Some(Grant::Granted { fence: 5 })),
        Step::Attempt,
        "a message to the token that gave the lock back is not trusted"
    );
}

#[test]
fn a_new_token_joins_anew_and_its_messages_are_trusted_from_its_own_join() {
    let now = Instant::now();
    let mut acquisition = waiting(now);
    acquisition.woke(now + RENEW, None);
    look(&mut acquisition, now + RENEW);
    let failed = now + RENEW;
    assert_eq!(
        acquisition.attempted(failed, Outcome::Failed { permanent: false }),
        Step::NewToken
    );
    assert_eq!(
        acquisition.woke(failed, Some(Grant::Granted { fence: 1 })),
        Step::Attempt,
        "the old token's place is no longer trusted"
    );
    acquisition.rotated(failed);
    let retry = failed + Duration::from_millis(20);
    assert_eq!(first_try(&mut acquisition, retry), Wait::FirstTry);
    assert!(matches!(
        acquisition.attempted(retry, held(5000)),
        Step::Subscribe { .. }
    ));
    acquisition.subscribed(Subscribed::Confirmed, channel());
    assert_eq!(
        look(&mut acquisition, retry),
        Wait::InLine {
            channel: Some(channel()),
            renewing: false
        },
        "the new token takes a place of its own"
    );
    acquisition.attempted(retry, held(5000));
    assert_eq!(
        won(acquisition.woke(retry, Some(Grant::Granted { fence: 2 }))).since,
        retry
    );
}
