#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

struct Id(u64);

#[distributed_lock(key = "item:{id}")]
async fn not_display(id: Id) -> Result<(), LockError> {
    let _ = id.0;
    Ok(())
}

fn main() {}
