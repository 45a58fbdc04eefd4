//! Redlock: one lock over several independent Redis masters, held when a majority holds it.
//!
//! Follows the algorithm of the Redis distributed-locks page: every operation goes to all
//! masters at once (never one after another), each with a short per-node timeout, so one slow
//! or stopped master costs at most that timeout. An acquisition counts only if a majority
//! granted it within the lock's validity (ttl minus the time the fan-out took minus an allowance
//! for clock drift); otherwise whatever was granted is given back at once.
//!
//! **Waking waiters.** Masters cannot agree on a line, so each keeps a wake list per lock: a
//! subscribed waiter's attempt takes a place (`"<channel> <token>"`, with a lease) on every
//! master where it finds the lock held by someone else, and renews it with every later attempt
//! (at least every [`RENEW`](super::RENEW)). A release deletes the lock on each master and
//! wakes only the first waiter whose lease still runs there, taking its place out, with one
//! message on its process's channel; the woken waiter tries every master again, and takes its
//! places again where it loses. So a release wakes at most one waiter per master, however many
//! processes wait. An attempt that does not reach a majority gives back what it won, and tries
//! again itself: soon when nobody can hold a majority, or else when whoever may hold one
//! releases it (which wakes waiters) or expires. Its give-back wakes nobody when another holder
//! has a majority of the answers (a woken waiter would only find the lock held); otherwise the
//! lock may be free once every contender has given back, and each master given back wakes one
//! waiter, as a release does.

mod master;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::failure::{self, Failure};
use super::line::Look;
pub(crate) use master::Master;
use master::Vote;

use super::{Attempt, Capabilities, LockRequest, Wait};
use crate::backend::keys::LockKeys;

/// Independent masters voting on every lock.
pub(crate) struct Quorum {
    nodes: Vec<Master>,
    node_timeout: Duration,
    /// This manager's wake-up channel, named in its waiters' places.
    channel: Arc<str>,
}

impl Quorum {
    pub(crate) fn new(nodes: Vec<Master>, node_timeout: Duration, channel: Arc<str>) -> Self {
        Quorum {
            nodes,
            node_timeout,
            channel,
        }
    }

    /// What Redlock can do: no fencing (independent masters keep no common counter), no
    /// hand-off (a release only wakes a waiter), each master's vote sent again on its own.
    pub(crate) const CAPABILITIES: Capabilities = Capabilities {
        fencing: false,
        hands_over: false,
        resends_commands: false,
        waits_for_replicas: false,
        keeps_place_on_drop: false,
        leases: false,
        // Taken one by one in the order of their keys (see `manager::all`).
        together: crate::backend::Together::Never,
        detects_deadlocks: false,
    };

    pub(crate) fn nodes(&self) -> &[Master] {
        &self.nodes
    }

