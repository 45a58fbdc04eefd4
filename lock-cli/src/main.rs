//! `distlock`: who holds distlock's Redis locks — list them, show one, watch them change, and
//! break one whose holder is stuck — and which lock templates the fleet takes in both orders.
//!
//! ```text
//! distlock list 'trace:*'            # a table; --json for scripts
//! distlock show trace:abc
//! distlock watch                     # acquisitions, hand-offs, releases, expiries
//! distlock release trace:abc --force # asks first; --yes to skip the question
//! distlock doctor                    # what in the deployment breaks locks, and the fixes
//! distlock order                     # lock templates taken in both orders (deadlocks to be)
//! distlock list --url rediss://redis.internal:6380 --tls-ca-cert ca.pem  # over TLS
//! distlock --cluster --url redis://10.0.0.1:7000,redis://10.0.0.2:7000 list
//! distlock --redlock --url redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379 list
//! distlock --sentinel locks --url redis://10.0.0.1:26379,redis://10.0.0.2:26379 list
//! ```
//!
//! Exit status: 0 done, 1 when the lock asked for is not held, a release was not done or a
//! `doctor` check failed (✗), 2 for
//! a usage error or when Redis cannot be reached or refuses a command.

mod doctor;
mod format;
#[cfg(feature = "tls")]
mod tls;
mod watch;

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::pin::pin;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use distlock::{LockError, LockInfo, LockManager, LockManagerBuilder};
use futures_util::StreamExt;

