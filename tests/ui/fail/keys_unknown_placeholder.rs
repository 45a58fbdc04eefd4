#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(keys = ["account:{from}", "account:{too}"])]
async fn transfer(from: u32, to: u32) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
