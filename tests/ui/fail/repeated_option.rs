#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl = 60, ttl = 30)]
async fn repeated_ttl() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "a", key = "b")]
async fn repeated_key() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
