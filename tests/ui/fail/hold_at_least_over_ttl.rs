#![allow(dead_code)]

use distlock::distributed_lock;

#[distributed_lock(key = "report", ttl = 10, hold_at_least = "20s")]
async fn explicit_ttl() -> Result<(), std::io::Error> {
    Ok(())
}

// The default ttl is 30 s.
#[distributed_lock(key = "report", hold_at_least = "1m")]
async fn default_ttl() -> Result<(), std::io::Error> {
    Ok(())
}

#[distributed_lock(key = "report", hold_at_least = 0)]
async fn zero() -> Result<(), std::io::Error> {
    Ok(())
}

fn main() {}
