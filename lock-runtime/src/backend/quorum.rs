//! Redlock: one lock over several independent Redis masters, held when a majority holds it.
//!
//! Follows the algorithm of the Redis distributed-locks page: every operation goes to all
//! masters at once (never one after another), each with a short per-node timeout, so one slow
//! or stopped master costs at most that timeout. An acquisition counts only if a majority
//! granted it within the lock's validity (ttl minus the time the fan-out took minus an allowance
//! for clock drift); otherwise whatever was granted is given back at once.

use std::future::Future;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::{RedisError, RedisResult};
use tokio::time::Instant;

use super::node::Look;
use super::node::Node;
use super::{Attempt, Wait};
use crate::keys::LockKeys;

/// Independent masters voting on every lock.
pub(crate) struct Quorum {
    nodes: Vec<Node>,
    node_timeout: Duration,
}

impl Quorum {
    pub(crate) fn new(nodes: Vec<Node>, node_timeout: Duration) -> Self {
        Quorum {
            nodes,
            node_timeout,
        }
    }

    pub(crate) fn nodes(&self) -> &[Node] {
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
    pub(crate) async fn ping(&self, probe: &LockKeys) -> RedisResult<()> {
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
    pub(crate) async fn try_lock(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
        wait: Wait,
    ) -> RedisResult<Attempt> {
        let started = Instant::now();
        let results = self
            .on_each(|node| node.try_lock(keys, token, ttl_millis, false, wait.clone()))
            .await;
        let granted = results
            .iter()
            .filter(|result| matches!(result, Ok(Attempt::Acquired { .. })))
            .count();
        let ttl = Duration::from_millis(ttl_millis);
        if granted >= self.majority() && started.elapsed() + drift(ttl) < ttl {
            return Ok(Attempt::Acquired {
                fence: None,
                // Counted from when the attempt was sent, less the drift allowance.
                expires_in: ttl - drift(ttl),
            });
        }
        // Not ours: give back what some masters granted (or may still grant, if they did not
        // answer) so the next contender does not wait for those to expire.
        if granted > 0 || results.iter().any(Result::is_err) {
            let _ = self.unlock(keys, token).await;
        }
        let answered = results.iter().filter(|result| result.is_ok()).count();
        self.check_quorum(&results, answered)?;
        let held: Vec<Option<Duration>> = results
            .iter()
            .filter_map(|result| match result {
                Ok(Attempt::Held { remaining }) => Some(*remaining),
                _ => None,
            })
            .collect();
        Ok(Attempt::Held {
            remaining: self.held_for(&held, results.len() - answered),
        })
    }

    /// How long to wait before trying again, given the remaining ttls of the masters that
    /// answered "held by someone else" and how many masters did not answer.
    ///
    /// While those masters (and the silent ones, which may hold it too) can still make up a
    /// majority, someone may hold the lock, and no retry can win before enough of them expire:
    /// wait for the release's wake-up, or until the k-th shortest of those ttls has run out, k
    /// being how many must expire before no majority is left. Retrying sooner only wins the
    /// masters that lost their data and gives them back, over and over, for as long as the
    /// holder holds. A split among contenders that each give back their minority also ends
    /// here, and ends early: a subscribed waiter marks the lock as awaited on every master
    /// where it found it held, so each give-back there (by a distlock contender) deletes the
    /// mark and publishes the waiter's wake-up.
    ///
    /// Otherwise no contender can have a majority (a split vote, or a majority granted too
    /// late): retry soon, after a random delay, so the contenders do not collide again.
    /// `None` when the masters did not say when (a plain `SET NX` does not ask, a key without
    /// expiry has no end).
    fn held_for(&self, held: &[Option<Duration>], unanswered: usize) -> Option<Duration> {
        let possible_holders = held.len() + unanswered;
        if possible_holders < self.majority() {
            return Some(
                Duration::from_millis(1) + crate::retry::jitter(Duration::from_millis(10)),
            );
        }
        // A ttl not known (no expiry, or not asked) counts as the longest.
        let must_expire = possible_holders - self.majority() + 1;
        let mut known: Vec<Duration> = held.iter().flatten().copied().collect();
        known.sort_unstable();
        known.get(must_expire - 1).copied()
    }

    /// Releases on every master; ours if a majority still held it.
    pub(crate) async fn unlock(&self, keys: &LockKeys, token: &str) -> RedisResult<bool> {
        let results = self.on_each(|node| node.unlock(keys, token, false)).await;
        self.majority_true(&results)
    }

    /// Extends on every master; succeeds if a majority extended it within the ttl.
    pub(crate) async fn extend(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> RedisResult<bool> {
        let started = Instant::now();
        let results = self
            .on_each(|node| node.extend(keys, token, ttl_millis))
            .await;
        let ttl = Duration::from_millis(ttl_millis);
        Ok(self.majority_true(&results)? && started.elapsed() + drift(ttl) < ttl)
    }

    /// Whether a majority of the masters hold `token` for the lock.
    pub(crate) async fn is_held(&self, keys: &LockKeys, token: &str) -> RedisResult<bool> {
        let results = self.on_each(|node| node.is_held(keys, token)).await;
        self.majority_true(&results)
    }

    /// The lock as a majority of the masters hold it: the value a majority agree on, with the
    /// shortest time left among them; `None` when no value has a majority (free, or taken on
    /// too few masters to count as held). Masters have no line, so no waiters are counted, and
    /// no fencing counter.
    pub(crate) async fn inspect(&self, keys: &LockKeys) -> RedisResult<Option<Look>> {
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
                }));
            }
        }
        Ok(None)
    }

    /// Runs `operation` on every master at once, each bounded by the per-node timeout.
    async fn on_each<'a, T, F, Fut>(&'a self, operation: F) -> Vec<RedisResult<T>>
    where
        F: Fn(&'a Node) -> Fut,
        Fut: Future<Output = RedisResult<T>> + 'a,
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

    /// `true` when a majority answered `true`; an error when too few masters answered to tell.
    fn majority_true(&self, results: &[RedisResult<bool>]) -> RedisResult<bool> {
        let yes = results
            .iter()
            .filter(|result| matches!(result, Ok(true)))
            .count();
        if yes >= self.majority() {
            return Ok(true);
        }
        let answered = results.iter().filter(|result| result.is_ok()).count();
        self.check_quorum(results, answered)?;
        Ok(false)
    }

    /// An error naming how many masters answered, when fewer than a majority did.
    fn check_quorum<T>(&self, results: &[RedisResult<T>], answered: usize) -> RedisResult<()> {
        if answered >= self.majority() {
            return Ok(());
        }
        let last_error = results
            .iter()
            .rev()
            .find_map(|result| result.as_ref().err())
            .map_or_else(String::new, ToString::to_string);
        Err(RedisError::from(std::io::Error::other(format!(
            "only {answered} of {} Redlock masters answered, and a majority ({}) is needed \
             (last error: {last_error}); bring masters back or check the URLs",
            self.nodes.len(),
            self.majority()
        ))))
    }
}

