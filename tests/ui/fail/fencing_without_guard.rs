#![allow(dead_code)]

// `fencing = true` draws a token only the guard gives to the body: without `guard = ...` it
// could never reach the storage it is for.
use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "ledger:{account}", fencing = true)]
async fn unread(account: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "ledger:{account}", ttl = 10, fencing = true, auto_extend = true)]
fn unread_blocking(account: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
