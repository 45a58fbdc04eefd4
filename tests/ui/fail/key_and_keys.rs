#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "account:{from}", keys = ["account:{from}", "account:{to}"])]
async fn transfer(from: u32, to: u32) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
