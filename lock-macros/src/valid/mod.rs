//! Every rule of `#[distributed_lock]`, in one place, with the one error collector.
//!
//! Parsing ([`crate::args`]) only checks the form of each value; this module decides whether
//! the attribute and the function it is on are allowed together:
//!
//! - the options: `key` is given, no option is repeated, `ttl` and `timeout` are within the
//!   limits the runtime enforces (read from `lock_limits`, so both refuse the same values),
//!   `hold_at_least` is at most the ttl, and `on_busy = "skip"` or `"fail"` (one attempt) comes
//!   without a `timeout`;
//! - the function: an `async fn` or a plain `fn` (the blocking form) with a body, not `const`,
//!   returning a `Result`;
//! - the key: every placeholder names a parameter a placeholder may use;
//! - `guard` does not hide a parameter;
//! - with `on_busy = "skip"`, the return type says what a skipped call returns (`Result<(), E>`
//!   or `Result<Option<T>, E>`).
//!
//! Every problem is reported in one run, each spanned at the token at fault and saying what to
//! write instead. [`check`] returns a [`Valid`], the only input [`crate::expand`] accepts.
//!
//! The rules on the options are here; those on the signature are in `signature`, on the
//! parameters a key may name in `params`, and the search for an undeclared guard in `guard`.

use proc_macro::TokenStream;
use proc_macro2::{Ident, Span};
use syn::ItemFn;

use lock_limits::{Violation, MAX_DURATION_MILLIS, MAX_DURATION_TEXT};

use crate::args::{self, Args, DurationArg, KeyArg, KeysArg, OnBusy};

mod guard;
mod params;
mod signature;

use guard::{undeclared_guard, undeclared_guard_error};
pub(crate) use params::bound_idents;
use params::{check_guard, check_placeholders, Params};
use signature::{check_signature, check_skip_return};
pub(crate) use signature::{skipped, Skipped};

/// Collects errors so that one run reports them all.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    /// Adds `error` (which may itself hold several) to the collection.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(errors) => errors.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// `Err` with every error pushed, or `Ok` if there is none.
    pub(crate) fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// An attribute and its function that passed every rule: what [`crate::expand`] generates from.
pub(crate) struct Valid<'a> {
    pub(crate) args: &'a Args,
    /// The lock's template; with `keys`, the first of them.
    pub(crate) key: &'a KeyArg,
    /// `keys = [..]`: every template, taken all or none.
    pub(crate) keys: Option<&'a KeysArg>,
    pub(crate) function: &'a ItemFn,
    /// The name the body sees the held lock as: `guard = name`, or the name an otherwise valid
    /// body uses without it (bound anyway, so that [`Valid::hint`] is the only error).
    pub(crate) guard: Option<Ident>,
    /// An error to report next to the generated function: the body uses a guard it did not
    /// declare.
    pub(crate) hint: Option<syn::Error>,
}

/// Parses the item the attribute is on, which must be a function with a body.
pub(crate) fn function(item: TokenStream) -> syn::Result<ItemFn> {
    syn::parse::<ItemFn>(item).map_err(|_| {
        syn::Error::new(
            Span::call_site(),
            "`#[distributed_lock]` goes on a function with a body (an `async fn`, or a plain \
             `fn` for synchronous code): a free function, or a method in an `impl` block",
        )
    })
}

