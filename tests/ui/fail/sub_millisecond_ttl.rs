#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl = 0.0005)]
async fn too_short() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", ttl = "1.5ms")]
async fn fractional() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
