//! The README's quick start must be `examples/quickstart.rs` verbatim, so that what a new user
//! copies is what CI compiles (clippy builds every example) and runs.

#[test]
fn readme_quick_start_is_the_quickstart_example() {
    let readme = include_str!("../README.md");
    let example = include_str!("../examples/quickstart.rs");
    let block = format!("```rust\n{}\n```", example.trim_end());
    assert!(
        readme.contains(&block),
        "README.md's quick start differs from examples/quickstart.rs: paste the file into the \
         README's ```rust block under \"Quick start\""
    );
}

#[test]
fn readme_names_the_commands_that_ci_runs() {
    let readme = include_str!("../README.md");
    let ci = include_str!("../.ci/run");
    for command in [
        "cargo test --workspace --all-features",
        "cargo run --example process_traces",
    ] {
        assert!(readme.contains(command), "README.md lacks `{command}`");
        assert!(ci.contains(command), ".ci/run lacks `{command}`");
    }
}
