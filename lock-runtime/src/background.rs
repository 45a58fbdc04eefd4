//! A small process-wide runtime on its own thread, for work that must not depend on the
//! caller's runtime: releases started from `Drop` (the caller's runtime may be shutting down,
//! or there may be none) and the wake-up subscriptions that outlive any one caller.
//!
//! It starts on first use and lives as long as the process.

use std::future::Future;

use once_cell::sync::OnceCell;
use tokio::runtime::{Builder, Handle};

static HANDLE: OnceCell<Handle> = OnceCell::new();

/// Runs `future` to completion on the background runtime.
pub(crate) fn spawn<F>(future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    drop(handle().spawn(future));
}

/// The background runtime, started on first use.
pub(crate) fn handle() -> &'static Handle {
    HANDLE.get_or_init(|| {
        let runtime = Builder::new_current_thread()
            .enable_all()
            .thread_name("distlock-background")
            .build()
            .expect("distlock: cannot start its background runtime (out of threads or file descriptors?)");
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("distlock-background".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .expect("distlock: cannot start its background thread (out of threads?)");
        handle
    })
}
