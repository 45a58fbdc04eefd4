#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "user:{self.id}")]
async fn free(id: u64) -> Result<(), LockError> {
    Ok(())
}

struct User;

impl User {
    #[distributed_lock(key = "user:<self.id>")]
    async fn associated(id: u64) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {}
