//! The arguments of `#[distributed_lock(...)]`, parsed into one typed [`Args`].
//!
//! Every option is `name = value`, separated by commas, in any order. Parsing reports every
//! problem it finds (not only the first), each spanned at the token at fault and saying what to
//! write instead. The key template is scanned here too (its syntax does not depend on the
//! function); whether its placeholders name real parameters is checked in [`crate::expand`].

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::{Ident, Lit, LitBool, LitStr, Path, Token};

use crate::key::{self, Segment};

/// The option keywords. `crate` is a Rust keyword and is parsed as `Token![crate]`.
mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(timeout);
    syn::custom_keyword!(guard);
    syn::custom_keyword!(auto_extend);
    syn::custom_keyword!(fencing);
}

/// Every option the attribute takes, in the order the documentation lists them.
const OPTIONS: [&str; 7] = [
    "key",
    "ttl",
    "timeout",
    "guard",
    "auto_extend",
    "fencing",
    "crate",
];

/// Lock expiry when `ttl` is not given: 30 s.
pub(crate) const DEFAULT_TTL_MS: u64 = 30_000;
/// How long to wait for the lock when `timeout` is not given: 10 s.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// The accepted duration forms, quoted in every duration error.
const DURATION_FORMS: &str = "seconds as a number (`60`, `0.5`) or a string with a unit \
                              (`\"500ms\"`, `\"2s\"`, `\"1.5s\"`, `\"5m\"`, `\"1h\"`)";

/// The parsed arguments of one `#[distributed_lock(...)]`.
pub(crate) struct Args {
    /// `key = "..."`: the template as written, and scanned.
    pub(crate) key: KeyArg,
    /// `ttl = ...`; `None` means [`DEFAULT_TTL_MS`].
    pub(crate) ttl: Option<DurationArg>,
    /// `timeout = ...`; `None` means [`DEFAULT_TIMEOUT_MS`].
    pub(crate) timeout: Option<DurationArg>,
    /// `guard = name`: the identifier the body sees the held `&LockGuard` as.
    pub(crate) guard: Option<Ident>,
    /// `auto_extend = true|false`.
    pub(crate) auto_extend: Option<LitBool>,
    /// `fencing = true|false`.
    pub(crate) fencing: Option<LitBool>,
    /// `crate = "path"`: where the facade crate is, if renamed.
    pub(crate) crate_path: Option<CratePath>,
}

/// The `key` option: the literal (for spans) and its scanned segments.
pub(crate) struct KeyArg {
    pub(crate) literal: LitStr,
    pub(crate) segments: Vec<Segment>,
}

/// A `ttl` or `timeout` value in whole milliseconds, with the span of the value as written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DurationArg {
    pub(crate) millis: u64,
    pub(crate) span: Span,
}

/// The `crate` option: the path, and the span of the string it was written in.
pub(crate) struct CratePath {
    pub(crate) path: Path,
    pub(crate) span: Span,
}

impl CratePath {
    /// The default facade path, `::distlock`.
    pub(crate) fn default_path() -> Path {
        syn::parse_quote!(::distlock)
    }
}

/// Which option a `name =` introduces.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Name {
    Key,
    Ttl,
    Timeout,
    Guard,
    AutoExtend,
    Fencing,
    Crate,
}

