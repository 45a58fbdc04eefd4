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

use proc_macro::TokenStream;
use proc_macro2::{Delimiter, Group, Ident, Span, TokenTree};
use quote::{quote, ToTokens};
use syn::{FnArg, ItemFn, LitStr, Pat, ReturnType, Signature, Type};

use lock_limits::{Violation, MAX_DURATION_MILLIS, MAX_DURATION_TEXT};

use crate::args::{self, Args, DurationArg, KeyArg, KeysArg, OnBusy};
use crate::key::Segment;

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

/// The names a body is likely to give the held lock when it forgets `guard = ...`.
const GUARD_NAMES: [&str; 2] = ["lock", "guard"];

/// The methods of the guard. A call of one of them on an undefined `lock` is taken for a use of
/// the held lock; a `static lock` elsewhere is never taken for one, as its methods (`read`,
/// `lock`, ...) are other ones.
const GUARD_METHODS: [&str; 9] = [
    "key",
    "keys",
    "token",
    "fencing_token",
    "extend",
    "is_held",
    "lost",
    "is_lost",
    "release",
];

/// Without `guard = ...`, a name of [`GUARD_NAMES`] that the body calls a guard method on
/// (`lock.extend(..)`) but never binds: the first such use. rustc would only say that the name
/// is not found.
///
/// Read from the body's tokens, macro arguments included, and careful to never refuse a body
/// that compiles: every appearance of the name other than as the receiver of a guard method
/// (`let lock`, `|lock|`, `Some(lock)`, `use a::lock`, `lock(..)`, `{ lock: .. }`) counts as
/// a binding, and a parameter of that name binds it too. A field or method of that name
/// (`self.lock`, `mutex.lock()`), or an item reached by a path (`config::lock`), is another
/// thing and is skipped.
fn undeclared_guard(args: &Args, function: &ItemFn) -> Option<Ident> {
    if args.guard.is_some() {
        return None;
    }
    let params = Params::of(&function.sig);
    let body = function.block.to_token_stream();
    GUARD_NAMES.iter().find_map(|name| {
        let bound = params.named.iter().any(|param| param == name)
            || params.destructured.iter().any(|(param, _)| param == name);
        if bound {
            return None;
        }
        let mut scan = GuardScan::default();
        scan.tokens(body.clone(), name);
        if scan.bound {
            None
        } else {
            scan.first_use
        }
    })
}

/// The error for a guard the body uses without `guard = ...`.
fn undeclared_guard_error(name: &Ident) -> syn::Error {
    syn::Error::new(
        name.span(),
        format!(
            "`{name}` is not defined: to use the held lock in the body, add `guard = {name}` to \
             the `#[distributed_lock(...)]` attribute"
        ),
    )
}

/// What [`undeclared_guard`] found of one name in a body.
#[derive(Default)]
struct GuardScan {
    /// The first `name.<guard method>`.
    first_use: Option<Ident>,
    /// Whether the name appears anywhere else, where it may be bound.
    bound: bool,
}

impl GuardScan {
    fn tokens(&mut self, tokens: proc_macro2::TokenStream, name: &str) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        for (at, token) in tokens.iter().enumerate() {
            match token {
                TokenTree::Group(group) => self.tokens(group.stream(), name),
                TokenTree::Ident(ident) if ident == name => {
                    let after_dot = at
                        .checked_sub(1)
                        .is_some_and(|before| is_dot(&tokens[before]))
                        && !at
                            .checked_sub(2)
                            .is_some_and(|before| is_dot(&tokens[before]));
                    if after_dot {
                        continue; // a field or a method of that name: `self.lock`, `m.lock()`
                    }
                    let method_call = tokens.get(at + 1).is_some_and(is_dot)
                        && !tokens.get(at + 2).is_some_and(is_dot)
                        && matches!(tokens.get(at + 2), Some(TokenTree::Ident(method))
                            if GUARD_METHODS.iter().any(|guard_method| method == guard_method));
                    let in_path = at >= 2 && is_colon(&tokens[at - 1]) && is_colon(&tokens[at - 2]);
                    if method_call && in_path {
                        // An item reached by a path, `config::lock.key()`: never the guard,
                        // which is a local. (`use a::lock` binds the name: counted below.)
                        continue;
                    }
                    if method_call {
                        self.first_use.get_or_insert_with(|| ident.clone());
                    } else {
                        self.bound = true;
                    }
                }
                _ => {}
            }
        }
    }
}

