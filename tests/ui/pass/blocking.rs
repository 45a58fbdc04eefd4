// On a plain `fn` the attribute takes the lock through `distlock::blocking`: the same options,
// every receiver, generics, `guard`, `?` and `return`. This one runs for real on the in-process
// backend (no Redis): the lock is held while the body runs and released on every way out.
use std::fmt::Display;
use std::time::Duration;

use distlock::blocking::{self, LockGuard};
use distlock::{distributed_lock, LockError, LockOptions};

fn is_free(name: &str) -> bool {
    let manager = blocking::global().unwrap();
    match manager.try_acquire(name, &LockOptions::new()).unwrap() {
        Some(guard) => {
            guard.release().unwrap();
            true
        }
        None => false,
    }
}

#[distributed_lock(key = "job:{id}", ttl = 5, timeout = "2s")]
fn job(id: u32) -> Result<bool, LockError> {
    // Held while the body runs.
    Ok(!is_free(&format!("job:{id}")))
}

#[distributed_lock(key = "early:{id}", timeout = 0)]
fn early(id: u32, fail: bool) -> Result<u32, LockError> {
    if fail {
        return Err(LockError::Config("asked to fail".into()));
    }
    let parsed: u32 = "7".parse().map_err(|_| LockError::Config("not a number".into()))?;
    Ok(parsed + id)
}

#[distributed_lock(key = "guarded", ttl = "300ms", auto_extend = true, fencing = true, guard = lock)]
fn guarded() -> Result<(String, Option<u64>), LockError> {
    let held: &LockGuard = lock;
    lock.extend(Duration::from_secs(5))?;
    std::thread::sleep(Duration::from_millis(50));
    Ok((held.key().to_owned(), lock.fencing_token()))
}

#[distributed_lock(key = "io")]
fn io() -> std::io::Result<()> {
    Ok(())
}

#[distributed_lock(key = "generic:{item}")]
fn generic<T>(item: T, extra: impl Display) -> Result<String, LockError>
where
    T: Display + Clone,
{
    Ok(format!("{item}{extra}"))
}

struct Account {
    id: u64,
    balance: u64,
}

impl Account {
    #[distributed_lock(key = "account:{self.id}")]
    fn balance(&self) -> Result<u64, LockError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:{self.id}", guard = lock)]
    pub fn withdraw(&mut self, amount: u64) -> Result<u64, LockError> {
        let _ = lock.token();
        self.balance -= amount;
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.id>:close")]
    fn close(self) -> Result<u64, LockError> {
        Ok(self.balance)
    }
}

trait Store {
    fn save(&self, id: u64) -> Result<(), LockError>;
}

impl Store for Account {
    #[distributed_lock(key = "store:{id}")]
    fn save(&self, id: u64) -> Result<(), LockError> {
        let _ = (self.id, id);
        Ok(())
    }
}

#[distributed_lock(key = "panics")]
fn panics() -> Result<(), LockError> {
    panic!("the body fails while holding the lock");
}

fn main() {
    blocking::init_with(blocking::LockManager::in_process()).unwrap();

    assert!(job(1).unwrap(), "held while the body runs");
    assert!(is_free("job:1"), "released after it");

    assert_eq!(early(1, false).unwrap(), 8);
    assert!(early(2, true).is_err());
    assert!(is_free("early:2"), "released on `return`");

    let (key, fence) = guarded().unwrap();
    assert_eq!(key, "lock:guarded");
    assert!(fence.is_some());
    io().unwrap();
    assert_eq!(generic(4, "x").unwrap(), "4x");

    let mut account = Account { id: 9, balance: 10 };
    assert_eq!(account.balance().unwrap(), 10);
    assert_eq!(account.withdraw(3).unwrap(), 7);
    account.save(1).unwrap();
    assert_eq!(account.close().unwrap(), 7);

    assert!(std::panic::catch_unwind(panics).is_err());
    assert!(is_free("panics"), "released while the panic unwound");

    // Held elsewhere: the timeout reaches the caller as `E::from(LockError)`.
    let holder = blocking::global()
        .unwrap()
        .acquire("early:3", &LockOptions::new())
        .unwrap();
    assert!(matches!(early(3, false), Err(LockError::Timeout { .. })));
    holder.release().unwrap();
}