impl Name {
    fn as_str(self) -> &'static str {
        match self {
            Name::Key => "key",
            Name::Ttl => "ttl",
            Name::Timeout => "timeout",
            Name::Guard => "guard",
            Name::AutoExtend => "auto_extend",
            Name::Fencing => "fencing",
            Name::Crate => "crate",
        }
    }

    /// How the option is written, for "write ... instead" messages.
    fn example(self) -> &'static str {
        match self {
            Name::Key => "key = \"trace:{trace_id}\"",
            Name::Ttl => "ttl = 60",
            Name::Timeout => "timeout = \"500ms\"",
            Name::Guard => "guard = lock",
            Name::AutoExtend => "auto_extend = true",
            Name::Fencing => "fencing = true",
            Name::Crate => "crate = \"::distlock\"",
        }
    }

    /// Parses the option name if the next token is one; `None` otherwise (nothing consumed).
    fn parse_known(input: ParseStream) -> syn::Result<Option<(Name, Span)>> {
        macro_rules! try_keyword {
            ($($kw:path => $name:expr),* $(,)?) => {
                $(
                    if input.peek($kw) {
                        let keyword: $kw = input.parse()?;
                        return Ok(Some(($name, keyword.span)));
                    }
                )*
            };
        }
        // `crate` is a Rust keyword, not a custom keyword.
        if input.peek(Token![crate]) {
            let keyword: Token![crate] = input.parse()?;
            return Ok(Some((Name::Crate, keyword.span)));
        }
        try_keyword!(
            kw::key => Name::Key,
            kw::ttl => Name::Ttl,
            kw::timeout => Name::Timeout,
            kw::guard => Name::Guard,
            kw::auto_extend => Name::AutoExtend,
            kw::fencing => Name::Fencing,
        );
        Ok(None)
    }
}

/// Collects errors so that one run reports them all.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(errors) => errors.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Options while they are being parsed; `Args` once `key` is known to be there.
#[derive(Default)]
struct Partial {
    key: Option<KeyArg>,
    ttl: Option<DurationArg>,
    timeout: Option<DurationArg>,
    guard: Option<Ident>,
    auto_extend: Option<LitBool>,
    fencing: Option<LitBool>,
    crate_path: Option<CratePath>,
    seen: Vec<Name>,
}

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut partial = Partial::default();
        let mut errors = Errors::default();

        while !input.is_empty() {
            if let Err(error) = parse_option(input, &mut partial) {
                errors.push(error);
            }
            // Resynchronise on the next top-level comma, so that one bad option does not hide
            // the problems of the others.
            skip_to_comma(input)?;
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }

        if partial.key.is_none() && !partial.seen.contains(&Name::Key) {
            errors.push(syn::Error::new(
                Span::call_site(),
                "missing `key`: `#[distributed_lock]` needs the name of the lock, e.g. \
                 `#[distributed_lock(key = \"trace:{trace_id}\")]`",
            ));
        }
        errors.finish()?;

        Ok(Args {
            key: partial.key.expect("a missing key is reported above"),
            ttl: partial.ttl,
            timeout: partial.timeout,
            guard: partial.guard,
            auto_extend: partial.auto_extend,
            fencing: partial.fencing,
            crate_path: partial.crate_path,
        })
    }
}

/// Parses one `name = value`, leaving the stream at the `,` after it (or at its end).
fn parse_option(input: ParseStream, partial: &mut Partial) -> syn::Result<()> {
    let Some((name, name_span)) = Name::parse_known(input)? else {
        if input.peek(LitStr) {
            // `#[distributed_lock("...")]`: reported as an unnamed key, not as a missing one.
            partial.seen.push(Name::Key);
        }
        return Err(unknown_option(input));
    };

    if partial.seen.contains(&name) {
        return Err(syn::Error::new(
            name_span,
            format!(
                "`{}` is given more than once: keep only one `{}`",
                name.as_str(),
                name.example()
            ),
        ));
    }
    partial.seen.push(name);

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
                name.as_str(),
                name.example()
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
                name.as_str(),
                name.example()
            ),
        ));
    }

    match name {
        Name::Key => partial.key = Some(parse_value(value, name, parse_key)?),
        Name::Ttl => partial.ttl = Some(parse_value(value, name, parse_ttl)?),
        Name::Timeout => partial.timeout = Some(parse_value(value, name, parse_timeout)?),
        Name::Guard => partial.guard = Some(parse_value(value, name, parse_guard)?),
        Name::AutoExtend => {
            partial.auto_extend = Some(parse_value(value, name, |input| parse_bool(input, name))?);
        }
        Name::Fencing => {
            partial.fencing = Some(parse_value(value, name, |input| parse_bool(input, name))?);
        }
        Name::Crate => partial.crate_path = Some(parse_value(value, name, parse_crate)?),
    }
    Ok(())
}

