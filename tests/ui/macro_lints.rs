//! The code `#[distributed_lock]` generates must not trigger a warning, from rustc or from clippy
//! (`clippy::all` and `clippy::pedantic`), under `cargo clippy --workspace --all-targets -- -D
//! warnings`. This file uses the attribute in every form; it compiles in `cargo test` too, where
//! its one test only checks that the futures are `Send` (no Redis needed).
#![deny(warnings)]
#![deny(clippy::all, clippy::pedantic)]

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockGuard};

#[derive(Debug)]
#[allow(dead_code)] // the fields are only there to be printed
enum AppError {
    Lock(LockError),
    Invalid(u32),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

type AppResult<T> = Result<T, AppError>;

struct Order {
    id: u64,
    region: Region,
}

struct Region {
    name: String,
}

#[distributed_lock(key = "fixed")]
async fn fixed() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "order:{order.region.name}:{order.id}:<attempt>:{{escaped}}")]
async fn placeholders(order: &Order, attempt: u32) -> AppResult<u64> {
    if attempt > 3 {
        return Err(AppError::Invalid(attempt));
    }
    Ok(order.id)
}

#[distributed_lock(
    key = "everything:{id}",
    ttl = 60,
    timeout = "500ms",
    guard = lock,
    auto_extend = true,
    fencing = true
)]
async fn everything(id: u64) -> Result<Option<u64>, AppError> {
    lock.extend(Duration::from_secs(60)).await?;
    let _: &LockGuard = lock;
    Ok(lock.fencing_token().map(|token| token + id))
}

#[distributed_lock(key = "unused-guard", ttl = 0.5, timeout = 0, guard = lock)]
async fn unused_guard() -> std::io::Result<()> {
    Ok(())
}

#[distributed_lock(key = "durations", ttl = "1h", timeout = "1.5s")]
async fn durations() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let value: u32 = "1".parse()?;
    assert_eq!(value, 1);
    Ok(())
}

#[distributed_lock(key = "generic:{item}")]
async fn generic<T>(item: T, extra: impl Display + Send) -> Result<String, LockError>
where
    T: Display + Send + Sync,
{
    Ok(format!("{item}{extra}"))
}

#[distributed_lock(key = "borrowed:{name}")]
async fn borrowed<'a>(name: &'a str) -> Result<&'a str, LockError> {
    Ok(name)
}

struct Account {
    id: u64,
    balance: u64,
}

impl Account {
    #[distributed_lock(key = "account:{self.id}")]
    async fn balance(&self) -> Result<u64, LockError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:{self.id}", guard = lock)]
    async fn withdraw(&mut self, amount: u64) -> Result<u64, AppError> {
        let _ = lock.token();
        self.balance = self.balance.saturating_sub(amount);
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:{self.id}")]
    async fn close(self) -> Result<u64, LockError> {
        Ok(self.balance)
    }
}

#[distributed_lock(key = "shared:{name}")]
async fn shared(state: Arc<Vec<u8>>, name: String) -> Result<usize, LockError> {
    Ok(state.len() + name.len())
}

fn assert_send<T: Send>(_: T) {}

// The blocking form, on a plain `fn`.
#[distributed_lock(
    key = "blocking:{order.id}:<attempt>",
    ttl = 60,
    timeout = "500ms",
    guard = lock,
    auto_extend = true,
    fencing = true
)]
fn blocking_everything(order: &Order, attempt: u32) -> AppResult<Option<u64>> {
    if attempt > 3 {
        return Err(AppError::Invalid(attempt));
    }
    lock.extend(Duration::from_secs(60))?;
    Ok(lock.fencing_token())
}

#[distributed_lock(key = "blocking:unused", guard = lock)]
fn blocking_unused_guard() -> std::io::Result<()> {
    Ok(())
}

impl Account {
    #[distributed_lock(key = "account:{self.id}:blocking")]
    fn blocking_withdraw(&mut self, amount: u64) -> Result<u64, LockError> {
        self.balance -= amount;
        Ok(self.balance)
    }
}

/// The blocking form runs on a plain thread; without a global manager it fails at once.
#[test]
fn the_blocking_form_compiles_and_reports_a_missing_manager() {
    let order = Order {
        id: 1,
        region: Region {
            name: "eu".to_owned(),
        },
    };
    let _ = &order.region.name;
    let mut account = Account { id: 1, balance: 5 };
    assert!(matches!(
        blocking_everything(&order, 1),
        Err(AppError::Lock(LockError::NotInitialized))
    ));
    assert!(blocking_unused_guard().is_err());
    assert!(matches!(
        account.blocking_withdraw(1),
        Err(LockError::NotInitialized)
    ));
}

#[test]
fn generated_futures_are_send() {
    let order = Order {
        id: 1,
        region: Region {
            name: "eu".to_owned(),
        },
    };
    let mut account = Account { id: 1, balance: 5 };
    assert_send(fixed());
    assert_send(placeholders(&order, 1));
    assert_send(everything(1));
    assert_send(unused_guard());
    assert_send(durations());
    assert_send(generic(1, "x"));
    assert_send(borrowed("x"));
    assert_send(account.balance());
    assert_send(account.withdraw(1));
    assert_send(account.close());
    assert_send(shared(Arc::default(), String::new()));
    let _ = AppError::Invalid(0);
}
