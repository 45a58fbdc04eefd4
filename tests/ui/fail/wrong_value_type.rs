#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl = true)]
async fn bool_ttl() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", guard = "lock")]
async fn string_guard() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", auto_extend = 1)]
async fn integer_flag() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", fencing = "yes")]
async fn string_flag() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = job)]
async fn unquoted_key() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", crate = distlock)]
async fn unquoted_crate() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
