//! A small process-wide runtime on its own thread, for work that must not depend on the
//! caller's runtime: releases started from `Drop` (the caller's runtime may be shutting down,
//! or there may be none), the wake-up subscriptions that outlive any one caller, and every call
//! of `distlock::blocking`.
//!
//! It starts on first use and lives as long as the process. A process forked without exec
//! keeps the parent's memory but none of its other threads: the runtime it inherits has no
//! thread to drive its timers and sockets, so anything sent to it would wait for ever. Each
//! process therefore has its own: the runtime is tagged with the id of the process that started
//! it, and a process that finds another's starts a fresh one; the inherited one is never used
//! again (its tasks, connections included, belong to the parent).

use std::future::Future;
use std::sync::{Mutex, PoisonError};

use tokio::runtime::{Builder, Handle};

/// The background runtime and the id of the process whose thread drives it.
static CURRENT: Mutex<Option<(u32, Handle)>> = Mutex::new(None);

/// Runs `future` to completion on the background runtime.
pub(crate) fn spawn<F>(future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    drop(handle().spawn(future));
}

/// This process's background runtime, started on first use (in this process).
pub(crate) fn handle() -> Handle {
    let pid = std::process::id();
    let mut current = CURRENT.lock().unwrap_or_else(PoisonError::into_inner);
    match &*current {
        Some((started_by, handle)) if *started_by == pid => handle.clone(),
        _ => {
            let handle = start();
            *current = Some((pid, handle.clone()));
            handle
        }
    }
}

/// Starts a runtime, and the thread that drives it for as long as the process lives.
fn start() -> Handle {
    let runtime = Builder::new_current_thread()
        .enable_all()
        .thread_name("distlock-background")
        .build()
        .expect(
            "distlock: cannot start its background runtime (out of threads or file descriptors?)",
        );
    let handle = runtime.handle().clone();
    std::thread::Builder::new()
        .name("distlock-background".into())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))
        .expect("distlock: cannot start its background thread (out of threads?)");
    handle
}