/// Checks every rule on `args` and on `function` (when the item is one), adding to the errors
/// parsing already found; returns what to generate from when there are none.
pub(crate) fn check<'a>(
    args: &'a Args,
    function: Option<&'a ItemFn>,
    mut errors: Errors,
) -> syn::Result<Valid<'a>> {
    check_options(args, &mut errors);
    let mut undeclared = None;
    if let Some(function) = function {
        check_signature(&function.sig, &mut errors);
        let params = Params::of(&function.sig);
        let templates = args.keys.iter().flat_map(|keys| &keys.templates);
        for key in args.key.iter().chain(templates) {
            check_placeholders(&key.segments, &params, &key.literal, &mut errors);
        }
        check_guard(args, &params, &mut errors);
        check_skip_return(args, &function.sig, &mut errors);
        undeclared = undeclared_guard(args, function);
    }
    check_fencing(args, undeclared.is_some(), &mut errors);
    let mut hint = undeclared.as_ref().map(undeclared_guard_error);
    if errors.0.is_some() {
        // Rejected anyway: the hint goes with the other errors.
        if let Some(hint) = hint.take() {
            errors.push(hint);
        }
    }
    errors.finish()?;
    let (key, keys) = match (&args.key, &args.keys) {
        (Some(key), _) => (Some(key), None),
        (None, Some(keys)) => (keys.templates.first(), Some(keys)),
        (None, None) => (None, None),
    };
    match (key, function) {
        (Some(key), Some(function)) => Ok(Valid {
            args,
            key,
            keys,
            function,
            guard: args.guard.clone().or(undeclared),
            hint,
        }),
        // Both cases pushed an error above (a missing key, or an item that is not a function).
        _ => Err(syn::Error::new(
            Span::call_site(),
            "`#[distributed_lock]` needs `key = \"...\"` and a function",
        )),
    }
}

/// `fencing = true` draws a token that only reaches the body through the guard: without
/// `guard = ...` nothing can pass it to the storage it is for. Not reported when the body
/// already uses an undeclared guard, whose message says the same thing to do.
fn check_fencing(args: &Args, body_uses_guard: bool, errors: &mut Errors) {
    if args.guard.is_some() || body_uses_guard || !args.fencing.as_ref().is_some_and(|f| f.value) {
        return;
    }
    let span = args
        .written
        .iter()
        .find(|(name, _)| *name == "fencing")
        .map_or_else(Span::call_site, |(_, span)| *span);
    errors.push(syn::Error::new(
        span,
        "`fencing = true` draws a fencing token that only the body can pass on to the storage \
         it protects, and this body has no way to read it: add `guard = lock` to the attribute \
         and read `lock.fencing_token()` in the body (or remove `fencing`)",
    ));
}

/// `keys`: not with `key`, and not empty (`lock_limits::check_key_count`, the runtime's rule).
fn check_keys(args: &Args, errors: &mut Errors) {
    let Some((_, keys_span)) = args.written.iter().find(|(name, _)| *name == "keys") else {
        return;
    };
    if args.is_written("key") {
        errors.push(syn::Error::new(
            *keys_span,
            "`key` and `keys` together: write `key = \"...\"` for one lock, or list every \
             lock in `keys = [\"...\", \"...\"]` and remove `key`",
        ));
    }
    if let Some(keys) = &args.keys {
        if lock_limits::check_key_count(keys.templates.len()).is_err() {
            errors.push(syn::Error::new(
                keys.span,
                "`keys` is empty: name at least one lock, e.g. \
                 `keys = [\"account:{from}\", \"account:{to}\"]` (for one lock, `key = \"...\"`)",
            ));
        }
    }
}

/// The rules on the options alone.
fn check_options(args: &Args, errors: &mut Errors) {
    check_keys(args, errors);
    if !args.is_written("key") && !args.is_written("keys") {
        errors.push(syn::Error::new(
            Span::call_site(),
            "missing `key`: `#[distributed_lock]` needs the name of the lock, e.g. \
             `#[distributed_lock(key = \"trace:{trace_id}\")]`",
        ));
    }
    for (at, (name, span)) in args.written.iter().enumerate() {
        if args.written[..at]
            .iter()
            .any(|(earlier, _)| earlier == name)
        {
            errors.push(syn::Error::new(
                *span,
                format!(
                    "`{name}` is given more than once: keep only one `{}`",
                    args::option(name).example
                ),
            ));
        }
    }
    if let Some(ttl) = &args.ttl {
        if let Err(message) = ttl_rule(ttl) {
            errors.push(syn::Error::new_spanned(&ttl.tokens, message));
        }
    }
    if let Some(timeout) = &args.timeout {
        if let Err(message) = timeout_rule(timeout) {
            errors.push(syn::Error::new_spanned(&timeout.tokens, message));
        }
    }
    if let Some(hold) = &args.hold_at_least {
        if let Err(message) = hold_rule(hold, args.ttl.as_ref()) {
            errors.push(syn::Error::new_spanned(&hold.tokens, message));
        }
    }
    check_on_busy_timeout(args, errors);
    check_kind(args, errors);
}

