//! The `#[distributed_lock]` attribute of [distlock](https://docs.rs/distlock).
//!
//! Use it through the `distlock` crate (`use distlock::distributed_lock;`): the code it generates
//! calls `::distlock::__private`, not this crate.
//!
//! The crate is split by step, so that each question has one place to look: where an option is
//! parsed, where its rules are checked, where its code is generated.
//!
//! - `args` parses the attribute's arguments into one typed `Args` (its `OPTIONS` table is the
//!   one list of options), using `duration` for duration literals and `key` for the key
//!   template;
//! - `valid` checks every rule, on the options and on the function, with one error collector;
//! - `expand` generates the rewritten function from what passed.
//!
//! This file only wires them together.

// Nothing in this crate needs `unsafe`, so no change may bring it in unnoticed.
#![forbid(unsafe_code)]

use proc_macro::TokenStream;

mod args;
mod duration;
mod expand;
mod key;
mod valid;

/// Runs the body of an `async fn` (or a plain `fn`: see below) while holding a distributed lock
/// on Redis.
///
/// ```no_run
/// use distlock::distributed_lock;
/// # #[derive(Debug)]
/// # struct AppError(distlock::LockError);
/// # impl From<distlock::LockError> for AppError {
/// #     fn from(error: distlock::LockError) -> Self { AppError(error) }
/// # }
///
/// #[distributed_lock(key = "trace:{trace_id}", ttl = 60)]
/// async fn process_trace(trace_id: &str) -> Result<(), AppError> {
///     // only one worker in the whole fleet runs this block for a given trace_id
///     Ok(())
/// }
/// ```
///
/// Before the body runs, the function acquires the lock `key` from the global lock manager
/// (`distlock::init(url)` at startup), waiting up to `timeout`. After the body — whether it ends
/// normally, by `return`, by `?` or by an error — it releases the lock, and awaits the release
/// before returning. If the future is dropped mid-body or the body panics, the guard releases the
/// lock in the background; the lock also expires by itself after `ttl`, so a crashed worker never
/// blocks the fleet.
///
/// The signature and the other attributes of the function are kept as written; only the body is
/// wrapped, so `return` and `?` keep their meaning, and the returned future is `Send` whenever the
/// body's is.
///
/// # Errors reach the caller through `From<LockError>`
///
/// The function must return a `Result` (any type path whose last segment ends with `Result`:
/// `Result<T, E>`, `std::io::Result<T>`, `anyhow::Result<T>`, an alias like `AppResult<T>`).
/// When the lock cannot be taken in time (or Redis fails, or the global manager is not
/// initialised) the function returns `Err(E::from(distlock::LockError))` without running the body,
/// so the error type needs `impl From<distlock::LockError>`. `std::io::Error`, `anyhow::Error` and
/// `Box<dyn Error + Send + Sync>` have one already. A plain `fn` that returns a future (`impl
/// Future`, `Pin<Box<dyn Future>>`) is refused: its work runs after it returns, when the lock
/// would already be given back; make it an `async fn`.
///
/// ```no_run
/// #[derive(Debug)]
/// enum AppError {
///     Lock(distlock::LockError),
///     // ...
/// }
///
/// impl From<distlock::LockError> for AppError {
///     fn from(error: distlock::LockError) -> Self {
///         AppError::Lock(error)
///     }
/// }
/// ```
///
/// # Options
///
/// Options are `name = value`, separated by commas, in any order; each may be given once.
///
/// ## `key = "<template>"` (required)
///
/// The name of the lock (the Redis key is the manager's prefix, `lock:` by default, followed by
/// it). Placeholders interpolate the `Display` of arguments, evaluated by reference before the
/// lock is taken:
///
/// | written | means |
/// |---|---|
/// | `{param}` or `<param>` | the argument `param` |
/// | `{param.field.sub}` or `<param.field>` | a field of it (tuple fields too: `{pair.0}`) |
/// | `{self.id}` | a field of the receiver, in a method with `self` / `&self` / `&mut self` |
/// | `{{` and `}}` | a literal `{` and `}` |
///
/// A `<` that does not open `<ident>` or `<ident.field..>` is literal text, so `"a<b"` and
/// `"x < 3"` need no escaping. A placeholder must name a parameter bound to a plain name (`x` or
/// `mut x`, not a pattern like `(a, b)`) or `self`.
///
/// ```no_run
/// # use distlock::distributed_lock;
/// # #[derive(Debug)]
/// # struct AppError(distlock::LockError);
/// # impl From<distlock::LockError> for AppError {
/// #     fn from(error: distlock::LockError) -> Self { AppError(error) }
/// # }
/// # struct Order { id: u64 }
/// # struct Region(String);
/// # impl std::fmt::Display for Region {
/// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(&self.0) }
/// # }
/// # struct Account { id: u64 }
/// #[distributed_lock(key = "order:{order.id}:<region>")]
/// async fn ship(order: &Order, region: Region) -> Result<(), AppError> { Ok(()) }
///
/// impl Account {
///     #[distributed_lock(key = "account:{self.id}")]
///     async fn withdraw(&mut self, amount: u64) -> Result<(), AppError> { Ok(()) }
/// }
/// ```
///
/// ## `keys = ["<template>", ..]` (instead of `key`)
///
/// Several locks, taken all or none with `LockManager::acquire_all` and held by one guard: every caller takes them in one order (their full keys sorted), so two calls
/// that name the same locks in opposite orders never deadlock, and a name that appears twice
/// (a transfer from an account to itself) is taken once. Each template is written as `key` is.
/// Not with `key`, and not empty.
///
/// ```no_run
/// # use distlock::distributed_lock;
/// # #[derive(Debug)]
/// # struct AppError(distlock::LockError);
/// # impl From<distlock::LockError> for AppError {
/// #     fn from(error: distlock::LockError) -> Self { AppError(error) }
/// # }
/// #[distributed_lock(keys = ["account:{from}", "account:{to}"], ttl = 10)]
/// async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), AppError> { Ok(()) }
/// ```
///
/// ## `ttl = <duration>` (default 30 s)
///
/// How long the lock lives in Redis if it is not released or extended: seconds as a number
/// (`ttl = 60`, `ttl = 0.5`) or a string with a unit: `"500ms"`, `"2s"`, `"1.5s"`, `"5m"`, `"1h"`.
/// It must be at least 1 ms and a whole number of milliseconds (Redis `PX`), and at most 365 days
/// (for long work, a short ttl with `auto_extend = true`).
///
/// ## `timeout = <duration>` (default 10 s)
///
/// How long to wait for the lock when another worker holds it, in the same forms as `ttl`.
/// At most 365 days; `timeout = 0` makes a single attempt. When it runs out the function returns
/// `Err(E::from(LockError::Timeout { .. }))`.
///
/// ```no_run
/// # use distlock::distributed_lock;
/// # #[derive(Debug)]
/// # struct AppError(distlock::LockError);
/// # impl From<distlock::LockError> for AppError {
/// #     fn from(error: distlock::LockError) -> Self { AppError(error) }
/// # }
/// #[distributed_lock(key = "report:{day}", ttl = "5m", timeout = 0)]
/// async fn build_report(day: u32) -> Result<(), AppError> { Ok(()) }
/// ```
///
/// ## `guard = <name>`
///
/// Binds the held lock as `name: &distlock::LockGuard` in the body, to extend it during long
/// work or read its key, token or fencing token. A body that calls the guard's methods on a
/// `lock` (or `guard`) it never binds is told to add `guard = lock`:
///
/// ```no_run
/// # use distlock::distributed_lock;
/// # #[derive(Debug)]
/// # struct AppError(distlock::LockError);
/// # impl From<distlock::LockError> for AppError {
/// #     fn from(error: distlock::LockError) -> Self { AppError(error) }
/// # }
/// # fn chunks(file: &str) -> Vec<&str> { vec![file] }
/// # async fn load(chunk: &str) -> Result<(), AppError> { Ok(()) }
/// #[distributed_lock(key = "import:{file}", ttl = 30, guard = lock)]
/// async fn import(file: &str) -> Result<(), AppError> {
///     for chunk in chunks(file) {
///         load(chunk).await?;
///         lock.extend(std::time::Duration::from_secs(30)).await?;
///     }
///     tracing::info!(key = lock.key(), token = lock.token(), "imported");
///     Ok(())
/// }
/// ```
///
/// ## `auto_extend = true | false` (default false)
///
/// A watchdog extends the lock every `ttl / 3` while the body runs. If the lock is lost anyway
/// (Redis unreachable for longer than the TTL, taken over), the body is cancelled at its next
/// `.await` and the function returns `Err(E::from(LockError::Lost { .. }))`.
///
/// ## `fencing = true | false` (default false)
///
/// Acquisition also draws a fencing token, strictly increasing per key across all clients; read
/// it with `lock.fencing_token()` (with `guard = lock`) and pass it to the storage you protect
/// so it can reject writes from a holder whose lock has expired. `fencing = true` needs a
/// `guard`: without one the token could never leave the lock, and it is a compile error.
///
/// ```no_run
/// # use distlock::distributed_lock;
/// # #[derive(Debug)]
/// # struct AppError(distlock::LockError);
/// # impl From<distlock::LockError> for AppError {
/// #     fn from(error: distlock::LockError) -> Self { AppError(error) }
/// # }
/// # struct Store;
/// # impl Store {
/// #     async fn write(&self, account: u64, fence: Option<u64>) -> Result<(), AppError> { Ok(()) }
/// # }
/// #[distributed_lock(key = "ledger:{account}", auto_extend = true, fencing = true, guard = lock)]
/// async fn post(account: u64, store: &Store) -> Result<(), AppError> {
///     store.write(account, lock.fencing_token()).await
/// }
/// ```
///
/// ## `on_busy = "wait" | "skip" | "fail"` (default `"wait"`)
///
/// What to do when someone else holds the lock: wait up to `timeout`; or make one attempt and,
/// if it is held, return without running the body — `Ok(())` from a `Result<(), E>`, `Ok(None)`
/// from a `Result<Option<T>, E>` (any other return type is a compile error), with a `tracing`
/// debug event naming the key; or make one attempt and return
/// `Err(E::from(LockError::Busy { key }))`. With `"skip"` and `"fail"`, a `timeout` is an error.
///
/// ## `hold_at_least = <duration>` (at most `ttl`)
///
/// Keep the lock until this long after it was taken, even when the body finishes sooner: the
/// release leaves it to expire then instead of deleting it. With `on_busy = "skip"`, a job that
/// every node starts on its own clock runs once, as long as the clocks differ by less than this:
///
/// ```no_run
/// # use distlock::distributed_lock;
/// # #[derive(Debug)]
/// # struct AppError(distlock::LockError);
/// # impl From<distlock::LockError> for AppError {
/// #     fn from(error: distlock::LockError) -> Self { AppError(error) }
/// # }
/// # async fn send_report() -> Result<(), AppError> { Ok(()) }
/// #[distributed_lock(key = "report:nightly", ttl = 600, on_busy = "skip", hold_at_least = "30s")]
/// async fn nightly_report() -> Result<(), AppError> {
///     send_report().await
/// }
/// ```
///
/// ## `permits = <n>` (default 1)
///
/// A semaphore: at most n holders of the name at once, fleet-wide, each permit a lease with the
/// ttl (extended, kept alive by `auto_extend`, given back at its ttl when its holder dies);
/// waiters are served first come, first served. 1 is the mutex. At least 1, and not with
/// `mode = "read"`; every caller of a name must give the same n:
///
/// ```no_run
/// # use distlock::{distributed_lock, LockError};
/// # async fn charge(order: u64) -> Result<(), LockError> { Ok(()) }
/// #[distributed_lock(key = "payments:api", permits = 5, auto_extend = true)]
/// async fn call_payments(order: u64) -> Result<(), LockError> {
///     charge(order).await
/// }
/// ```
///
/// ## `mode = "read" | "write"` (default `"write"`)
///
/// A read-write lock: readers share the name, a writer (`"write"`, the mutex) is alone. The line
/// is fair: a writer is never overtaken by readers that come after it. A task holding the read
/// lock that asks for the write lock of the same name gets `LockError::Config` at once:
///
/// ```no_run
/// # use distlock::{distributed_lock, LockError};
/// #[distributed_lock(key = "catalog:{shop}", mode = "read")]
/// async fn show_catalog(shop: &str) -> Result<usize, LockError> {
///     Ok(shop.len())
/// }
///
/// #[distributed_lock(key = "catalog:{shop}", mode = "write")]
/// async fn rebuild_catalog(shop: &str) -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// ## `crate = "<path>"` (default `"::distlock"`)
///
/// The path of the `distlock` crate, for code that renames the dependency or re-exports it:
///
/// ```no_run
/// use distlock as dl;
///
/// #[dl::distributed_lock(key = "job", crate = "dl")]
/// async fn job() -> Result<(), dl::LockError> { Ok(()) }
/// ```
///
/// # Where it applies
///
/// Any `async fn` with a body: free functions, inherent methods and trait-impl methods with any
/// receiver (`self`, `&self`, `&mut self`, `self: Box<Self>`), with generics, `where` clauses,
/// lifetimes and `impl Trait` arguments.
///
/// # Synchronous functions
///
/// On a plain `fn` the attribute takes the lock through `distlock::blocking` (install it with
/// `distlock::blocking::init(url)`, or `distlock::init`), with the same options and rules, except
/// that `on_busy` is `"wait"` (`"skip"` and `"fail"` are compile errors there). The
/// body is kept as written after a local that holds the lock and releases it when dropped: on
/// return, on `?`, and while a panic unwinds, before the function returns. `guard = name` binds
/// `&distlock::blocking::LockGuard`. A synchronous body cannot be interrupted, so with
/// `auto_extend` the watchdog keeps the lock alive while it runs, but a lock lost anyway does not
/// stop it: the release logs a warning, and a body with a guard can check `guard.is_lost()`.
/// Called on a thread where a tokio runtime is current it returns
/// `E::from(LockError::InsideAsyncRuntime { .. })` at once rather than block that thread.
///
/// ```no_run
/// # use distlock::distributed_lock;
/// # #[derive(Debug)]
/// # struct AppError(distlock::LockError);
/// # impl From<distlock::LockError> for AppError {
/// #     fn from(error: distlock::LockError) -> Self { AppError(error) }
/// # }
/// #[distributed_lock(key = "report:{day}", ttl = "5m")]
/// fn build_report(day: u32) -> Result<(), AppError> {
///     // one process of the fleet at a time, for a given day
///     Ok(())
/// }
///
/// fn main() -> Result<(), AppError> {
///     distlock::blocking::init("redis://127.0.0.1:6379")?;
///     build_report(7)
/// }
/// ```
///
/// # Compile-time errors
///
/// Every mistake is reported where it is written, saying what to write instead: a missing or
/// empty `key`; an unclosed `{`, stray `}` or empty `{}` in the key; a placeholder that names no
/// parameter (the message lists the parameters there are); an unknown or repeated option; a
/// duration that is zero, negative, under a millisecond, over 365 days or unparsable (the
/// runtime refuses the same values, so none of them compiles and then fails on every call); a
/// value of the wrong kind; a `const fn`, or a function that does not return a `Result`; a
/// `timeout` with `on_busy = "skip"` or `"fail"`; a return type that does not say what a skipped
/// call returns; a `hold_at_least` longer than the ttl; `permits = 0`, or `permits` with
/// `mode = "read"`; a `mode` other than `"read"` or `"write"`; `fencing = true` without `guard`, whose
/// token the body could never read; a body that calls the guard's methods on `lock` (or
/// `guard`) without binding it with `guard = ...`. If the error type has no `From<LockError>`,
/// rustc points at it, saying to add one.
///
/// When the attribute's arguments or the function are wrong, the function is still emitted as
/// written next to the errors, so the rest of the crate (and the IDE) keeps seeing it, and only
/// those errors are reported: no `unused variable` for a parameter only the key uses, no
/// unknown name for the guard the body uses.
///
/// # Fine print
///
/// - Placeholders always use `Display`; format specs such as `{id:?}` are rejected.
/// - A `<` followed by a name and `>` (`<id>`, `<order.id>`) is always a placeholder; there is no
///   escape for such literal text. Any other `<` or `>` is literal.
/// - Durations are whole milliseconds, as Redis stores them (`"1.5ms"` is rejected rather than
///   rounded).
/// - `guard` may not reuse the name of a parameter, which it would hide in the body.
/// - The key is formatted (by reference) before the lock is taken; then the body takes the
///   arguments by value (`async move`), exactly as the original body did.
/// - An `async fn` turned into a boxed future by another attribute (such as `#[async_trait]`)
///   before this one runs is no longer an `async fn`, and is rejected.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = valid::Errors::default();
    let args = args::Args::parse(args.into(), &mut errors);
    let function = match valid::function(item.clone()) {
        Ok(function) => Some(function),
        Err(error) => {
            errors.push(error);
            None
        }
    };
    let expanded = valid::check(&args, function.as_ref(), errors).and_then(|valid| {
        let mut tokens = expand::expand(&valid)?;
        if let Some(hint) = &valid.hint {
            tokens.extend(hint.to_compile_error());
        }
        Ok(tokens)
    });

    match expanded {
        Ok(tokens) => tokens.into(),
        Err(errors) => {
            // Keep the item, so that the rest of the crate (and the IDE) still sees the function
            // and reports only these errors, not every use of a function that vanished.
            let mut tokens = match &function {
                Some(function) => expand::rejected(function).into(),
                None => item,
            };
            tokens.extend(TokenStream::from(errors.to_compile_error()));
            tokens
        }
    }
}
