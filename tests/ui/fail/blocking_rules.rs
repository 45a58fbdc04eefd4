#![allow(dead_code, unused_variables, unused_imports)]

// A plain `fn` (the blocking form) follows the same rules as an `async fn`.
use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job")]
fn returns_nothing() {}

#[distributed_lock(key = "job:{nope}")]
fn unknown_placeholder(id: u32) -> Result<(), LockError> {
    Ok(())
}

struct Opaque;

#[distributed_lock(key = "job", ttl = 0)]
fn bad_duration() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job")]
fn no_from() -> Result<(), Opaque> {
    Ok(())
}

fn main() {}