/// The error for a token where an option name should be.
fn unknown_option(input: ParseStream) -> syn::Error {
    let valid = OPTIONS
        .iter()
        .map(|option| format!("`{option}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if input.peek(Ident::peek_any) {
        let ident = input.call(Ident::parse_any).expect("peeked an identifier");
        let written = ident.to_string();
        let hint = closest_option(&written)
            .map(|option| format!("did you mean `{option}`? "))
            .unwrap_or_default();
        return syn::Error::new(
            ident.span(),
            format!("unknown option `{written}`: {hint}the options are {valid}"),
        );
    }
    if input.peek(LitStr) {
        let literal: LitStr = input.parse().expect("peeked a string literal");
        return syn::Error::new(
            literal.span(),
            format!(
                "expected `key = ...`: name the option, as in `key = {}`",
                literal.to_token_stream()
            ),
        );
    }
    syn::Error::new(
        input.span(),
        format!(
            "expected an option, as in `key = \"trace:{{trace_id}}\"`; the options are {valid}"
        ),
    )
}

/// The valid option closest to a misspelt one, if it is close enough to be a typo.
fn closest_option(written: &str) -> Option<&'static str> {
    OPTIONS
        .iter()
        .map(|option| (edit_distance(written, option), *option))
        .filter(|(distance, option)| *distance <= option.len().div_ceil(3))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, option)| option)
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

/// Parses the whole of `value` with `parser`; leftover tokens are an error.
fn parse_value<T>(
    value: TokenStream,
    name: Name,
    parser: impl FnOnce(ParseStream) -> syn::Result<T>,
) -> syn::Result<T> {
    let whole = |input: ParseStream| {
        let parsed = parser(input)?;
        if !input.is_empty() {
            return Err(syn::Error::new(
                input.span(),
                format!(
                    "unexpected tokens after the value of `{}`: write `{}`, and separate \
                     options with `,`",
                    name.as_str(),
                    name.example()
                ),
            ));
        }
        Ok(parsed)
    };
    whole.parse2(value)
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
            let mut errors = Errors::default();
            for problem in problems {
                errors.push(syn::Error::new(literal.span(), problem.message));
            }
            Err(errors
                .finish()
                .expect_err("scan failed with at least one problem"))
        }
    }
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

fn parse_bool(input: ParseStream, name: Name) -> syn::Result<LitBool> {
    let value = value_tokens(input);
    input.parse::<LitBool>().map_err(|_| {
        syn::Error::new_spanned(
            &value,
            format!(
                "`{0}` takes `true` or `false`: write `{0} = true`",
                name.as_str()
            ),
        )
    })
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

fn parse_ttl(input: ParseStream) -> syn::Result<DurationArg> {
    parse_duration(input, Limit::Ttl)
}

fn parse_timeout(input: ParseStream) -> syn::Result<DurationArg> {
    parse_duration(input, Limit::Timeout)
}

/// The rules that differ between `ttl` and `timeout`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Limit {
    /// Must be at least 1 ms: a lock that expires at once protects nothing.
    Ttl,
    /// May be 0: a single attempt.
    Timeout,
}

impl Limit {
    fn name(self) -> &'static str {
        match self {
            Limit::Ttl => "ttl",
            Limit::Timeout => "timeout",
        }
    }
}