fn is_dot(token: &TokenTree) -> bool {
    matches!(token, TokenTree::Punct(punct) if punct.as_char() == '.')
}

fn is_colon(token: &TokenTree) -> bool {
    matches!(token, TokenTree::Punct(punct) if punct.as_char() == ':')
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

/// What a function with `on_busy = "skip"` returns when it skips its body: `Ok(())` for
/// `Result<(), E>`, `Ok(None)` for `Result<Option<T>, E>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skipped {
    Unit,
    None,
}

/// What a skipped call of a function returning `output` returns, if its type says it
/// unambiguously (see [`Skipped`]): read from the first type argument of the `...Result`.
pub(crate) fn skipped(output: &ReturnType) -> Option<Skipped> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    match ok_type(ty)? {
        Type::Tuple(tuple) if tuple.elems.is_empty() => Some(Skipped::Unit),
        Type::Path(path) if path.qself.is_none() && is_standard_option(&path.path) => {
            Some(Skipped::None)
        }
        _ => None,
    }
}

/// `Option<T>`, `std::option::Option<T>` or `core::option::Option<T>`: the type whose `None` a
/// skipped call returns (`my::Option<T>` is another type, which that `None` would not fit).
fn is_standard_option(path: &syn::Path) -> bool {
    let names: Vec<String> = path
        .segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect();
    let standard = match names.as_slice() {
        [option] => path.leading_colon.is_none() && option == "Option",
        [root, module, option] => {
            (root == "std" || root == "core") && module == "option" && option == "Option"
        }
        _ => false,
    };
    standard
        && path.segments.iter().last().is_some_and(|segment| {
            matches!(segment.arguments, syn::PathArguments::AngleBracketed(_))
        })
}

/// The `T` of `Result<T, E>`, `io::Result<T>`, `AppResult<T>`: the first type argument.
fn ok_type(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let syn::PathArguments::AngleBracketed(arguments) = &path.path.segments.last()?.arguments
    else {
        return None;
    };
    arguments.args.iter().find_map(|argument| match argument {
        syn::GenericArgument::Type(ty) => Some(ty),
        _ => None,
    })
}

/// With `on_busy = "skip"`, the return type must say what a skipped call returns.
fn check_skip_return(args: &Args, sig: &Signature, errors: &mut Errors) {
    if sig.asyncness.is_none() && matches!(args.on_busy, Some(OnBusy::Skip | OnBusy::Fail)) {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "`on_busy = \"skip\"` and `\"fail\"` work on an `async fn` only for now: make it \
             `async fn`, or use `on_busy = \"wait\"` (the default) on this blocking `fn`",
        ));
        return;
    }
    if args.on_busy != Some(OnBusy::Skip) {
        return;
    }
    let ReturnType::Type(_, ty) = &sig.output else {
        return; // reported by the return-type rule
    };
    if !is_result(ty) || skipped(&sig.output).is_some() {
        return;
    }
    let written = pretty_tokens(&ty.to_token_stream().to_string());
    let instead = match ok_type(ty) {
        Some(ok) => {
            let ok = pretty_tokens(&ok.to_token_stream().to_string());
            format!(
                "write `Option<{ok}>` in place of `{ok}` and return `Ok(Some(..))` from the body"
            )
        }
        None => "write the type out as `Result<(), E>` or `Result<Option<T>, E>`".to_owned(),
    };
    errors.push(syn::Error::new_spanned(
        ty,
        format!(
            "with `on_busy = \"skip\"` the body does not run when the lock is held, and the \
             return type must say what is returned then: `Result<(), E>` returns `Ok(())`, \
             `Result<Option<T>, E>` returns `Ok(None)`; this function returns `{written}`: \
             {instead}, or use `on_busy = \"fail\"` to return `Err(LockError::Busy)` instead"
        ),
    ));
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

