// A refused attribute reports its own errors and nothing else: no `unused variable` for the
// parameters only the key uses, no "cannot find value" for the guard the body uses.
#![allow(dead_code)]

use std::time::Duration;

use distlock::{distributed_lock, LockError};

struct Order {
    id: u64,
}

#[distributed_lock(key = "order:{order.id}:{region}:{attempt}", ttl = 0)]
async fn ship(order: &Order, region: &str, attempt: u32) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "order:{order.id}:{region}", ttl = 0, guard = lock)]
async fn ship_guarded(order: &Order, region: &str) -> Result<(), LockError> {
    lock.extend(Duration::from_secs(30)).await?;
    Ok(())
}

#[distributed_lock(key = "order:{order.id}:{nope}", guard = lock)]
fn ship_blocking(order: &Order) -> Result<(), LockError> {
    lock.extend(Duration::from_secs(30))?;
    Ok(())
}

#[distributed_lock(key = "order:{id}", timeout = -1)]
async fn undeclared(id: u64) -> Result<(), LockError> {
    lock.extend(Duration::from_secs(30)).await?;
    Ok(())
}

fn main() {}
