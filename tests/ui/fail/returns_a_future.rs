#![allow(dead_code, unused_variables, unused_imports)]

// A plain `fn` whose work is a future it returns: the lock would be held only while the future
// is built, so the attribute asks for an `async fn`, not for a `Result` around the future.
use std::future::Future;
use std::pin::Pin;

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "impl:{id}")]
fn returns_impl_future(id: u32) -> impl Future<Output = Result<u32, LockError>> {
    async move { Ok(id) }
}

#[distributed_lock(key = "boxed:{id}")]
fn returns_boxed_future(id: u32) -> Pin<Box<dyn Future<Output = Result<u32, LockError>> + Send>> {
    Box::pin(async move { Ok(id) })
}

fn main() {}