    /// How many masters make a majority.
    pub(crate) fn majority(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Checks that a majority of the masters answer; done as soon as one has.
    ///
    /// Not bounded by the per-node timeout, which is for lock operations on open connections:
    /// opening one (TCP, handshake, loading the scripts) takes longer, and under load more than
    /// 100 ms, so that bound would fail `connect` on healthy masters. Each master's connect and
    /// response timeouts bound it instead, and a frozen minority costs nothing once a majority
    /// answered.
    pub(crate) async fn ping(&self, probe: &LockKeys) -> failure::Result<()> {
        let mut pending: FuturesUnordered<_> =
            self.nodes.iter().map(|node| node.ping(probe)).collect();
        let (mut results, mut answered) = (Vec::new(), 0);
        while let Some(result) = pending.next().await {
            if result.is_ok() {
                answered += 1;
                if answered >= self.majority() {
                    return Ok(());
                }
            }
            results.push(result);
        }
        self.check_quorum(&results, answered)
    }

    /// One attempt on every master; see the module documentation.
    pub(crate) async fn try_lock(&self, request: LockRequest<'_>) -> failure::Result<Attempt> {
        // Independent masters keep no common counter: a manager refuses fencing here.
        let LockRequest {
            keys,
            token,
            ttl_millis,
            wait,
            ..
        } = request;
        let member = match &wait {
            Wait::InLine {
                channel: Some(channel),
                ..
            } => Some(member(channel, token)),
            _ => None,
        };
        let first_try = wait == Wait::FirstTry;
        let started = Instant::now();
        let results = self
            .on_each(|node| node.vote(keys, token, ttl_millis, first_try, member.as_deref()))
            .await;
        let granted = results
            .iter()
            .filter(|result| matches!(result, Ok(Vote::Granted)))
            .count();
        let ttl = Duration::from_millis(ttl_millis);
        if granted >= self.majority() && started.elapsed() + drift(ttl) < ttl {
            return Ok(Attempt::Acquired {
                fence: None,
                // Counted from when the attempt was sent, less the drift allowance.
                expires_in: ttl.saturating_sub(drift(ttl)),
            });
        }
        let held: Vec<(Option<Duration>, Option<&str>)> = results
            .iter()
            .filter_map(|result| match result {
                Ok(Vote::Held { remaining, holder }) => Some((*remaining, holder.as_deref())),
                _ => None,
            })
            .collect();
        // Not ours: give back what some masters granted (or may still grant, if they did not
        // answer) so the next contender does not wait for those to expire. Quietly when
        // another holder has a majority of the answers: a waiter woken now would only find
        // the lock held by it, whose release wakes waiters. Otherwise nobody may hold the lock
        // once every contender has given back (a split, a majority granted too late, or too
        // few masters answering to tell): wake a waiter on each master given back, so that
        // waiters asleep behind what looked like a holder with the silent masters try again.
        if granted > 0 || results.iter().any(Result::is_err) {
            let wake = likeliest_holder(&held).map_or(0, |(_, count)| count) < self.majority();
            let to_give_back: Vec<bool> = results
                .iter()
                .map(|result| !matches!(result, Ok(Vote::Held { .. })))
                .collect();
            let _ = self
                .on_each_where(&to_give_back, |node| {
                    node.release_vote(keys, token, None, wake)
                })
                .await;
        }
        let answered = results.iter().filter(|result| result.is_ok()).count();
        self.check_quorum(&results, answered)?;
        Ok(Attempt::Held {
            remaining: self.held_for(&held, results.len() - answered),
        })
    }

    /// How long to wait before trying again, given the remaining ttl and the holder (`None`:
    /// not known) of each master that answered "held by someone else", and how many masters did
    /// not answer.
    ///
    /// While one holder (and the silent masters, which may be its too) can still make up a
    /// majority, it may hold the lock, and no retry can win before enough of its masters
    /// expire: wait for the release's wake-up, or until the k-th shortest of its ttls has run
    /// out, k being how many must expire before no majority is left. Retrying sooner only wins
    /// the masters that lost their data and gives them back, over and over, for as long as the
    /// holder holds. Holders that were not asked (a first try's `SET NX`) count as one.
    ///
    /// Otherwise no contender can have a majority (a split vote, or a majority granted too
    /// late): retry soon, after a random delay, so the contenders do not collide again.
    /// `None` when the masters did not say when (a plain `SET NX` does not ask, a key without
    /// expiry has no end).
    fn held_for(
        &self,
        held: &[(Option<Duration>, Option<&str>)],
        unanswered: usize,
    ) -> Option<Duration> {
        let Some((likeliest, count)) = likeliest_holder(held) else {
            return Some(soon());
        };
        let possible_holders = count + unanswered;
        if possible_holders < self.majority() {
            return Some(soon());
        }
        // A ttl not known (no expiry, or not asked) counts as the longest.
        let must_expire = possible_holders - self.majority() + 1;
        let mut known: Vec<Duration> = held
            .iter()
            .filter(|(_, holder)| *holder == likeliest)
            .filter_map(|(remaining, _)| *remaining)
            .collect();
        known.sort_unstable();
        known.get(must_expire - 1).copied()
    }

    /// Releases on every master, waking the first live waiter on each master where the lock
    /// was ours, and takes `token`'s places in the wake lists out (a waiter that gives up, or
    /// one that won a majority while some masters were held by others); ours if a majority
    /// still held it.
    pub(crate) async fn unlock(&self, keys: &LockKeys, token: &str) -> failure::Result<bool> {
        let member = member(&self.channel, token);
        let results = self
            .on_each(|node| node.release_vote(keys, token, Some(&member), true))
            .await;
        self.majority_true(&results)
    }

    /// Leaves the lock to expire `keep_millis` from now on every master; ours if a majority
    /// still held it.
    pub(crate) async fn hold(
        &self,
        keys: &LockKeys,
        token: &str,
        keep_millis: u64,
    ) -> failure::Result<bool> {
        let results = self
            .on_each(|node| async move { Ok(node.hold(keys, token, keep_millis).await?.is_ours()) })
            .await;
        self.majority_true(&results)
    }

    /// Extends on every master; succeeds if a majority extended it within the ttl.
    pub(crate) async fn extend(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> failure::Result<bool> {
        let started = Instant::now();
        let results = self
            .on_each(
                |node| async move { Ok(node.extend(keys, token, ttl_millis).await?.is_ours()) },
            )
            .await;
        let ttl = Duration::from_millis(ttl_millis);
        Ok(self.majority_true(&results)? && started.elapsed() + drift(ttl) < ttl)
    }

    /// Whether a majority of the masters hold `token` for the lock.
    pub(crate) async fn is_held(&self, keys: &LockKeys, token: &str) -> failure::Result<bool> {
        let results = self.on_each(|node| node.is_held(keys, token)).await;
        self.majority_true(&results)
    }

    /// The lock as a majority of the masters hold it: the value a majority agree on, with the
    /// shortest time left among them; `None` when no value has a majority (free, or taken on
    /// too few masters to count as held). Masters have no line, so no waiters are counted, and
    /// no fencing counter.
    pub(crate) async fn inspect(&self, keys: &LockKeys) -> failure::Result<Option<Look>> {
        let results = self.on_each(|node| node.inspect(keys)).await;
        let answered = results.iter().filter(|result| result.is_ok()).count();
        self.check_quorum(&results, answered)?;
        let looks: Vec<&Look> = results
            .iter()
            .filter_map(|result| result.as_ref().ok()?.as_ref())
            .collect();
        for look in &looks {
            let agreeing: Vec<&&Look> = looks
                .iter()
                .filter(|other| other.value == look.value)
                .collect();
            if agreeing.len() >= self.majority() {
                return Ok(Some(Look {
                    value: look.value.clone(),
                    ttl_left: agreeing.iter().filter_map(|look| look.ttl_left).min(),
                    waiters: 0,
                    fence: None,
                    // Each master recorded its own grant, by its own clock: the earliest.
                    granted: agreeing.iter().filter_map(|look| look.granted).min(),
                    leased: None,
                }));
            }
        }
        Ok(None)
    }

    /// Runs `operation` on every master at once, each bounded by the per-node timeout.
    async fn on_each<'a, T, F, Fut>(&'a self, operation: F) -> Vec<failure::Result<T>>
    where
        F: Fn(&'a Master) -> Fut,
        Fut: Future<Output = failure::Result<T>> + 'a,
    {
        join_all(self.nodes.iter().map(|node| {
            let call = operation(node);
            async move {
                tokio::time::timeout(self.node_timeout, call)
                    .await
                    .unwrap_or_else(|_| Err(node_timed_out(self.node_timeout)))
            }
        }))
        .await
    }

    /// Runs `operation` at once on the masters whose entry in `which` is `true`, each bounded by
    /// the per-node timeout.
    async fn on_each_where<'a, T, F, Fut>(
        &'a self,
        which: &[bool],
        operation: F,
    ) -> Vec<failure::Result<T>>
    where
        F: Fn(&'a Master) -> Fut,
        Fut: Future<Output = failure::Result<T>> + 'a,
    {
        join_all(
            self.nodes
                .iter()
                .zip(which)
                .filter(|(_, &chosen)| chosen)
                .map(|(node, _)| {
                    let call = operation(node);
                    async move {
                        tokio::time::timeout(self.node_timeout, call)
                            .await
                            .unwrap_or_else(|_| Err(node_timed_out(self.node_timeout)))
                    }
                }),
        )
        .await
    }

    /// `true` when a majority answered `true`, `false` when enough answered `false` that no
    /// majority is left; an error when the silent masters could still make up a majority (they
    /// may hold our token: "not ours" would then be false).
    fn majority_true(&self, results: &[failure::Result<bool>]) -> failure::Result<bool> {
        let yes = results
            .iter()
            .filter(|result| matches!(result, Ok(true)))
            .count();
        if yes >= self.majority() {
            return Ok(true);
        }
        let answered = results.iter().filter(|result| result.is_ok()).count();
        self.check_quorum(results, answered)?;
        let silent = results.len() - answered;
        if yes + silent >= self.majority() {
            return Err(self.undecided(results, yes, silent));
        }
        Ok(false)
    }

    /// The failure of an answer that the silent masters could still turn either way.
    fn undecided<T>(&self, results: &[failure::Result<T>], yes: usize, silent: usize) -> Failure {
        Failure::Undecided {
            masters: self.nodes.len(),
            confirmed: yes,
            silent,
            needed: self.majority(),
            last_error: last_error(results),
        }
    }

    /// A failure naming how many masters answered, when fewer than a majority did.
    fn check_quorum<T>(
        &self,
        results: &[failure::Result<T>],
        answered: usize,
    ) -> failure::Result<()> {
        if answered >= self.majority() {
            return Ok(());
        }
        Err(Failure::NoQuorum {
            masters: self.nodes.len(),
            answered,
            needed: self.majority(),
            last_error: last_error(results),
        })
    }
}

/// The last error among `results`, as text (empty when none failed).
fn last_error<T>(results: &[failure::Result<T>]) -> String {
    results
        .iter()
        .rev()
        .find_map(|result| result.as_ref().err())
        .map_or_else(String::new, ToString::to_string)
}

/// The holder on the most masters, and on how many: only it can have a majority. Holders that
/// were not asked (a first try's `SET NX`) count as one.
fn likeliest_holder<'a>(
    held: &[(Option<Duration>, Option<&'a str>)],
) -> Option<(Option<&'a str>, usize)> {
    let mut counts: Vec<(Option<&str>, usize)> = Vec::new();
    for (_, holder) in held {
        match counts.iter_mut().find(|(known, _)| known == holder) {
            Some((_, count)) => *count += 1,
            None => counts.push((*holder, 1)),
        }
    }
    counts.into_iter().max_by_key(|(_, count)| *count)
}

/// A waiter's place in a wake list: its process's channel, then its token.
fn member(channel: &str, token: &str) -> String {
    let mut member = String::with_capacity(channel.len() + 1 + token.len());
    member.push_str(channel);
    member.push(' ');
    member.push_str(token);
    member
}

/// When no contender can hold a majority: soon, with jitter so they do not collide again.
fn soon() -> Duration {
    Duration::from_millis(1) + crate::support::retry::jitter(Duration::from_millis(10))
}

/// Allowance for clock drift between this host and the masters: 1 % of the ttl plus 2 ms, as
/// the Redlock description suggests.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// A master that did not answer within the per-node timeout: the request was sent, and may
/// still run there.
fn node_timed_out(limit: Duration) -> Failure {
    Failure::NoAnswer {
        what: "a Redlock master",
        waited: limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Timeouts;
    use crate::redis::connection::{Connections, Endpoint};

    /// `n` masters that are never contacted.
    fn masters(n: usize) -> Quorum {
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            response: Duration::from_secs(1),
        };
        let nodes = (0..n)
            .map(|_| {
                let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
                Master::new(Connections::new(Endpoint::Standalone(client), timeouts))
            })
            .collect();
        Quorum::new(nodes, Duration::from_millis(100), Arc::from("channel"))
    }

    fn five() -> Quorum {
        masters(5)
    }

    /// A master that did not answer.
    fn silent() -> failure::Result<bool> {
        Err(node_timed_out(Duration::from_millis(100)))
    }

    // An `Option` because the remaining ttls it stands for are: a master may not say.
    #[allow(clippy::unnecessary_wraps)]
    fn ms(millis: u64) -> Option<Duration> {
        Some(Duration::from_millis(millis))
    }

    /// The same holder (or none known) on every master.
    fn by_one(remaining: &[Option<Duration>]) -> Vec<(Option<Duration>, Option<&'static str>)> {
        remaining
            .iter()
            .map(|remaining| (*remaining, None))
            .collect()
    }

    #[test]
    fn a_held_majority_is_waited_for_until_it_cannot_be_a_majority_any_more() {
        let quorum = five();
        // Held on 4 (one master lost the key): a majority is gone once 2 have expired.
        assert_eq!(
            quorum.held_for(&by_one(&[ms(900), ms(300), ms(500), ms(700)]), 0),
            ms(500)
        );
        // Held on 3: the first expiry ends the majority.
        assert_eq!(
            quorum.held_for(&by_one(&[ms(900), ms(300), ms(500)]), 0),
            ms(300)
        );
        // Held on 2 and one master silent: it may hold it too.
        assert_eq!(quorum.held_for(&by_one(&[ms(900), ms(300)]), 1), ms(300));
        // Without an expiry, or not asked: not known.
        assert_eq!(quorum.held_for(&by_one(&[None, None, None]), 0), None);
        assert_eq!(
            quorum.held_for(&by_one(&[None, ms(400), ms(200), None]), 0),
            ms(400)
        );
        // Held by "a" on 3 and by "b" on 1: only a's ttls count.
        let held = [
            (ms(100), Some("b")),
            (ms(900), Some("a")),
            (ms(700), Some("a")),
            (ms(800), Some("a")),
        ];
        assert_eq!(quorum.held_for(&held, 0), ms(700));
    }

    #[test]
    fn a_split_with_no_possible_majority_retries_soon() {
        let quorum = five();
        let long = ms(30_000);
        for (held, unanswered) in [
            (by_one(&[long, long]), 0),
            (by_one(&[long]), 1),
            (vec![], 0),
            // Three contenders split the five masters 2 / 2 / 1: none can have a majority.
            (
                vec![
                    (long, Some("a")),
                    (long, Some("a")),
                    (long, Some("b")),
                    (long, Some("b")),
                ],
                0,
            ),
            (
                vec![(long, Some("a")), (long, Some("b")), (long, Some("c"))],
                0,
            ),
        ] {
            let retry = quorum.held_for(&held, unanswered).unwrap();
            assert!(retry <= Duration::from_millis(11), "{held:?}: {retry:?}");
        }
    }

    #[test]
    fn a_majority_is_more_than_half_of_the_masters() {
        let majorities: Vec<usize> = (1..=6).map(|n| masters(n).majority()).collect();
        assert_eq!(majorities, [1, 2, 2, 3, 3, 4]);
    }

    #[test]
    fn only_yes_votes_count_towards_a_majority() {
        let quorum = five();
        let (yes, no) = (|| Ok(true), || Ok(false));
        assert!(quorum
            .majority_true(&[yes(), yes(), yes(), no(), silent()])
            .unwrap());
        assert!(!quorum
            .majority_true(&[yes(), yes(), no(), no(), no()])
            .unwrap());
        // Three no votes leave no majority, whatever the silent masters hold.
        assert!(!quorum
            .majority_true(&[yes(), no(), no(), no(), silent()])
            .unwrap());
        // Two yes votes and two silent masters, which may hold it too: not "no".
        let error = quorum
            .majority_true(&[yes(), yes(), no(), silent(), silent()])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("2 of 5 Redlock masters confirmed and 2 did not answer"),
            "{error}"
        );
    }

    #[test]
    fn too_few_answers_are_an_error_that_names_the_counts_and_the_last_cause() {
        let quorum = five();
        let error = quorum
            .majority_true(&[Ok(true), Ok(true), silent(), silent(), silent()])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("only 2 of 5 Redlock masters answered")
                && error.contains("a majority (3) is needed")
                && error.contains("(last error: a Redlock master did not answer within 100ms)")
                && error.contains("bring masters back or check the URLs"),
            "{error}"
        );
        assert!(quorum.check_quorum(&[silent(), silent()], 3).is_ok());
    }

    #[test]
    fn the_drift_allowance_is_one_percent_of_the_ttl_plus_two_milliseconds() {
        assert_eq!(drift(Duration::from_secs(10)), Duration::from_millis(102));
        assert_eq!(drift(Duration::from_millis(100)), Duration::from_millis(3));
    }
}
