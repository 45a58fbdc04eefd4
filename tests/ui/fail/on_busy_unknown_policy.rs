#![allow(dead_code)]

use distlock::distributed_lock;

#[distributed_lock(key = "report", on_busy = "ignore")]
async fn ignores() -> Result<(), std::io::Error> {
    Ok(())
}

#[distributed_lock(key = "report", on_busy = skip)]
async fn unquoted() -> Result<(), std::io::Error> {
    Ok(())
}

fn main() {}
