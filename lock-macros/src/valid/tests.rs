use super::params::pretty_tokens;
use super::*;
use crate::key;
use quote::quote;
use syn::{LitStr, Signature};

/// Every message of `errors`, one a line.
fn messages(errors: Errors) -> String {
    match errors.finish() {
        Ok(()) => String::new(),
        Err(error) => error
            .into_iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// The rule errors for `attribute` on `function` (both parsed without errors).
fn rules(attribute: proc_macro2::TokenStream, function: &str) -> String {
    let mut errors = Errors::default();
    let args = Args::parse(attribute, &mut errors);
    assert!(errors.0.is_none(), "{}", messages(errors));
    let function: ItemFn = syn::parse_str(function).unwrap();
    match check(&args, Some(&function), Errors::default()) {
        Ok(_) => String::new(),
        Err(error) => error
            .into_iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

const FN: &str = "async fn f(id: u32) -> Result<(), E> { Ok(()) }";

#[test]
fn a_correct_attribute_passes() {
    assert_eq!(
        rules(
            quote!(
                key = "k:{id}",
                ttl = 60,
                timeout = 0,
                guard = lock,
                auto_extend = true
            ),
            FN
        ),
        ""
    );
}

#[test]
fn keys_rules() {
    assert_eq!(rules(quote!(keys = ["a:{id}", "b:{id}"]), FN), "");
    assert_eq!(rules(quote!(keys = ["only"]), FN), "");
    assert!(rules(quote!(keys = []), FN).contains("`keys` is empty"));
    assert!(rules(quote!(key = "k", keys = ["a"]), FN).contains("`key` and `keys` together"));
    assert!(rules(quote!(keys = ["a:{id}", "b:{nope}"]), FN).contains("no parameter `nope`"));
    assert!(!rules(quote!(keys = ["a"]), FN).contains("missing `key`"));
}

#[test]
fn missing_key() {
    assert!(rules(quote!(), FN).contains("missing `key`"));
    assert!(rules(quote!(ttl = 5), FN).contains("missing `key`"));
}

#[test]
fn repeated_option() {
    let message = rules(quote!(key = "k", ttl = 5, ttl = 6, ttl = 7), FN);
    assert_eq!(message.lines().count(), 2, "{message}");
    assert!(message.contains("`ttl` is given more than once: keep only one `ttl = 60`"));
}

#[test]
fn bad_durations() {
    for (attribute, expected) in [
        (quote!(key = "k", ttl = 0), "is zero"),
        (quote!(key = "k", ttl = "0ms"), "is zero"),
        (quote!(key = "k", ttl = -5), "is negative"),
        (quote!(key = "k", ttl = "-5s"), "is negative"),
        (quote!(key = "k", timeout = -1), "is negative"),
        (quote!(key = "k", ttl = 0.0001), "less than 1 ms"),
        (quote!(key = "k", timeout = 0.0001), "less than 1 ms"),
        (
            quote!(key = "k", ttl = "1.5ms"),
            "write e.g. `ttl = \"1ms\"`",
        ),
        (
            quote!(key = "k", timeout = 1.0005),
            "write e.g. `timeout = \"1000ms\"`",
        ),
        (
            quote!(key = "k", ttl = "9000h"),
            "write at most `ttl = \"8760h\"`",
        ),
        (
            quote!(key = "k", ttl = 1e40),
            "longer than the maximum of 365 days",
        ),
        (
            quote!(key = "k", timeout = "9000h"),
            "write at most `timeout = \"8760h\"`",
        ),
    ] {
        let message = rules(attribute.clone(), FN);
        assert!(message.contains(expected), "{attribute}: {message}");
    }
}

#[test]
fn the_limits_are_those_of_the_runtime() {
    // 365 days, the last accepted value, and one millisecond more.
    let max = format!("{MAX_DURATION_MILLIS}ms");
    let over = format!("{}ms", MAX_DURATION_MILLIS + 1);
    assert_eq!(rules(quote!(key = "k", ttl = #max, timeout = #max), FN), "");
    assert_eq!(rules(quote!(key = "k", ttl = "8760h"), FN), "");
    assert!(rules(quote!(key = "k", ttl = #over), FN).contains("longer than the maximum"));
    assert!(rules(quote!(key = "k", timeout = #over), FN).contains("longer than the maximum"));
    assert_eq!(rules(quote!(key = "k", ttl = "1ms", timeout = -0), FN), "");
}

#[test]
fn guard_may_not_hide_a_parameter() {
    let message = rules(quote!(key = "k", guard = id), FN);
    assert!(
        message.contains("would hide the parameter `id`"),
        "{message}"
    );
    let message = rules(
        quote!(key = "k", guard = lock),
        "async fn f(lock: u8) -> Result<(), E> { Ok(()) }",
    );
    assert!(message.contains("`guard = held`"), "{message}");
}

#[test]
fn permits_and_mode_follow_the_shared_rule() {
    let message = rules(quote!(key = "k", permits = 0), FN);
    assert!(
        message.contains("`permits = 0` lets nobody in"),
        "{message}"
    );
    let message = rules(quote!(key = "k", permits = 3, mode = "read"), FN);
    assert!(message.contains("pick one"), "{message}");
    let message = rules(quote!(key = "k", permits = 99999999999), FN);
    assert!(message.contains("at most 4294967295"), "{message}");
    for fine in [
        quote!(key = "k", permits = 3),
        quote!(key = "k", permits = 1, mode = "read"),
        quote!(key = "k", mode = "write", permits = 7),
    ] {
        assert_eq!(rules(fine.clone(), FN), "", "{fine}");
    }
}

#[test]
fn fencing_needs_a_guard() {
    let message = rules(quote!(key = "k", fencing = true), FN);
    assert!(message.contains("add `guard = lock`"), "{message}");
    assert!(message.contains("`lock.fencing_token()`"), "{message}");
    assert_eq!(rules(quote!(key = "k", fencing = true, guard = g), FN), "");
    assert_eq!(rules(quote!(key = "k", fencing = false), FN), "");
}

/// The name of the guard a body uses without `guard = ...`, if any.
fn undeclared(attribute: proc_macro2::TokenStream, function: &str) -> Option<String> {
    let mut errors = Errors::default();
    let args = Args::parse(attribute, &mut errors);
    let function: ItemFn = syn::parse_str(function).unwrap();
    undeclared_guard(&args, &function).map(|name| name.to_string())
}

#[test]
fn a_guard_used_but_never_bound_is_found() {
    for (body, name) in [
        ("lock.extend(d).await?; Ok(())", "lock"),
        ("Ok(guard.key().len())", "guard"),
        ("println!(\"{}\", lock.token()); Ok(())", "lock"),
        ("if lock.is_lost() { return Ok(()) } Ok(())", "lock"),
    ] {
        let function = format!("async fn f(id: u32) -> Result<(), E> {{ {body} }}");
        assert_eq!(
            undeclared(quote!(key = "k"), &function).as_deref(),
            Some(name),
            "{body}"
        );
        assert_eq!(undeclared(quote!(key = "k", guard = lock), &function), None);
    }
}

/// Never a false alarm on a body that compiles: any other appearance of the name may bind
/// it, and a field or method of that name is another thing.
#[test]
fn a_guard_name_bound_or_used_otherwise_is_left_alone() {
    for body in [
        "let lock = Ticket; lock.key(); Ok(())",
        "let f = |lock: &T| lock.key(); Ok(())",
        "if let Some(lock) = x { lock.extend(d); } Ok(())",
        "for guard in all { guard.release(); } Ok(())",
        "use a::lock; lock.key(); Ok(())",
        "my_macro!(lock); lock.key(); Ok(())",
        "self.lock.key(); m.lock().unwrap(); Ok(())",
        "lock.read(); Ok(())",
        "Ok(lock)",
        // An item reached by a path (a `static` or `const` of another module or type) is
        // not the guard, whatever its methods: the body compiles without `guard = ...`.
        "Ok(crate::config::lock.key().len())",
        "Self::guard.release(); Ok(())",
        "super::lock.token(); Ok(())",
        "<T>::lock.key(); Ok(())",
    ] {
        let function = format!("async fn f(id: u32) -> Result<(), E> {{ {body} }}");
        assert_eq!(undeclared(quote!(key = "k"), &function), None, "{body}");
    }
    assert_eq!(
        undeclared(
            quote!(key = "k"),
            "async fn f(lock: &L) -> Result<(), E> { lock.key(); Ok(()) }"
        ),
        None
    );
}

#[test]
fn signature_rules() {
    // A plain `fn` is the blocking form: the same rules apply.
    assert_eq!(
        rules(quote!(key = "k"), "fn f() -> Result<(), E> { Ok(()) }"),
        ""
    );
    let message = rules(quote!(key = "k"), "fn f() {}");
    assert!(
        message.contains("this function returns nothing"),
        "{message}"
    );
    let message = rules(
        quote!(key = "k"),
        "const fn f() -> Result<(), E> { Ok(()) }",
    );
    assert!(message.contains("cannot go on a `const fn`"), "{message}");
    let message = rules(quote!(key = "k"), "async fn f() {}");
    assert!(
        message.contains("this function returns nothing"),
        "{message}"
    );
    let message = rules(quote!(key = "k"), "async fn f() -> Option<u8> { None }");
    assert!(
        message.contains("`-> Result<Option<u8>, YourError>`"),
        "{message}"
    );
    for output in [
        "std::io::Result<()>",
        "anyhow::Result<u8>",
        "AppResult<u8>",
        "(Result<(), E>)",
    ] {
        let function = format!("async fn f() -> {output} {{ todo!() }}");
        assert_eq!(rules(quote!(key = "k"), &function), "", "{output}");
    }
}

/// A skipped call returns `core`'s `None`: an `Option` of another path (`my::Option`) is
/// refused here with the rule's message, not left to a type mismatch inside the expansion.
#[test]
fn skip_accepts_only_the_standard_option() {
    for output in [
        "Result<Option<u8>, E>",
        "Result<std::option::Option<u8>, E>",
        "Result<::core::option::Option<u8>, E>",
        "anyhow::Result<Option<u8>>",
        "std::io::Result<()>",
    ] {
        let function = format!("async fn f() -> {output} {{ todo!() }}");
        assert_eq!(
            rules(quote!(key = "k", on_busy = "skip"), &function),
            "",
            "{output}"
        );
    }
    for output in ["Result<my::Option<u8>, E>", "Result<Option, E>"] {
        let function = format!("async fn f() -> {output} {{ todo!() }}");
        let message = rules(quote!(key = "k", on_busy = "skip"), &function);
        assert!(
            message.contains("the return type must say what is returned then"),
            "{output}: {message}"
        );
    }
}

#[test]
fn every_problem_is_reported_at_once() {
    let mut errors = Errors::default();
    let args = Args::parse(quote!(key = "{nope}", ttl = 0, guard = "g"), &mut errors);
    let function: ItemFn = syn::parse_str("const fn f() {}").unwrap();
    let message = match check(&args, Some(&function), errors) {
        Ok(_) => panic!("should be rejected"),
        Err(error) => error.into_iter().map(|e| e.to_string()).collect::<Vec<_>>(),
    };
    // guard (parse), ttl, const, no Result, unknown placeholder.
    assert_eq!(message.len(), 5, "{message:#?}");
}

#[test]
fn not_a_function_is_checked_for_options_only() {
    let mut errors = Errors::default();
    let args = Args::parse(quote!(ttl = 0), &mut errors);
    let error = check(&args, None, errors).err().unwrap();
    assert_eq!(error.into_iter().count(), 2);
}

fn params(sig: &str) -> Params {
    let sig: Signature = syn::parse_str(sig).unwrap();
    Params::of(&sig)
}

fn validate_str(template: &str, sig: &str) -> Result<(), String> {
    let literal = LitStr::new(template, Span::call_site());
    let mut errors = Errors::default();
    check_placeholders(
        &key::scan(template).unwrap(),
        &params(sig),
        &literal,
        &mut errors,
    );
    match messages(errors) {
        message if message.is_empty() => Ok(()),
        message => Err(message),
    }
}

#[test]
fn params_are_read_from_the_signature() {
    let p = params("async fn f(&self, a: u32, mut b: u32, ref c: u32, (d, e): (u8, u8), _: u8)");
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
