//! Parsing the arguments of `#[distributed_lock(...)]` into one typed [`Args`].
//!
//! Every option is `name = value`, separated by commas, in any order. [`OPTIONS`] is the one
//! list of options: the parser looks names up in it, and the list of valid options and the "did
//! you mean" hint in error messages are read from it. Parsing only checks the *form* of each
//! value (a string, an identifier, a duration literal, a path); whether a value is allowed
//! (zero, negative, too long, repeated, a placeholder naming no parameter) is a rule, checked in
//! [`crate::valid`]. A value that cannot be parsed is reported, its field stays `None`, and the
//! next option is parsed anyway, so that one run reports every problem.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Ident, Lit, LitBool, LitStr, Path, Token};

use crate::duration::{self, Millis, DURATION_FORMS};
use crate::key::{self, Segment};
use crate::valid::Errors;

/// One option of the attribute: its name, how it is written, and how its value is parsed into
/// its field of [`Args`].
pub(crate) struct OptionSpec {
    /// The name, as written before `=`.
    pub(crate) name: &'static str,
    /// A correct use, quoted in "write ... instead" messages.
    pub(crate) example: &'static str,
    /// Parses the whole value (the tokens after `=`) into its field of [`Args`].
    parse: fn(ParseStream, &mut Args) -> syn::Result<()>,
}

/// Every option the attribute takes, in the order the documentation lists them.
pub(crate) const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "key",
        example: "key = \"trace:{trace_id}\"",
        parse: |input, args| {
            args.key = Some(parse_key(input)?);
            Ok(())
        },
    },
    OptionSpec {
        name: "keys",
        example: "keys = [\"account:{from}\", \"account:{to}\"]",
        parse: |input, args| {
            args.keys = Some(parse_keys(input)?);
            Ok(())
        },
    },
    OptionSpec {
        name: "ttl",
        example: "ttl = 60",
        parse: |input, args| {
            args.ttl = Some(parse_duration(input, "ttl")?);
            Ok(())
        },
    },
    OptionSpec {
        name: "timeout",
        example: "timeout = \"500ms\"",
        parse: |input, args| {
            args.timeout = Some(parse_duration(input, "timeout")?);
            Ok(())
        },
    },
    OptionSpec {
        name: "guard",
        example: "guard = lock",
        parse: |input, args| {
            args.guard = Some(parse_guard(input)?);
            Ok(())
        },
    },
    OptionSpec {
        name: "auto_extend",
        example: "auto_extend = true",
        parse: |input, args| {
            args.auto_extend = Some(parse_bool(input, "auto_extend")?);
            Ok(())
        },
    },
    OptionSpec {
        name: "fencing",
        example: "fencing = true",
        parse: |input, args| {
            args.fencing = Some(parse_bool(input, "fencing")?);
            Ok(())
        },
    },
    OptionSpec {
        name: "on_busy",
        example: "on_busy = \"skip\"",
        parse: |input, args| {
            args.on_busy = Some(parse_on_busy(input)?);
            Ok(())
        },
    },
    OptionSpec {
        name: "hold_at_least",
        example: "hold_at_least = \"30s\"",
        parse: |input, args| {
            args.hold_at_least = Some(parse_duration(input, "hold_at_least")?);
            Ok(())
        },
    },
    OptionSpec {
        name: "permits",
        example: "permits = 5",
        parse: |input, args| {
            args.permits = Some(parse_permits(input)?);
            Ok(())
        },
    },
    OptionSpec {
        name: "mode",
        example: "mode = \"read\"",
        parse: |input, args| {
            args.mode = Some(parse_mode(input)?);
            Ok(())
        },
    },
    OptionSpec {
        name: "crate",
        example: "crate = \"::distlock\"",
        parse: |input, args| {
            args.crate_path = Some(parse_crate(input)?);
            Ok(())
        },
    },
];

/// The entry of [`OPTIONS`] called `name`.
///
/// # Panics
///
/// If `name` is not in the table: callers pass names read from the table itself.
pub(crate) fn option(name: &str) -> &'static OptionSpec {
    OPTIONS
        .iter()
        .find(|spec| spec.name == name)
        .unwrap_or_else(|| panic!("`{name}` is not in OPTIONS"))
}

