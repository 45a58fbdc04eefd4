#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", crate = "not a path")]
async fn not_a_path() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", crate = "")]
async fn empty_path() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
