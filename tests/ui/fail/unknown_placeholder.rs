#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "trace:{trace}")]
async fn brace(trace_id: &str, attempt: u32) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "trace:<trace>")]
async fn angle(trace_id: &str) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job:{id}")]
async fn no_parameters() -> Result<(), LockError> {
    Ok(())
}

struct Worker;

impl Worker {
    #[distributed_lock(key = "worker:{name}")]
    async fn method(&self, id: u64) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {}
