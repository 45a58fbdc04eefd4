// Without `distlock::init`, the function returns `E::from(LockError::NotInitialized)` and never
// runs its body. This one runs for real: no Redis is needed to fail to acquire.
use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "never:{id}", timeout = 0)]
async fn never_runs(id: u32) -> Result<(), LockError> {
    panic!("the body ran without the lock (id {id})");
}

#[distributed_lock(key = "io")]
async fn io_error() -> std::io::Result<()> {
    panic!("the body ran without the lock");
}

#[tokio::main]
async fn main() {
    let error = never_runs(1).await.unwrap_err();
    assert!(
        matches!(error, LockError::NotInitialized),
        "expected NotInitialized, got {error:?}"
    );
    let error = io_error().await.unwrap_err();
    assert!(!error.to_string().is_empty());
}
