//! The function's parameters: which names a key placeholder may use, and `guard` not hiding
//! one of them.

use proc_macro2::Ident;
use syn::{FnArg, LitStr, Pat, Signature};

use super::Errors;
use crate::args::Args;
use crate::key::Segment;

/// `guard = name` must not reuse a parameter's name, which it would hide in the body.
pub(super) fn check_guard(args: &Args, params: &Params, errors: &mut Errors) {
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
pub(super) struct Params {
    /// Whether the function has a `self` receiver.
    pub(super) has_receiver: bool,
    /// Parameters bound by a plain identifier pattern (`x`, `mut x`, `ref x`), in order.
    pub(super) named: Vec<String>,
    /// Names bound inside a destructuring pattern, with that pattern as written, e.g.
    /// `("a", "(a, b)")`: they exist in the body but a placeholder cannot name them.
    pub(super) destructured: Vec<(String, String)>,
}

impl Params {
    /// Reads the parameters of `sig`.
    pub(super) fn of(sig: &Signature) -> Params {
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
pub(super) fn bound_names(pattern: &Pat, names: &mut Vec<String>) {
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
pub(super) fn pretty_tokens(text: &str) -> String {
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
pub(super) fn check_placeholders(
    segments: &[Segment],
    params: &Params,
    key: &LitStr,
    errors: &mut Errors,
) {
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

pub(super) fn available(params: &Params) -> String {
    let listing = params.listing();
    if listing.is_empty() {
        "it has no parameters a placeholder could name: use a fixed key, or add a parameter"
            .to_owned()
    } else {
        format!("the parameters a placeholder can name are: {listing}")
    }
}
