#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", tll = 60)]
async fn typo() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", retries = 3)]
async fn unknown() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
