#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "catalog", permits = 4, mode = "read")]
async fn both() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
