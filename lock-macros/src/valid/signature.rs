//! The rules on the function's signature: not `const`, returning a `Result`, and, with
//! `on_busy = "skip"`, a return type that says what a skipped call returns.

use proc_macro2::{Delimiter, Group};
use quote::{quote, ToTokens};
use syn::{ReturnType, Signature, Type};

use super::params::pretty_tokens;
use super::Errors;
use crate::args::{Args, OnBusy};

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
pub(super) fn is_standard_option(path: &syn::Path) -> bool {
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
pub(super) fn ok_type(ty: &Type) -> Option<&Type> {
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
pub(super) fn check_skip_return(args: &Args, sig: &Signature, errors: &mut Errors) {
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

/// The rules on the signature alone: not a `const fn`, returning a `...Result`. An `async fn`
/// takes the lock with `.await`; a plain `fn` takes it through `distlock::blocking`.
pub(super) fn check_signature(sig: &Signature, errors: &mut Errors) {
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

pub(super) const WHY_RESULT: &str =
    "`#[distributed_lock]` needs a function that returns a `Result`, \
                          because acquiring the lock can fail (timeout, Redis unreachable) and \
                          that error reaches the caller as `E::from(distlock::LockError)`";

pub(super) fn check_return_type(sig: &Signature) -> syn::Result<()> {
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
    let text = ty.to_token_stream().to_string();
    let written = pretty_tokens(&text);
    if sig.asyncness.is_none() && names_a_future(&text) {
        // Wrapping the future in a `Result` would make this the blocking form, which holds the
        // lock only while the future is built, not while it runs.
        return Err(syn::Error::new_spanned(
            ty,
            format!(
                "`#[distributed_lock]` holds the lock while the body runs, and this function's \
                 work runs later, in the future it returns (`{written}`); make it an `async fn` \
                 that returns the future's output, a `Result<T, E>` where \
                 `E: From<distlock::LockError>`"
            ),
        ));
    }
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

/// Whether the return type written as `text` (its tokens) is a future: `impl Future<..>` (or
/// `impl .. + Future<..>`), or a path whose generic arguments contain one
/// (`Pin<Box<dyn Future<..>>>`, `BoxFuture<'_, T>`).
fn names_a_future(text: &str) -> bool {
    text.split(|c: char| !c.is_alphanumeric() && c != '_')
        .any(|word| word == "Future" || word == "BoxFuture" || word == "LocalBoxFuture")
}

/// Whether `ty` is a path whose last segment ends with `Result` (`Result<T, E>`,
/// `std::io::Result<T>`, `anyhow::Result<T>`, an alias like `AppResult<T>`).
pub(super) fn is_result(ty: &Type) -> bool {
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
