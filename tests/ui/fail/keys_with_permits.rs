// Several keys are taken all or none as mutexes: not as a semaphore, not to read.
use distlock::{distributed_lock, LockError};

#[distributed_lock(keys = ["account:{from}", "account:{to}"], permits = 2)]
async fn as_permits(from: u64, to: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(keys = ["account:{from}", "account:{to}"], mode = "read")]
async fn to_read(from: u64, to: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