/// Parses a duration value: `60`, `0.5`, `-1` (rejected), `"500ms"`, ...
fn parse_duration(input: ParseStream, limit: Limit) -> syn::Result<DurationArg> {
    let name = limit.name();
    let value = value_tokens(input);
    let negative: Option<Token![-]> = input.parse()?;
    let literal: Lit = input.parse().map_err(|_| {
        syn::Error::new_spanned(
            &value,
            format!("`{name}` takes a duration: {DURATION_FORMS}"),
        )
    })?;
    // Spans `-` and the literal together when negative.
    let spanned = match &negative {
        Some(minus) => quote::quote!(#minus #literal),
        None => literal.to_token_stream(),
    };
    let error = |message: String| syn::Error::new_spanned(&spanned, message);

    let (text, parsed) = match &literal {
        Lit::Int(int) => {
            if !int.suffix().is_empty() {
                return Err(error(suffix_message(
                    name,
                    int.base10_digits(),
                    int.suffix(),
                )));
            }
            (
                int.base10_digits().to_owned(),
                parse_number(int.base10_digits(), 1000),
            )
        }
        Lit::Float(float) => {
            if !float.suffix().is_empty() {
                return Err(error(suffix_message(
                    name,
                    float.base10_digits(),
                    float.suffix(),
                )));
            }
            (
                float.base10_digits().to_owned(),
                parse_number(float.base10_digits(), 1000),
            )
        }
        Lit::Str(string) => (
            format!("\"{}\"", string.value()),
            parse_with_unit(&string.value()),
        ),
        _ => {
            return Err(error(format!(
                "`{name}` takes a duration: {DURATION_FORMS}"
            )))
        }
    };
    let written = match &negative {
        Some(_) => format!("-{text}"),
        None => text,
    };

    let millis = parsed.map_err(|problem| error(problem.message(name, &written)))?;
    let is_negative = negative.is_some() || written.trim_start_matches('"').starts_with('-');
    check_limits(millis, is_negative, limit, &written).map_err(error)?;
    Ok(DurationArg {
        millis: millis.whole,
        span: literal.span(),
    })
}

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

/// A duration in milliseconds, as an exact decimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Millis {
    /// The whole milliseconds.
    whole: u64,
    /// Whether there is a fraction of a millisecond beyond `whole`.
    fraction: bool,
}

/// Why a duration text does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DurationProblem {
    /// Not a number with an accepted unit.
    Unparsable,
    /// A string without unit, like `"60"`.
    MissingUnit(String),
    /// A string with an unknown unit, like `"5d"`.
    UnknownUnit(String),
    /// More milliseconds than Redis accepts.
    TooLarge,
}

impl DurationProblem {
    fn message(&self, name: &str, written: &str) -> String {
        match self {
            DurationProblem::Unparsable => {
                format!("`{name} = {written}` is not a duration: write {DURATION_FORMS}")
            }
            DurationProblem::MissingUnit(number) => format!(
                "`{name} = {written}` has no unit: write `{name} = \"{number}s\"` or \
                 `{name} = {number}` for seconds, or `\"{number}ms\"` for milliseconds"
            ),
            DurationProblem::UnknownUnit(unit) => format!(
                "unknown unit `{unit}` in `{name} = {written}`: the units are `ms`, `s`, `m` \
                 and `h`, as in `\"500ms\"`, `\"2s\"`, `\"5m\"`, `\"1h\"`"
            ),
            DurationProblem::TooLarge => format!(
                "`{name} = {written}` is too large: Redis takes at most {} milliseconds",
                i64::MAX
            ),
        }
    }
}

/// Parses `"<number><unit>"`, e.g. `"500ms"`, `"1.5s"`, `"5 m"`.
fn parse_with_unit(text: &str) -> Result<Millis, DurationProblem> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(text.len());
    let (number, unit) = (text[..split].trim(), text[split..].trim());
    let number_unsigned = number.strip_prefix('-').unwrap_or(number);
    let unit_millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" if is_decimal(number_unsigned) => {
            return Err(DurationProblem::MissingUnit(number.to_owned()))
        }
        "" => return Err(DurationProblem::Unparsable),
        other if is_decimal(number_unsigned) && other.chars().all(char::is_alphabetic) => {
            return Err(DurationProblem::UnknownUnit(other.to_owned()))
        }
        _ => return Err(DurationProblem::Unparsable),
    };
    if !is_decimal(number_unsigned) {
        return Err(DurationProblem::Unparsable);
    }
    parse_number(number_unsigned, unit_millis)
}

