#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl = 0)]
async fn zero() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", ttl = "0ms")]
async fn zero_string() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
