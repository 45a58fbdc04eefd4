//! What the workloads share beyond their contenders: the deployments of workload 5 and the
//! critical section of workload 2.

use std::time::{Duration, Instant};

use distlock::{LockManagerBuilder, LockOptions};

use crate::contenders::Cycler;
use crate::cpu::redis_cpu_seconds;
use crate::{RESPONSE_TIMEOUT, TTL};

/// One deployment of workload 5: a manager on it, and a connection to each of its Redis nodes.
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    pub(crate) cycler: Cycler,
    pub(crate) nodes: Vec<redis::Connection>,
}

impl Backend {
    /// `builder` with the bench's response timeout, connected on `runtime` (whose tasks then
    /// drive its connections).
    pub(crate) fn connect(
        name: &'static str,
        runtime: &tokio::runtime::Runtime,
        builder: LockManagerBuilder,
        nodes: &[test_support::RedisServer],
    ) -> Self {
        let manager = runtime
            .block_on(builder.response_timeout(RESPONSE_TIMEOUT).connect())
            .unwrap_or_else(|error| panic!("{name}: cannot connect distlock: {error}"));
        Backend {
            name,
            cycler: Cycler::Manual(manager, LockOptions::new().ttl(TTL)),
            nodes: nodes.iter().map(test_support::RedisServer::conn).collect(),
        }
    }

    /// Redis's CPU seconds so far, summed over every node of the backend.
    pub(crate) fn redis_cpu_seconds(&mut self) -> Option<f64> {
        self.nodes.iter_mut().map(redis_cpu_seconds).sum()
    }

    /// Keys on all its nodes together.
    pub(crate) fn keys(&mut self) -> i64 {
        self.nodes
            .iter_mut()
            .map(|node| {
                redis::cmd("DBSIZE")
                    .query::<i64>(node)
                    .expect("DBSIZE failed")
            })
            .sum()
    }
}

/// Holds the lock until exactly `acquired + critical`, yielding to the runtime between checks
/// (a `tokio::time::sleep` would round up to the next 1 ms timer tick).
pub(crate) async fn critical_section(acquired: Instant, critical: Duration) {
    let end = acquired + critical;
    while Instant::now() < end {
        tokio::task::yield_now().await;
        std::hint::spin_loop();
    }
}
