// The returned future is `Send + 'static` when the body's is, so it can be spawned.
use std::sync::Arc;

use distlock::{distributed_lock, LockError};

#[derive(Default)]
struct State {
    counter: tokio::sync::Mutex<u64>,
}

#[distributed_lock(key = "counter:{name}", ttl = 5, guard = lock)]
async fn increment(state: Arc<State>, name: String) -> Result<u64, LockError> {
    let mut counter = state.counter.lock().await;
    *counter += 1;
    tokio::task::yield_now().await;
    let _ = lock.token();
    Ok(*counter)
}

#[allow(dead_code)]
fn spawn_many(state: &Arc<State>) -> Vec<tokio::task::JoinHandle<Result<u64, LockError>>> {
    (0..4)
        .map(|i| tokio::spawn(increment(Arc::clone(state), format!("c{i}"))))
        .collect()
}

fn assert_send<T: Send + 'static>(_: T) {}

fn main() {
    assert_send(increment(Arc::default(), "a".to_owned()));
}