/// Who holds distlock's Redis locks: list, show, watch, and break them.
#[derive(Debug, Parser)]
#[command(name = "distlock", version, about)]
struct Cli {
    /// Redis URL (`redis://[user:password@]host:port[/db]`, `rediss://...` for TLS). With
    /// `--cluster`, any nodes of the cluster; with `--redlock`, every Redlock master; with
    /// `--sentinel`, some of the sentinels (repeat the option, or separate with commas: a comma
    /// followed by the next URL's scheme, so that a password may hold one).
    // Not clap's `value_delimiter`: a password may hold a comma, and a URL cut there would
    // be printed with the part of the password before it (see `split_urls`).
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    url: Vec<String>,
    /// The URLs name nodes of a Redis Cluster: every master is scanned.
    #[arg(long, global = true, conflicts_with_all = ["redlock", "sentinel"])]
    cluster: bool,
    /// The URLs name the independent masters of a Redlock set (at least 3): every master is
    /// scanned, and a lock is shown as the majority of them hold it.
    #[arg(long, global = true, conflicts_with = "sentinel")]
    redlock: bool,
    /// The URLs name Redis Sentinels, and SERVICE the monitored master's name (`sentinel
    /// monitor SERVICE ...` in their configuration): the locks are read on that master.
    #[arg(long, value_name = "SERVICE", global = true)]
    sentinel: Option<String>,
    /// The key prefix the application's lock manager uses.
    #[arg(long, default_value = "lock:", global = true)]
    prefix: String,
    /// PEM file of the certificate authority that signed the server's TLS certificate, for a
    /// `rediss://` URL the system's root certificates do not vouch for (a private CA, a
    /// self-signed server). It replaces the system's roots.
    #[arg(long, env = "DISTLOCK_TLS_CA_CERT", value_name = "PATH", global = true)]
    tls_ca_cert: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
    /// Where `--url` came from, for `list` to say which server it read.
    #[arg(skip)]
    url_source: Option<ValueSource>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A table of the held locks whose name matches PATTERN (a Redis glob).
    List {
        #[arg(default_value = "*")]
        pattern: String,
        /// One JSON array, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// One lock in detail (exit status 1 when it is not held).
    Show {
        name: String,
        /// A JSON object (`null` when not held).
        #[arg(long)]
        json: bool,
    },
    /// A live view: refreshes in place in a terminal, prints one line per change otherwise.
    Watch {
        #[arg(default_value = "*")]
        pattern: String,
        /// Seconds between looks.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many looks (default: until interrupted).
        #[arg(long)]
        looks: Option<u64>,
    },
    /// Check the deployment for what breaks locks — eviction policy, persistence, replicas,
    /// ACL, server version, latency — on every server of it; one line per check (✓ / ✗ / ?)
    /// with the fix for each ✗ and ?. Exit status 1 when any check is ✗.
    Doctor {
        /// One JSON object (`deployment`, `ok`, `checks`), for scripts.
        #[arg(long)]
        json: bool,
    },
    /// The orders in which the fleet's tasks took locks of two key templates (holding one,
    /// waiting for the other), and the inversions: two templates taken in both orders, which
    /// deadlock when two tasks do both at once. Read from the record the applications keep in
    /// Redis (its first 10 000 orders, kept 7 days after the last record).
    Order {
        /// One JSON object (`orders`, `inversions`), for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Break a lock whose holder is stuck; prints whose it was. It goes to the next waiter in
    /// line, as if its holder had released it.
    Release {
        name: String,
        /// Required: breaking a lock lets another worker in while its holder may still run.
        #[arg(long)]
        force: bool,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

/// What went wrong, and the exit status it gives.
enum Failure {
    /// The lock asked for is not held, or the release was not done: status 1.
    NotDone(String),
    /// Redis unreachable or refusing, bad usage: status 2.
    Error(String),
    /// Standard output was closed by its reader (`distlock list | head -1`): the reader has
    /// what it wanted, so the command ends quietly, with status 0.
    Closed,
}

impl From<LockError> for Failure {
    fn from(error: LockError) -> Self {
        Failure::Error(error.to_string())
    }
}

impl Cli {
    /// The command line as parsed by clap, its URLs separated (see [`split_urls`]) and their
    /// source recorded.
    fn from_matches(matches: &ArgMatches) -> Result<Cli, clap::Error> {
        let mut cli = Cli::from_arg_matches(matches)?;
        cli.url = split_urls(&cli.url);
        cli.url_source = matches.value_source("url");
        Ok(cli)
    }

    /// Whether `--url` is the default, which nobody chose and may be someone else's server.
    fn url_defaulted(&self) -> bool {
        !matches!(
            self.url_source,
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    }

    /// Two topology options at once, which clap's `conflicts_with` misses when one is given
    /// before the subcommand and the other after it (global options are checked per command).
    fn topology_conflict(&self) -> Option<String> {
        let given: Vec<&str> = [
            (self.cluster, "--cluster"),
            (self.redlock, "--redlock"),
            (self.sentinel.is_some(), "--sentinel <SERVICE>"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect();
        match given.as_slice() {
            [first, second, ..] => Some(format!(
                "the argument '{first}' cannot be used with '{second}'"
            )),
            _ => None,
        }
    }
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_matches(&matches).unwrap_or_else(|error| error.exit());
    if let Some(message) = cli.topology_conflict() {
        // As clap reports its own conflicts: the usage error's status and format.
        Cli::command()
            .error(ErrorKind::ArgumentConflict, message)
            .exit();
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(cli)) {
        // A reader that closed the pipe (`distlock list | head`) got what it wanted.
        Ok(()) | Err(Failure::Closed) => ExitCode::SUCCESS,
        Err(Failure::NotDone(message)) => {
            eprintln!("{message}");
            ExitCode::from(1)
        }
        Err(Failure::Error(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    if let Command::Release { force: false, .. } = cli.command {
        return Err(Failure::Error(
            "`release` breaks a lock that someone may still be using: add `--force` to do it"
                .into(),
        ));
    }
    if let Command::Doctor { json } = cli.command {
        // The TLS options are checked as for the other subcommands (a CA with a plain URL, a
        // CA with --sentinel, a file that holds no certificate); the builder itself is unused:
        // `doctor` asks each server directly, without a lock manager.
        let _unused = trust(LockManager::builder(""), &cli)?;
        return doctor::run(&cli, &server(&cli), json).await;
    }
    let manager = connect(&cli).await?;
    let (server, defaulted) = (server(&cli), cli.url_defaulted());
    match cli.command {
        Command::List { pattern, json } => list(&manager, &pattern, json, &server, defaulted).await,
        Command::Show { name, json } => show(&manager, &name, json).await,
        Command::Watch {
            pattern,
            interval,
            looks,
        } => {
            if !(interval.is_finite() && interval > 0.0 && interval <= 3600.0) {
                return Err(Failure::Error(format!(
                    "--interval {interval} is not a number of seconds between 0 and 3600; \
                     try --interval 1"
                )));
            }
            let interval = Duration::from_secs_f64(interval);
            watch::run(&manager, &pattern, interval, looks).await
        }
        Command::Order { json } => order(&manager, json, &server, defaulted).await,
        Command::Release { name, yes, .. } => release(&manager, &name, yes).await,
        Command::Doctor { .. } => unreachable!("answered before connecting"),
    }
}

/// Which server the command reads, and where that came from, e.g. `Redis at
/// redis://127.0.0.1:6379 (the default: no --url or REDIS_URL given)`; passwords hidden.
fn server(cli: &Cli) -> String {
    let urls: Vec<String> = cli.url.iter().map(|url| redact(url)).collect();
    let urls = urls.join(", ");
    let what = if cli.cluster {
        format!("Redis Cluster at {urls}")
    } else if cli.redlock {
        format!("Redlock masters {urls}")
    } else if let Some(service) = &cli.sentinel {
        format!(
            "Sentinel service `{}` of the sentinels {urls}",
            format::cell(service)
        )
    } else {
        format!("Redis at {urls}")
    };
    let source = match cli.url_source {
        Some(ValueSource::CommandLine) => "from --url",
        Some(ValueSource::EnvVariable) => "from REDIS_URL",
        // The default may be someone else's server: say so, and how to read another.
        _ => "the default: no --url or REDIS_URL given",
    };
    format!("{} ({source})", format::cell(&what))
}

/// Connects as the application's manager would, saying where (without a password) if Redis
/// cannot be reached.
async fn connect(cli: &Cli) -> Result<LockManager, Failure> {
    let builder = if cli.cluster {
        LockManager::cluster_builder(&cli.url)
    } else if cli.redlock {
        // Said here rather than by the library, whose advice names its builder methods.
        if cli.url.len() < 3 {
            return Err(Failure::Error(format!(
                "--redlock needs the URLs of at least 3 independent masters (5 is usual), and \
                 got {}; for a single server leave out --redlock",
                cli.url.len()
            )));
        }
        LockManager::redlock_builder(&cli.url)
    } else if let Some(service) = &cli.sentinel {
        LockManager::sentinel_builder(&cli.url, service.clone())
    } else {
        match cli.url.as_slice() {
            [url] => LockManager::builder(url),
            _ => {
                return Err(Failure::Error(
                    "several URLs: add `--cluster` if they are nodes of one Redis Cluster, \
                     `--redlock` if they are independent Redlock masters, or `--sentinel \
                     SERVICE` if they are sentinels; or give one URL"
                        .into(),
                ))
            }
        }
    };
    let builder = trust(builder, cli)?;
    builder
        .key_prefix(cli.prefix.clone())
        .connect()
        .await
        .map_err(|error| {
            let at: Vec<String> = cli.url.iter().map(|url| redact(url)).collect();
            let at = match &cli.sentinel {
                Some(service) => format!("service `{service}` of the sentinels {}", at.join(", ")),
                None => at.join(", "),
            };
            #[cfg(feature = "tls")]
            if let Some(message) = tls::refused_certificate(&error, &at, cli.tls_ca_cert.as_deref())
            {
                return Failure::Error(message);
            }
            Failure::Error(format!(
                "cannot use Redis at {at}: {error}\n(check --url or REDIS_URL, and that the server \
                 runs and lets this user run GET, SET, EVALSHA and SCAN)"
            ))
        })
}

/// The builder, trusting the CA of `--tls-ca-cert` when one is given. Checked before
/// connecting, so that a wrong option or file is named as such rather than surfacing as a
/// refused handshake.
fn trust(builder: LockManagerBuilder, cli: &Cli) -> Result<LockManagerBuilder, Failure> {
    let Some(path) = &cli.tls_ca_cert else {
        #[cfg(not(feature = "tls"))]
        if let Some(url) = cli.url.iter().find(|url| is_tls_url(url)) {
            return Err(Failure::Error(format!(
                "{} is a TLS URL, but this `distlock` was built without TLS: reinstall it with \
                 its default features (`cargo install --path lock-cli`)",
                redact(url)
            )));
        }
        return Ok(builder);
    };
    if let Some(url) = cli.url.iter().find(|url| !is_tls_url(url)) {
        return Err(Failure::Error(format!(
            "--tls-ca-cert (or DISTLOCK_TLS_CA_CERT) is for TLS, but {} is not a TLS URL: \
             write it as rediss://host:port to connect over TLS, or leave the CA out",
            redact(url)
        )));
    }
    #[cfg(feature = "tls")]
    {
        let pem = tls::read_ca(path).map_err(Failure::Error)?;
        Ok(builder.tls_root_certificate(pem))
    }
    #[cfg(not(feature = "tls"))]
    Err(Failure::Error(format!(
        "--tls-ca-cert {}: this `distlock` was built without TLS: reinstall it with its default \
         features (`cargo install --path lock-cli`)",
        path.display()
    )))
}

fn is_tls_url(url: &str) -> bool {
    url.get(..9)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"))
}

/// The URLs given, each value cut at every comma that the next URL's scheme follows
/// (`redis://a:6379,redis://b:6379`). A password may hold a comma (URLs allow it unencoded):
/// a URL cut there would not connect, and its first part, with no `@` to tell that it has a
/// password, would be printed whole in the error.
fn split_urls(values: &[String]) -> Vec<String> {
    let mut urls = Vec::with_capacity(values.len());
    for value in values {
        let mut start = 0;
        for (comma, _) in value.match_indices(',') {
            if comma >= start && starts_with_scheme(&value[comma + 1..]) {
                urls.push(value[start..comma].to_owned());
                start = comma + 1;
            }
        }
        urls.push(value[start..].to_owned());
    }
    urls
}

/// Whether `text` starts with a URL scheme and `://` (a letter, then letters, digits, `+`,
/// `-` or `.`).
fn starts_with_scheme(text: &str) -> bool {
    let Some((scheme, _)) = text.split_once("://") else {
        return false;
    };
    scheme.starts_with(|first: char| first.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// The URL as distlock's own errors show it: every password hidden.
fn redact(url: &str) -> String {
    distlock::redact_url(url)
}

async fn collect(manager: &LockManager, pattern: &str) -> Result<Vec<LockInfo>, Failure> {
    let mut locks = Vec::new();
    let mut found = pin!(manager.list(pattern));
    while let Some(info) = found.next().await {
        locks.push(info?);
    }
    locks.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(locks)
}

/// `list`: the table under a first line naming the server read (for `--json`, only the array,
/// and that line on standard error when the server is the default one nobody chose).
async fn list(
    manager: &LockManager,
    pattern: &str,
    json: bool,
    server: &str,
    defaulted: bool,
) -> Result<(), Failure> {
    let locks = collect(manager, pattern).await?;
    let mut out = std::io::stdout().lock();
    let text = if json {
        if defaulted {
            keep_going(write_out(
                &mut std::io::stderr().lock(),
                &format!("{server}\n"),
            ))?;
        }
        let all: Vec<_> = locks.iter().map(format::json).collect();
        format!("{}\n", serde_json::Value::Array(all))
    } else if locks.is_empty() {
        format!("{server}\nno held lock matches {pattern:?}\n")
    } else {
        format!("{server}\n{}", format::table(&locks))
    };
    write_out(&mut out, &text)
}

/// `order`: the inversions, then every order, under a first line naming the server read (for
/// `--json`, only the object, and that line on standard error when the server is the default).
async fn order(
    manager: &LockManager,
    json: bool,
    server: &str,
    defaulted: bool,
) -> Result<(), Failure> {
    let orders = manager.orders().await?;
    let text = if json {
        if defaulted {
            keep_going(write_out(
                &mut std::io::stderr().lock(),
                &format!("{server}\n"),
            ))?;
        }
        format!("{}\n", format::orders_json(&orders))
    } else if orders.is_empty() {
        format!(
            "{server}\nno lock order recorded under the prefix {:?}: an order is recorded the first \
             time a task holding a lock of one `#[distributed_lock]` key template waits for one of \
             another\n",
            manager.key_prefix()
        )
    } else {
        format!("{server}\n{}", format::orders(&orders))
    };
    write_out(&mut std::io::stdout().lock(), &text)
}

async fn show(manager: &LockManager, name: &str, json: bool) -> Result<(), Failure> {
    let info = manager.inspect(name).await?;
    let mut out = std::io::stdout().lock();
    match (info, json) {
        (Some(info), true) => write_out(&mut out, &format!("{}\n", format::json(&info))),
        (Some(info), false) => write_out(&mut out, &format::detail(&info)),
        (None, true) => {
            // Not held is status 1 whether or not the reader took the `null`.
            keep_going(write_out(&mut out, "null\n"))?;
            Err(Failure::NotDone(format!(
                "{} is not held",
                format::cell(&format!("{}{name}", manager.key_prefix()))
            )))
        }
        (None, false) => Err(Failure::NotDone(format!(
            "{} is not held",
            format::cell(&format!("{}{name}", manager.key_prefix()))
        ))),
    }
}

async fn release(manager: &LockManager, name: &str, yes: bool) -> Result<(), Failure> {
    let Some(info) = manager.inspect(name).await? else {
        return Err(Failure::NotDone(format!(
            "{} is not held; nothing to release",
            format::cell(&format!("{}{name}", manager.key_prefix()))
        )));
    };
    let whose = format::whose(&info);
    let mut out = std::io::stdout().lock();
    // Whether the lock is broken must not depend on whether standard output is still read:
    // the exit status says what was done.
    keep_going(write_out(
        &mut out,
        &format!("{} is held by {whose}\n", format::cell(&info.key)),
    ))?;
    if !yes {
        // The question goes to standard error, so that standard output holds only the facts.
        keep_going(write_out(&mut std::io::stderr().lock(), "Break it? [y/N] "))?;
        let mut answer = String::new();
        let read = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            let hint = if read.map_or(true, |n| n == 0) && !std::io::stdin().is_terminal() {
                " (no answer on standard input: pass --yes to confirm without a terminal)"
            } else {
                ""
            };
            return Err(Failure::NotDone(format!(
                "left {} as it is{hint}",
                format::cell(&info.key)
            )));
        }
    }
    if manager.force_release(&info).await? {
        keep_going(write_out(
            &mut out,
            &format!(
                "released {} (it was held by {whose})\n",
                format::cell(&info.key)
            ),
        ))
    } else {
        Err(Failure::NotDone(format!(
            "{} changed hands since it was read, so nothing was released; run the command again",
            format::cell(&info.key)
        )))
    }
}

fn write_out(out: &mut impl Write, text: &str) -> Result<(), Failure> {
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|error| {
            if error.kind() == std::io::ErrorKind::BrokenPipe {
                Failure::Closed
            } else {
                Failure::Error(format!("cannot write to standard output: {error}"))
            }
        })
}

/// A write whose reader went away is no reason to stop what the command does next.
fn keep_going(written: Result<(), Failure>) -> Result<(), Failure> {
    match written {
        Err(Failure::Closed) => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> Cli {
        let matches = Cli::command().try_get_matches_from(args).unwrap();
        Cli::from_matches(&matches).unwrap()
    }

    /// A comma separates URLs only where the next one starts with its scheme: a comma in a
    /// password (or anywhere else in a URL) keeps the URL whole.
    #[test]
    fn urls_are_separated_where_the_next_one_starts() {
        let split = |values: &[&str]| {
            split_urls(
                &values
                    .iter()
                    .map(|&value| value.to_owned())
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(
            split(&["redis://a:1,redis://b:2,rediss://c:3", "redis+unix:///s"]),
            [
                "redis://a:1",
                "redis://b:2",
                "rediss://c:3",
                "redis+unix:///s"
            ]
        );
        assert_eq!(
            split(&["redis://u:s3,cret@a:1,redis://u:p,w@b:2"]),
            ["redis://u:s3,cret@a:1", "redis://u:p,w@b:2"]
        );
        assert_eq!(split(&["redis://:a,b,c@h:1"]), ["redis://:a,b,c@h:1"]);
    }

    /// The server nobody chose is named as such, with how to read another.
    #[test]
    fn the_default_server_is_named_as_the_default() {
        // Read by clap at parse time: a REDIS_URL of the environment would be a chosen server.
        std::env::remove_var("REDIS_URL");
        let cli = parsed(&["distlock", "list"]);
        assert!(cli.url_defaulted());
        assert_eq!(
            server(&cli),
            "Redis at redis://127.0.0.1:6379 (the default: no --url or REDIS_URL given)"
        );
        let cli = parsed(&["distlock", "--url", "redis://u:pw@10.0.0.1:6380", "list"]);
        assert!(!cli.url_defaulted());
        assert_eq!(
            server(&cli),
            "Redis at redis://u:***@10.0.0.1:6380 (from --url)"
        );
        let cli = parsed(&[
            "distlock",
            "--cluster",
            "--url",
            "redis://a:7000,redis://b:7000",
            "list",
        ]);
        assert_eq!(
            server(&cli),
            "Redis Cluster at redis://a:7000, redis://b:7000 (from --url)"
        );
    }
}
