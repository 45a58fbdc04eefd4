//! The futures of paths an uncontended acquisition and release do not take, kept out of the
//! stack frames of those that do.
//!
//! An async function's `poll` reserves stack room for every future it builds or inlines,
//! whether the path that needs it is taken or not. `Box::pin(future).await` alone does not keep
//! a rare path's future out: the future is built in the caller's frame before it moves to the
//! heap, and its `poll`, called from one place, is often inlined into the caller's. A few such
//! paths make every call's frame kilobytes larger, and the uncontended cycle pays for each of
//! its cache lines: between two round trips, Redis and the network stack run, and what the
//! cycle touches must be fetched again.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The future `make` returns, built in this function's frame and boxed, then polled by a
/// function that is never inlined: neither its construction nor its `poll` lands in the frame
/// of the future that awaits it. It is `Send` when that future is.
///
/// ```ignore
/// // A rare path of a hot async function:
/// let released = cold::boxed(|| self.unlock_naming_the_key(keys, token, Unlock::Release)).await;
/// ```
#[inline(never)]
pub(crate) fn boxed<F: Future>(make: impl FnOnce() -> F) -> Boxed<F> {
    Boxed(Box::pin(make()))
}

/// A future built by [`boxed`].
pub(crate) struct Boxed<F>(Pin<Box<F>>);

impl<F: Future> Future for Boxed<F> {
    type Output = F::Output;

    #[inline(never)]
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<F::Output> {
        self.0.as_mut().poll(context)
    }
}
