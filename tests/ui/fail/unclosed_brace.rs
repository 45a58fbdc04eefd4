#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "trace:{trace_id")]
async fn unclosed(trace_id: &str) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
