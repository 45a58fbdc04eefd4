//! Code generation for `#[distributed_lock]`: from a [`Valid`] attribute and function to the
//! rewritten function. Every rule has been checked before ([`crate::valid`]); this module only
//! writes code.
//!
//! The signature and the attributes of the function are kept exactly as written and only the
//! body is replaced: the original body becomes an `async move` block, so `return` and `?` inside
//! it keep their meaning and no lifetime is rewritten. On a plain `fn` (the blocking form) the
//! body is kept as it is, after a local that holds the lock and releases it when dropped. The generated code names the runtime only through `<crate>::__private` (`::distlock::__private` unless
//! `crate = "..."` says otherwise), and sets only the options the user wrote: every default
//! lives in the runtime's `LockOptions`.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::{
    AttrStyle, GenericArgument, Ident, ItemFn, LitStr, Member, PathArguments, ReturnType, Type,
};

use crate::args::{DurationArg, OnBusy};
use crate::key::Segment;
use crate::valid::{self, Skipped, Valid};

/// The rewritten function.
pub(crate) fn expand(valid: &Valid) -> syn::Result<TokenStream> {
    let Valid {
        args,
        key,
        keys,
        function,
        ref guard,
        hint: _,
    } = *valid;
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let outer_attrs = attrs
        .iter()
        .filter(|attr| matches!(attr.style, AttrStyle::Outer));
    let inner_attrs = attrs
        .iter()
        .filter(|attr| matches!(attr.style, AttrStyle::Inner(_)));

    let default_path: syn::Path = syn::parse_quote!(::distlock);
    let krate = args
        .crate_path
        .as_ref()
        .map_or(&default_path, |crate_path| &crate_path.path);
    // With `crate = "..."`, `__private` takes the span of that string, so a path that is not the
    // distlock crate is reported there ("could not find `__private` in ...").
    let private_span = args
        .crate_path
        .as_ref()
        .map_or_else(Span::call_site, |crate_path| crate_path.span);
    let private_ident = Ident::new("__private", private_span);
    let private = quote!(#krate::#private_ident);

    // Mixed-site hygiene: the body cannot see (or clash with) the generated locals.
    let local = |name: &str| Ident::new(name, Span::mixed_site());
    let key_var = local("__distlock_key");
    let options_var = local("__distlock_options");
    let guard_var = local("__distlock_guard");
    let outcome_var = local("__distlock_outcome");
    let acquired = local("__distlock_acquired");
    let error = local("__distlock_error");
    let output = local("__distlock_output");
    let lost = local("__distlock_lost");
    let label_var = local("__distlock_label");
    let span_var = local("__distlock_span");

    // Who takes the lock, for inspection, metrics and the span: the function's path and the
    // key template as written (never the rendered key: one label per function, not per id).
    let fn_name = sig.ident.unraw().to_string();
    let templates: Vec<&crate::args::KeyArg> = match keys {
        Some(keys) => keys.templates.iter().collect(),
        None => vec![key],
    };
    let template = &templates
        .iter()
        .map(|key| key.literal.value())
        .collect::<Vec<_>>()
        .join(", ");

    let (key_expr, key_type) = if keys.is_some() {
        let exprs = templates
            .iter()
            .map(|key| key_expression(&key.segments, &key.literal))
            .collect::<syn::Result<Vec<_>>>()?;
        (
            quote!(::std::vec![#(#exprs),*]),
            quote!(::std::vec::Vec<::std::string::String>),
        )
    } else {
        (
            key_expression(&key.segments, &key.literal)?,
            quote!(::std::string::String),
        )
    };
    // The span names every key of the call, joined.
    let span_key = if keys.is_some() {
        quote!(&#key_var.join(", "))
    } else {
        quote!(&#key_var)
    };
    // The runtime's call for one lock or for several, by its one-lock name.
    let call = |name: &str| {
        let name = if keys.is_some() {
            name.replacen("acquire", "acquire_all", 1)
        } else {
            name.to_owned()
        };
        Ident::new(&name, Span::call_site())
    };
    let (acquire_fn, acquire_or_busy_fn, try_acquire_fn, acquire_blocking_fn) = (
        call("acquire"),
        call("acquire_or_busy"),
        call("try_acquire"),
        call("acquire_blocking"),
    );
    // The `format!` arguments carry the key literal's span (so a non-`Display` placeholder is
    // reported there), which makes clippy read them as user code that could be inlined.
    let has_placeholders = templates.iter().any(|key| {
        key.segments
            .iter()
            .any(|segment| matches!(segment, Segment::Placeholder(_)))
    });
    let key_lint_allow = has_placeholders.then(|| quote!(#[allow(clippy::uninlined_format_args)]));

    // Only the options written are set; the builder methods take the span of the value, so a
    // type error in them would point at what the user wrote.
    let duration = |arg: Option<&DurationArg>, method: &str| {
        arg.map(|arg| {
            let method = Ident::new(method, arg.span);
            let millis = proc_macro2::Literal::u64_unsuffixed(arg.millis.whole);
            quote!(.#method(#private::Duration::from_millis(#millis)))
        })
    };
    let ttl = duration(args.ttl.as_ref(), "ttl");
    let timeout = duration(args.timeout.as_ref(), "timeout");
    let hold_at_least = duration(args.hold_at_least.as_ref(), "hold_at_least");
    let auto_extend = args
        .auto_extend
        .as_ref()
        .map(|value| quote!(.auto_extend(#value)));
    let fencing = args.fencing.as_ref().map(|value| quote!(.fencing(#value)));
    let permits = args.permits.as_ref().map(|permits| {
        let method = Ident::new("permits", permits.span);
        let count = proc_macro2::Literal::u64_unsuffixed(permits.value);
        quote!(.#method(#count))
    });
    let mode = args.mode.as_ref().map(|mode| {
        let method = Ident::new("mode", mode.span);
        let variant = Ident::new(if mode.read { "Read" } else { "Write" }, mode.span);
        quote!(.#method(#private::LockMode::#variant))
    });

    let from_error = convert_error(&sig.output, krate, &private_ident, &error);
    let prelude = quote! {
        #(#inner_attrs)*
        #key_lint_allow
        let #key_var: #key_type = #key_expr;
        let #label_var: &'static str =
            ::core::concat!(::core::module_path!(), "::", #fn_name, " ", #template);
        // Every option is a literal, so the call site builds its options once and every call
        // shares them: a call pays for no label text, no allocation, no drop.
        let #options_var: &'static #private::LockOptions = {
            static OPTIONS: ::std::sync::OnceLock<#private::LockOptions> =
                ::std::sync::OnceLock::new();
            OPTIONS.get_or_init(|| {
                #private::LockOptions::new()
                    #ttl
                    #timeout
                    #auto_extend
                    #fencing
                    #hold_at_least
                    #permits
                    #mode
                    .label(#label_var)
            })
        };
        // The acquisition, the body and the release run in the call's `distlock.lock` span.
        let #span_var = #private::span(#span_key, #label_var);
    };

    if sig.asyncness.is_none() {
        // The blocking form: the lock is held by the scrutinee of the body's `match`, whose drop
        // releases it, so the body stays as written — `return`, `?` and a panic all release on
        // their way out. Being a temporary created before the body's, it is dropped after them:
        // in edition 2021 the temporaries of a function's last expression outlive its locals,
        // so a guard held by a local would be released before the body's last temporaries (a
        // `MutexGuard`, a transaction that commits on drop) are done.
        let guard_binding = guard.as_ref().map(|guard| {
            quote! {
                #[allow(unused_variables)]
                let #guard: &#private::BlockingLockGuard = #guard_var.guard();
            }
        });
        // Without a guard, the arm is the body's own block: braces of ours straight around a
        // one-line body would be rustc's `unused_braces` in the user's crate, and an arm is not
        // linted. With a guard, the binding comes first and the body is the arm of a `match ()`
        // after it: still a block of its own, so that an item of the body named like the guard
        // is what the name means inside it, as in the async form, rather than clash with the
        // binding.
        let body = match guard_binding {
            None => block.to_token_stream(),
            Some(binding) => quote!({
                #binding
                match () {
                    () => #block
                }
            }),
        };
        return Ok(quote! {
            #(#outer_attrs)*
            #vis #sig {
                #prelude
                let #span_var = #span_var.entered();
                match #private::#acquire_blocking_fn(&#key_var, #options_var) {
                    ::core::result::Result::Ok(ref #guard_var) => #body
                    ::core::result::Result::Err(#error) => {
                        return ::core::result::Result::Err(#from_error);
                    }
                }
            }
        });
    }

    let guard_binding = guard.as_ref().map(|guard| {
        quote! {
            #[allow(unused_variables)]
            let #guard: &#private::LockGuard = &#guard_var;
        }
    });
    let from_lost = convert_error(&sig.output, krate, &private_ident, &lost);

    // The acquisition runs in the call's span too, so its wait shows up in the trace.
    let in_span = |call: TokenStream| quote!(#private::Instrument::instrument(#call, ::core::clone::Clone::clone(&#span_var)));
    let policy = args.on_busy.unwrap_or(OnBusy::Wait);
    let acquire = match policy {
        OnBusy::Wait | OnBusy::Fail => {
            let function = match policy {
                OnBusy::Fail => &acquire_or_busy_fn,
                _ => &acquire_fn,
            };
            let call = in_span(quote!(#private::#function(&#key_var, #options_var)));
            quote! {
                let #guard_var = match #call.await {
                    ::core::result::Result::Ok(#acquired) => #acquired,
                    ::core::result::Result::Err(#error) => {
                        return ::core::result::Result::Err(#from_error);
                    }
                };
            }
        }
        OnBusy::Skip => {
            let value = match valid::skipped(&sig.output) {
                Some(Skipped::None) => quote!(::core::option::Option::None),
                // `valid` made sure it is one of the two.
                _ => quote!(()),
            };
            let call = in_span(quote!(#private::#try_acquire_fn(&#key_var, #options_var)));
            quote! {
                let #guard_var = match #call.await {
                    ::core::result::Result::Ok(::core::option::Option::Some(#acquired)) => #acquired,
                    ::core::result::Result::Ok(::core::option::Option::None) => {
                        return ::core::result::Result::Ok(#value);
                    }
                    ::core::result::Result::Err(#error) => {
                        return ::core::result::Result::Err(#from_error);
                    }
                };
            }
        }
    };

    Ok(quote! {
        #(#outer_attrs)*
        #vis #sig {
            #prelude
            #acquire
            let #outcome_var = {
                #guard_binding
                #private::Instrument::instrument(
                    #private::run(&#guard_var, async move #block),
                    ::core::clone::Clone::clone(&#span_var),
                )
                .await
            };
            match #outcome_var {
                ::core::result::Result::Ok(#output) => {
                    #private::Instrument::instrument(#private::release(#guard_var), #span_var)
                        .await;
                    #output
                }
                ::core::result::Result::Err(#lost) => {
                    ::core::result::Result::Err(#from_lost)
                }
            }
        }
    })
}

/// The function as written, for an attribute that was refused: emitted next to the errors so
/// that the rest of the crate (and the IDE) still sees it, with nothing added to them. Its
/// parameters may be used only in the key, so the body first borrows each of them
/// (`let _ = &order;`): no `unused variable` warning, and no `#[allow(..)]`, which a crate's
/// `#![forbid(unused_variables)]` (or `forbid(warnings)`) would refuse with an error of its
/// own. (A guard the body uses is no further error: rustc reports no unresolved name once a
/// macro has failed.)
pub(crate) fn rejected(function: &ItemFn) -> TokenStream {
    let mut function = function.clone();
    let mut idents = Vec::new();
    for input in &function.sig.inputs {
        if let syn::FnArg::Typed(typed) = input {
            valid::bound_idents(&typed.pat, &mut idents);
        }
    }
    let uses: Vec<syn::Stmt> = idents
        .iter()
        .map(|ident| syn::parse_quote!(let _ = &#ident;))
        .collect();
    function.block.stmts.splice(0..0, uses);
    function.into_token_stream()
}

/// The expression that builds the key: `format!` with the placeholders as positional arguments,
/// all spanned at the key literal, so that a placeholder whose type is not `Display` is reported
/// there. A key without placeholders is a plain `String::from`.
fn key_expression(segments: &[Segment], literal: &LitStr) -> syn::Result<TokenStream> {
    let span = literal.span();
    let placeholders: Vec<TokenStream> = segments
        .iter()
        .filter_map(|segment| match segment {
            Segment::Placeholder(placeholder) => Some(placeholder),
            Segment::Literal(_) => None,
        })
        .map(|placeholder| {
            let root = identifier(&placeholder.root, span)?;
            let fields = placeholder
                .fields
                .iter()
                .map(|field| member(field, span))
                .collect::<syn::Result<Vec<_>>>()?;
            Ok(quote_spanned!(span=> #root #(.#fields)*))
        })
        .collect::<syn::Result<_>>()?;

    if placeholders.is_empty() {
        let text: String = segments
            .iter()
            .map(|segment| match segment {
                Segment::Literal(text) => text.as_str(),
                Segment::Placeholder(_) => "",
            })
            .collect();
        let text = LitStr::new(&text, span);
        // Fully qualified: `String::from` needs `From` in scope, which `#![no_implicit_prelude]`
        // takes away. Through `::std`, not `::core`: these tokens carry the literal's span, so
        // they resolve in the user's edition, and in 2015 `::core` is a path in the crate root.
        return Ok(quote_spanned!(span=>
            <::std::string::String as ::std::convert::From<&'static str>>::from(#text)
        ));
    }
    let format = LitStr::new(&format_string(segments), span);
    Ok(quote_spanned!(span=> ::std::format!(#format, #(#placeholders),*)))
}

/// The `format!` string for a scanned template: literal text with `{` and `}` doubled, and `{}`
/// for each placeholder, in order.
fn format_string(segments: &[Segment]) -> String {
    let mut format = String::new();
    for segment in segments {
        match segment {
            Segment::Literal(text) => {
                format.push_str(&text.replace('{', "{{").replace('}', "}}"));
            }
            Segment::Placeholder(_) => format.push_str("{}"),
        }
    }
    format
}

/// A field access after a placeholder's root: an identifier or a tuple index.
fn member(field: &str, span: Span) -> syn::Result<Member> {
    if let Ok(index) = field.parse::<u32>() {
        return Ok(Member::Unnamed(syn::Index { index, span }));
    }
    identifier(field, span).map(Member::Named)
}

/// The identifier written as `text` in a key template, at `span`. A raw one (`r#type`) stays
/// raw: `Ident::new` refuses the `r#`.
fn identifier(text: &str, span: Span) -> syn::Result<Ident> {
    let mut ident = Parser::parse_str(Ident::parse_any, text)
        .map_err(|_| syn::Error::new(span, format!("`{text}` is not an identifier")))?;
    ident.set_span(span);
    Ok(ident)
}

/// `<crate>::__private::FromLockError::from_lock_error(value)`: `E::from(value)` through the
/// runtime's trait whose `#[diagnostic::on_unimplemented]` says, for an `E` without
/// `From<LockError>`, what to add. The call is located on the error type (see
/// [`error_location`]), where rustc reports that message; `__private` keeps its own location,
/// so that a `crate = "..."` that is not distlock is reported once, at that string.
///
/// Only the *location* of the tokens moves (`located_at`): their hygiene stays what it was, so
/// `value` still resolves to the generated binding and the crate path where it is written.
fn convert_error(
    output: &ReturnType,
    krate: &syn::Path,
    private: &Ident,
    value: &Ident,
) -> TokenStream {
    let ReturnType::Type(_, ty) = output else {
        return quote!(#krate::#private::FromLockError::from_lock_error(#value));
    };
    let location = error_location(ty);
    let krate = relocate(krate.to_token_stream(), location);
    let separator = relocate(quote!(::), location);
    let call = relocate(quote!(FromLockError::from_lock_error(#value)), location);
    quote!(#krate #separator #private #separator #call)
}

/// `tokens`, each shown at `location` in diagnostics, resolving as before.
fn relocate(tokens: TokenStream, location: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut moved =
                    proc_macro2::Group::new(group.delimiter(), relocate(group.stream(), location));
                moved.set_span(group.span().located_at(location));
                token = TokenTree::Group(moved);
            } else {
                token.set_span(token.span().located_at(location));
            }
            token
        })
        .collect()
}

/// Where to report a missing `From<LockError>`: the name of `E` in `Result<T, E>` (`Opaque` in
/// `errors::Opaque`), or the name of the type when `E` is not written (`AppResult` in
/// `AppResult<T>`).
fn error_location(ty: &Type) -> Span {
    let name = |ty: &Type| match ty {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .map(|segment| segment.ident.span()),
        _ => None,
    };
    let error = error_type(ty);
    error
        .and_then(name)
        .or_else(|| error.map(|error| first_span(error.to_token_stream())))
        .or_else(|| name(ty))
        .unwrap_or_else(|| first_span(ty.to_token_stream()))
}

/// The `E` of `Result<T, E>` (the last of at least two type arguments), if written.
fn error_type(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let PathArguments::AngleBracketed(arguments) = &path.path.segments.last()?.arguments else {
        return None;
    };
    let types: Vec<&Type> = arguments
        .args
        .iter()
        .filter_map(|argument| match argument {
            GenericArgument::Type(ty) => Some(ty),
            _ => None,
        })
        .collect();
    match types.as_slice() {
        [_, .., error] => Some(error),
        _ => None,
    }
}

fn first_span(tokens: TokenStream) -> Span {
    tokens
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |token| token.span())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::Args;
    use crate::key;
    use crate::valid::{self, Errors};

    /// The expansion of `attribute` on `function`, as text.
    fn expanded(attribute: TokenStream, function: &str) -> String {
        let mut errors = Errors::default();
        let args = Args::parse(attribute, &mut errors);
        let function: ItemFn = syn::parse_str(function).unwrap();
        let valid = valid::check(&args, Some(&function), errors).unwrap();
        expand(&valid).unwrap().to_string()
    }

    const FN: &str = "async fn f(id: u32) -> Result<(), E> { Ok(()) }";

    #[test]
    fn only_the_options_written_are_set() {
        let code = expanded(quote!(key = "k"), FN);
        assert!(code.contains("LockOptions :: new ()"), "{code}");
        for method in [". ttl", ". timeout", ". auto_extend", ". fencing"] {
            assert!(!code.contains(method), "{method} in {code}");
        }
        let code = expanded(
            quote!(key = "k", timeout = "1.5s", fencing = true, guard = lock),
            FN,
        );
        assert!(
            code.contains(". timeout (:: distlock :: __private :: Duration :: from_millis (1500))"),
            "{code}"
        );
        assert!(code.contains(". fencing (true)"), "{code}");
        assert!(!code.contains(". ttl"), "{code}");
    }

    /// A body that uses `lock` without `guard = lock` gets it bound all the same, so that the
    /// hint is its only error.
    #[test]
    fn an_undeclared_guard_is_bound() {
        let mut errors = Errors::default();
        let args = Args::parse(quote!(key = "k"), &mut errors);
        let function: ItemFn =
            syn::parse_str("async fn f() -> Result<(), E> { lock.extend(D).await?; Ok(()) }")
                .unwrap();
        let valid = valid::check(&args, Some(&function), errors).unwrap();
        assert!(valid.hint.is_some());
        let code = expand(&valid).unwrap().to_string();
        assert!(
            code.contains("let lock : & :: distlock :: __private :: LockGuard"),
            "{code}"
        );
    }

    #[test]
    fn the_crate_path_replaces_distlock() {
        let code = expanded(quote!(key = "k", crate = "dl"), FN);
        assert!(code.contains("dl :: __private :: acquire"), "{code}");
        assert!(!code.contains(":: distlock ::"), "{code}");
    }

    #[test]
    fn format_string_escapes_literal_braces() {
        let segments = key::scan("{{a}}:{id}:<b>").unwrap();
        assert_eq!(format_string(&segments), "{{a}}:{}:{}");
    }

    #[test]
    fn a_key_without_placeholders_is_a_plain_string() {
        let code = expanded(quote!(key = "a{{b}}"), FN);
        assert!(
            code.contains("< :: std :: string :: String as :: std :: convert :: From < & 'static str >> :: from (\"a{b}\")"),
            "{code}"
        );
        assert!(!code.contains("format !"), "{code}");
    }
}
