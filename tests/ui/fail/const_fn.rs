#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job")]
const fn at_compile_time() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