/// The parsed arguments of one `#[distributed_lock(...)]`. A field is `None` when its option is
/// not written (the runtime's default applies) or its value could not be parsed (an error is
/// reported).
#[derive(Default)]
pub(crate) struct Args {
    /// `key = "..."`: the template as written, and scanned.
    pub(crate) key: Option<KeyArg>,
    /// `keys = ["...", ...]`: several templates, taken all or none.
    pub(crate) keys: Option<KeysArg>,
    /// `ttl = ...`.
    pub(crate) ttl: Option<DurationArg>,
    /// `timeout = ...`.
    pub(crate) timeout: Option<DurationArg>,
    /// `guard = name`: the identifier the body sees the held `&LockGuard` as.
    pub(crate) guard: Option<Ident>,
    /// `auto_extend = true|false`.
    pub(crate) auto_extend: Option<LitBool>,
    /// `fencing = true|false`.
    pub(crate) fencing: Option<LitBool>,
    /// `on_busy = "wait" | "skip" | "fail"`.
    pub(crate) on_busy: Option<OnBusy>,
    /// `hold_at_least = ...`.
    pub(crate) hold_at_least: Option<DurationArg>,
    /// `permits = n`: a semaphore of n permits.
    pub(crate) permits: Option<PermitsArg>,
    /// `mode = "read" | "write"`.
    pub(crate) mode: Option<ModeArg>,
    /// `crate = "path"`: where the facade crate is, if renamed.
    pub(crate) crate_path: Option<CratePath>,
    /// Every option written, parsed or not, in order, with the span of its name (for the
    /// "missing" and "repeated" rules).
    pub(crate) written: Vec<(&'static str, Span)>,
}

/// The `key` option: the literal (for spans) and its scanned segments.
pub(crate) struct KeyArg {
    pub(crate) literal: LitStr,
    pub(crate) segments: Vec<Segment>,
}

/// The `keys` option: each template as `key` has it, and the span of the whole list.
pub(crate) struct KeysArg {
    pub(crate) templates: Vec<KeyArg>,
    pub(crate) span: Span,
}

/// A `ttl` or `timeout` value, exactly as parsed: the rules decide whether it is allowed.
pub(crate) struct DurationArg {
    /// The value, without its sign.
    pub(crate) millis: Millis,
    /// Whether it was written with a `-`.
    pub(crate) negative: bool,
    /// The value as written (`-5`, `"500ms"`), for messages.
    pub(crate) written: String,
    /// The value's tokens (with the `-`), so that an error underlines all of it.
    pub(crate) tokens: TokenStream,
    /// The literal's span, given to the generated builder call.
    pub(crate) span: Span,
}

/// What a locked function does when someone else holds the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnBusy {
    /// Wait up to `timeout` (the default).
    Wait,
    /// One attempt; if held, return without running the body.
    Skip,
    /// One attempt; if held, return `LockError::Busy`.
    Fail,
}

impl OnBusy {
    /// The value as written in the attribute, for messages.
    pub(crate) fn written(self) -> &'static str {
        match self {
            OnBusy::Wait => "on_busy = \"wait\"",
            OnBusy::Skip => "on_busy = \"skip\"",
            OnBusy::Fail => "on_busy = \"fail\"",
        }
    }
}

/// The `permits` option: the number as written (its rules are checked in `valid`), and its
/// tokens for spans.
pub(crate) struct PermitsArg {
    /// The number; `u64::MAX` for one too large for a `u64`, which the rules refuse as such.
    pub(crate) value: u64,
    /// The value's tokens, so that an error underlines it.
    pub(crate) tokens: TokenStream,
    /// The literal's span, given to the generated builder call.
    pub(crate) span: Span,
}

/// The `mode` option: whether it is `"read"`, and the span of the string.
pub(crate) struct ModeArg {
    pub(crate) read: bool,
    pub(crate) span: Span,
}

/// The `crate` option: the path, and the span of the string it was written in.
pub(crate) struct CratePath {
    pub(crate) path: Path,
    pub(crate) span: Span,
}

impl Args {
    /// Parses the attribute's arguments, pushing every problem onto `errors`.
    pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> Args {
        let mut args = Args::default();
        let parser = |input: ParseStream| {
            while !input.is_empty() {
                if let Err(error) = parse_option(input, &mut args) {
                    errors.push(error);
                }
                // Resynchronise on the next top-level comma, so that one bad option does not
                // hide the problems of the others.
                skip_to_comma(input)?;
                if !input.is_empty() {
                    input.parse::<Token![,]>()?;
                }
            }
            Ok(())
        };
        if let Err(error) = parser.parse2(tokens) {
            errors.push(error);
        }
        args
    }

    /// Whether the option `name` is written, even with a value that did not parse.
    pub(crate) fn is_written(&self, name: &str) -> bool {
        self.written.iter().any(|(written, _)| *written == name)
    }
}

