#![allow(dead_code)]

// The body uses the held lock under a name the attribute does not bind: the message says to add
// `guard = <name>`, and it is the only error (no "cannot find value" next to it).
use std::time::Duration;

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "import:{file}", ttl = 30)]
async fn import(file: &str) -> Result<usize, LockError> {
    lock.extend(Duration::from_secs(30)).await?;
    Ok(file.len())
}

#[distributed_lock(key = "job")]
fn blocking_job() -> Result<String, LockError> {
    Ok(guard.key().to_owned())
}

// With `fencing = true`, the same one message.
#[distributed_lock(key = "ledger:{account}", fencing = true)]
async fn post(account: u64) -> Result<Option<u64>, LockError> {
    let _ = account;
    Ok(lock.fencing_token())
}

// Inside a macro's arguments too.
#[distributed_lock(key = "report")]
async fn report() -> Result<(), LockError> {
    println!("holding {}", lock.key());
    Ok(())
}

fn main() {}
