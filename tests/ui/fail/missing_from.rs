#![allow(dead_code, unused_variables, unused_imports)]

use distlock::distributed_lock;

#[derive(Debug)]
struct NotFromLockError;

mod errors {
    #[derive(Debug)]
    pub struct Opaque;
}

type OpaqueResult<T> = Result<T, errors::Opaque>;

#[distributed_lock(key = "job")]
async fn no_from() -> Result<(), NotFromLockError> {
    Ok(())
}

#[distributed_lock(key = "job")]
async fn no_from_path() -> Result<u32, errors::Opaque> {
    Ok(1)
}

#[distributed_lock(key = "job")]
async fn no_from_alias() -> OpaqueResult<u32> {
    Ok(1)
}

fn main() {}
