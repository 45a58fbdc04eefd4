//! CPU time of this process and of the Redis server, read around each round.

use crate::idle::IdleSpinners;

/// CPU time spent so far by this process (all its threads) and by the Redis server: a reading
/// before and after a round tells where a cycle's time goes, client or server.
pub(crate) struct CpuMeter {
    pub(crate) redis: Option<redis::Connection>,
    /// Idle spinners while they run: their CPU time is not the bench's.
    pub(crate) spinners: Option<IdleSpinners>,
}

/// One reading of [`CpuMeter`], in seconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuReading {
    pub(crate) client: Option<f64>,
    pub(crate) redis: Option<f64>,
}

impl CpuMeter {
    pub(crate) fn new(client: &redis::Client) -> Self {
        CpuMeter {
            redis: client.get_connection().ok(),
            spinners: None,
        }
    }

    pub(crate) fn read(&mut self) -> CpuReading {
        CpuReading {
            client: client_cpu_seconds(self.spinners.as_ref()),
            redis: self.redis.as_mut().and_then(redis_cpu_seconds),
        }
    }

    /// Runs `round`, returning its result and the client's and Redis's CPU microseconds per
    /// one of its `units` (cycles).
    pub(crate) fn measure<T>(
        &mut self,
        units: u64,
        round: impl FnOnce() -> T,
    ) -> (T, Option<f64>, Option<f64>) {
        let before = self.read();
        let result = round();
        let after = self.read();
        let per_unit =
            |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (b - a) * 1e6 / units as f64);
        (
            result,
            per_unit(before.client, after.client),
            per_unit(before.redis, after.redis),
        )
    }
}

/// The CPU time of every thread of this process but the idle spinners
/// (`/proc/self/task/*/schedstat`, Linux).
pub(crate) fn client_cpu_seconds(spinners: Option<&IdleSpinners>) -> Option<f64> {
    let mut nanos = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(task) = task else { continue };
        if spinners.is_some_and(|spinners| spinners.is_spinner(&task.file_name().to_string_lossy()))
        {
            continue;
        }
        // A thread may end between the listing and the read: it then counts no more.
        if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
            nanos += text.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(nanos as f64 / 1e9)
}

/// `used_cpu_sys + used_cpu_user` of `INFO cpu` (microsecond resolution).
pub(crate) fn redis_cpu_seconds(connection: &mut redis::Connection) -> Option<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query(connection).ok()?;
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.trim().parse::<f64>().ok())
    };
    Some(field("used_cpu_sys:")? + field("used_cpu_user:")?)
}
