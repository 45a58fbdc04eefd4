#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job")]
fn not_async() -> Result<(), LockError> {
    Ok(())
}

struct Worker;

impl Worker {
    #[distributed_lock(key = "job")]
    fn method(&self) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {}
