//! Validation of the annotated function, and generation of its new body.
//!
//! Like `tracing-attributes`, the signature and the attributes of the function are kept exactly
//! as written and only the body is replaced: the original body becomes an `async move` block, so
//! `return` and `?` inside it keep their meaning and no lifetime is rewritten. The generated code
//! names the runtime only through `<crate>::__private` (`::distlock::__private` unless
//! `crate = "..."` says otherwise).

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::{
    AttrStyle, GenericArgument, Ident, ItemFn, LitStr, Member, PathArguments, ReturnType,
    Signature, Type,
};

use crate::args::{Args, CratePath, DurationArg, Errors, DEFAULT_TIMEOUT_MS, DEFAULT_TTL_MS};
use crate::key::{self, Params, Segment};

/// Validates `function` against `args` and, if every rule holds, returns the rewritten function.
///
/// All problems are reported together, each spanned at the token at fault.
pub(crate) fn expand(args: &Args, function: &ItemFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    if let Err(error) = check_signature(&function.sig) {
        errors.push(error);
    }
    let params = Params::of(&function.sig);
    if let Err(error) = key::validate(&args.key.segments, &params, &args.key.literal) {
        errors.push(error);
    }
    if let Some(guard) = &args.guard {
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
    errors.finish()?;
    generate(args, function)
}

/// The rules on the signature alone: `async fn`, returning a `...Result`.
pub(crate) fn check_signature(sig: &Signature) -> syn::Result<()> {
    let mut errors = Errors::default();
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            format!(
                "`#[distributed_lock]` only works on an `async fn`: the lock is acquired with \
                 `.await` before the body runs; make it `async fn {}(..)`",
                sig.ident
            ),
        ));
    }
    if let Err(error) = check_return_type(sig) {
        errors.push(error);
    }
    errors.finish()
}

const WHY_RESULT: &str = "`#[distributed_lock]` needs a function that returns a `Result`, \
                          because acquiring the lock can fail (timeout, Redis unreachable) and \
                          that error reaches the caller as `E::from(distlock::LockError)`";

fn check_return_type(sig: &Signature) -> syn::Result<()> {
    let ty = match &sig.output {
        ReturnType::Type(_, ty) => ty,
        ReturnType::Default => {
            // Underline `fn name(..)`: there is no return type to point at.
            let mut paren = Group::new(Delimiter::Parenthesis, TokenStream::new());
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
    let written = key::pretty_tokens(&ty.to_token_stream().to_string());
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

fn generate(args: &Args, function: &ItemFn) -> syn::Result<TokenStream> {
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

    let default_path = CratePath::default_path();
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
    let template = &args.key.literal.value();

    let key_expr = key_expression(&args.key.segments, &args.key.literal)?;
    // The `format!` arguments carry the key literal's span (so a non-`Display` placeholder is
    // reported there), which makes clippy read them as user code that could be inlined.
    let has_placeholders = args
        .key
        .segments
        .iter()
        .any(|segment| matches!(segment, Segment::Placeholder(_)));
    let key_lint_allow = has_placeholders.then(|| quote!(#[allow(clippy::uninlined_format_args)]));

    // The builder methods take the span of the option's value (call site for defaults), so a
    // type error in them would point at what the user wrote.
    let duration = |arg: Option<DurationArg>, method: &str, default: u64| {
        let (millis, span) = arg.map_or((default, Span::call_site()), |arg| (arg.millis, arg.span));
        let method = Ident::new(method, span);
        let millis = proc_macro2::Literal::u64_unsuffixed(millis);
        quote!(.#method(#private::Duration::from_millis(#millis)))
    };
    let ttl = duration(args.ttl, "ttl", DEFAULT_TTL_MS);
    let timeout = duration(args.timeout, "timeout", DEFAULT_TIMEOUT_MS);
    let auto_extend = args
        .auto_extend
        .as_ref()
        .map(|value| quote!(.auto_extend(#value)));
    let fencing = args.fencing.as_ref().map(|value| quote!(.fencing(#value)));

    let guard_binding = args.guard.as_ref().map(|guard| {
        quote! {
            #[allow(unused_variables)]
            let #guard: &#private::LockGuard = &#guard_var;
        }
    });

    let from_error = convert_error(&sig.output, &error);
    let from_lost = convert_error(&sig.output, &lost);

    Ok(quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #key_lint_allow
            let #key_var: ::std::string::String = #key_expr;
            let #label_var: &'static str =
                ::core::concat!(::core::module_path!(), "::", #fn_name, " ", #template);
            let #options_var = #private::LockOptions::new()
                #ttl
                #timeout
                #auto_extend
                #fencing
                .label(#label_var);
            // The acquisition, the body and the release run in the call's `distlock.lock` span.
            let #span_var = #private::span(&#key_var, #label_var);
            let #guard_var = match #private::Instrument::instrument(
                #private::acquire(&#key_var, &#options_var),
                ::core::clone::Clone::clone(&#span_var),
            )
            .await
            {
                ::core::result::Result::Ok(#acquired) => #acquired,
                ::core::result::Result::Err(#error) => {
                    return ::core::result::Result::Err(#from_error);
                }
            };
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
            let root = Ident::new(&placeholder.root, span);
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
        return Ok(quote_spanned!(span=> ::std::string::String::from(#text)));
    }
    let format = LitStr::new(&key::format_string(segments), span);
    Ok(quote_spanned!(span=> ::std::format!(#format, #(#placeholders),*)))
}

/// A field access after a placeholder's root: an identifier or a tuple index.
fn member(field: &str, span: Span) -> syn::Result<Member> {
    if let Ok(index) = field.parse::<u32>() {
        return Ok(Member::Unnamed(syn::Index { index, span }));
    }
    let mut ident = Parser::parse_str(Ident::parse_any, field)
        .map_err(|_| syn::Error::new(span, format!("`{field}` is not a field name")))?;
    ident.set_span(span);
    Ok(Member::Named(ident))
}

/// `::core::convert::From::from(value)`, located so that a missing `From<LockError>` is
/// reported at the return type rather than at the attribute.
///
/// rustc spans an expression from the start of its first token to the end of its last one, so
/// the call path runs from the first to the last token of the return type ("required by a bound
/// introduced by this call"), and the argument, which rustc underlines as the unsatisfied
/// bound, sits on the error type (see [`error_location`]). Only the *location* of the tokens
/// moves (`located_at`): their hygiene stays that of the expansion, so `value` still resolves to
/// the generated binding, and lints that skip macro output (clippy's `useless_conversion` when
/// `E` is `LockError` itself) keep skipping it.
fn convert_error(output: &ReturnType, value: &Ident) -> TokenStream {
    let ReturnType::Type(_, ty) = output else {
        return quote!(::core::convert::From::from(#value));
    };
    let (ty_first, ty_last) = first_and_last_span(ty.to_token_stream());
    let at = |location: Span| Span::call_site().located_at(location);

    let from = format_ident!("from", span = at(ty_last));
    let mut value = value.clone();
    value.set_span(value.span().located_at(error_location(ty)));
    quote_spanned!(at(ty_first)=> ::core::convert::From::#from(#value))
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
        .or_else(|| error.map(|error| first_and_last_span(error.to_token_stream()).0))
        .or_else(|| name(ty))
        .unwrap_or_else(|| first_and_last_span(ty.to_token_stream()).0)
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

fn first_and_last_span(tokens: TokenStream) -> (Span, Span) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let first = tokens.first().map_or_else(Span::call_site, TokenTree::span);
    let last = tokens.last().map_or(first, TokenTree::span);
    (first, last)
}
