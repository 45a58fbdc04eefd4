//! What the workers and the nemesis write down: one JSON object a line, appended as it happens,
//! so that a worker killed with SIGKILL leaves every line it wrote before it died.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Microseconds since the Unix epoch: the one clock every process of the run reads (they all run
/// on this machine), so that events of different workers can be put in one order.
pub(crate) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
        })
}

/// One line of a worker's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Event {
    /// When it happened ([`now_micros`]).
    pub(crate) t: u64,
    /// The worker slot (0..workers); a restarted worker keeps its slot.
    pub(crate) worker: u32,
    /// Which start of that slot: 0 first, +1 after each SIGKILL and restart.
    pub(crate) life: u32,
    /// The section's number within this life.
    pub(crate) section: u64,
    #[serde(flatten)]
    pub(crate) what: What,
}

/// The steps of one fenced read-modify-write section, in the order a worker takes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub(crate) enum What {
    /// The section asks for the lock of record `key`.
    Start { key: String },
    /// The lock is held, with this fencing token.
    Acquired { token: u64 },
    /// The store answered the fenced read: the record's value, or `None` when it refused the
    /// token because it had seen a newer one.
    Read { value: Option<u64> },
    /// About to ask the store to write `value` (the value read + 1). Written before the call,
    /// so that a write whose worker died before hearing the answer is known to exist.
    Writing { value: u64 },
    /// The store's answer: `Some(n)` accepted as the record's n-th accepted write, `None` refused.
    Wrote { seq: Option<u64> },
    /// The protected work is over; the lock is released next. The hold as the checker sees it
    /// ends here, before the release can let anybody else in.
    Releasing,
    /// How the section ended.
    End {
        outcome: Outcome,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

/// How a section ended, as the worker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// The store accepted the write.
    Done,
    /// The store refused the read or the write: a newer token had been seen.
    Stale,
    /// The lock was not granted within the acquire timeout.
    Timeout,
    /// Any other error (Redis unreachable, connection cut, ...).
    Error,
}

/// One fault the nemesis injected, from `start` until it was over at `end`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Fault {
    pub(crate) kind: FaultKind,
    /// The worker slot it hit, for the faults aimed at one worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) worker: Option<u32>,
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// The kinds of fault, in the order the report lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FaultKind {
    /// SIGKILL of a worker, then a new worker in its slot.
    Kill,
    /// SIGSTOP of a worker for longer than the lock's ttl, then SIGCONT.
    Stop,
    /// Every connection between one worker and the lock Redis closed by its fault proxy.
    Cut,
    /// The lock Redis killed and started again; it reloads its append-only file.
    Restart,
    /// A Sentinel failover of the lock Redis.
    Failover,
}

impl FaultKind {
    /// Every kind, in report order.
    pub(crate) const ALL: [FaultKind; 5] = [
        FaultKind::Kill,
        FaultKind::Stop,
        FaultKind::Cut,
        FaultKind::Restart,
        FaultKind::Failover,
    ];

    /// The name the report and `--faults` use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Stop => "stop",
            FaultKind::Cut => "cut",
            FaultKind::Restart => "restart",
            FaultKind::Failover => "failover",
        }
    }
}

/// Appends JSON lines to a file. Each line goes to the kernel in one `write` (the file is not
/// buffered), so a SIGKILL loses nothing that was written.
pub(crate) struct Log {
    file: File,
}

impl Log {
    pub(crate) fn open(path: &Path) -> std::io::Result<Log> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Log { file })
    }

    pub(crate) fn write<T: Serialize>(&mut self, record: &T) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)
    }
}

/// Reads every line of a JSON-lines file. A last line cut short (its writer was killed in the
/// middle of a `write`) is skipped; any other line that does not parse is an error.
pub(crate) fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> std::io::Result<Vec<T>> {
    let lines: Vec<String> = BufReader::new(File::open(path)?)
        .lines()
        .collect::<Result<_, _>>()?;
    let last = lines.len().saturating_sub(1);
    let mut records = Vec::with_capacity(lines.len());
    for (n, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(record) => records.push(record),
            Err(_) if n == last => {}
            Err(error) => {
                return Err(std::io::Error::other(format!(
                    "{} line {}: {error}",
                    path.display(),
                    n + 1
                )))
            }
        }
    }
    Ok(records)
}
