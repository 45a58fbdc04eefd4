#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "")]
async fn empty() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
