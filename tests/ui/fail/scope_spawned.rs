// A scope's future borrows its guard: it cannot be spawned away from the guard, whose owner
// could then release the lock while the scope still says the task holds it.
use distlock::{LockError, LockManager, LockOptions};

async fn spawned(manager: LockManager) -> Result<(), LockError> {
    let guard = manager.acquire("job", &LockOptions::new()).await?;
    tokio::spawn(guard.scope(async {}));
    guard.release().await
}

fn main() {}
