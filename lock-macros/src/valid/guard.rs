//! A held lock the body uses without `guard = ...`: found in the body's tokens, so that the
//! error says what to add instead of rustc's "not found".

use proc_macro2::{Ident, TokenTree};
use quote::ToTokens;
use syn::ItemFn;

use super::params::Params;
use crate::args::Args;

/// The names a body is likely to give the held lock when it forgets `guard = ...`.
pub(super) const GUARD_NAMES: [&str; 2] = ["lock", "guard"];

/// The methods of the guard. A call of one of them on an undefined `lock` is taken for a use of
/// the held lock; a `static lock` elsewhere is never taken for one, as its methods (`read`,
/// `lock`, ...) are other ones.
pub(super) const GUARD_METHODS: [&str; 9] = [
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
pub(super) fn undeclared_guard(args: &Args, function: &ItemFn) -> Option<Ident> {
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
pub(super) fn undeclared_guard_error(name: &Ident) -> syn::Error {
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
pub(super) struct GuardScan {
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

pub(super) fn is_dot(token: &TokenTree) -> bool {
    matches!(token, TokenTree::Punct(punct) if punct.as_char() == '.')
}

pub(super) fn is_colon(token: &TokenTree) -> bool {
    matches!(token, TokenTree::Punct(punct) if punct.as_char() == ':')
}
