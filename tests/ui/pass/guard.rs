// `guard = name` binds `&LockGuard` in the body; `auto_extend` and `fencing` set the options.
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockGuard};

#[distributed_lock(key = "import:{file}", ttl = 30, guard = lock)]
async fn import(file: &str) -> Result<usize, LockError> {
    let guard: &LockGuard = lock;
    lock.extend(Duration::from_secs(30)).await?;
    let key: &str = guard.key();
    let token: &str = lock.token();
    Ok(file.len() + key.len() + token.len())
}

#[distributed_lock(key = "watched", auto_extend = true)]
async fn watched() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "fenced:{account}", fencing = true, guard = held)]
async fn fenced(account: u64) -> Result<Option<u64>, LockError> {
    let _ = account;
    Ok(held.fencing_token())
}

#[distributed_lock(key = "both", auto_extend = true, fencing = true, guard = lock)]
async fn both() -> Result<(), LockError> {
    let _: Option<u64> = lock.fencing_token();
    Ok(())
}

#[distributed_lock(key = "off", auto_extend = false, fencing = false)]
async fn explicitly_off() -> Result<(), LockError> {
    Ok(())
}

// An unused guard is fine: no warning.
#[deny(warnings)]
#[distributed_lock(key = "unused", guard = lock)]
async fn unused_guard() -> Result<(), LockError> {
    Ok(())
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(import("data.csv"));
    assert_send(watched());
    assert_send(fenced(1));
    assert_send(both());
    assert_send(explicitly_off());
    assert_send(unused_guard());
}

// A body that binds `lock` or `guard` itself, or calls methods named so, uses its own: no
// `guard = ...` is asked for.
#[allow(dead_code)]
mod own_names {
    use distlock::{distributed_lock, LockError};

    struct Ticket;

    impl Ticket {
        fn key(&self) -> &str {
            "ticket"
        }
    }

    struct Shared {
        lock: std::sync::Mutex<u32>,
    }

    #[distributed_lock(key = "own:{id}")]
    pub(crate) async fn local(id: u32) -> Result<usize, LockError> {
        let lock = Ticket;
        let guard = Ticket;
        Ok(lock.key().len() + guard.key().len() + id as usize)
    }

    #[distributed_lock(key = "own-closure")]
    pub(crate) fn closure() -> Result<usize, LockError> {
        let lengths = [Ticket].iter().map(|lock| lock.key().len()).sum();
        Ok(lengths)
    }

    #[distributed_lock(key = "own-field")]
    pub(crate) fn field(shared: &Shared) -> Result<u32, LockError> {
        Ok(*shared.lock.lock().unwrap())
    }

    mod config {
        #[allow(non_upper_case_globals)]
        pub(crate) static lock: super::Ticket = super::Ticket;
    }

    // A `lock` reached by a path is that item, not the guard.
    #[distributed_lock(key = "own-path")]
    pub(crate) fn path() -> Result<usize, LockError> {
        Ok(config::lock.key().len())
    }

    #[distributed_lock(key = "own-param:{lock}")]
    pub(crate) fn param(lock: &str) -> Result<usize, LockError> {
        Ok(lock.len())
    }
}
