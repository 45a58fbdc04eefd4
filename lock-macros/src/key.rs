//! The key template of `#[distributed_lock(key = "...")]`: its scanner and segments.
//!
//! A template is literal text with placeholders:
//!
//! - `{param}` / `{param.field.sub}` / `{self.id}`: the `Display` of an argument (or a field of it);
//! - `<param>` / `<param.field>`: the same, in angle brackets (for templates written that way);
//! - `{{` and `}}`: a literal `{` and `}`.
//!
//! A `<` that does not open `<ident>` or `<ident.field...>` is literal text, so keys such as
//! `"a<b"` or `"x < 3"` need no escaping. Scanning ([`scan`]) only looks at the text; whether a
//! placeholder names a real parameter of the function is a rule, checked in [`crate::valid`].

use std::fmt;

use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::Ident;

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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn hostile_templates_scan_without_panicking() {
        // Control characters and NUL are literal text.
        assert_eq!(scan("a\0\u{7}b").unwrap(), vec![lit("a\0\u{7}b")]);
        // A placeholder name that is not an identifier never reaches `Ident::new`.
        assert!(errors("{\"}")[0].contains("is not a valid placeholder"));
        assert!(errors("{a b}")[0].contains("is not a valid placeholder"));
        assert_eq!(scan("<a b>").unwrap(), vec![lit("<a b>")]);
        // Huge templates, with many placeholders or many escapes, scan in one pass.
        let many = "{id}".repeat(10_000);
        assert_eq!(scan(&many).unwrap().len(), 10_000);
        let escapes = "{{".repeat(50_000);
        assert_eq!(scan(&escapes).unwrap(), vec![lit(&"{".repeat(50_000))]);
        // `}}` is a literal `}`, the third one is stray.
        assert_eq!(errors(&"}".repeat(3)).len(), 1);
        // Raw identifiers and keywords are names a placeholder may use.
        assert_eq!(
            scan("{r#type}").unwrap(),
            vec![ph("{r#type}", "r#type", &[])]
        );
    }
}
