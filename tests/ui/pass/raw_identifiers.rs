// A parameter with a raw name (`r#type`) is named raw in a placeholder, as the attribute's own
// error for `{type}` advises, in both placeholder syntaxes and in both forms. Runs on the
// in-process backend (no Redis), reading each key back from the guard.
use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "raw:{r#type}:<r#type>", guard = lock)]
async fn asynchronous(r#type: u32) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

#[distributed_lock(key = "raw:{r#type}:<r#type>", guard = lock)]
fn blocking(r#type: u32) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

fn main() {
    distlock::blocking::init_with(distlock::blocking::LockManager::in_process()).unwrap();
    assert_eq!(blocking(7).unwrap(), "lock:raw:7:7");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        distlock::init_with(distlock::LockManager::in_process()).unwrap();
        assert_eq!(asynchronous(8).await.unwrap(), "lock:raw:8:8");
    });
}
