#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl = -5)]
async fn negative_ttl() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", ttl = "-1s")]
async fn negative_ttl_string() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", timeout = -1)]
async fn negative_timeout() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
