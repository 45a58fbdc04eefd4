// The generated code is warning-free under the strictest settings (rustc's side here; the clippy
// side is checked by tests/macro_lints.rs under `cargo clippy`).
#![deny(warnings)]
#![deny(clippy::pedantic, clippy::all)]
#![deny(unused_qualifications, unused_results, unreachable_pub, missing_docs)]
//! Lint test.

use distlock::{distributed_lock, LockError};

/// Static key.
#[distributed_lock(key = "static")]
pub async fn fixed() -> Result<(), LockError> {
    Ok(())
}

/// Placeholders and every option.
#[distributed_lock(
    key = "item:{id}:<name>:{{x}}",
    ttl = 60,
    timeout = "500ms",
    guard = lock,
    auto_extend = true,
    fencing = true,
)]
pub async fn everything(id: u64, name: &str) -> Result<u64, LockError> {
    Ok(id + name.len() as u64)
}

/// Unused guard.
#[distributed_lock(key = "unused", guard = lock)]
pub async fn unused_guard() -> Result<(), LockError> {
    Ok(())
}

/// Used guard.
#[distributed_lock(key = "used", guard = lock)]
pub async fn used_guard() -> Result<usize, LockError> {
    Ok(lock.key().len())
}

/// `return` and `?`.
#[distributed_lock(key = "early:{flag}")]
pub async fn early(flag: bool) -> std::io::Result<u32> {
    if flag {
        return Ok(1);
    }
    let value: u32 = "2".parse().map_err(std::io::Error::other)?;
    Ok(value)
}

/// The blocking form with a body of one expression on one line, and no guard (rustc's
/// `unused_braces` looks at one-line blocks only).
#[distributed_lock(key = "blocking")]
pub fn blocking_one_expression() -> Result<(), LockError> { Ok(()) }

/// The same with a guard.
#[distributed_lock(key = "blocking:guarded", guard = lock)]
pub fn blocking_one_expression_guarded() -> Result<(), LockError> { Ok(()) }

/// A struct with a locked method.
pub struct Thing {
    id: u32,
}

impl Thing {
    /// Method with a receiver placeholder.
    #[distributed_lock(key = "thing:{self.id}")]
    pub async fn touch(&mut self) -> Result<u32, LockError> {
        self.id += 1;
        Ok(self.id)
    }
}

fn main() {
    let mut thing = Thing { id: 0 };
    drop(thing.touch());
    drop(fixed());
    drop(everything(1, "n"));
    drop(unused_guard());
    drop(used_guard());
    drop(early(true));
    assert!(matches!(
        blocking_one_expression(),
        Err(LockError::NotInitialized)
    ));
    assert!(matches!(
        blocking_one_expression_guarded(),
        Err(LockError::NotInitialized)
    ));
}
