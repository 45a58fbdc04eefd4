#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job")]
struct Job;

trait Work {
    #[distributed_lock(key = "job")]
    async fn work(&self) -> Result<(), LockError>;
}

fn main() {}
