#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl = "9000h")]
async fn ttl_of_9000_hours() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", ttl = 1e40)]
async fn ttl_past_every_integer() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", timeout = 31536000.001)]
async fn timeout_a_millisecond_too_long() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
