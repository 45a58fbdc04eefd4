#![allow(dead_code, unused_variables, unused_imports)]

// A path that resolves, but not to the distlock facade: rustc points at the string.
use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", crate = "std")]
async fn not_distlock() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