fn is_decimal(text: &str) -> bool {
    let mut parts = text.splitn(2, '.');
    let whole = parts.next().unwrap_or_default();
    let fraction = parts.next();
    let digits = |part: &str| part.chars().all(|c| c.is_ascii_digit());
    match fraction {
        None => !whole.is_empty() && digits(whole),
        Some(fraction) => {
            (!whole.is_empty() || !fraction.is_empty()) && digits(whole) && digits(fraction)
        }
    }
}

/// Converts a non-negative decimal number (`60`, `0.5`, `1e3`, `2.5E-1`) of a unit worth
/// `unit_millis` milliseconds into exact milliseconds. No floating point: `1.1` seconds is
/// exactly 1100 ms.
fn parse_number(text: &str, unit_millis: u128) -> Result<Millis, DurationProblem> {
    let text = text.replace('_', "");
    let (mantissa_text, exponent) = match text.find(['e', 'E']) {
        Some(at) => {
            let exponent: i32 = text[at + 1..]
                .parse()
                .map_err(|_| DurationProblem::Unparsable)?;
            (&text[..at], exponent)
        }
        None => (text.as_str(), 0),
    };
    if !is_decimal(mantissa_text) {
        return Err(DurationProblem::Unparsable);
    }
    let (whole, fraction) = mantissa_text.split_once('.').unwrap_or((mantissa_text, ""));
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    let fraction_len = i32::try_from(fraction.len()).map_err(|_| DurationProblem::TooLarge)?;
    // value = digits × 10^(exponent − fraction_len) units.
    let scale = exponent - fraction_len;
    if digits.len() > 30 || scale > 30 {
        return if digits.is_empty() {
            Ok(Millis {
                whole: 0,
                fraction: false,
            })
        } else {
            Err(DurationProblem::TooLarge)
        };
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| DurationProblem::TooLarge)?
    };
    let scaled = mantissa
        .checked_mul(unit_millis)
        .ok_or(DurationProblem::TooLarge)?;
    let (whole, fraction) = if scale >= 0 {
        let factor = 10u128
            .checked_pow(scale.unsigned_abs())
            .ok_or(DurationProblem::TooLarge)?;
        (
            scaled
                .checked_mul(factor)
                .ok_or(DurationProblem::TooLarge)?,
            false,
        )
    } else if scale < -38 {
        (0, scaled != 0)
    } else {
        let divisor = 10u128.pow(scale.unsigned_abs());
        (scaled / divisor, scaled % divisor != 0)
    };
    let whole = u64::try_from(whole)
        .ok()
        .filter(|whole| i64::try_from(*whole).is_ok())
        .ok_or(DurationProblem::TooLarge)?;
    Ok(Millis { whole, fraction })
}

