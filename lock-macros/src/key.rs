//! The key template of `#[distributed_lock(key = "...")]`: scanning and validation.
//!
//! A template is literal text with placeholders:
//!
//! - `{param}` / `{param.field.sub}` / `{self.id}`: the `Display` of an argument (or a field of it);
//! - `<param>` / `<param.field>`: the same, in angle brackets (for templates written that way);
//! - `{{` and `}}`: a literal `{` and `}`.
//!
//! A `<` that does not open `<ident>` or `<ident.field...>` is literal text, so keys such as
//! `"a<b"` or `"x < 3"` need no escaping. Scanning ([`scan`]) only looks at the text; whether a
//! placeholder names a real parameter is checked afterwards ([`validate`]) against the parameters
//! of the function, so that both kinds of mistakes are reported with a message that says what to
//! write instead.

use std::fmt;

use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::{FnArg, Ident, LitStr, Pat, Signature};

/// One piece of a scanned key template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Text copied into the key as it is (escapes already resolved: `{{` is stored as `{`).
    Literal(String),
    /// A placeholder, replaced by the `Display` of the value it names.
    Placeholder(Placeholder),
}

/// A placeholder such as `{trace.id}` or `<trace_id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placeholder {
    /// The parameter it names: an identifier or `self`.
    pub(crate) root: String,
    /// Field accesses after the root (`trace.id.raw` has `["id", "raw"]`); a field is an
    /// identifier or a tuple index.
    pub(crate) fields: Vec<String>,
    /// The placeholder as written in the template, e.g. `{trace.id}`, for error messages.
    pub(crate) written: String,
}

/// A template that cannot be scanned. The message says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScanError {
    pub(crate) message: String,
}

impl fmt::Display for ScanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

fn scan_error(message: impl Into<String>) -> ScanError {
    ScanError {
        message: message.into(),
    }
}

/// Splits a key template into literal text and placeholders.
///
/// Adjacent literal text is merged into one [`Segment::Literal`]. Every problem in the template is
/// reported, not only the first.
pub(crate) fn scan(template: &str) -> Result<Vec<Segment>, Vec<ScanError>> {
    if template.is_empty() {
        return Err(vec![scan_error(
            "the lock key is empty: give the lock a name, e.g. `key = \"trace:{trace_id}\"`",
        )]);
    }

    let mut segments = Vec::new();
    let mut errors = Vec::new();
    let mut literal = String::new();
    let mut rest = template;

    while let Some(c) = rest.chars().next() {
        match c {
            '{' if rest.starts_with("{{") => {
                literal.push('{');
                rest = &rest[2..];
            }
            '}' if rest.starts_with("}}") => {
                literal.push('}');
                rest = &rest[2..];
            }
            '{' => {
                let Some(close) = rest.find('}') else {
                    errors.push(scan_error(format!(
                        "unclosed `{{` in the lock key: close the placeholder, as in \
                         `{{param}}`, or write `{{{{` for a literal `{{` (in `{rest}`)"
                    )));
                    break;
                };
                let written = &rest[..=close];
                let inner = written[1..written.len() - 1].trim();
                match parse_path(inner) {
                    Ok(placeholder) => {
                        flush(&mut literal, &mut segments);
                        segments.push(Segment::Placeholder(Placeholder {
                            written: written.to_owned(),
                            ..placeholder
                        }));
                    }
                    Err(problem) => errors.push(brace_error(written, inner, &problem)),
                }
                rest = &rest[close + 1..];
            }
            '}' => {
                errors.push(scan_error(
                    "unmatched `}` in the lock key: write `}}` for a literal `}`, or open the \
                     placeholder with `{`, as in `{param}`",
                ));
                rest = &rest[1..];
            }
            '<' => {
                // `<ident>` / `<ident.field>` is a placeholder; any other `<` is literal text.
                let angle = rest.find('>').and_then(|close| {
                    let placeholder = parse_path(&rest[1..close]).ok()?;
                    Some((close, placeholder))
                });
                if let Some((close, placeholder)) = angle {
                    flush(&mut literal, &mut segments);
                    segments.push(Segment::Placeholder(Placeholder {
                        written: rest[..=close].to_owned(),
                        ..placeholder
                    }));
                    rest = &rest[close + 1..];
                } else {
                    literal.push('<');
                    rest = &rest[1..];
                }
            }
            other => {
                literal.push(other);
                rest = &rest[other.len_utf8()..];
            }
        }
    }
    flush(&mut literal, &mut segments);

    if errors.is_empty() {
        Ok(segments)
    } else {
        Err(errors)
    }
}

fn flush(literal: &mut String, segments: &mut Vec<Segment>) {
    if !literal.is_empty() {
        segments.push(Segment::Literal(std::mem::take(literal)));
    }
}

/// Why the inside of a placeholder is not a path.
enum PathProblem {
    Empty,
    FormatSpec,
    NotAPath,
}