/// The rules on the signature alone: not a `const fn`, returning a `...Result`. An `async fn`
/// takes the lock with `.await`; a plain `fn` takes it through `distlock::blocking`.
fn check_signature(sig: &Signature, errors: &mut Errors) {
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span,
            format!(
                "`#[distributed_lock]` cannot go on a `const fn`: taking a lock talks to Redis, \
                 which cannot happen at compile time; remove `const` from `{}`",
                sig.ident
            ),
        ));
    }
    if let Err(error) = check_return_type(sig) {
        errors.push(error);
    }
}

const WHY_RESULT: &str = "`#[distributed_lock]` needs a function that returns a `Result`, \
                          because acquiring the lock can fail (timeout, Redis unreachable) and \
                          that error reaches the caller as `E::from(distlock::LockError)`";

fn check_return_type(sig: &Signature) -> syn::Result<()> {
    let ty = match &sig.output {
        ReturnType::Type(_, ty) => ty,
        ReturnType::Default => {
            // Underline `fn name(..)`: there is no return type to point at.
            let mut paren = Group::new(Delimiter::Parenthesis, proc_macro2::TokenStream::new());
            paren.set_span(sig.paren_token.span.join());
            let fn_token = &sig.fn_token;
            let ident = &sig.ident;
            return Err(syn::Error::new_spanned(
                quote!(#fn_token #ident #paren),
                format!(
                    "{WHY_RESULT}; this function returns nothing: write `-> Result<(), YourError>` \
                     where `YourError: From<distlock::LockError>`, and end the body with `Ok(())`"
                ),
            ));
        }
    };
    if is_result(ty) {
        return Ok(());
    }
    let written = pretty_tokens(&ty.to_token_stream().to_string());
    let instead = match &**ty {
        Type::Tuple(tuple) if tuple.elems.is_empty() => {
            "write `-> Result<(), YourError>` where `YourError: From<distlock::LockError>`, and \
             end the body with `Ok(())`"
                .to_owned()
        }
        _ => format!(
            "write `-> Result<{written}, YourError>` where `YourError: From<distlock::LockError>`, \
             and wrap the value in `Ok(..)`"
        ),
    };
    Err(syn::Error::new_spanned(
        ty,
        format!("{WHY_RESULT}; it returns `{written}`: {instead}"),
    ))
}

/// Whether `ty` is a path whose last segment ends with `Result` (`Result<T, E>`,
/// `std::io::Result<T>`, `anyhow::Result<T>`, an alias like `AppResult<T>`).
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(path) if path.qself.is_none() => path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident.to_string().ends_with("Result")),
        Type::Group(group) => is_result(&group.elem),
        Type::Paren(paren) => is_result(&paren.elem),
        _ => false,
    }
}

/// `guard = name` must not reuse a parameter's name, which it would hide in the body.
fn check_guard(args: &Args, params: &Params, errors: &mut Errors) {
    let Some(guard) = &args.guard else {
        return;
    };
    if params.named.iter().any(|name| guard == name) {
        errors.push(syn::Error::new(
            guard.span(),
            format!(
                "`guard = {guard}` would hide the parameter `{guard}` in the body: choose \
                 another name, e.g. `guard = {}`",
                if guard == "lock" { "held" } else { "lock" }
            ),
        ));
    }
}