/// Allowance for clock drift between this host and the masters: 1 % of the ttl plus 2 ms, as
/// the Redlock description suggests.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

fn node_timed_out(limit: Duration) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("a Redlock master did not answer within the per-node timeout of {limit:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::{Connections, Endpoint, Timeouts};

    /// `n` masters that are never contacted.
    fn masters(n: usize) -> Quorum {
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            response: Duration::from_secs(1),
        };
        let nodes = (0..n)
            .map(|_| {
                let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
                Node::new(
                    Connections::new(Endpoint::Standalone(client), timeouts),
                    super::super::node::Protocol::Mark,
                )
            })
            .collect();
        Quorum::new(nodes, Duration::from_millis(100))
    }

    fn five() -> Quorum {
        masters(5)
    }

    /// A master that did not answer.
    fn silent() -> RedisResult<bool> {
        Err(RedisError::from(std::io::Error::other("master down")))
    }

    fn ms(millis: u64) -> Option<Duration> {
        Some(Duration::from_millis(millis))
    }

    #[test]
    fn a_held_majority_is_waited_for_until_it_cannot_be_a_majority_any_more() {
        let quorum = five();
        // Held on 4 (one master lost the key): a majority is gone once 2 have expired.
        assert_eq!(
            quorum.held_for(&[ms(900), ms(300), ms(500), ms(700)], 0),
            ms(500)
        );
        // Held on 3: the first expiry ends the majority.
        assert_eq!(quorum.held_for(&[ms(900), ms(300), ms(500)], 0), ms(300));
        // Held on 2 and one master silent: it may hold it too.
        assert_eq!(quorum.held_for(&[ms(900), ms(300)], 1), ms(300));
        // Without an expiry, or not asked: not known.
        assert_eq!(quorum.held_for(&[None, None, None], 0), None);
        assert_eq!(quorum.held_for(&[None, ms(400), ms(200), None], 0), ms(400));
    }

    #[test]
    fn a_split_with_no_possible_majority_retries_soon() {
        let quorum = five();
        for (held, unanswered) in [(vec![ms(30_000), ms(30_000)], 0), (vec![ms(30_000)], 1)] {
            let retry = quorum.held_for(&held, unanswered).unwrap();
            assert!(retry <= Duration::from_millis(11), "{retry:?}");
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
        // Three answered: enough to tell that two yes votes are not a majority.
        assert!(!quorum
            .majority_true(&[yes(), yes(), no(), silent(), silent()])
            .unwrap());
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
                && error.contains("master down")
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