/// Parses one `name = value`, leaving the stream at the `,` after it (or at its end).
fn parse_option(input: ParseStream, args: &mut Args) -> syn::Result<()> {
    let (spec, name_span) = if input.peek(Ident::peek_any) {
        // `parse_any` also takes `crate`, a Rust keyword.
        let name = input.call(Ident::parse_any)?;
        let Some(spec) = OPTIONS.iter().find(|spec| name == spec.name) else {
            return Err(unknown_option(&name));
        };
        args.written.push((spec.name, name.span()));
        (spec, name.span())
    } else if input.peek(LitStr) {
        // `#[distributed_lock("...")]`: an unnamed key, not a missing one.
        let literal: LitStr = input.parse()?;
        args.written.push(("key", literal.span()));
        return Err(syn::Error::new(
            literal.span(),
            format!(
                "expected `key = ...`: name the option, as in `key = {}`",
                literal.to_token_stream()
            ),
        ));
    } else {
        return Err(syn::Error::new(
            input.span(),
            format!(
                "expected an option, as in `key = \"trace:{{trace_id}}\"`; the options are {}",
                option_list()
            ),
        ));
    };

    if !input.peek(Token![=]) {
        let span = if input.is_empty() || input.peek(Token![,]) {
            name_span
        } else {
            input.span()
        };
        return Err(syn::Error::new(
            span,
            format!(
                "expected `=` after `{}`: write `{}`",
                spec.name, spec.example
            ),
        ));
    }
    let eq: Token![=] = input.parse()?;

    let value = take_until_comma(input)?;
    if value.is_empty() {
        return Err(syn::Error::new(
            eq.span,
            format!(
                "`{}` needs a value after `=`: write `{}`",
                spec.name, spec.example
            ),
        ));
    }
    let whole = |input: ParseStream| {
        (spec.parse)(input, args)?;
        if !input.is_empty() {
            return Err(syn::Error::new(
                input.span(),
                format!(
                    "unexpected tokens after the value of `{}`: write `{}`, and separate \
                     options with `,`",
                    spec.name, spec.example
                ),
            ));
        }
        Ok(())
    };
    whole.parse2(value)
}