/// The names a key placeholder may use, read from a function signature.
#[derive(Debug, Default)]
struct Params {
    /// Whether the function has a `self` receiver.
    has_receiver: bool,
    /// Parameters bound by a plain identifier pattern (`x`, `mut x`, `ref x`), in order.
    named: Vec<String>,
    /// Names bound inside a destructuring pattern, with that pattern as written, e.g.
    /// `("a", "(a, b)")`: they exist in the body but a placeholder cannot name them.
    destructured: Vec<(String, String)>,
}

impl Params {
    /// Reads the parameters of `sig`.
    fn of(sig: &Signature) -> Params {
        let mut params = Params::default();
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(_) => params.has_receiver = true,
                FnArg::Typed(typed) => match &*typed.pat {
                    Pat::Ident(ident) if ident.subpat.is_none() => {
                        params.named.push(ident.ident.to_string());
                    }
                    pattern => {
                        let written = pretty_tokens(&quote::quote!(#pattern).to_string());
                        let mut names = Vec::new();
                        bound_names(pattern, &mut names);
                        for name in names {
                            params.destructured.push((name, written.clone()));
                        }
                    }
                },
            }
        }
        params
    }

    /// The list shown in error messages, e.g. "`self`, `trace_id`, `attempt`".
    fn listing(&self) -> String {
        let receiver = self.has_receiver.then(|| "self".to_owned());
        let names: Vec<String> = receiver
            .into_iter()
            .chain(self.named.iter().cloned())
            .map(|name| format!("`{name}`"))
            .collect();
        names.join(", ")
    }
}

/// Collects the names a pattern binds.
fn bound_names(pattern: &Pat, names: &mut Vec<String>) {
    let mut idents = Vec::new();
    bound_idents(pattern, &mut idents);
    names.extend(idents.iter().map(ToString::to_string));
}

/// Collects the identifiers a pattern binds.
pub(crate) fn bound_idents<'p>(pattern: &'p Pat, idents: &mut Vec<&'p Ident>) {
    match pattern {
        Pat::Ident(ident) => {
            idents.push(&ident.ident);
            if let Some((_, sub)) = &ident.subpat {
                bound_idents(sub, idents);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| bound_idents(p, idents)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| bound_idents(p, idents)),
        Pat::Struct(strukt) => strukt
            .fields
            .iter()
            .for_each(|field| bound_idents(&field.pat, idents)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| bound_idents(p, idents)),
        Pat::Reference(reference) => bound_idents(&reference.pat, idents),
        Pat::Paren(paren) => bound_idents(&paren.pat, idents),
        Pat::Type(typed) => bound_idents(&typed.pat, idents),
        Pat::Or(or) => or.cases.iter().for_each(|p| bound_idents(p, idents)),
        _ => {}
    }
}

/// Makes `quote`'s spaced-out token text readable in messages: `Option < u32 >` → `Option<u32>`.
fn pretty_tokens(text: &str) -> String {
    let mut pretty = text.to_owned();
    for (spaced, tight) in [
        (" :: ", "::"),
        (":: ", "::"),
        (" < ", "<"),
        ("< ", "<"),
        (" <", "<"),
        (" >", ">"),
        (" ,", ","),
        ("& ", "&"),
        ("( ", "("),
        (" )", ")"),
        ("[ ", "["),
        (" ]", "]"),
        (" ;", ";"),
        ("' ", "'"),
    ] {
        pretty = pretty.replace(spaced, tight);
    }
    pretty
}

