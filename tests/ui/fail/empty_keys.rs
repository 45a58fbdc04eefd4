#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(keys = [])]
async fn nothing() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
