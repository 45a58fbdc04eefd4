//! `permits` and `mode`: a semaphore and both modes of a read-write lock, async and blocking.
#![allow(dead_code)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "payments:api", permits = 5, ttl = 30)]
async fn call_payments() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "catalog:{shop}", mode = "read")]
async fn read_catalog(shop: &str) -> Result<usize, LockError> {
    Ok(shop.len())
}

#[distributed_lock(key = "catalog:{shop}", mode = "write", auto_extend = true)]
async fn rewrite_catalog(shop: &str) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "reports", permits = 2)]
fn report_now() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "catalog:{shop}", mode = "read", permits = 1)]
fn read_catalog_blocking(shop: &str) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