/// Checks that every placeholder names a parameter a placeholder may use.
///
/// Errors are spanned at the key literal (stable Rust cannot point inside a string literal) and
/// name the placeholder at fault.
fn check_placeholders(segments: &[Segment], params: &Params, key: &LitStr, errors: &mut Errors) {
    let mut push = |message: String| errors.push(syn::Error::new(key.span(), message));

    for segment in segments {
        let Segment::Placeholder(placeholder) = segment else {
            continue;
        };
        let root = placeholder.root.as_str();
        let written = &placeholder.written;
        if root == "self" {
            if !params.has_receiver {
                push(format!(
                    "the lock key uses `{written}`, but this function has no `self` receiver; \
                     {}",
                    available(params)
                ));
            }
            continue;
        }
        if params.named.iter().any(|name| name == root) {
            continue;
        }
        if let Some((_, pattern)) = params.destructured.iter().find(|(name, _)| name == root) {
            push(format!(
                "the lock key uses `{written}`, but `{root}` is bound inside the pattern \
                 `{pattern}`; a placeholder can only name a parameter bound to a plain name: \
                 bind the parameter to a name (e.g. `pair: (u32, u32)`) and write a field of it \
                 in the key (e.g. `{{pair.0}}`)"
            ));
            continue;
        }
        push(format!(
            "the lock key uses `{written}`, but this function has no parameter `{root}`; {}",
            available(params)
        ));
    }
}