/// `permits` and `mode`: the rule the runtime applies too (`lock_limits::check_kind`), each
/// violation pointing at the value at fault.
fn check_kind(args: &Args, errors: &mut Errors) {
    let permits = args.permits.as_ref().map_or(1, |permits| permits.value);
    let read = args.mode.as_ref().is_some_and(|mode| mode.read);
    let checked = if args.keys.is_some() {
        lock_limits::check_kind_of_several(permits, read)
    } else {
        lock_limits::check_kind(permits, read)
    };
    let Err(violation) = checked else {
        return;
    };
    match (violation, &args.permits, &args.mode) {
        (lock_limits::KindViolation::NoPermits, Some(written), _) => {
            errors.push(syn::Error::new_spanned(
                &written.tokens,
                "`permits = 0` lets nobody in: write `permits = 1` for a mutex (or leave it out), \
                 or the number of holders allowed at once, e.g. `permits = 5`",
            ));
        }
        (lock_limits::KindViolation::TooManyPermits, Some(written), _) => {
            errors.push(syn::Error::new_spanned(
                &written.tokens,
                "`permits` is at most 4294967295 (a u32): write fewer permits",
            ));
        }
        (lock_limits::KindViolation::PermitsWithRead, Some(written), Some(mode)) => {
            let mut error = syn::Error::new_spanned(
                &written.tokens,
                "`permits` with `mode = \"read\"`: readers already share the lock without a \
                 count; pick one — remove `mode` for a semaphore of n holders, or remove \
                 `permits` for a read-write lock",
            );
            error.combine(syn::Error::new(mode.span, "the read mode is given here"));
            errors.push(error);
        }
        (lock_limits::KindViolation::SeveralKeys, permits, mode) => {
            let message = "`keys` with `permits` or `mode = \"read\"`: several locks are taken \
                           all or none as mutexes only; remove `permits` and `mode`, or lock one \
                           name with `key = \"...\"`";
            errors.push(match (permits, mode) {
                (Some(permits), _) => syn::Error::new_spanned(&permits.tokens, message),
                (None, Some(mode)) => syn::Error::new(mode.span, message),
                (None, None) => syn::Error::new(Span::call_site(), message),
            });
        }
        // Without a written `permits` the count is 1, which every mode takes.
        _ => {}
    }
}

/// `on_busy = "skip"` or `"fail"` make one attempt: a `timeout` would be ignored, so writing one
/// is a mistake to point out.
fn check_on_busy_timeout(args: &Args, errors: &mut Errors) {
    let Some(policy) = args.on_busy else {
        return;
    };
    if policy == OnBusy::Wait {
        return;
    }
    for (name, span) in &args.written {
        if *name == "timeout" {
            errors.push(syn::Error::new(
                *span,
                format!(
                    "`timeout` does nothing with `{}`, which makes one attempt and never waits: \
                     remove `timeout`, or write `on_busy = \"wait\"` to wait up to it",
                    policy.written()
                ),
            ));
        }
    }
}

/// `hold_at_least`: a positive whole number of milliseconds, at most the lock's ttl (the one
/// written, or the default).
fn hold_rule(hold: &DurationArg, ttl: Option<&DurationArg>) -> Result<(), String> {
    let written = &hold.written;
    if hold.millis.is_zero() {
        return Err(format!(
            "`hold_at_least = {written}` keeps the lock for no time at all: remove it, or write \
             how long the lock is kept after it is taken, e.g. `hold_at_least = \"30s\"`"
        ));
    }
    if hold.negative {
        return Err(format!(
            "`hold_at_least = {written}` is negative: write how long the lock is kept after it \
             is taken, e.g. `hold_at_least = \"30s\"`"
        ));
    }
    if hold.millis.whole == 0 {
        return Err(less_than_a_millisecond("hold_at_least", written));
    }
    if hold.millis.fraction {
        return Err(not_whole_milliseconds("hold_at_least", hold));
    }
    let (ttl_millis, ttl_text) = match ttl {
        Some(ttl) if ttl.negative => return Ok(()), // reported by the ttl rule
        Some(ttl) => (ttl.millis.whole, format!("`ttl = {}`", ttl.written)),
        None => (
            lock_limits::DEFAULT_TTL_MILLIS,
            format!(
                "the default ttl of {} s",
                lock_limits::DEFAULT_TTL_MILLIS / 1000
            ),
        ),
    };
    if hold.millis.whole > ttl_millis {
        return Err(format!(
            "`hold_at_least = {written}` is longer than {ttl_text}: the lock would expire before \
             the hold ends; write a `hold_at_least` of at most the ttl, or a longer ttl, e.g. \
             `ttl = \"{}ms\"`",
            hold.millis.whole
        ));
    }
    Ok(())
}

