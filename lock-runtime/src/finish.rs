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

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type CleanUp<T> = Box<dyn FnOnce(T) -> BoxFuture<()> + Send>;

/// A future that, if dropped before it completes, is driven to completion in the background
/// and its output handed to `clean_up`.
pub(crate) struct FinishOnDrop<T: Send + 'static> {
    future: Option<BoxFuture<T>>,
    clean_up: Option<CleanUp<T>>,
}

impl<T: Send + 'static> FinishOnDrop<T> {
    pub(crate) fn new<F, C, G>(future: F, clean_up: C) -> Self
    where
        F: Future<Output = T> + Send + 'static,
        C: FnOnce(T) -> G + Send + 'static,
        G: Future<Output = ()> + Send + 'static,
    {
        FinishOnDrop {
            future: Some(Box::pin(future)),
            clean_up: Some(Box::new(move |output| Box::pin(clean_up(output)))),
        }
    }
}

impl<T: Send + 'static> Future for FinishOnDrop<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let future = self
            .future
            .as_mut()
            .expect("FinishOnDrop polled after it completed");
        let output = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<T: Send + 'static> Drop for FinishOnDrop<T> {
    fn drop(&mut self) {
        let (Some(future), Some(clean_up)) = (self.future.take(), self.clean_up.take()) else {
            return;
        };
        let finish = async move { clean_up(future.await).await };
        // The caller's runtime drives the connection the call went out on; finish there when
        // we can, otherwise on the background runtime.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(finish)),
            Err(_) => crate::background::spawn(finish),
        }
    }
}
