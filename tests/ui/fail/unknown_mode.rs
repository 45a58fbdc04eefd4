#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "catalog", mode = "shared")]
async fn shared() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "catalog", mode = read)]
async fn unquoted() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