/// `ttl`: positive, whole milliseconds, at least `lock_limits::MIN_TTL_MILLIS`, at most
/// `lock_limits::MAX_DURATION_MILLIS`.
fn ttl_rule(ttl: &DurationArg) -> Result<(), String> {
    let written = &ttl.written;
    if ttl.negative && !ttl.millis.is_zero() {
        return Err(format!(
            "`ttl = {written}` is negative: the lock must live for a positive time, \
             e.g. `ttl = 30` (seconds) or `ttl = \"500ms\"`"
        ));
    }
    match lock_limits::check_ttl(ttl.millis.whole) {
        Err(Violation::TooShort) if ttl.millis.is_zero() => Err(format!(
            "`ttl = {written}` is zero: a lock that expires at once protects nothing; give it \
             a positive time, e.g. `ttl = 30` (seconds) or `ttl = \"500ms\"`"
        )),
        Err(Violation::TooShort) => Err(less_than_a_millisecond("ttl", written)),
        Err(Violation::TooLong) => Err(format!(
            "`ttl = {written}` is longer than the maximum of {MAX_DURATION_TEXT}, which the \
             runtime would refuse on every call: write at most `ttl = \"{}h\"`; for long work, \
             a short ttl with `auto_extend = true` keeps the lock while the body runs and frees \
             it soon after a crash",
            max_hours()
        )),
        Ok(()) if ttl.millis.fraction => Err(not_whole_milliseconds("ttl", ttl)),
        Ok(()) => Ok(()),
    }
}

/// `timeout`: zero (a single attempt) or whole milliseconds up to
/// `lock_limits::MAX_DURATION_MILLIS`.
fn timeout_rule(timeout: &DurationArg) -> Result<(), String> {
    let written = &timeout.written;
    if timeout.millis.is_zero() {
        return Ok(());
    }
    if timeout.negative {
        return Err(format!(
            "`timeout = {written}` is negative: write `timeout = 0` for a single attempt, or a \
             positive time to wait, e.g. `timeout = 5`"
        ));
    }
    if timeout.millis.whole == 0 {
        return Err(less_than_a_millisecond("timeout", written));
    }
    match lock_limits::check_timeout(timeout.millis.whole) {
        Err(Violation::TooLong | Violation::TooShort) => Err(format!(
            "`timeout = {written}` is longer than the maximum of {MAX_DURATION_TEXT}, which the \
             runtime would refuse on every call: write at most `timeout = \"{}h\"`",
            max_hours()
        )),
        Ok(()) if timeout.millis.fraction => Err(not_whole_milliseconds("timeout", timeout)),
        Ok(()) => Ok(()),
    }
}

/// The maximum duration in whole hours, for "write at most" hints.
fn max_hours() -> u64 {
    MAX_DURATION_MILLIS / 3_600_000
}

fn less_than_a_millisecond(name: &str, written: &str) -> String {
    format!(
        "`{name} = {written}` is less than 1 ms: Redis keeps expiries in whole milliseconds \
         (PX); write at least `{name} = \"1ms\"`"
    )
}

fn not_whole_milliseconds(name: &str, value: &DurationArg) -> String {
    format!(
        "`{name} = {}` is not a whole number of milliseconds: Redis keeps expiries in whole \
         milliseconds (PX); write e.g. `{name} = \"{}ms\"`",
        value.written, value.millis.whole
    )
}

#[cfg(test)]
mod tests;
