//! Compile-time tests of `#[distributed_lock]`: `tests/ui/pass` must compile (and run: none of
//! them needs Redis), `tests/ui/fail` must fail with the message in the neighbouring `.stderr`.
//!
//! Regenerate the `.stderr` files after a deliberate message change with
//! `TRYBUILD=overwrite cargo test --test ui`, then read every diff.
//!
//! `macro_lints` compiles the attribute in every form under `#![deny(warnings)]` and clippy's
//! pedantic group.

mod macro_lints;

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
