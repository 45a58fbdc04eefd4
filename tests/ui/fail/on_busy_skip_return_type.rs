#![allow(dead_code)]

use distlock::distributed_lock;

#[distributed_lock(key = "report", on_busy = "skip")]
async fn count() -> Result<u32, std::io::Error> {
    Ok(1)
}

#[distributed_lock(key = "report", on_busy = "skip")]
async fn text() -> std::io::Result<String> {
    Ok(String::new())
}

fn main() {}
