// A crate that forbids unused variables (or warnings) gets a refused attribute's own error and
// nothing else: no `#[allow(unused_variables)]` that the `forbid` refuses, no unused parameter.
#![forbid(unused_variables)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job:{id}", ttl = 0)]
async fn job(id: u32, (attempt, region): (u32, &str)) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