fn available(params: &Params) -> String {
    let listing = params.listing();
    if listing.is_empty() {
        "it has no parameters a placeholder could name: use a fixed key, or add a parameter"
            .to_owned()
    } else {
        format!("the parameters a placeholder can name are: {listing}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key;
    use quote::quote;

    /// Every message of `errors`, one a line.
    fn messages(errors: Errors) -> String {
        match errors.finish() {
            Ok(()) => String::new(),
            Err(error) => error
                .into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// The rule errors for `attribute` on `function` (both parsed without errors).
    fn rules(attribute: proc_macro2::TokenStream, function: &str) -> String {
        let mut errors = Errors::default();
        let args = Args::parse(attribute, &mut errors);
        assert!(errors.0.is_none(), "{}", messages(errors));
        let function: ItemFn = syn::parse_str(function).unwrap();
        match check(&args, Some(&function), Errors::default()) {
            Ok(_) => String::new(),
            Err(error) => error
                .into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    const FN: &str = "async fn f(id: u32) -> Result<(), E> { Ok(()) }";

    #[test]
    fn a_correct_attribute_passes() {
        assert_eq!(
            rules(
                quote!(
                    key = "k:{id}",
                    ttl = 60,
                    timeout = 0,
                    guard = lock,
                    auto_extend = true
                ),
                FN
            ),
            ""
        );
    }

    #[test]
    fn keys_rules() {
        assert_eq!(rules(quote!(keys = ["a:{id}", "b:{id}"]), FN), "");
        assert_eq!(rules(quote!(keys = ["only"]), FN), "");
        assert!(rules(quote!(keys = []), FN).contains("`keys` is empty"));
        assert!(rules(quote!(key = "k", keys = ["a"]), FN).contains("`key` and `keys` together"));
        assert!(rules(quote!(keys = ["a:{id}", "b:{nope}"]), FN).contains("no parameter `nope`"));
        assert!(!rules(quote!(keys = ["a"]), FN).contains("missing `key`"));
    }

    #[test]
    fn missing_key() {
        assert!(rules(quote!(), FN).contains("missing `key`"));
        assert!(rules(quote!(ttl = 5), FN).contains("missing `key`"));
    }

    #[test]
    fn repeated_option() {
        let message = rules(quote!(key = "k", ttl = 5, ttl = 6, ttl = 7), FN);
        assert_eq!(message.lines().count(), 2, "{message}");
        assert!(message.contains("`ttl` is given more than once: keep only one `ttl = 60`"));
    }

    #[test]
    fn bad_durations() {
        for (attribute, expected) in [
            (quote!(key = "k", ttl = 0), "is zero"),
            (quote!(key = "k", ttl = "0ms"), "is zero"),
            (quote!(key = "k", ttl = -5), "is negative"),
            (quote!(key = "k", ttl = "-5s"), "is negative"),
            (quote!(key = "k", timeout = -1), "is negative"),
            (quote!(key = "k", ttl = 0.0001), "less than 1 ms"),
            (quote!(key = "k", timeout = 0.0001), "less than 1 ms"),
            (
                quote!(key = "k", ttl = "1.5ms"),
                "write e.g. `ttl = \"1ms\"`",
            ),
            (
                quote!(key = "k", timeout = 1.0005),
                "write e.g. `timeout = \"1000ms\"`",
            ),
            (
                quote!(key = "k", ttl = "9000h"),
                "write at most `ttl = \"8760h\"`",
            ),
            (
                quote!(key = "k", ttl = 1e40),
                "longer than the maximum of 365 days",
            ),
            (
                quote!(key = "k", timeout = "9000h"),
                "write at most `timeout = \"8760h\"`",
            ),
        ] {
            let message = rules(attribute.clone(), FN);
            assert!(message.contains(expected), "{attribute}: {message}");
        }
    }

    #[test]
    fn the_limits_are_those_of_the_runtime() {
        // 365 days, the last accepted value, and one millisecond more.
        let max = format!("{MAX_DURATION_MILLIS}ms");
        let over = format!("{}ms", MAX_DURATION_MILLIS + 1);
        assert_eq!(rules(quote!(key = "k", ttl = #max, timeout = #max), FN), "");
        assert_eq!(rules(quote!(key = "k", ttl = "8760h"), FN), "");
        assert!(rules(quote!(key = "k", ttl = #over), FN).contains("longer than the maximum"));
        assert!(rules(quote!(key = "k", timeout = #over), FN).contains("longer than the maximum"));
        assert_eq!(rules(quote!(key = "k", ttl = "1ms", timeout = -0), FN), "");
    }

    #[test]
    fn guard_may_not_hide_a_parameter() {
        let message = rules(quote!(key = "k", guard = id), FN);
        assert!(
            message.contains("would hide the parameter `id`"),
            "{message}"
        );
        let message = rules(
            quote!(key = "k", guard = lock),
            "async fn f(lock: u8) -> Result<(), E> { Ok(()) }",
        );
        assert!(message.contains("`guard = held`"), "{message}");
    }

    #[test]
    fn permits_and_mode_follow_the_shared_rule() {
        let message = rules(quote!(key = "k", permits = 0), FN);
        assert!(
            message.contains("`permits = 0` lets nobody in"),
            "{message}"
        );
        let message = rules(quote!(key = "k", permits = 3, mode = "read"), FN);
        assert!(message.contains("pick one"), "{message}");
        let message = rules(quote!(key = "k", permits = 99999999999), FN);
        assert!(message.contains("at most 4294967295"), "{message}");
        for fine in [
            quote!(key = "k", permits = 3),
            quote!(key = "k", permits = 1, mode = "read"),
            quote!(key = "k", mode = "write", permits = 7),
        ] {
            assert_eq!(rules(fine.clone(), FN), "", "{fine}");
        }
    }

    #[test]
    fn fencing_needs_a_guard() {
        let message = rules(quote!(key = "k", fencing = true), FN);
        assert!(message.contains("add `guard = lock`"), "{message}");
        assert!(message.contains("`lock.fencing_token()`"), "{message}");
        assert_eq!(rules(quote!(key = "k", fencing = true, guard = g), FN), "");
        assert_eq!(rules(quote!(key = "k", fencing = false), FN), "");
    }

    /// The name of the guard a body uses without `guard = ...`, if any.
    fn undeclared(attribute: proc_macro2::TokenStream, function: &str) -> Option<String> {
        let mut errors = Errors::default();
        let args = Args::parse(attribute, &mut errors);
        let function: ItemFn = syn::parse_str(function).unwrap();
        undeclared_guard(&args, &function).map(|name| name.to_string())
    }

    #[test]
    fn a_guard_used_but_never_bound_is_found() {
        for (body, name) in [
            ("lock.extend(d).await?; Ok(())", "lock"),
            ("Ok(guard.key().len())", "guard"),
            ("println!(\"{}\", lock.token()); Ok(())", "lock"),
            ("if lock.is_lost() { return Ok(()) } Ok(())", "lock"),
        ] {
            let function = format!("async fn f(id: u32) -> Result<(), E> {{ {body} }}");
            assert_eq!(
                undeclared(quote!(key = "k"), &function).as_deref(),
                Some(name),
                "{body}"
            );
            assert_eq!(undeclared(quote!(key = "k", guard = lock), &function), None);
        }
    }

    /// Never a false alarm on a body that compiles: any other appearance of the name may bind
    /// it, and a field or method of that name is another thing.
    #[test]
    fn a_guard_name_bound_or_used_otherwise_is_left_alone() {
        for body in [
            "let lock = Ticket; lock.key(); Ok(())",
            "let f = |lock: &T| lock.key(); Ok(())",
            "if let Some(lock) = x { lock.extend(d); } Ok(())",
            "for guard in all { guard.release(); } Ok(())",
            "use a::lock; lock.key(); Ok(())",
            "my_macro!(lock); lock.key(); Ok(())",
            "self.lock.key(); m.lock().unwrap(); Ok(())",
            "lock.read(); Ok(())",
            "Ok(lock)",
            // An item reached by a path (a `static` or `const` of another module or type) is
            // not the guard, whatever its methods: the body compiles without `guard = ...`.
            "Ok(crate::config::lock.key().len())",
            "Self::guard.release(); Ok(())",
            "super::lock.token(); Ok(())",
            "<T>::lock.key(); Ok(())",
        ] {
            let function = format!("async fn f(id: u32) -> Result<(), E> {{ {body} }}");
            assert_eq!(undeclared(quote!(key = "k"), &function), None, "{body}");
        }
        assert_eq!(
            undeclared(
                quote!(key = "k"),
                "async fn f(lock: &L) -> Result<(), E> { lock.key(); Ok(()) }"
            ),
            None
        );
    }

    #[test]
    fn signature_rules() {
        // A plain `fn` is the blocking form: the same rules apply.
        assert_eq!(
            rules(quote!(key = "k"), "fn f() -> Result<(), E> { Ok(()) }"),
            ""
        );
        let message = rules(quote!(key = "k"), "fn f() {}");
        assert!(
            message.contains("this function returns nothing"),
            "{message}"
        );
        let message = rules(
            quote!(key = "k"),
            "const fn f() -> Result<(), E> { Ok(()) }",
        );
        assert!(message.contains("cannot go on a `const fn`"), "{message}");
        let message = rules(quote!(key = "k"), "async fn f() {}");
        assert!(
            message.contains("this function returns nothing"),
            "{message}"
        );
        let message = rules(quote!(key = "k"), "async fn f() -> Option<u8> { None }");
        assert!(
            message.contains("`-> Result<Option<u8>, YourError>`"),
            "{message}"
        );
        for output in [
            "std::io::Result<()>",
            "anyhow::Result<u8>",
            "AppResult<u8>",
            "(Result<(), E>)",
        ] {
            let function = format!("async fn f() -> {output} {{ todo!() }}");
            assert_eq!(rules(quote!(key = "k"), &function), "", "{output}");
        }
    }

    /// A skipped call returns `core`'s `None`: an `Option` of another path (`my::Option`) is
    /// refused here with the rule's message, not left to a type mismatch inside the expansion.
    #[test]
    fn skip_accepts_only_the_standard_option() {
        for output in [
            "Result<Option<u8>, E>",
            "Result<std::option::Option<u8>, E>",
            "Result<::core::option::Option<u8>, E>",
            "anyhow::Result<Option<u8>>",
            "std::io::Result<()>",
        ] {
            let function = format!("async fn f() -> {output} {{ todo!() }}");
            assert_eq!(
                rules(quote!(key = "k", on_busy = "skip"), &function),
                "",
                "{output}"
            );
        }
        for output in ["Result<my::Option<u8>, E>", "Result<Option, E>"] {
            let function = format!("async fn f() -> {output} {{ todo!() }}");
            let message = rules(quote!(key = "k", on_busy = "skip"), &function);
            assert!(
                message.contains("the return type must say what is returned then"),
                "{output}: {message}"
            );
        }
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let mut errors = Errors::default();
        let args = Args::parse(quote!(key = "{nope}", ttl = 0, guard = "g"), &mut errors);
        let function: ItemFn = syn::parse_str("const fn f() {}").unwrap();
        let message = match check(&args, Some(&function), errors) {
            Ok(_) => panic!("should be rejected"),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        };
        // guard (parse), ttl, const, no Result, unknown placeholder.
        assert_eq!(message.len(), 5, "{message:#?}");
    }

    #[test]
    fn not_a_function_is_checked_for_options_only() {
        let mut errors = Errors::default();
        let args = Args::parse(quote!(ttl = 0), &mut errors);
        let error = check(&args, None, errors).err().unwrap();
        assert_eq!(error.into_iter().count(), 2);
    }

    fn params(sig: &str) -> Params {
        let sig: Signature = syn::parse_str(sig).unwrap();
        Params::of(&sig)
    }

    fn validate_str(template: &str, sig: &str) -> Result<(), String> {
        let literal = LitStr::new(template, Span::call_site());
        let mut errors = Errors::default();
        check_placeholders(
            &key::scan(template).unwrap(),
            &params(sig),
            &literal,
            &mut errors,
        );
        match messages(errors) {
            message if message.is_empty() => Ok(()),
            message => Err(message),
        }
    }

    #[test]
    fn params_are_read_from_the_signature() {
        let p =
            params("async fn f(&self, a: u32, mut b: u32, ref c: u32, (d, e): (u8, u8), _: u8)");
        assert!(p.has_receiver);
        assert_eq!(p.named, ["a", "b", "c"]);
        assert_eq!(
            p.destructured,
            [
                ("d".to_owned(), "(d, e)".to_owned()),
                ("e".to_owned(), "(d, e)".to_owned())
            ]
        );
    }

    #[test]
    fn placeholders_naming_parameters_are_accepted() {
        validate_str("{a}:{b.x}:<c>", "async fn f(a: u32, mut b: B, c: &str)").unwrap();
        validate_str("{self.id}:{a}", "async fn f(&mut self, a: u32)").unwrap();
        validate_str("{self}", "async fn f(self)").unwrap();
    }

    #[test]
    fn unknown_placeholder_lists_parameters() {
        let message = validate_str("{nope}", "async fn f(&self, a: u32, b: u32)").unwrap_err();
        assert!(message.contains("no parameter `nope`"), "{message}");
        assert!(message.contains("`self`, `a`, `b`"), "{message}");
    }

    #[test]
    fn unknown_placeholder_without_parameters() {
        let message = validate_str("{nope}", "async fn f()").unwrap_err();
        assert!(message.contains("it has no parameters"), "{message}");
    }

    #[test]
    fn destructured_names_are_rejected() {
        let message = validate_str("{a}", "async fn f((a, b): (u32, u32))").unwrap_err();
        assert!(
            message.contains("bound inside the pattern `(a, b)`"),
            "{message}"
        );
    }

    #[test]
    fn self_without_receiver_is_rejected() {
        let message = validate_str("{self.id}", "async fn f(id: u32)").unwrap_err();
        assert!(message.contains("no `self` receiver"), "{message}");
        assert!(message.contains("`id`"), "{message}");
    }

    #[test]
    fn every_unknown_placeholder_is_reported() {
        let message = validate_str("{x}{y}", "async fn f(a: u32)").unwrap_err();
        assert_eq!(message.lines().count(), 2, "{message}");
    }

    #[test]
    fn pretty_tokens_tightens_generics() {
        assert_eq!(
            pretty_tokens(&quote::quote!(Option<Vec<&'a str>>).to_string()),
            "Option<Vec<&'a str>>"
        );
        assert_eq!(
            pretty_tokens(&quote::quote!(std::io::Result<(u8, u8)>).to_string()),
            "std::io::Result<(u8, u8)>"
        );
    }
}
