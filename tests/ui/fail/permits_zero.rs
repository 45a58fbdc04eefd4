#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "payments", permits = 0)]
async fn nobody() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "payments", permits = -2)]
async fn negative() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
