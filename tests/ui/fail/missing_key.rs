#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock]
async fn no_arguments() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(ttl = 60)]
async fn no_key() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock("trace:{id}")]
async fn unnamed(id: u32) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
