//! `on_busy` and `hold_at_least`: every policy with the return types it takes.
#![allow(dead_code)]

use distlock::distributed_lock;

#[distributed_lock(key = "report", on_busy = "wait", timeout = 5)]
async fn waits() -> std::io::Result<u32> {
    Ok(1)
}

#[distributed_lock(key = "report", on_busy = "skip")]
async fn skips_unit() -> Result<(), std::io::Error> {
    Ok(())
}

#[distributed_lock(key = "report:{day}", on_busy = "skip", hold_at_least = "30s")]
async fn skips_option(day: u32) -> Result<Option<u32>, std::io::Error> {
    Ok(Some(day))
}

#[distributed_lock(key = "report", on_busy = "skip")]
async fn skips_io_result() -> std::io::Result<()> {
    Ok(())
}

#[distributed_lock(key = "report", on_busy = "skip")]
async fn skips_std_option() -> Result<std::option::Option<String>, std::io::Error> {
    Ok(None)
}

#[distributed_lock(key = "report", on_busy = "fail", ttl = 60, hold_at_least = 60)]
async fn fails() -> Result<String, std::io::Error> {
    Ok(String::new())
}

#[distributed_lock(key = "report", hold_at_least = 0.5, auto_extend = true)]
async fn holds() -> Result<(), std::io::Error> {
    Ok(())
}

fn spawnable() {
    fn is_send<T: Send>(_: T) {}
    is_send(skips_option(1));
    is_send(fails());
}

fn main() {}
