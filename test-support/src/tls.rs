//! TLS and ACL for [`RedisServer`]: a self-signed CA and server certificate made with the
//! `openssl` CLI ([`TlsFiles`]), a TLS-only server ([`RedisServer::start_tls`]), an ACL user
//! limited to given commands ([`RedisServer::add_acl_user`]), and [`run_bounded`], which runs
//! a CLI tool (`openssl`, `redis-cli`) without letting it hang the test.
//!
//! The `redis` dev-dependency has no TLS feature, so assertions on a TLS server go through
//! `redis-cli --tls` ([`RedisServer::tls_cli`]); the redis-rs helpers of [`RedisServer`]
//! (`get`, `conn`, ...) speak plain text and cannot reach it.

use std::fmt::Write as _;
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::server::{Readiness, RedisServer};

/// Bound of one `openssl` invocation (key generation takes well under a second).
const OPENSSL_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound of one `redis-cli` invocation made by a helper.
const CLI_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound of one readiness probe at start: short, it is retried until the start timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

const OPENSSL_NOT_FOUND: &str = "openssl not found on PATH: install it \
     (Debian/Ubuntu: `apt-get install -y openssl`, macOS: `brew install openssl`)";
const REDIS_CLI_NOT_FOUND: &str = "redis-cli not found on PATH: install it \
     (Debian/Ubuntu: `apt-get install -y redis-tools` or `redis-server`, macOS: `brew install redis`)";

/// OpenSSL config of the CA: self-signed, allowed to sign certificates (rustls/webpki insist on
/// `CA:TRUE` and `keyCertSign`). Written out instead of relying on the system `openssl.cnf`.
const CA_CONFIG: &str = "\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = distlock test CA
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
";

/// Extensions of the server certificate: valid for `127.0.0.1` and `localhost`, TLS server only.
const SERVER_EXTENSIONS: &str = "\
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

/// PEM files of a throwaway PKI: a self-signed CA and a server certificate signed by it for
/// `IP:127.0.0.1` and `DNS:localhost` (P-256 keys, valid for 10 years from now).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The directory holding every file below (and openssl's scratch files).
    pub dir: PathBuf,
    /// `ca.crt`: what a client must trust.
    pub ca_cert: PathBuf,
    /// `ca.key`: the CA's private key (to sign more certificates, e.g. client ones).
    pub ca_key: PathBuf,
    /// `server.crt`: the server certificate, signed by the CA.
    pub server_cert: PathBuf,
    /// `server.key`: the server's private key.
    pub server_key: PathBuf,
}

impl TlsFiles {
    /// Creates `dir` if needed and generates the files in it with the `openssl` CLI. Nothing
    /// removes them: put them in a directory that is removed anyway (a server's own one, or a
    /// [`unique_temp_dir`](crate::unique_temp_dir) the test removes).
    ///
    /// Panics with an install hint if `openssl` is missing, and with openssl's output if a
    /// step fails.
    pub fn generate(dir: &Path) -> Self {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("cannot create TLS dir {}: {e}", dir.display()));
        let files = Self {
            dir: dir.to_path_buf(),
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
        };
        let ca_config = dir.join("ca.cnf");
        let server_ext = dir.join("server.ext");
        let server_csr = dir.join("server.csr");
        for (path, text) in [(&ca_config, CA_CONFIG), (&server_ext, SERVER_EXTENSIONS)] {
            std::fs::write(path, text)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        }
        let ec_key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];

        let mut ca = Command::new("openssl");
        ca.args([
            "req",
            "-x509",
            "-new",
            "-days",
            "3650",
            "-extensions",
            "v3_ca",
        ])
        .args(ec_key)
        .arg("-config")
        .arg(&ca_config)
        .arg("-keyout")
        .arg(&files.ca_key)
        .arg("-out")
        .arg(&files.ca_cert);
        openssl(&mut ca, "create the CA certificate");

        let mut csr = Command::new("openssl");
        csr.args(["req", "-new", "-subj", "/CN=localhost"])
            .args(ec_key)
            .arg("-keyout")
            .arg(&files.server_key)
            .arg("-out")
            .arg(&server_csr);
        openssl(&mut csr, "create the server key and signing request");

        let mut sign = Command::new("openssl");
        sign.args(["x509", "-req", "-days", "3650", "-CAcreateserial"])
            .arg("-in")
            .arg(&server_csr)
            .arg("-CA")
            .arg(&files.ca_cert)
            .arg("-CAkey")
            .arg(&files.ca_key)
            .arg("-extfile")
            .arg(&server_ext)
            .arg("-out")
            .arg(&files.server_cert);
        openssl(&mut sign, "sign the server certificate with the CA");
        files
    }

    /// The settings (name, value) of a server whose `port` speaks only TLS with these
    /// certificates, not asking clients for certificates of their own: for the command line
    /// (`--name value`) or a configuration file (`name value`).
    pub fn tls_only_settings(&self, port: u16) -> Vec<(&'static str, String)> {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        vec![
            ("tls-port", port.to_string()),
            ("tls-cert-file", path(&self.server_cert)),
            ("tls-key-file", path(&self.server_key)),
            ("tls-ca-cert-file", path(&self.ca_cert)),
            ("tls-auth-clients", "no".to_owned()),
        ]
    }

    /// The CA certificate, PEM-encoded (what a rustls client adds to its root store).
    pub fn ca_pem(&self) -> Vec<u8> {
        read_pem(&self.ca_cert)
    }
}