/// Parses `ident(.field)*`, where the root may be `self` and a field is an identifier or a tuple
/// index.
fn parse_path(text: &str) -> Result<Placeholder, PathProblem> {
    if text.is_empty() {
        return Err(PathProblem::Empty);
    }
    if text.contains(':') {
        return Err(PathProblem::FormatSpec);
    }
    let mut parts = text.split('.');
    let root = parts.next().unwrap_or_default();
    if !is_identifier(root) {
        return Err(PathProblem::NotAPath);
    }
    let fields: Vec<String> = parts.map(str::to_owned).collect();
    if !fields
        .iter()
        .all(|field| is_identifier(field) || is_tuple_index(field))
    {
        return Err(PathProblem::NotAPath);
    }
    Ok(Placeholder {
        root: root.to_owned(),
        fields,
        written: String::new(),
    })
}

fn brace_error(written: &str, inner: &str, problem: &PathProblem) -> ScanError {
    match problem {
        PathProblem::Empty => scan_error(
            "empty placeholder `{}` in the lock key: name a parameter inside the braces, as in \
             `{trace_id}`, or write `{{}}` for literal braces",
        ),
        PathProblem::FormatSpec => {
            let name = inner.split(':').next().unwrap_or_default().trim();
            scan_error(format!(
                "format specs are not supported in the lock key (`{written}`): a placeholder is \
                 always written with `Display`; write `{{{name}}}`"
            ))
        }
        PathProblem::NotAPath => scan_error(format!(
            "`{written}` is not a valid placeholder: write a parameter name, as in `{{param}}` \
             or `{{param.field}}`, or write `{{{{` and `}}}}` for literal braces"
        )),
    }
}

/// An identifier as Rust lexes it (keywords and raw identifiers included, `_` excluded), so the
/// generated code can turn it into an `Ident` without panicking.
fn is_identifier(text: &str) -> bool {
    // The character filter keeps text the lexer could choke on (quotes, ...) away from it.
    text != "_"
        && text
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '#')
        && Parser::parse_str(Ident::parse_any, text).is_ok()
}

