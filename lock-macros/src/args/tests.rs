use super::*;
use quote::quote;

/// Parses `tokens`, returning the arguments and the parse errors, one message a line.
fn parse(tokens: TokenStream) -> (Args, String) {
    let mut errors = Errors::default();
    let args = Args::parse(tokens, &mut errors);
    let messages = match errors.finish() {
        Ok(()) => String::new(),
        Err(error) => error
            .into_iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    };
    (args, messages)
}

fn args(tokens: TokenStream) -> Args {
    let (args, errors) = parse(tokens);
    assert!(errors.is_empty(), "{errors}");
    args
}

fn error(tokens: TokenStream) -> String {
    let (_, errors) = parse(tokens);
    assert!(!errors.is_empty(), "arguments should be rejected");
    errors
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
    ));
    assert_eq!(args.key.unwrap().literal.value(), "trace:{id}");
    assert_eq!(args.ttl.unwrap().millis.whole, 500);
    assert_eq!(args.timeout.unwrap().millis.whole, 0);
    assert_eq!(args.guard.unwrap(), "lock");
    assert!(args.auto_extend.unwrap().value);
    assert!(!args.fencing.unwrap().value);
    assert!(args.crate_path.unwrap().path.is_ident("dl"));
    let written: Vec<&str> = args.written.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        written,
        [
            "key",
            "ttl",
            "timeout",
            "guard",
            "auto_extend",
            "fencing",
            "crate"
        ]
    );
}

#[test]
fn every_option_in_the_table_parses_its_example() {
    for spec in OPTIONS {
        let example: TokenStream = spec.example.parse().unwrap();
        let args = args(example);
        assert!(args.is_written(spec.name), "{}", spec.name);
    }
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
        let parsed = args(quote!(key = "k", ttl = #tokens, timeout = #tokens));
        assert_eq!(parsed.ttl.unwrap().millis.whole, millis, "{tokens}");
        assert_eq!(parsed.timeout.unwrap().millis.whole, millis, "{tokens}");
    }
}

#[test]
fn signs_are_kept_for_the_rules() {
    let parsed = args(quote!(ttl = -5, timeout = "-1s"));
    let ttl = parsed.ttl.unwrap();
    assert!(ttl.negative && ttl.written == "-5" && ttl.millis.whole == 5_000);
    let timeout = parsed.timeout.unwrap();
    assert!(timeout.negative && timeout.written == "\"-1s\"");
    assert!(!args(quote!(ttl = 5)).ttl.unwrap().negative);
}

#[test]
fn options_not_written_are_absent() {
    let args = args(quote!(key = "k"));
    assert!(args.ttl.is_none() && args.timeout.is_none() && args.guard.is_none());
    assert!(args.auto_extend.is_none() && args.fencing.is_none());
    assert!(args.crate_path.is_none());
}

#[test]
fn unknown_option_lists_the_options() {
    let message = error(quote!(key = "k", tll = 5));
    assert!(message.contains("unknown option `tll`"), "{message}");
    assert!(message.contains("did you mean `ttl`?"), "{message}");
    assert!(
        message.contains(
            "`key`, `keys`, `ttl`, `timeout`, `guard`, `auto_extend`, `fencing`, `on_busy`, \
             `hold_at_least`, `permits`, `mode`, `crate`"
        ),
        "{message}"
    );
    let message = error(quote!(key = "k", retries = 5));
    assert!(!message.contains("did you mean"), "{message}");
}

#[test]
fn a_bad_option_does_not_hide_the_others() {
    let (args, message) = parse(quote!(key = "", guard = "g", bogus = 1, ttl = 5));
    assert_eq!(message.lines().count(), 3, "{message}");
    assert_eq!(args.ttl.as_ref().unwrap().millis.whole, 5_000);
    assert!(args.is_written("key") && args.key.is_none());
}

#[test]
fn missing_equals_and_value() {
    assert!(error(quote!(key)).contains("expected `=` after `key`"));
    assert!(error(quote!(key = "k", ttl)).contains("expected `=` after `ttl`"));
    assert!(error(quote!(key = "k", ttl =)).contains("`ttl` needs a value"));
    assert!(error(quote!("k")).contains("expected `key = ...`"));
    assert!(error(quote!(= 5)).contains("expected an option"));
}

#[test]
fn an_unnamed_key_counts_as_written() {
    let (args, _) = parse(quote!("k"));
    assert!(args.is_written("key"));
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
fn unparsable_durations() {
    assert!(error(quote!(key = "k", ttl = "soon")).contains("is not a duration"));
    assert!(error(quote!(key = "k", ttl = "60")).contains("has no unit"));
    assert!(error(quote!(key = "k", ttl = "5d")).contains("unknown unit `d`"));
}

#[test]
fn key_syntax_errors_are_argument_errors() {
    assert!(error(quote!(key = "")).contains("the lock key is empty"));
    let message = error(quote!(key = "a{b}}c{"));
    assert_eq!(message.lines().count(), 2, "{message}");
}

#[test]
fn crate_paths() {
    for path in ["::distlock", "dl", "crate::deps::distlock", "self::dl"] {
        args(quote!(key = "k", crate = #path));
    }
    assert!(error(quote!(key = "k", crate = "")).contains("is not a path"));
    assert!(error(quote!(key = "k", crate = "a<b>")).contains("is not a path"));
}

#[test]
fn keys_take_a_list_of_templates() {
    let parsed = args(quote!(keys = ["a:{x}", "b"]));
    let keys = parsed.keys.expect("parsed");
    assert_eq!(keys.templates.len(), 2);
    assert_eq!(keys.templates[1].literal.value(), "b");
    assert!(error(quote!(keys = "a")).contains("takes a list of string literals"));
    assert!(error(quote!(keys = [a, b])).contains("takes a list of string literals"));
    assert!(error(quote!(keys = ["a{"])).contains('{'));
}

#[test]
fn did_you_mean() {
    assert_eq!(edit_distance("ttl", "ttl"), 0);
    assert_eq!(edit_distance("tll", "ttl"), 1);
    assert_eq!(edit_distance("timout", "timeout"), 1);
    assert_eq!(closest_option("autoextend"), Some("auto_extend"));
    assert_eq!(closest_option("ky"), Some("key"));
    assert_eq!(closest_option("keyss"), Some("keys"));
    assert_eq!(closest_option("crates"), Some("crate"));
    assert_eq!(closest_option("fenced"), Some("fencing"));
    assert_eq!(closest_option("x"), None);
    assert_eq!(closest_option("retries"), None);
}

#[test]
fn option_looks_names_up_in_the_table() {
    assert_eq!(option("ttl").example, "ttl = 60");
    for spec in OPTIONS {
        assert!(spec.example.starts_with(spec.name), "{}", spec.name);
    }
}
