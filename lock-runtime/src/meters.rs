//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade, with the `metrics`
//! feature: whatever recorder the application installed (Prometheus, `StatsD`, `OpenTelemetry`)
//! receives them. Without the feature every call here is empty and the types carry nothing.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `distlock_acquisitions_total` | counter | `label`, `outcome` | acquisitions by outcome: `acquired`, `busy` (a single attempt found it held), `timeout`, `error` |
//! | `distlock_wait_seconds` | histogram | `label` | from asking to holding, for acquisitions that got the lock |
//! | `distlock_hold_seconds` | histogram | `label` | from holding to released (or lost) |
//! | `distlock_lost_total` | counter | `label` | locks found lost while held: expired, or taken over |
//! | `distlock_release_failures_total` | counter | `label` | releases Redis did not answer or refused: the lock is left to its ttl |
//! | `distlock_held` | gauge | `label` | locks this process holds now |
//! | `distlock_lock_order_inversions_total` | counter | `first`, `second` | pairs of key templates taken in both orders, by tasks of this process or, through the record in Redis, by another process and this one (see `hold::order`): once per pair per process |
//! | `distlock_eviction_risk` | gauge | `server` | 1 when the server (`host:port`, checked at connect) may evict lock keys under memory pressure, 0 when it keeps them (see [`diagnose`](crate::diagnose)) |
//!
//! `label` is [`LockOptions::label`](crate::LockOptions::label) — for the attribute, the
//! function's path and key template — or `unlabelled`; never the rendered key: a time series
//! per trace id would swamp any metrics store. `server` is an address, of which a deployment
//! has a handful.

#[cfg(feature = "metrics")]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(feature = "metrics")]
use std::sync::Arc;

#[cfg(feature = "metrics")]
use tokio::time::Instant;

use crate::{LockError, LockOptions};

/// Counts a lock-order inversion between the key templates `first` and `second` (once per
/// pair: rare, so the labels are made here).
pub(crate) fn order_inversion(first: &str, second: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "distlock_lock_order_inversions_total",
        "first" => first.to_owned(),
        "second" => second.to_owned()
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (first, second);
}

/// The label of a lock without one.
#[cfg(feature = "metrics")]
const UNLABELLED: &str = "unlabelled";

/// What an acquisition's metrics are labelled with.
#[derive(Clone)]
pub(crate) struct Meter {
    #[cfg(feature = "metrics")]
    label: Arc<str>,
}

// Without the feature the methods record nothing, so they leave `self` unread.
#[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
impl Meter {
    pub(crate) fn new(options: &LockOptions) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = options;
        Meter {
            #[cfg(feature = "metrics")]
            label: options
                .shared_label()
                .unwrap_or_else(|| Arc::from(UNLABELLED)),
        }
    }

    /// Counts the end of an acquisition started at `started`: `Ok(true)` acquired, `Ok(false)`
    /// a single attempt that found it held, `Err` a timeout or an error.
    pub(crate) fn acquisition(&self, outcome: Result<bool, &LockError>, started: Stopwatch) {
        #[cfg(feature = "metrics")]
        {
            let waited = started.started.elapsed();
            let outcome = match outcome {
                Ok(true) => {
                    metrics::histogram!("distlock_wait_seconds", "label" => Arc::clone(&self.label))
                        .record(waited.as_secs_f64());
                    "acquired"
                }
                Ok(false) => "busy",
                Err(LockError::Timeout { .. }) => "timeout",
                Err(_) => "error",
            };
            metrics::counter!(
                "distlock_acquisitions_total",
                "label" => Arc::clone(&self.label),
                "outcome" => outcome
            )
            .increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (outcome, started);
    }

    /// Starts counting a held lock: its hold ends once, at release or loss.
    pub(crate) fn hold(&self) -> Hold {
        #[cfg(feature = "metrics")]
        metrics::gauge!("distlock_held", "label" => Arc::clone(&self.label)).increment(1.0);
        Hold {
            #[cfg(feature = "metrics")]
            meter: self.clone(),
            #[cfg(feature = "metrics")]
            since: Instant::now(),
            #[cfg(feature = "metrics")]
            ended: AtomicBool::new(false),
        }
    }
}

/// When an acquisition started, for its wait-time histogram. Only the `metrics` feature reads
/// the clock for it: without it, every acquisition would pay two clock reads for nothing.
#[derive(Clone, Copy)]
pub(crate) struct Stopwatch {
    #[cfg(feature = "metrics")]
    started: Instant,
}

impl Stopwatch {
    pub(crate) fn start() -> Self {
        Stopwatch {
            #[cfg(feature = "metrics")]
            started: Instant::now(),
        }
    }
}

/// One held lock's metrics.
pub(crate) struct Hold {
    #[cfg(feature = "metrics")]
    meter: Meter,
    #[cfg(feature = "metrics")]
    since: Instant,
    #[cfg(feature = "metrics")]
    ended: AtomicBool,
}

#[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
impl Hold {
    /// The lock is no longer held (released, lost, or its guard gone): records the hold time
    /// and lowers the gauge, the first time only.
    pub(crate) fn end(&self) {
        #[cfg(feature = "metrics")]
        if !self.ended.swap(true, Ordering::AcqRel) {
            let label = &self.meter.label;
            metrics::histogram!("distlock_hold_seconds", "label" => Arc::clone(label))
                .record(self.since.elapsed().as_secs_f64());
            metrics::gauge!("distlock_held", "label" => Arc::clone(label)).decrement(1.0);
        }
    }

    /// The lock was found lost.
    pub(crate) fn lost(&self) {
        #[cfg(feature = "metrics")]
        metrics::counter!("distlock_lost_total", "label" => Arc::clone(&self.meter.label))
            .increment(1);
        self.end();
    }

    /// A release failed: Redis did not answer it, or refused it.
    pub(crate) fn release_failed(&self) {
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "distlock_release_failures_total",
            "label" => Arc::clone(&self.meter.label)
        )
        .increment(1);
        self.end();
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.end();
    }
}
