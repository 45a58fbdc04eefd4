//! Finishing a Redis call whose caller stopped waiting for it.
//!
//! Dropping a future does not recall a command already sent: Redis may still grant a lock that
//! the caller will never hear about. [`FinishOnDrop`] keeps such a call going after its caller
//! is gone and hands the reply to a clean-up step (for an acquisition: release what was granted).
//! The clean-up runs after the reply, on the same connection's order of events, so it can never
//! overtake the command it cleans up after.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// What to do with the output of a call whose caller is gone.
pub(crate) trait CleanUp<T>: Send + 'static {
    fn run(self, output: T) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

impl<T, C, G> CleanUp<T> for C
where
    C: FnOnce(T) -> G + Send + 'static,
    G: Future<Output = ()> + Send + 'static,
{
    fn run(self, output: T) -> Pin<Box<dyn Future<Output = ()> + Send>> {
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
}

impl<F, C> FinishOnDrop<F, C>
where
    F: Future + Send + 'static,
    F::Output: Send,
    C: CleanUp<F::Output>,
{
    pub(crate) fn new(future: F, clean_up: C) -> Self {
        FinishOnDrop {
            future: Some(Box::pin(future)),
            clean_up: Some(clean_up),
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
        let finish = async move { clean_up.run(future.await).await };
        // The caller's runtime drives the connection the call went out on; finish there when
        // we can, otherwise on the background runtime.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(finish)),
            Err(_) => crate::background::spawn(finish),
        }
    }
}