fn is_tuple_index(text: &str) -> bool {
    !text.is_empty()
        && text.chars().all(|c| c.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'))
}

/// The names a key placeholder may use, read from a function signature.
#[derive(Debug, Default)]
pub(crate) struct Params {
    /// Whether the function has a `self` receiver.
    pub(crate) has_receiver: bool,
    /// Parameters bound by a plain identifier pattern (`x`, `mut x`, `ref x`), in order.
    pub(crate) named: Vec<String>,
    /// Names bound inside a destructuring pattern, with that pattern as written, e.g.
    /// `("a", "(a, b)")`: they exist in the body but a placeholder cannot name them.
    pub(crate) destructured: Vec<(String, String)>,
}

impl Params {
    /// Reads the parameters of `sig`.
    pub(crate) fn of(sig: &Signature) -> Params {
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

/// Collects the identifiers a pattern binds.
fn bound_names(pattern: &Pat, names: &mut Vec<String>) {
    match pattern {
        Pat::Ident(ident) => {
            names.push(ident.ident.to_string());
            if let Some((_, sub)) = &ident.subpat {
                bound_names(sub, names);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Struct(strukt) => strukt
            .fields
            .iter()
            .for_each(|field| bound_names(&field.pat, names)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Reference(reference) => bound_names(&reference.pat, names),
        Pat::Paren(paren) => bound_names(&paren.pat, names),
        Pat::Type(typed) => bound_names(&typed.pat, names),
        Pat::Or(or) => or.cases.iter().for_each(|p| bound_names(p, names)),
        _ => {}
    }
}

/// Makes `quote`'s spaced-out token text readable in messages: `Option < u32 >` → `Option<u32>`.
pub(crate) fn pretty_tokens(text: &str) -> String {
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
pub(crate) fn validate(segments: &[Segment], params: &Params, key: &LitStr) -> syn::Result<()> {
    let mut errors: Option<syn::Error> = None;
    let mut push = |message: String| {
        let error = syn::Error::new(key.span(), message);
        match &mut errors {
            Some(errors) => errors.combine(error),
            None => errors = Some(error),
        }
    };

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

    errors.map_or(Ok(()), Err)
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

/// The `format!` string for a scanned template: literal text with `{` and `}` doubled, and `{}`
/// for each placeholder, in order.
pub(crate) fn format_string(segments: &[Segment]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::Span;

    fn lit(text: &str) -> Segment {
        Segment::Literal(text.to_owned())
    }

    fn ph(written: &str, root: &str, fields: &[&str]) -> Segment {
        Segment::Placeholder(Placeholder {
            root: root.to_owned(),
            fields: fields.iter().map(|f| (*f).to_owned()).collect(),
            written: written.to_owned(),
        })
    }

    fn errors(template: &str) -> Vec<String> {
        scan(template)
            .expect_err("template should be rejected")
            .into_iter()
            .map(|e| e.message)
            .collect()
    }

    #[test]
    fn plain_text_is_one_literal() {
        assert_eq!(scan("jobs:nightly").unwrap(), vec![lit("jobs:nightly")]);
    }

    #[test]
    fn brace_placeholder() {
        assert_eq!(
            scan("trace:{trace_id}").unwrap(),
            vec![lit("trace:"), ph("{trace_id}", "trace_id", &[])]
        );
    }

    #[test]
    fn brace_placeholder_with_fields() {
        assert_eq!(
            scan("{p.field.sub}:{pair.0}").unwrap(),
            vec![
                ph("{p.field.sub}", "p", &["field", "sub"]),
                lit(":"),
                ph("{pair.0}", "pair", &["0"]),
            ]
        );
    }

    #[test]
    fn self_placeholder() {
        assert_eq!(
            scan("user:{self.id}").unwrap(),
            vec![lit("user:"), ph("{self.id}", "self", &["id"])]
        );
    }

    #[test]
    fn spaces_inside_braces_are_trimmed() {
        assert_eq!(scan("{ id }").unwrap(), vec![ph("{ id }", "id", &[])]);
    }

    #[test]
    fn angle_placeholder() {
        assert_eq!(
            scan("trace:<trace_id>").unwrap(),
            vec![lit("trace:"), ph("<trace_id>", "trace_id", &[])]
        );
        assert_eq!(
            scan("<job.owner.name>-x").unwrap(),
            vec![ph("<job.owner.name>", "job", &["owner", "name"]), lit("-x")]
        );
    }

    #[test]
    fn angle_that_opens_no_placeholder_is_literal() {
        assert_eq!(scan("a<b").unwrap(), vec![lit("a<b")]);
        assert_eq!(scan("x < 3").unwrap(), vec![lit("x < 3")]);
        assert_eq!(scan("x < 3 > 2").unwrap(), vec![lit("x < 3 > 2")]);
        assert_eq!(scan("<>").unwrap(), vec![lit("<>")]);
        assert_eq!(scan("<a.>").unwrap(), vec![lit("<a.>")]);
        assert_eq!(scan("<1>").unwrap(), vec![lit("<1>")]);
        assert_eq!(scan("a>b").unwrap(), vec![lit("a>b")]);
        assert_eq!(scan("<<a>").unwrap(), vec![lit("<"), ph("<a>", "a", &[])]);
    }

    #[test]
    fn escaped_braces() {
        assert_eq!(scan("{{x}}").unwrap(), vec![lit("{x}")]);
        assert_eq!(
            scan("{{{id}}}").unwrap(),
            vec![lit("{"), ph("{id}", "id", &[]), lit("}")]
        );
    }

    #[test]
    fn unicode_text_and_names() {
        assert_eq!(
            scan("clé:{nom}é").unwrap(),
            vec![lit("clé:"), ph("{nom}", "nom", &[]), lit("é")]
        );
    }

    #[test]
    fn empty_key_is_rejected() {
        assert!(errors("")[0].contains("the lock key is empty"));
    }

    #[test]
    fn unclosed_brace_is_rejected() {
        let messages = errors("trace:{trace_id");
        assert_eq!(messages.len(), 1);
        assert!(messages[0].contains("unclosed `{`"), "{messages:?}");
        assert!(messages[0].contains("`{{`"), "{messages:?}");
    }

    #[test]
    fn stray_closing_brace_is_rejected() {
        let messages = errors("trace}");
        assert!(messages[0].contains("unmatched `}`"), "{messages:?}");
        assert!(messages[0].contains("`}}`"), "{messages:?}");
    }

    #[test]
    fn empty_braces_are_rejected() {
        let messages = errors("trace:{}");
        assert!(messages[0].contains("empty placeholder"), "{messages:?}");
        assert!(errors("{  }")[0].contains("empty placeholder"));
    }

    #[test]
    fn format_specs_are_rejected() {
        let messages = errors("{id:?}");
        assert!(messages[0].contains("format specs"), "{messages:?}");
        assert!(messages[0].contains("write `{id}`"), "{messages:?}");
    }

    #[test]
    fn invalid_paths_are_rejected() {
        for template in ["{a-b}", "{1}", "{a.}", "{.a}", "{a..b}", "{_}", "{a.01}"] {
            let messages = errors(template);
            assert!(
                messages[0].contains("is not a valid placeholder"),
                "{template}: {messages:?}"
            );
        }
    }

    #[test]
    fn every_error_is_reported() {
        assert_eq!(errors("{} and } and {x").len(), 3);
    }

    #[test]
    fn format_string_escapes_literal_braces() {
        let segments = scan("{{a}}:{id}:<b>").unwrap();
        assert_eq!(format_string(&segments), "{{a}}:{}:{}");
    }

    fn params(sig: &str) -> Params {
        let sig: Signature = syn::parse_str(sig).unwrap();
        Params::of(&sig)
    }

    fn validate_str(template: &str, sig: &str) -> Result<(), String> {
        let key = LitStr::new(template, Span::call_site());
        validate(&scan(template).unwrap(), &params(sig), &key).map_err(|e| {
            e.into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        })
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
