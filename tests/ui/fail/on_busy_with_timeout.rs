#![allow(dead_code)]

use distlock::distributed_lock;

#[distributed_lock(key = "report", on_busy = "skip", timeout = 5)]
async fn skips() -> Result<(), std::io::Error> {
    Ok(())
}

#[distributed_lock(key = "report", timeout = "500ms", on_busy = "fail")]
async fn fails() -> Result<(), std::io::Error> {
    Ok(())
}

fn main() {}