/// Checks the value against the option's rules; the message says what to write instead.
fn check_limits(millis: Millis, negative: bool, limit: Limit, written: &str) -> Result<(), String> {
    let name = limit.name();
    let is_zero = millis.whole == 0 && !millis.fraction;
    match limit {
        Limit::Ttl if negative && !is_zero => Err(format!(
            "`ttl = {written}` is negative: the lock must live for a positive time, \
             e.g. `ttl = 30` (seconds) or `ttl = \"500ms\"`"
        )),
        Limit::Ttl if is_zero => Err(format!(
            "`ttl = {written}` is zero: a lock that expires at once protects nothing; give it \
             a positive time, e.g. `ttl = 30` (seconds) or `ttl = \"500ms\"`"
        )),
        Limit::Timeout if negative && !is_zero => Err(format!(
            "`timeout = {written}` is negative: write `timeout = 0` for a single attempt, or a \
             positive time to wait, e.g. `timeout = 5`"
        )),
        Limit::Timeout if is_zero => Ok(()),
        _ if millis.whole == 0 => Err(format!(
            "`{name} = {written}` is less than 1 ms: Redis keeps expiries in whole \
             milliseconds (PX); write at least `{name} = \"1ms\"`"
        )),
        _ if millis.fraction => Err(format!(
            "`{name} = {written}` is not a whole number of milliseconds: Redis keeps expiries \
             in whole milliseconds (PX); write e.g. `{name} = \"{}ms\"`",
            millis.whole
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    #[allow(clippy::unnecessary_wraps)] // compared with `Result`s
    fn whole(millis: u64) -> Result<Millis, DurationProblem> {
        Ok(Millis {
            whole: millis,
            fraction: false,
        })
    }

    #[test]
    fn seconds_as_numbers() {
        assert_eq!(parse_number("60", 1000), whole(60_000));
        assert_eq!(parse_number("0", 1000), whole(0));
        assert_eq!(parse_number("0.5", 1000), whole(500));
        assert_eq!(parse_number("1.1", 1000), whole(1_100));
        assert_eq!(parse_number(".25", 1000), whole(250));
        assert_eq!(parse_number("1e3", 1000), whole(1_000_000));
        assert_eq!(parse_number("2.5E-1", 1000), whole(250));
        assert_eq!(parse_number("1_000", 1000), whole(1_000_000));
        assert_eq!(
            parse_number("0.0005", 1000),
            Ok(Millis {
                whole: 0,
                fraction: true
            })
        );
        assert_eq!(
            parse_number("1.0005", 1000),
            Ok(Millis {
                whole: 1_000,
                fraction: true
            })
        );
    }

    #[test]
    fn strings_with_units() {
        assert_eq!(parse_with_unit("500ms"), whole(500));
        assert_eq!(parse_with_unit("2s"), whole(2_000));
        assert_eq!(parse_with_unit("1.5s"), whole(1_500));
        assert_eq!(parse_with_unit("5m"), whole(300_000));
        assert_eq!(parse_with_unit("0.5m"), whole(30_000));
        assert_eq!(parse_with_unit("1h"), whole(3_600_000));
        assert_eq!(parse_with_unit(" 10 s "), whole(10_000));
        assert_eq!(parse_with_unit("0s"), whole(0));
        assert_eq!(
            parse_with_unit("1.5ms"),
            Ok(Millis {
                whole: 1,
                fraction: true
            })
        );
    }

    #[test]
    fn bad_strings() {
        assert_eq!(
            parse_with_unit("60"),
            Err(DurationProblem::MissingUnit("60".into()))
        );
        assert_eq!(
            parse_with_unit("5d"),
            Err(DurationProblem::UnknownUnit("d".into()))
        );
        assert_eq!(
            parse_with_unit("5 minutes"),
            Err(DurationProblem::UnknownUnit("minutes".into()))
        );
        for text in [
            "", "soon", "ms", "1..2s", "1.2.3s", "s5", "1s2", "--1s", ".",
        ] {
            assert_eq!(
                parse_with_unit(text),
                Err(DurationProblem::Unparsable),
                "{text:?}"
            );
        }
    }

    #[test]
    fn huge_values_are_too_large() {
        assert_eq!(
            parse_number("99999999999999999999999", 1000),
            Err(DurationProblem::TooLarge)
        );
        assert_eq!(parse_number("1e40", 1000), Err(DurationProblem::TooLarge));
        assert_eq!(
            parse_with_unit("9999999999999999h"),
            Err(DurationProblem::TooLarge)
        );
        assert_eq!(parse_number("0e40", 1000), whole(0));
    }

    #[test]
    fn limits() {
        let at = |millis, fraction| Millis {
            whole: millis,
            fraction,
        };
        assert!(check_limits(at(1, false), false, Limit::Ttl, "\"1ms\"").is_ok());
        assert!(check_limits(at(0, false), false, Limit::Timeout, "0").is_ok());
        let zero = check_limits(at(0, false), false, Limit::Ttl, "0").unwrap_err();
        assert!(zero.contains("is zero"), "{zero}");
        let negative = check_limits(at(5_000, false), true, Limit::Ttl, "-5").unwrap_err();
        assert!(negative.contains("is negative"), "{negative}");
        let negative = check_limits(at(5_000, false), true, Limit::Timeout, "-5").unwrap_err();
        assert!(negative.contains("timeout = 0"), "{negative}");
        let tiny = check_limits(at(0, true), false, Limit::Ttl, "0.0005").unwrap_err();
        assert!(tiny.contains("less than 1 ms"), "{tiny}");
        let tiny = check_limits(at(0, true), false, Limit::Timeout, "0.0005").unwrap_err();
        assert!(tiny.contains("less than 1 ms"), "{tiny}");
        let fraction = check_limits(at(1, true), false, Limit::Ttl, "\"1.5ms\"").unwrap_err();
        assert!(
            fraction.contains("whole number of milliseconds"),
            "{fraction}"
        );
    }

    fn args(tokens: TokenStream) -> syn::Result<Args> {
        syn::parse2(tokens)
    }

    fn error(tokens: TokenStream) -> String {
        match args(tokens) {
            Ok(_) => panic!("arguments should be rejected"),
            Err(error) => error
                .into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    #[test]
    fn all_options() {
        let args = args(quote!(
            key = "trace:{id}",
            ttl = "500ms",
            timeout = 0,
            guard = lock,
            auto_extend = true,
            fencing = false,
            crate = "dl",
        ))
        .unwrap();
        assert_eq!(args.key.literal.value(), "trace:{id}");
        assert_eq!(args.ttl.unwrap().millis, 500);
        assert_eq!(args.timeout.unwrap().millis, 0);
        assert_eq!(args.guard.unwrap(), "lock");
        assert!(args.auto_extend.unwrap().value);
        assert!(!args.fencing.unwrap().value);
        assert!(args.crate_path.unwrap().path.is_ident("dl"));
    }

    #[test]
    fn durations_in_every_form() {
        for (tokens, millis) in [
            (quote!(60), 60_000),
            (quote!(0.5), 500),
            (quote!(1e1), 10_000),
            (quote!("500ms"), 500),
            (quote!("2s"), 2_000),
            (quote!("1.5s"), 1_500),
            (quote!("5m"), 300_000),
            (quote!("1h"), 3_600_000),
        ] {
            let parsed = args(quote!(key = "k", ttl = #tokens, timeout = #tokens)).unwrap();
            assert_eq!(parsed.ttl.unwrap().millis, millis, "{tokens}");
            assert_eq!(parsed.timeout.unwrap().millis, millis, "{tokens}");
        }
    }

    #[test]
    fn defaults_are_absent() {
        let args = args(quote!(key = "k")).unwrap();
        assert!(args.ttl.is_none() && args.timeout.is_none() && args.guard.is_none());
        assert!(args.auto_extend.is_none() && args.fencing.is_none());
        assert!(args.crate_path.is_none());
    }

    #[test]
    fn missing_key() {
        assert!(error(quote!()).contains("missing `key`"));
        assert!(error(quote!(ttl = 5)).contains("missing `key`"));
    }

    #[test]
    fn unknown_option_lists_the_options() {
        let message = error(quote!(key = "k", tll = 5));
        assert!(message.contains("unknown option `tll`"), "{message}");
        assert!(message.contains("did you mean `ttl`?"), "{message}");
        assert!(
            message.contains("`key`, `ttl`, `timeout`, `guard`, `auto_extend`, `fencing`, `crate`"),
            "{message}"
        );
        let message = error(quote!(key = "k", retries = 5));
        assert!(!message.contains("did you mean"), "{message}");
    }

    #[test]
    fn repeated_option() {
        let message = error(quote!(key = "k", ttl = 5, ttl = 6));
        assert!(
            message.contains("`ttl` is given more than once"),
            "{message}"
        );
    }

    #[test]
    fn all_problems_are_reported() {
        let message = error(quote!(key = "", ttl = 0, guard = "g", bogus = 1));
        assert_eq!(message.lines().count(), 4, "{message}");
    }

    #[test]
    fn missing_equals_and_value() {
        assert!(error(quote!(key)).contains("expected `=` after `key`"));
        assert!(error(quote!(key = "k", ttl)).contains("expected `=` after `ttl`"));
        assert!(error(quote!(key = "k", ttl =)).contains("`ttl` needs a value"));
        assert!(error(quote!("k")).contains("expected `key = ...`"));
    }

    #[test]
    fn wrong_value_types() {
        assert!(error(quote!(key = k)).contains("`key` takes a string literal"));
        assert!(error(quote!(key = "k", ttl = true)).contains("`ttl` takes a duration"));
        assert!(error(quote!(key = "k", guard = "g")).contains("write `guard = g`"));
        assert!(error(quote!(key = "k", guard = 1)).contains("`guard` takes the name"));
        assert!(error(quote!(key = "k", auto_extend = 1)).contains("takes `true` or `false`"));
        assert!(error(quote!(key = "k", fencing = "yes")).contains("takes `true` or `false`"));
        assert!(error(quote!(key = "k", crate = dl)).contains("`crate` takes the path"));
        assert!(error(quote!(key = "k", crate = "not a path")).contains("is not a path"));
        assert!(error(quote!(key = "k", ttl = 5 s)).contains("unexpected tokens"));
        assert!(error(quote!(key = "k", ttl = 500ms)).contains("write `ttl = \"500ms\"`"));
        assert!(error(quote!(key = "k", ttl = 5u64)).contains("write `ttl = 5`"));
    }

    #[test]
    fn bad_durations() {
        assert!(error(quote!(key = "k", ttl = 0)).contains("is zero"));
        assert!(error(quote!(key = "k", ttl = "0ms")).contains("is zero"));
        assert!(error(quote!(key = "k", ttl = -5)).contains("is negative"));
        assert!(error(quote!(key = "k", ttl = "-5s")).contains("is negative"));
        assert!(error(quote!(key = "k", timeout = -1)).contains("is negative"));
        assert!(error(quote!(key = "k", ttl = 0.0001)).contains("less than 1 ms"));
        assert!(error(quote!(key = "k", ttl = "soon")).contains("is not a duration"));
        assert!(error(quote!(key = "k", ttl = "60")).contains("has no unit"));
        assert!(error(quote!(key = "k", ttl = "5d")).contains("unknown unit `d`"));
        args(quote!(key = "k", timeout = 0)).unwrap();
        args(quote!(key = "k", timeout = -0)).unwrap();
    }

    #[test]
    fn key_syntax_errors_are_argument_errors() {
        assert!(error(quote!(key = "")).contains("the lock key is empty"));
        assert!(error(quote!(key = "a{b")).contains("unclosed `{`"));
    }

    #[test]
    fn crate_paths() {
        for path in ["::distlock", "dl", "crate::deps::distlock", "self::dl"] {
            args(quote!(key = "k", crate = #path)).unwrap();
        }
        assert!(error(quote!(key = "k", crate = "")).contains("is not a path"));
        assert!(error(quote!(key = "k", crate = "a<b>")).contains("is not a path"));
    }

    #[test]
    fn edit_distance_works() {
        assert_eq!(edit_distance("ttl", "ttl"), 0);
        assert_eq!(edit_distance("tll", "ttl"), 1);
        assert_eq!(edit_distance("timout", "timeout"), 1);
        assert_eq!(closest_option("autoextend"), Some("auto_extend"));
        assert_eq!(closest_option("keys"), Some("key"));
        assert_eq!(closest_option("x"), None);
    }
}
