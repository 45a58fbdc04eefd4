//! Pauses between tries: exponential backoff, and jitter that keeps waiters that woke together
//! from retrying together.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// An exponential backoff: `first`, then doubling, never more than `max`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    pub(crate) first: Duration,
    pub(crate) max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) const fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The next pause, with up to half of it again at random; doubles the one after.
    pub(crate) fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(self.max);
        pause + jitter(pause / 2)
    }

    /// Starts over from `first`.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

/// A random duration in `0..=max`.
pub(crate) fn jitter(max: Duration) -> Duration {
    let max_micros = super::units::micros(max);
    if max_micros == 0 {
        return Duration::ZERO;
    }
    // RandomState is seeded randomly per thread and stepped per instance: cheap randomness
    // without another dependency.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    // Saturating: a bound of u64::MAX µs then leaves out only that one value.
    Duration::from_micros(random % max_micros.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_bound() {
        for _ in 0..1000 {
            assert!(jitter(Duration::from_millis(2)) <= Duration::from_millis(2));
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
        // The largest Duration must not overflow the bound.
        let _ = jitter(Duration::MAX);
    }

    #[test]
    fn backoff_doubles_up_to_its_maximum_and_starts_over() {
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(35));
        let pauses: Vec<Duration> = (0..4).map(|_| backoff.next_pause()).collect();
        for (pause, base) in pauses.iter().zip([10, 20, 35, 35]) {
            let base = Duration::from_millis(base);
            assert!(
                *pause >= base && *pause <= base + base / 2,
                "{pause:?} for {base:?}"
            );
        }
        backoff.reset();
        assert!(backoff.next_pause() <= Duration::from_millis(15));
    }
}