/// Runs one `openssl` step, panicking with its output (or the install hint) if it fails.
fn openssl(command: &mut Command, what: &str) {
    match run_bounded(command, OPENSSL_TIMEOUT) {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!(
            "openssl could not {what} ({}): {command:?}\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => panic!("{OPENSSL_NOT_FOUND}"),
        Err(e) => panic!("openssl could not {what}: {e}: {command:?}"),
    }
}

fn read_pem(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

impl RedisServer {
    /// Starts a TLS-only server; see [`start_tls_with`](Self::start_tls_with).
    pub fn start_tls() -> Self {
        Self::start_tls_with(&[])
    }

    /// Starts `redis-server` with a fresh [`TlsFiles`] (in `<dir>/tls`, removed with the
    /// server) and `--port 0 --tls-port P --tls-cert-file .. --tls-key-file ..
    /// --tls-ca-cert-file .. --tls-auth-clients no` followed by `extra_args`: port P speaks
    /// only TLS, there is no plain-text port. It counts as started once
    /// `redis-cli --tls --cacert ca.crt -p P INFO server` answers (also after
    /// [`restart`](Self::restart)).
    ///
    /// Use [`tls_url`](Self::tls_url), [`ca_pem`](Self::ca_pem) and
    /// [`tls_cli`](Self::tls_cli); [`port`](Self::port) is the TLS port, while
    /// [`url`](Self::url) and the redis-rs helpers (`get`, `conn`, ...) speak plain text and
    /// fail against this server.
    ///
    /// Panics with install hints if `openssl` or `redis-cli` is missing, or if redis-server was
    /// built without TLS (its log then says so).
    pub fn start_tls_with(extra_args: &[&str]) -> Self {
        require_redis_cli();
        let dir = crate::unique_temp_dir("redis-tls");
        let files = TlsFiles::generate(&dir.join("tls"));
        Self::start_tls_in(dir, &files, extra_args)
    }

    /// [`start_tls_with`](Self::start_tls_with) with certificates made by the caller, which
    /// several servers may share (a replica must trust its master's certificate): the files
    /// must outlive the server, which does not remove them.
    pub fn start_tls_using(files: &TlsFiles, extra_args: &[&str]) -> Self {
        require_redis_cli();
        Self::start_tls_in(crate::unique_temp_dir("redis-tls"), files, extra_args)
    }

    fn start_tls_in(dir: PathBuf, files: &TlsFiles, extra_args: &[&str]) -> Self {
        let files = files.clone();
        let extra: Vec<String> = extra_args
            .iter()
            .map(std::string::ToString::to_string)
            .collect();
        let readiness = Readiness::Tls {
            ca_file: files.ca_cert.clone(),
        };
        RedisServer::start_custom(dir, readiness, move |port| {
            // `--port 0` comes after the harness's `--port P`, and the last one wins.
            let mut args = vec!["--port".to_owned(), "0".to_owned()];
            args.extend(
                files
                    .tls_only_settings(port)
                    .into_iter()
                    .flat_map(|(name, value)| [format!("--{name}"), value]),
            );
            args.extend(extra.iter().cloned());
            args
        })
    }

    /// `rediss://127.0.0.1:<port>/`. Panics if the server was not started with
    /// [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> String {
        self.require_tls("tls_url");
        format!("rediss://127.0.0.1:{}/", self.port())
    }

    /// The PEM bytes of the CA that signed the server certificate (the client's root of
    /// trust). Panics if the server is not a TLS one.
    pub fn ca_pem(&self) -> Vec<u8> {
        read_pem(self.require_tls("ca_pem"))
    }

    /// Runs `redis-cli --tls --cacert <ca> -h 127.0.0.1 -p <port> <args...>` (bounded to 10 s)
    /// and returns its stdout without the trailing newline, e.g. `tls_cli(&["PING"])` gives
    /// `"PONG"`. Options may come first (`&["--user", "u", "--pass", "p", "GET", "k"]`).
    ///
    /// redis-cli exits with 0 after an error *reply*, which then shows up as the text
    /// (`"NOPERM ..."`, `"ERR ..."`); this panics only when redis-cli itself fails (no
    /// connection, handshake refused, timeout), with its stderr. Panics if the server is not
    /// a TLS one.
    pub fn tls_cli(&self, args: &[&str]) -> String {
        let ca = self.require_tls("tls_cli");
        let mut command = Command::new("redis-cli");
        command
            .arg("--tls")
            .arg("--cacert")
            .arg(ca)
            .args(["-h", "127.0.0.1", "-p", &self.port().to_string()])
            .args(args);
        match run_bounded(&mut command, CLI_TIMEOUT) {
            Ok(output) if output.status.success() => String::from_utf8_lossy(&output.stdout)
                .trim_end_matches(['\r', '\n'])
                .to_string(),
            Ok(output) => panic!(
                "redis-cli --tls on port {} failed ({}) for {args:?}: {}{}",
                self.port(),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(e) if e.kind() == ErrorKind::NotFound => panic!("{REDIS_CLI_NOT_FOUND}"),
            Err(e) => panic!(
                "redis-cli --tls on port {} failed for {args:?}: {e}",
                self.port()
            ),
        }
    }

    /// Creates (or replaces) the ACL user `name` with
    /// `ACL SETUSER name reset on >password ~* &* -@all +<cmd>...`: every key and channel, but
    /// only the listed commands. An entry is a command name (`"get"`, `"client|setinfo"`),
    /// which gets a `+`, or a rule used as it is when it starts with `+` or `-` (`"+@read"`,
    /// `"-flushall"`).
    ///
    /// Returns the URL that logs in as the user: `redis://name:password@127.0.0.1:<port>/`,
    /// or `rediss://...` on a [TLS server](Self::start_tls) (user and password
    /// percent-encoded). Works on TLS servers too (through `redis-cli`). Panics if Redis
    /// refuses the rule (e.g. an unknown command).
    pub fn add_acl_user(&self, name: &str, password: &str, allowed: &[&str]) -> String {
        let mut rule: Vec<String> = ["ACL", "SETUSER", name, "reset", "on"]
            .iter()
            .map(std::string::ToString::to_string)
            .collect();
        rule.push(format!(">{password}"));
        rule.extend(["~*", "&*", "-@all"].map(String::from));
        for entry in allowed {
            if entry.starts_with('+') || entry.starts_with('-') {
                rule.push(entry.to_string());
            } else {
                rule.push(format!("+{entry}"));
            }
        }
        let scheme = if self.tls_ca_file().is_some() {
            let args: Vec<&str> = rule.iter().map(String::as_str).collect();
            let reply = self.tls_cli(&args);
            assert_eq!(
                reply,
                "OK",
                "{} on port {} was refused",
                rule.join(" "),
                self.port()
            );
            "rediss"
        } else {
            let mut cmd = redis::cmd(&rule[0]);
            cmd.arg(&rule[1..]);
            let mut conn = self.conn();
            cmd.query::<()>(&mut conn).unwrap_or_else(|e| {
                panic!("{} on port {} failed: {e}", rule.join(" "), self.port())
            });
            "redis"
        };
        format!(
            "{scheme}://{}:{}@127.0.0.1:{}/",
            percent_encode(name),
            percent_encode(password),
            self.port()
        )
    }

    /// The CA file of a TLS server, or a panic naming `what` was called on a plain one.
    fn require_tls(&self, what: &str) -> &Path {
        self.tls_ca_file().unwrap_or_else(|| {
            panic!(
                "{what}: redis-server on port {} is not a TLS server (use RedisServer::start_tls)",
                self.port()
            )
        })
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters (for URL userinfo).
fn percent_encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// Panics with the install hint unless `redis-cli` can be run.
pub fn require_redis_cli() {
    match run_bounded(Command::new("redis-cli").arg("--version"), CLI_TIMEOUT) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => panic!("{REDIS_CLI_NOT_FOUND}"),
        Err(e) => panic!("cannot run `redis-cli --version`: {e}"),
    }
}

/// The readiness probe of a TLS server (see [`Readiness::Tls`]): `INFO server` through
/// `redis-cli --tls`. `None` if nothing answered over TLS with this CA (yet); `Some(pid)` if a
/// Redis answered, with its `process_id` when it said (an error reply such as `NOAUTH` still
/// proves it is up).
// Three answers, not two: nothing answered, or a Redis answered with or without its pid.
#[allow(clippy::option_option)]
pub(super) fn probe_tls(port: u16, ca_file: &Path) -> Option<Option<u32>> {
    let mut command = Command::new("redis-cli");
    command.arg("--tls").arg("--cacert").arg(ca_file).args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "INFO",
        "server",
    ]);
    let output = run_bounded(&mut command, PROBE_TIMEOUT).ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() || text.trim().is_empty() || text.starts_with("LOADING") {
        return None;
    }
    Some(
        text.lines()
            .find_map(|line| line.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok()),
    )
}

/// Runs `command` (stdin closed, stdout and stderr captured) and waits at most `timeout` for
/// it; on timeout the process is killed and an error of kind `TimedOut` returned. A program
/// that is not installed gives an error of kind `NotFound`.
///
/// # Errors
/// Starting or waiting for the program failed, or it ran out of time, as above.
pub fn run_bounded(command: &mut Command, timeout: Duration) -> std::io::Result<Output> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Read both pipes while waiting, so a chatty program cannot block on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => Err(std::io::Error::new(
            ErrorKind::TimedOut,
            format!(
                "{command:?} did not finish within {timeout:?}; output so far: {}{}",
                String::from_utf8_lossy(&stdout),
                String::from_utf8_lossy(&stderr)
            ),
        )),
    }
}
