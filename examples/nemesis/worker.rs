//! A worker process: fenced read-modify-write sections, one after the other, until the run's end,
//! each step written to its history before the next one is taken.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use distlock::{LockError, LockManager, LockOptions};

use crate::history::{now_micros, Event, Log, Outcome, What};
use crate::store::Store;

/// How a worker reaches the lock Redis.
#[derive(Debug, Clone)]
pub(crate) enum LockAt {
    /// One server (here: through this worker's own fault proxy).
    Url(String),
    /// The master a Sentinel set names.
    Sentinels(Vec<String>),
}

/// What the parent tells a worker on its command line.
#[derive(Debug, Clone)]
pub(crate) struct WorkerArgs {
    pub(crate) slot: u32,
    pub(crate) life: u32,
    pub(crate) lock: LockAt,
    pub(crate) store_url: String,
    pub(crate) history: PathBuf,
    /// No section starts after this time ([`now_micros`]).
    pub(crate) until: u64,
    pub(crate) keys: u32,
    pub(crate) ttl: Duration,
}

/// Every Redis call of the worker (lock and store) gets this long to answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a lock write waits for the Sentinel set's replica to acknowledge it: a same-host
/// replica answers in well under a millisecond, and a failover takes it away for a few seconds.
const REPLICA_WAIT: Duration = Duration::from_millis(300);

pub(crate) fn run(args: &WorkerArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("worker {}: no runtime: {error}", args.slot);
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(sections(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("worker {}: {error}", args.slot);
            ExitCode::FAILURE
        }
    }
}

async fn sections(args: &WorkerArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut log = Log::open(&args.history)?;
    let store = Store::connect(&args.store_url, CALL_TIMEOUT).await?;
    let manager = connect(args).await?;
    // The section holds the lock well within its ttl unless a fault stops it: auto-extension
    // stays off so that a worker frozen past the ttl really loses the lock, and the store's
    // fencing is what keeps its late write out.
    let options = LockOptions::default()
        .ttl(args.ttl)
        .timeout(args.ttl * 2)
        .fencing(true)
        .label("nemesis");
    let mut section = 0;
    // A parent that died (Ctrl-C) leaves its workers to the init process: they stop with it.
    let parent = std::os::unix::process::parent_id();
    while now_micros() < args.until && std::os::unix::process::parent_id() == parent {
        section += 1;
        let key = format!("record-{}", fastrand::u32(0..args.keys));
        let mut note = |what: What| {
            log.write(&Event {
                t: now_micros(),
                worker: args.slot,
                life: args.life,
                section,
                what,
            })
        };
        note(What::Start { key: key.clone() })?;
        let (outcome, error) = match one_section(&manager, &store, &key, &options, &mut note).await
        {
            Ok(outcome) => (outcome, None),
            Err(SectionError::Lock(LockError::Timeout { .. })) => (Outcome::Timeout, None),
            Err(error) => (Outcome::Error, Some(error.to_string())),
        };
        note(What::End { outcome, error })?;
        if outcome == Outcome::Error {
            // Redis is restarting or the connection was cut: do not spin on it.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
enum SectionError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("store: {0}")]
    Store(#[from] redis::RedisError),
    #[error("history: {0}")]
    History(#[from] std::io::Error),
    #[error("the lock came without a fencing token")]
    NoToken,
}

/// One section: lock, fenced read, hold a little, fenced write of read + 1, release.
async fn one_section(
    manager: &LockManager,
    store: &Store,
    key: &str,
    options: &LockOptions,
    note: &mut impl FnMut(What) -> std::io::Result<()>,
) -> Result<Outcome, SectionError> {
    let guard = manager.acquire(key, options).await?;
    let token = guard.fencing_token().ok_or(SectionError::NoToken)?;
    note(What::Acquired { token })?;
    let outcome = match store.read(key, token).await? {
        None => {
            note(What::Read { value: None })?;
            Outcome::Stale
        }
        Some(value) => {
            note(What::Read { value: Some(value) })?;
            // The time between read and write is where a second holder would slip in; it is
            // also where a SIGSTOP lands most of the time.
            tokio::time::sleep(Duration::from_millis(fastrand::u64(10..60))).await;
            note(What::Writing { value: value + 1 })?;
            let seq = store.write(key, token, value + 1).await?;
            note(What::Wrote { seq })?;
            if seq.is_some() {
                Outcome::Done
            } else {
                Outcome::Stale
            }
        }
    };
    note(What::Releasing)?;
    // The section's result is settled by the store; a lock that expired meanwhile (the worker
    // was stopped) or a connection that was cut only makes the release fail, which the next
    // holder does not need.
    let _ = guard.release().await;
    Ok(outcome)
}

/// Connects to the lock Redis, retrying while it is down (the nemesis may be restarting it).
async fn connect(args: &WorkerArgs) -> Result<LockManager, LockError> {
    let mut attempts = 0;
    loop {
        let builder = match &args.lock {
            LockAt::Url(url) => LockManager::builder(url.clone()),
            // Without the replica's acknowledgement, a failover promotes a replica that may not
            // have the latest lock or fencing increment: a second holder, and a stale token.
            LockAt::Sentinels(urls) => {
                LockManager::sentinel_builder(urls, test_support::sentinel::SERVICE)
                    .wait_for_replicas(1, REPLICA_WAIT)
            }
        };
        let builder = builder
            .key_prefix("nemesis:")
            .connect_timeout(CALL_TIMEOUT)
            .response_timeout(CALL_TIMEOUT);
        match builder.connect().await {
            Ok(manager) => return Ok(manager),
            Err(error) if attempts < 50 => {
                attempts += 1;
                eprintln!("worker {}: connecting: {error}; again", args.slot);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => return Err(error),
        }
    }
}
