#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "trace:{trace_id:?}")]
async fn format_spec(trace_id: &str) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "trace:{trace-id}")]
async fn not_a_name(trace_id: &str) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
