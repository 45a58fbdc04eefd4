#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job:{lock}", guard = lock)]
async fn shadowed(lock: u32) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
