#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "pair:{a}")]
async fn destructured((a, b): (u32, u32)) -> Result<(), LockError> {
    let _ = (a, b);
    Ok(())
}

fn main() {}
