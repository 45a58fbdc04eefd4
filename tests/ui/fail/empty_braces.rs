#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "trace:{}")]
async fn empty_braces(trace_id: &str) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
