//! Finishing a Redis call whose caller stopped waiting for it.
//!
//! Dropping a future does not recall a command already sent: Redis may still grant a lock that
//! the caller will never hear about. [`FinishOnDrop`] keeps such a call going after its caller
//! is gone and hands the reply to a clean-up step (for an acquisition: release what was granted).
//!
//! The reply is awaited, and the clean-up run, on the caller's runtime: its task drives the
//! connection the command went out on, so the clean-up's commands follow the call's on that
//! connection and Redis runs them in that order. That runtime may be shutting down (the end of
//! a test, of `main`, a service stopping), and then the task is dropped before it is done. That
//! drop is noticed, and the clean-up runs again from the start on the background runtime,
//! which is always there, told that the call's outcome is unknown. Clean-ups are idempotent (a
//! release by token), so running one twice is harmless.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// What to do with the output of a call whose caller is gone: `Some(output)` when the reply
/// came, `None` when it never will (the runtime that drove the call shut down), so the call may
/// or may not have run. Must be idempotent: it may run a second time with `None` after being
/// interrupted.
pub(crate) trait CleanUp<T>: Clone + Send + 'static {
    fn apply(self, output: Option<T>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

impl<T, C, G> CleanUp<T> for C
where
    C: FnOnce(Option<T>) -> G + Clone + Send + 'static,
    G: Future<Output = ()> + Send + 'static,
{
    fn apply(self, output: Option<T>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        // Boxed only on the rare path where a caller gave up mid-call.
        Box::pin(self(output))
    }
}
/// A future that, if dropped before it completes, is driven to completion in the background
/// and its output handed to `clean_up`.
pub(crate) struct FinishOnDrop<F, C>
where
    F: Future + Send + 'static,
    F::Output: Send,
    C: CleanUp<F::Output>,
{
    // Boxed so that it can move into a background task half-way through: one allocation.
    future: Option<Pin<Box<F>>>,
    clean_up: Option<C>,
    /// Whether the future was polled: one that never was has sent nothing.
    started: bool,
}

impl<F, C> FinishOnDrop<F, C>
where
    F: Future + Send + 'static,
    F::Output: Send,
    C: CleanUp<F::Output>,
{
    /// The future `make` returns, boxed, with the clean-up of its output should it be dropped
    /// before it completes. Built here, not in the caller's frame: every acquisition makes
    /// one, and the caller's stack frame would otherwise hold a second copy of it (see
    /// `support::cold`).
    #[inline(never)]
    pub(crate) fn new(make: impl FnOnce() -> F, clean_up: C) -> Self {
        FinishOnDrop {
            future: Some(Box::pin(make())),
            clean_up: Some(clean_up),
            started: false,
        }
    }
}

// Nothing is pinned in place: the future is behind its own box.
impl<F, C> Unpin for FinishOnDrop<F, C>
where
    F: Future + Send + 'static,
    F::Output: Send,
    C: CleanUp<F::Output>,
{
}

impl<F, C> Future for FinishOnDrop<F, C>
where
    F: Future + Send + 'static,
    F::Output: Send,
    C: CleanUp<F::Output>,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.started = true;
        let future = self
            .future
            .as_mut()
            .expect("FinishOnDrop polled after it completed");
        let output = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<F, C> Drop for FinishOnDrop<F, C>
where
    F: Future + Send + 'static,
    F::Output: Send,
    C: CleanUp<F::Output>,
{
    fn drop(&mut self) {
        let (Some(future), Some(clean_up)) = (self.future.take(), self.clean_up.take()) else {
            return;
        };
        if self.started {
            finish_in_background(future, clean_up);
        }
    }
}

/// Drives `future` to its end in a task of its own and hands its output to `clean_up`. Not
/// inlined into the drop, which every acquisition runs (see `support::cold`).
#[inline(never)]
fn finish_in_background<F, C>(future: Pin<Box<F>>, clean_up: C)
where
    F: Future + Send + 'static,
    F::Output: Send,
    C: CleanUp<F::Output>,
{
    // Armed outside the task: a runtime that is shutting down drops a task it is handed
    // without ever polling it.
    let unfinished = Unfinished::arm(clean_up.clone());
    spawn_here(async move {
        let output = future.await;
        clean_up.apply(Some(output)).await;
        unfinished.disarm();
    });
}

/// Runs `clean_up` with `output` on the caller's runtime (after whatever this runtime's
/// connection has sent), and again with `None` on the background runtime if that one shuts down
/// first.
#[inline(never)]
pub(crate) fn spawn_clean_up<T, C>(clean_up: C, output: Option<T>)
where
    T: Send + 'static,
    C: CleanUp<T>,
{
    let unfinished = Unfinished::arm(clean_up.clone());
    spawn_here(async move {
        clean_up.apply(output).await;
        unfinished.disarm();
    });
}

/// Spawns on the current runtime, or on the background runtime outside of any.
fn spawn_here<F: Future<Output = ()> + Send + 'static>(future: F) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(future)),
        Err(_) => crate::support::background::spawn(future),
    }
}

/// Armed while a call is being finished; if dropped before that is done (its runtime shut down),
/// runs the clean-up with an unknown outcome on the background runtime.
struct Unfinished<T, C: CleanUp<T>> {
    clean_up: Option<C>,
    _output: std::marker::PhantomData<fn(T)>,
}

impl<T, C: CleanUp<T>> Unfinished<T, C> {
    fn arm(clean_up: C) -> Self {
        Unfinished {
            clean_up: Some(clean_up),
            _output: std::marker::PhantomData,
        }
    }

    fn disarm(mut self) {
        self.clean_up = None;
    }
}

impl<T, C: CleanUp<T>> Drop for Unfinished<T, C> {
    fn drop(&mut self) {
        if let Some(clean_up) = self.clean_up.take() {
            crate::support::background::spawn(clean_up.apply(None));
        }
    }
}