/// "`key`, `ttl`, ...": every option, for messages.
fn option_list() -> String {
    OPTIONS
        .iter()
        .map(|spec| format!("`{}`", spec.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error for a name that is not an option.
fn unknown_option(name: &Ident) -> syn::Error {
    let written = name.to_string();
    let hint = closest_option(&written)
        .map(|option| format!("did you mean `{option}`? "))
        .unwrap_or_default();
    syn::Error::new(
        name.span(),
        format!(
            "unknown option `{written}`: {hint}the options are {}",
            option_list()
        ),
    )
}

/// The valid option closest to a misspelt one, if it is close enough to be a typo.
fn closest_option(written: &str) -> Option<&'static str> {
    OPTIONS
        .iter()
        .map(|spec| (edit_distance(written, spec.name), spec.name))
        .filter(|(distance, name)| *distance <= name.len().div_ceil(3))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}

/// Levenshtein distance, on chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// Takes the tokens up to the next top-level `,` (not consumed).
fn take_until_comma(input: ParseStream) -> syn::Result<TokenStream> {
    input.step(|cursor| {
        let mut tokens = TokenStream::new();
        let mut rest = *cursor;
        while let Some((token, next)) = rest.token_tree() {
            if matches!(&token, TokenTree::Punct(punct) if punct.as_char() == ',') {
                break;
            }
            tokens.extend([token]);
            rest = next;
        }
        Ok((tokens, rest))
    })
}

fn skip_to_comma(input: ParseStream) -> syn::Result<()> {
    take_until_comma(input).map(drop)
}

/// The value's tokens, taken before parsing it: a failed parse may consume tokens, and an error
/// about the kind of value should underline all of it.
fn value_tokens(input: ParseStream) -> TokenStream {
    input.fork().parse::<TokenStream>().unwrap_or_default()
}

fn parse_key(input: ParseStream) -> syn::Result<KeyArg> {
    let value = value_tokens(input);
    let Ok(literal) = input.parse::<LitStr>() else {
        return Err(syn::Error::new_spanned(
            value,
            "`key` takes a string literal, the template of the lock name, e.g. \
             `key = \"trace:{trace_id}\"`",
        ));
    };
    match key::scan(&literal.value()) {
        Ok(segments) => Ok(KeyArg { literal, segments }),
        Err(problems) => {
            // Stable Rust cannot point inside a string literal: every problem underlines it.
            let mut errors = Errors::default();
            for problem in problems {
                errors.push(syn::Error::new(literal.span(), problem.message));
            }
            Err(errors
                .finish()
                .expect_err("scan fails with at least one problem"))
        }
    }
}

fn parse_keys(input: ParseStream) -> syn::Result<KeysArg> {
    let value = value_tokens(input);
    let wrong = || {
        syn::Error::new_spanned(
            &value,
            "`keys` takes a list of string literals, the templates of the lock names, e.g. \
             `keys = [\"account:{from}\", \"account:{to}\"]`",
        )
    };
    if !input.peek(syn::token::Bracket) {
        return Err(wrong());
    }
    let content;
    let bracket = syn::bracketed!(content in input);
    let literals = content
        .parse_terminated(|item: ParseStream| item.parse::<LitStr>(), Token![,])
        .map_err(|_| wrong())?;
    let mut templates = Vec::with_capacity(literals.len());
    let mut errors = Errors::default();
    for literal in literals {
        match key::scan(&literal.value()) {
            Ok(segments) => templates.push(KeyArg { literal, segments }),
            Err(problems) => {
                for problem in problems {
                    errors.push(syn::Error::new(literal.span(), problem.message));
                }
            }
        }
    }
    errors.finish()?;
    Ok(KeysArg {
        templates,
        span: bracket.span.join(),
    })
}

fn parse_guard(input: ParseStream) -> syn::Result<Ident> {
    let value = value_tokens(input);
    if input.peek(LitStr) {
        let literal: LitStr = input.parse()?;
        let value = literal.value();
        let suggestion = if syn::parse_str::<Ident>(&value).is_ok() {
            value
        } else {
            "lock".to_owned()
        };
        return Err(syn::Error::new(
            literal.span(),
            format!(
                "`guard` takes an identifier, not a string: write `guard = {suggestion}` \
                 (without quotes)"
            ),
        ));
    }
    // `Ident::parse` rejects keywords (`self`, `_` ...), which could not be bound by `let`.
    input.parse::<Ident>().map_err(|_| {
        syn::Error::new_spanned(
            &value,
            "`guard` takes the name to bind the held lock to in the body, e.g. `guard = lock`; \
             the body can then call `lock.extend(..)`, `lock.key()`, `lock.token()`",
        )
    })
}

fn parse_bool(input: ParseStream, name: &str) -> syn::Result<LitBool> {
    let value = value_tokens(input);
    input.parse::<LitBool>().map_err(|_| {
        syn::Error::new_spanned(
            &value,
            format!("`{name}` takes `true` or `false`: write `{name} = true`"),
        )
    })
}

fn parse_permits(input: ParseStream) -> syn::Result<PermitsArg> {
    const HINT: &str = "`permits` takes a whole number of holders allowed at once, at least 1 \
                        (1 is the mutex), e.g. `permits = 5`";
    let value = value_tokens(input);
    if input.peek(Token![-]) {
        return Err(syn::Error::new_spanned(value, HINT));
    }
    let Ok(literal) = input.parse::<syn::LitInt>() else {
        return Err(syn::Error::new_spanned(value, HINT));
    };
    if !literal.suffix().is_empty() {
        return Err(syn::Error::new(
            literal.span(),
            format!("{HINT}, without a type suffix"),
        ));
    }
    Ok(PermitsArg {
        value: literal.base10_parse::<u64>().unwrap_or(u64::MAX),
        span: literal.span(),
        tokens: value,
    })
}

fn parse_mode(input: ParseStream) -> syn::Result<ModeArg> {
    const HINT: &str = "`mode` takes `\"read\"` (shared with other readers) or `\"write\"` \
                        (alone, the default)";
    let value = value_tokens(input);
    if input.peek(Ident) {
        let ident: Ident = input.parse()?;
        return Err(syn::Error::new(
            ident.span(),
            format!("{HINT}, as a string: write `mode = \"{ident}\"`"),
        ));
    }
    let Ok(literal) = input.parse::<LitStr>() else {
        return Err(syn::Error::new_spanned(
            value,
            format!("{HINT}, e.g. `mode = \"read\"`"),
        ));
    };
    match literal.value().as_str() {
        "read" => Ok(ModeArg {
            read: true,
            span: literal.span(),
        }),
        "write" => Ok(ModeArg {
            read: false,
            span: literal.span(),
        }),
        other => Err(syn::Error::new(
            literal.span(),
            format!("`mode = \"{other}\"` is not a mode: {HINT}"),
        )),
    }
}

fn parse_on_busy(input: ParseStream) -> syn::Result<OnBusy> {
    const HINT: &str = "`on_busy` takes `\"wait\"` (wait up to `timeout`, the default), \
                        `\"skip\"` (if the lock is held, return without running the body) or \
                        `\"fail\"` (if the lock is held, return `LockError::Busy`)";
    let value = value_tokens(input);
    if input.peek(Ident) {
        let ident: Ident = input.parse()?;
        return Err(syn::Error::new(
            ident.span(),
            format!("{HINT}, as a string: write `on_busy = \"{ident}\"`"),
        ));
    }
    let Ok(literal) = input.parse::<LitStr>() else {
        return Err(syn::Error::new_spanned(
            value,
            format!("{HINT}, e.g. `on_busy = \"skip\"`"),
        ));
    };
    match literal.value().as_str() {
        "wait" => Ok(OnBusy::Wait),
        "skip" => Ok(OnBusy::Skip),
        "fail" => Ok(OnBusy::Fail),
        other => Err(syn::Error::new(
            literal.span(),
            format!("`on_busy = \"{other}\"` is not a policy: {HINT}"),
        )),
    }
}

fn parse_crate(input: ParseStream) -> syn::Result<CratePath> {
    const HINT: &str = "`crate` takes the path of the distlock crate as a string, e.g. \
                        `crate = \"::distlock\"` or, after `use distlock as dl;`, `crate = \"dl\"`";
    let value = value_tokens(input);
    let Ok(literal) = input.parse::<LitStr>() else {
        return Err(syn::Error::new_spanned(value, HINT));
    };
    // The path's tokens get the literal's span, so it resolves where the attribute is written.
    match literal.parse_with(Path::parse_mod_style) {
        Ok(path) => Ok(CratePath {
            path,
            span: literal.span(),
        }),
        Err(_) => Err(syn::Error::new(
            literal.span(),
            format!("{} is not a path: {HINT}", literal.to_token_stream()),
        )),
    }
}

/// Parses a duration value: `60`, `0.5`, `-1`, `"500ms"`, ... (the sign is kept for the rules).
fn parse_duration(input: ParseStream, name: &str) -> syn::Result<DurationArg> {
    let value = value_tokens(input);
    let minus: Option<Token![-]> = input.parse()?;
    let literal: Lit = input.parse().map_err(|_| {
        syn::Error::new_spanned(
            &value,
            format!("`{name}` takes a duration: {DURATION_FORMS}"),
        )
    })?;
    // Spans `-` and the literal together when negative.
    let tokens = match &minus {
        Some(minus) => quote::quote!(#minus #literal),
        None => literal.to_token_stream(),
    };
    let error = |message: String| syn::Error::new_spanned(&tokens, message);

    let (text, parsed) = match &literal {
        Lit::Int(int) if int.suffix().is_empty() => (
            int.base10_digits().to_owned(),
            duration::parse_seconds(int.base10_digits()),
        ),
        Lit::Float(float) if float.suffix().is_empty() => (
            float.base10_digits().to_owned(),
            duration::parse_seconds(float.base10_digits()),
        ),
        Lit::Int(int) => {
            return Err(error(suffix_message(
                name,
                int.base10_digits(),
                int.suffix(),
            )))
        }
        Lit::Float(float) => {
            return Err(error(suffix_message(
                name,
                float.base10_digits(),
                float.suffix(),
            )))
        }
        Lit::Str(string) => (
            format!("\"{}\"", string.value()),
            duration::parse_with_unit(&string.value()),
        ),
        _ => {
            return Err(error(format!(
                "`{name}` takes a duration: {DURATION_FORMS}"
            )))
        }
    };
    let written = match &minus {
        Some(_) => format!("-{text}"),
        None => text,
    };
    let millis = parsed.map_err(|problem| error(problem.message(name, &written)))?;
    let negative = minus.is_some() || written.trim_start_matches('"').trim().starts_with('-');
    Ok(DurationArg {
        millis,
        negative,
        written,
        tokens,
        span: literal.span(),
    })
}

/// The message for a number with a type suffix: `500ms` is a unit written outside a string,
/// `5u64` a Rust type suffix.
fn suffix_message(name: &str, digits: &str, suffix: &str) -> String {
    match suffix {
        "ms" | "s" | "m" | "h" => format!(
            "a duration with a unit is written as a string: write `{name} = \"{digits}{suffix}\"`"
        ),
        _ => {
            format!("`{name}` takes plain seconds without a type suffix: write `{name} = {digits}`")
        }
    }
}

#[cfg(test)]
mod tests;
