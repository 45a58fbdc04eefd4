#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl = "soon")]
async fn words() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", ttl = "60")]
async fn no_unit() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", timeout = "5d")]
async fn unknown_unit() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", ttl = 500ms)]
async fn unquoted_unit() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
