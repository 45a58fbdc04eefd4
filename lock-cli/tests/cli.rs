//! The `distlock` command run as a user runs it — the built binary against real servers — with
//! its output checked: list (table and JSON), show, watch (plain lines when not a terminal),
//! release --force, a server that cannot be reached and one that refuses a command, a server
//! that requires TLS, and every topology: a cluster, a Redlock set, a Sentinel service; and
//! `doctor`'s checks of each.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use distlock::{LockError, LockManager, LockOptions};
use test_support::sentinel::SERVICE;
use test_support::{free_port, RedisCluster, RedisServer, RedisServers, SentinelSet};

fn distlock(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_distlock"))
        .env_remove("REDIS_URL")
        .env_remove("DISTLOCK_TLS_CA_CERT")
        .arg("--url")
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the distlock binary runs")
}

/// Runs it with `args` only (the URLs among them), expecting `status`; returns stdout and
/// stderr.
fn expect_args(args: &[&str], status: i32) -> (String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .env_remove("REDIS_URL")
        .env_remove("DISTLOCK_TLS_CA_CERT")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the distlock binary runs");
    let (out, err) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(
        output.status.code(),
        Some(status),
        "distlock {args:?}\nstdout:\n{out}\nstderr:\n{err}"
    );
    (out, err)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs it, expecting `status`; returns stdout and stderr.
fn expect(url: &str, args: &[&str], status: i32) -> (String, String) {
    let output = distlock(url, args);
    let (out, err) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(
        output.status.code(),
        Some(status),
        "distlock {args:?}\nstdout:\n{out}\nstderr:\n{err}"
    );
    (out, err)
}

fn labelled(label: &str) -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(60)).label(label)
}

/// A server holding three locks: `report:7` (labelled, fenced), `trace:abc` (labelled) and
/// `by-hand`, written by hand; the guards are released when it is dropped.
struct ThreeLocks {
    server: RedisServer,
    url: String,
    _guards: [distlock::LockGuard; 2],
}

async fn three_locks() -> ThreeLocks {
    let server = RedisServer::start();
    let url = server.url();
    let manager = LockManager::connect(&url).await.unwrap();
    let report = manager
        .acquire(
            "report:7",
            &labelled("jobs::report report:{day}").fencing(true),
        )
        .await
        .unwrap();
    let trace = manager
        .acquire("trace:abc", &labelled("traces"))
        .await
        .unwrap();
    server.set_px("lock:by-hand", "hand-written", 30_000);
    ThreeLocks {
        server,
        url,
        _guards: [report, trace],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_names_the_server_then_tells_who_holds_each_lock() {
    let locks = three_locks().await;
    let url = &locks.url;
    let (out, _) = expect(url, &["list"], 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    // First, which server was read.
    assert_eq!(lines[0], format!("Redis at {url} (from --url)"), "{out}");
    for title in ["NAME", "HOLDER", "HELD FOR", "TTL LEFT", "WAITERS", "FENCE"] {
        assert!(lines[1].contains(title), "{out}");
    }
    let pid = format!("pid {}", std::process::id());
    assert!(lines[2].starts_with("by-hand ") && lines[2].contains("not written by distlock"));
    assert!(lines[3].starts_with("report:7 ") && lines[3].contains("jobs::report report:{day}"));
    assert!(
        lines[3].contains(&pid) && lines[3].trim_end().ends_with(" 1"),
        "{out}"
    );
    assert!(
        lines[4].starts_with("trace:abc ") && lines[4].contains("traces"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_json_gives_the_fields_of_the_locks_a_pattern_matches() {
    let locks = three_locks().await;
    let (out, _) = expect(&locks.url, &["list", "trace:*", "--json"], 0);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let locks = json.as_array().unwrap();
    assert_eq!(locks.len(), 1, "{out}");
    assert_eq!(locks[0]["name"], "trace:abc");
    assert_eq!(locks[0]["key"], "lock:trace:abc");
    assert_eq!(locks[0]["holder"]["label"], "traces");
    assert_eq!(locks[0]["holder"]["pid"], std::process::id());
    assert_eq!(locks[0]["waiters"], 0);
    let left = locks[0]["ttl_left_ms"].as_u64().unwrap();
    assert!(left > 30_000 && left <= 60_000, "{left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_tells_the_label_pid_fence_and_date_a_lock_was_taken() {
    let locks = three_locks().await;
    let (out, _) = expect(&locks.url, &["show", "report:7"], 0);
    assert!(
        out.contains("label:     jobs::report report:{day}"),
        "{out}"
    );
    assert!(
        out.contains(&format!("pid:       {}", std::process::id())),
        "{out}"
    );
    assert!(out.contains("fence:     1"), "{out}");
    // A date, not only a time of day: at 3 a.m. a lock may have been held since yesterday.
    let today = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    assert!(
        out.contains(&format!("since:     {}", &today[..11])),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_of_a_free_lock_says_it_is_not_held_and_exits_1() {
    let locks = three_locks().await;
    let (_, err) = expect(&locks.url, &["show", "report:8"], 1);
    assert!(err.contains("lock:report:8 is not held"), "{err}");
    let (out, _) = expect(&locks.url, &["show", "report:8", "--json"], 1);
    assert_eq!(out.trim(), "null");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_says_when_no_lock_matches_a_pattern_or_a_prefix() {
    let locks = three_locks().await;
    let (out, _) = expect(&locks.url, &["list", "none:*"], 0);
    assert!(out.contains("no held lock matches"), "{out}");
    let (out, _) = expect(&locks.url, &["--prefix", "other:", "list", "--json"], 0);
    assert_eq!(out.trim(), "[]");
    assert!(locks.server.exists("lock:by-hand"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_force_breaks_the_lock_and_says_whose_it_was() {
    let server = RedisServer::start();
    let url = server.url();
    let manager = LockManager::connect(&url).await.unwrap();
    let stuck = manager
        .acquire("stuck", &labelled("jobs::stuck"))
        .await
        .unwrap();

    let (_, err) = expect(&url, &["release", "stuck"], 2);
    assert!(err.contains("add `--force`"), "{err}");
    // Without --yes and without an answer, nothing is broken.
    let (out, err) = expect(&url, &["release", "stuck", "--force"], 1);
    assert!(out.contains("lock:stuck is held by jobs::stuck"), "{out}");
    assert!(err.contains("pass --yes"), "{err}");
    assert!(server.exists("lock:stuck"));
    // Answered "n" at the prompt: still nothing.
    let mut child = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(["--url", &url, "release", "stuck", "--force"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"n\n").unwrap();
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(1));
    assert!(server.exists("lock:stuck"));

    let (out, _) = expect(&url, &["release", "stuck", "--force", "--yes"], 0);
    let whose = format!("jobs::stuck (pid {} on ", std::process::id());
    assert!(
        out.contains(&format!("released lock:stuck (it was held by {whose}")),
        "{out}"
    );
    assert!(!server.exists("lock:stuck"));
    assert!(matches!(stuck.release().await, Err(LockError::Lost { .. })));
    let (_, err) = expect(&url, &["release", "stuck", "--force", "--yes"], 1);
    assert!(err.contains("not held"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_hands_the_lock_to_the_next_waiter() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = LockManager::connect(&url).await.unwrap();
    let waiter = LockManager::connect(&url).await.unwrap();
    let stuck = holder.acquire("handed", &labelled("first")).await.unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .acquire(
                "handed",
                &labelled("second").timeout(Duration::from_secs(30)),
            )
            .await
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while holder.inspect("handed").await.unwrap().unwrap().waiters == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter never lined up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let url2 = url.clone();
    let (out, _) = tokio::task::spawn_blocking(move || {
        expect(&url2, &["release", "handed", "--force", "--yes"], 0)
    })
    .await
    .unwrap();
    assert!(out.contains("it was held by first"), "{out}");
    let next = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter got the lock")
        .unwrap()
        .unwrap();
    assert_eq!(
        holder
            .inspect("handed")
            .await
            .unwrap()
            .unwrap()
            .holder
            .unwrap()
            .label,
        "second"
    );
    assert!(matches!(stuck.release().await, Err(LockError::Lost { .. })));
    next.release().await.unwrap();
}

#[test]
fn an_unreachable_server_is_a_clear_error_without_the_password() {
    let url = format!("redis://app:s3cret@127.0.0.1:{}", free_port());
    for args in [
        &["list"][..],
        &["show", "x"],
        &["release", "x", "--force", "--yes"],
    ] {
        let started = std::time::Instant::now();
        let (out, err) = expect(&url, args, 2);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{args:?} took {:?}",
            started.elapsed()
        );
        assert!(out.is_empty(), "{out}");
        assert!(
            err.starts_with("error: cannot use Redis at redis://app:***@127.0.0.1:"),
            "{err}"
        );
        assert!(err.contains("check --url or REDIS_URL"), "{err}");
        assert!(!err.contains("s3cret"), "the password was printed: {err}");
    }
    // REDIS_URL is read too, and its value is not shown in the help.
    let output = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .env("REDIS_URL", &url)
        .arg("list")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("app:***@"));
    let help = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .env("REDIS_URL", &url)
        .arg("--help")
        .output()
        .unwrap();
    assert!(!text(&help.stdout).contains("s3cret"));
}

/// `list` says first which server it read and where that came from (the default may be
/// someone else's server), password hidden; `--json` keeps standard output to the array.
#[test]
fn list_names_the_server_it_read_without_the_password() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let port = server.port();
    let url = format!("redis://default:s3cret@127.0.0.1:{port}");
    let server_line = |out: &str| out.lines().next().unwrap_or_default().to_owned();

    let (out, err) = expect(&url, &["list"], 0);
    assert_eq!(
        server_line(&out),
        format!("Redis at redis://default:***@127.0.0.1:{port} (from --url)"),
        "{out}"
    );
    assert!(out.contains("no held lock matches"), "{out}");
    assert!(
        !out.contains("s3cret") && !err.contains("s3cret"),
        "{out}{err}"
    );

    let from_env = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_distlock"))
            .env("REDIS_URL", &url)
            .env_remove("DISTLOCK_TLS_CA_CERT")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        (text(&output.stdout), text(&output.stderr))
    };
    let (out, err) = from_env(&["list"]);
    assert_eq!(
        server_line(&out),
        format!("Redis at redis://default:***@127.0.0.1:{port} (from REDIS_URL)"),
        "{out}"
    );
    assert!(
        !out.contains("s3cret") && !err.contains("s3cret"),
        "{out}{err}"
    );
    let (out, err) = from_env(&["list", "--json"]);
    assert_eq!(out.trim(), "[]");
    assert!(
        err.is_empty(),
        "a server that was chosen needs no note: {err}"
    );
}

/// A comma is a character a password may hold (URLs allow it unencoded): `--url` and
/// `REDIS_URL` separate URLs at a comma only where the next URL starts, so a URL with such a
/// password is one URL, it connects, and no part of the password is ever printed — also when
/// several such URLs are given, separated by commas.
#[test]
fn a_password_with_a_comma_is_one_url_and_never_printed() {
    let server = RedisServer::start_with(&["--requirepass", "s3,cret"]);
    let port = server.port();
    let url = format!("redis://default:s3,cret@127.0.0.1:{port}");
    let (out, err) = expect(&url, &["list"], 0);
    assert_eq!(
        out.lines().next().unwrap_or_default(),
        format!("Redis at redis://default:***@127.0.0.1:{port} (from --url)"),
        "{out}"
    );
    assert!(!out.contains("s3") && !err.contains("s3"), "{out}{err}");

    let urls: Vec<String> = (0..3)
        .map(|_| format!("redis://app:s3,cret@127.0.0.1:{}", free_port()))
        .collect();
    let urls = urls.join(",");
    let (out, err) = expect_args(&["--url", &urls, "--redlock", "list"], 2);
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("redis://app:***@127.0.0.1:"), "{err}");
    assert!(
        !err.contains("s3") && !err.contains("cret"),
        "the password was printed: {err}"
    );
}

/// A misspelled option gets clap's "did you mean", not only its "to pass it as a value" tip.
#[test]
fn a_misspelled_option_gets_a_suggestion() {
    for args in [&["--prefx", "x", "list"][..], &["list", "--jsn"]] {
        let (_, err) = expect_args(args, 2);
        assert!(err.contains("a similar argument exists"), "{args:?}: {err}");
        assert!(
            err.contains("'--prefix'") || err.contains("'--json'"),
            "{err}"
        );
    }
}

/// A password the URL parser does not take as one (a raw `/` in it, or given as a query
/// parameter) is a password all the same: the error says where, never what it is.
#[test]
fn passwords_the_url_parser_misreads_are_never_printed() {
    let port = free_port();
    for url in [
        format!("redis://app:s3/cret@127.0.0.1:{port}"),
        format!("redis://app:s3?cret@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}/?password=s3cret"),
        format!("redis://127.0.0.1:{port}/0?user=app&password=s3cret"),
    ] {
        let (out, err) = expect(&url, &["list", "--json"], 2);
        assert!(out.is_empty(), "{out}");
        assert!(err.contains("cannot use Redis at"), "{err}");
        assert!(
            !err.contains("s3") && !err.contains("cret"),
            "{url}: the password was printed: {err}"
        );
    }
}

/// `distlock list | head -1`: a reader that stops reading is the user's choice, not a failure
/// to report. The pipe is closed before the command writes, so every write finds it closed.
#[test]
fn a_closed_pipe_on_standard_output_is_no_error() {
    let server = RedisServer::start();
    let url = format!("redis://127.0.0.1:{}", server.port());
    // A lock written by hand under the default prefix, so that every command has a line to
    // print.
    let () = redis::cmd("SET")
        .arg("lock:hand-written")
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    for args in [
        &["list"][..],
        &["list", "--json"],
        &["show", "hand-written"],
        &["release", "hand-written", "--force", "--yes"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = Command::new(env!("CARGO_BIN_EXE_distlock"))
            .env_remove("REDIS_URL")
            .arg("--url")
            .arg(&url)
            .args(args)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = text(&output.stderr);
        assert!(err.is_empty(), "{args:?} printed: {err}");
        assert_eq!(output.status.code(), Some(0), "{args:?}: {err}");
    }
    // The release was done although nobody read that it was.
    let left: Option<String> = redis::cmd("GET")
        .arg("lock:hand-written")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(left, None);
}

#[test]
fn a_server_that_refuses_scan_is_a_clear_error() {
    let server = RedisServer::start();
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "ops", "on", ">pw", "~*", "&*", "+@all", "-scan"][..])
        .query(&mut server.conn())
        .unwrap();
    let url = format!("redis://ops:pw@127.0.0.1:{}", server.port());
    let (_, err) = expect(&url, &["list"], 2);
    assert!(err.to_lowercase().contains("scan"), "{err}");
    assert!(
        err.contains("NOPERM") || err.contains("permission"),
        "{err}"
    );
    assert!(!err.contains(">pw") && !err.contains(":pw@"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_one_line_per_change_when_not_a_terminal() {
    let server = RedisServer::start();
    let url = server.url();
    let manager = LockManager::connect(&url).await.unwrap();
    let first = manager.acquire("w:1", &labelled("first")).await.unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args([
            "--url",
            &url,
            "watch",
            "w:*",
            "--interval",
            "0.1",
            "--looks",
            "600",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (sender, lines) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if sender.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    let next_line = |what: &str| {
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no line for {what}"));
        assert!(line.contains(what), "{line:?} is not {what:?}");
        line
    };
    let line = next_line("held        lock:w:1 by first (pid");
    assert!(line.contains(" UTC  held "), "a time stamp first: {line}");
    let second = manager.acquire("w:2", &labelled("second")).await.unwrap();
    next_line("acquired    lock:w:2 by second");
    first.release().await.unwrap();
    next_line("released    lock:w:1 (held by first");
    server.set_px("lock:w:3", "by-hand", 1_500);
    next_line("acquired    lock:w:3 by an unknown holder");
    next_line("expired     lock:w:3");
    second.release().await.unwrap();
    next_line("released    lock:w:2");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_on_a_cluster_shows_the_locks_of_every_master() {
    let cluster = RedisCluster::start(3, 0);
    let manager = LockManager::cluster_builder(&cluster.urls())
        .connect()
        .await
        .unwrap();
    let mut guards = Vec::new();
    let mut masters = std::collections::BTreeSet::new();
    for i in 0..12 {
        let name = format!("c:{i}");
        masters.insert(cluster.node_for_key(&format!("lock:{name}")).port());
        guards.push(
            manager
                .acquire(&name, &labelled("cluster job"))
                .await
                .unwrap(),
        );
    }
    assert_eq!(masters.len(), 3);
    let seeds = cluster.urls().join(",");
    let (out, _) = tokio::task::spawn_blocking(move || {
        expect(&seeds, &["--cluster", "list", "c:*", "--json"], 0)
    })
    .await
    .unwrap();
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut names: Vec<String> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|lock| lock["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    let mut expected: Vec<String> = (0..12).map(|i| format!("c:{i}")).collect();
    expected.sort();
    assert_eq!(names, expected);
    for guard in guards {
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_and_labels_cannot_drive_the_terminal() {
    let server = RedisServer::start();
    let url = server.url();
    let manager = LockManager::connect(&url).await.unwrap();
    let name = "evil\u{1b}[2J{x}";
    let guard = manager
        .acquire(name, &labelled("label\u{1b}]0;pwned\u{7}\nsecond line"))
        .await
        .unwrap();
    // Bidirectional overrides and isolates would reorder what the terminal shows of a row.
    let reversed = "bidi\u{202E}txt.exe\u{202C}\u{2066}x\u{2069}\u{200F}\u{061C}";
    let reversed_guard = manager
        .acquire(reversed, &labelled("label\u{2067}rtl\u{2069}\u{202B}"))
        .await
        .unwrap();
    let url2 = url.clone();
    let outputs = tokio::task::spawn_blocking(move || {
        [
            expect(&url2, &["list"], 0),
            expect(&url2, &["show", name], 0),
            expect(&url2, &["release", name, "--force", "--yes"], 0),
        ]
    })
    .await
    .unwrap();
    let bidi = [
        '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}',
        '\u{2068}', '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}',
    ];
    for (out, err) in &outputs {
        for text in [out, err] {
            assert!(
                !text.contains('\u{1b}') && !text.contains('\u{7}'),
                "{text:?}"
            );
            assert!(
                !text.contains(bidi),
                "a bidirectional control printed raw: {text:?}"
            );
        }
    }
    let (list, _) = &outputs[0];
    assert_eq!(
        list.lines().count(),
        4,
        "the server, the header, one line per lock: {list}"
    );
    assert!(list.contains("evil\\u{1b}[2J{x}"), "{list}");
    assert!(
        list.contains("label\\u{1b}]0;pwned\\u{7}\\nsecond line"),
        "{list}"
    );
    assert!(
        list.contains("bidi\\u{202e}txt.exe\\u{202c}\\u{2066}x\\u{2069}\\u{200f}\\u{61c}"),
        "{list}"
    );
    assert!(
        list.contains("label\\u{2067}rtl\\u{2069}\\u{202b}"),
        "{list}"
    );
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    reversed_guard.release().await.unwrap();
}

/// A CA is for TLS: with a plain-text URL it says to write rediss://, password hidden.
#[test]
fn a_ca_with_a_plain_text_url_says_to_write_rediss() {
    let plain = format!("redis://app:s3cret@127.0.0.1:{}/", free_port());
    let (_, err) = expect(&plain, &["--tls-ca-cert", "/no/such/ca.pem", "list"], 2);
    assert!(err.contains("rediss://"), "{err}");
    assert!(err.contains("redis://app:***@127.0.0.1:"), "{err}");
    assert!(!err.contains("s3cret"), "the password was printed: {err}");
}

#[test]
fn help_documents_the_tls_options() {
    let help = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .arg("--help")
        .output()
        .unwrap();
    let help = text(&help.stdout);
    assert!(help.contains("rediss://"), "{help}");
    assert!(help.contains("--tls-ca-cert <PATH>"), "{help}");
    assert!(help.contains("DISTLOCK_TLS_CA_CERT"), "{help}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_lists_shows_and_releases_a_lock_held_on_a_majority() {
    let servers = RedisServers::start(5);
    let manager = LockManager::redlock_builder(&servers.urls())
        .connect()
        .await
        .unwrap();
    let guard = manager
        .acquire("r:job", &labelled("redlock job"))
        .await
        .unwrap();
    assert_eq!(servers.holders("lock:r:job").len(), 5);
    let urls = servers.urls();
    let pid = std::process::id();

    let outputs = tokio::task::spawn_blocking(move || {
        // The masters as a comma-separated list, and as a repeated option.
        let joined = urls.join(",");
        let mut repeated: Vec<&str> = urls.iter().flat_map(|url| ["--url", url]).collect();
        repeated.extend(["--redlock", "show", "r:job"]);
        [
            expect_args(&["--redlock", "--url", &joined, "list"], 0),
            expect_args(&["list", "--json", "--redlock", "--url", &joined], 0),
            expect_args(&repeated, 0),
        ]
    })
    .await
    .unwrap();
    let [(table, _), (json, _), (detail, _)] = &outputs;
    // Held on all five masters, listed once.
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[0].starts_with("Redlock masters redis://") && lines[0].ends_with("(from --url)"),
        "{table}"
    );
    assert!(
        lines[2].starts_with("r:job ")
            && lines[2].contains("redlock job")
            && lines[2].contains(&format!("pid {pid}")),
        "{table}"
    );
    let json: serde_json::Value = serde_json::from_str(json).unwrap();
    let locks = json.as_array().unwrap();
    assert_eq!(locks.len(), 1, "{json}");
    assert_eq!(locks[0]["key"], "lock:r:job");
    assert_eq!(locks[0]["holder"]["label"], "redlock job");
    assert_eq!(locks[0]["holder"]["pid"], pid);
    assert!(detail.contains("label:     redlock job"), "{detail}");
    assert!(detail.contains(&format!("pid:       {pid}")), "{detail}");

    let joined = servers.urls().join(",");
    let (out, _) = tokio::task::spawn_blocking(move || {
        expect_args(
            &[
                "--redlock",
                "--url",
                &joined,
                "release",
                "r:job",
                "--force",
                "--yes",
            ],
            0,
        )
    })
    .await
    .unwrap();
    assert!(
        out.contains(&format!(
            "released lock:r:job (it was held by redlock job (pid {pid} on "
        )),
        "{out}"
    );
    // Gone from a majority of the masters: no longer held as Redlock counts it.
    assert!(servers.holders("lock:r:job").len() < 3);
    assert!(manager.inspect("r:job").await.unwrap().is_none());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_lists_and_shows_a_lock_on_the_services_master() {
    let set = SentinelSet::start();
    let manager = LockManager::sentinel_builder(&set.sentinel_urls(), SERVICE)
        .connect()
        .await
        .unwrap();
    let guard = manager
        .acquire("s:job", &labelled("sentinel job"))
        .await
        .unwrap();
    let joined = set.sentinel_urls().join(",");
    let pid = std::process::id();

    let outputs = tokio::task::spawn_blocking(move || {
        [
            expect_args(&["--sentinel", SERVICE, "--url", &joined, "list"], 0),
            expect_args(
                &["--url", &joined, "show", "s:job", "--sentinel", SERVICE],
                0,
            ),
            expect_args(
                &["--url", &joined, "--sentinel", "no-such-service", "list"],
                2,
            ),
        ]
    })
    .await
    .unwrap();
    let [(table, _), (detail, _), (_, wrong_service)] = &outputs;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[0].starts_with(&format!(
            "Sentinel service `{SERVICE}` of the sentinels redis://"
        )),
        "{table}"
    );
    assert!(
        lines[2].starts_with("s:job ")
            && lines[2].contains("sentinel job")
            && lines[2].contains(&format!("pid {pid}")),
        "{table}"
    );
    assert!(detail.contains("label:     sentinel job"), "{detail}");
    assert!(detail.contains(&format!("pid:       {pid}")), "{detail}");
    assert!(
        wrong_service.starts_with("error: cannot use Redis at service `no-such-service` of the sentinels redis://127.0.0.1:"),
        "{wrong_service}"
    );
    assert!(
        wrong_service.contains("check the service name"),
        "{wrong_service}"
    );
    guard.release().await.unwrap();
}

#[test]
fn topology_options_that_conflict_are_usage_errors() {
    let urls = "redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3";
    // Before the subcommand, after it, and one on each side.
    for args in [
        &["--cluster", "--redlock", "list"][..],
        &["list", "--cluster", "--sentinel", "s"],
        &["--redlock", "show", "x", "--sentinel", "s"],
        &["--sentinel", "s", "release", "x", "--force", "--cluster"],
    ] {
        let mut all = vec!["--url", urls];
        all.extend(args);
        let (out, err) = expect_args(&all, 2);
        assert!(out.is_empty(), "{out}");
        assert!(
            err.starts_with("error: the argument '--") && err.contains("cannot be used with"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn several_urls_without_a_topology_name_the_options() {
    let (_, err) = expect_args(
        &[
            "--url",
            "redis://127.0.0.1:1",
            "--url",
            "redis://127.0.0.1:2",
            "list",
        ],
        2,
    );
    for option in ["--cluster", "--redlock", "--sentinel SERVICE"] {
        assert!(err.contains(option), "{err}");
    }
    let (_, err) = expect_args(
        &[
            "--redlock",
            "--url",
            "redis://127.0.0.1:1,redis://127.0.0.1:2",
            "list",
        ],
        2,
    );
    assert!(
        err.contains("--redlock needs the URLs of at least 3"),
        "{err}"
    );
    assert!(!err.contains("LockManager"), "library advice: {err}");
    // A Sentinel service takes the CA too (for TLS sentinels and their master): the file is
    // read, not refused for the topology.
    let (_, err) = expect_args(
        &[
            "--sentinel",
            "locks",
            "--url",
            "rediss://127.0.0.1:1",
            "--tls-ca-cert",
            "/no/such/ca.pem",
            "list",
        ],
        2,
    );
    assert!(
        err.contains("--tls-ca-cert") && err.contains("/no/such/ca.pem"),
        "{err}"
    );
    assert!(!err.contains("cannot be used with --sentinel"), "{err}");
}

#[test]
fn unreachable_redlock_masters_and_sentinels_are_clear_errors_without_passwords() {
    let urls: Vec<String> = (0..3)
        .map(|_| format!("redis://app:s3cret@127.0.0.1:{}", free_port()))
        .collect();
    let urls = urls.join(",");
    for topology in [&["--redlock"][..], &["--sentinel", "locks"]] {
        let mut args = vec!["--url", urls.as_str()];
        args.extend(topology);
        args.push("list");
        let started = std::time::Instant::now();
        let (out, err) = expect_args(&args, 2);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{topology:?} took {:?}",
            started.elapsed()
        );
        assert!(out.is_empty(), "{out}");
        assert!(err.starts_with("error: cannot use Redis at "), "{err}");
        assert!(err.contains("redis://app:***@127.0.0.1:"), "{err}");
        assert!(!err.contains("s3cret"), "the password was printed: {err}");
    }
}

#[test]
fn help_documents_the_topologies() {
    let help = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .arg("--help")
        .output()
        .unwrap();
    let help = text(&help.stdout);
    for option in ["--cluster", "--redlock", "--sentinel <SERVICE>"] {
        assert!(help.contains(option), "{help}");
    }
}

#[cfg(feature = "tls")]
mod tls {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use distlock::LockManager;
    use test_support::sentinel::SERVICE;
    use test_support::{
        free_port, skip_without, unique_temp_dir, Feature, RedisServer, SentinelSet, TlsFiles,
    };

    use super::{expect, expect_args, labelled, text};

    /// A `--tls-ca-cert` file holding `pem`, in a folder of its own removed on drop.
    struct CaFile {
        dir: std::path::PathBuf,
        path: String,
    }

    impl CaFile {
        fn new(name: &str, pem: &[u8]) -> CaFile {
            let dir = unique_temp_dir(name);
            let path = dir.join("ca.pem");
            std::fs::write(&path, pem).unwrap();
            let path = path.to_str().unwrap().to_owned();
            CaFile { dir, path }
        }
    }

    impl Drop for CaFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A wrong `--tls-ca-cert` file is refused before connecting: no TLS server needed.
    #[test]
    fn a_ca_file_that_is_missing_or_not_pem_is_a_clear_error() {
        let url = format!("rediss://app:s3cret@127.0.0.1:{}/", free_port());
        let dir = unique_temp_dir("cli-ca");
        let missing = dir.join("no-such-ca.pem");
        let missing = missing.to_str().unwrap();
        let (out, err) = expect(&url, &["--tls-ca-cert", missing, "list"], 2);
        assert!(out.is_empty(), "{out}");
        assert!(
            err.starts_with("error: cannot read the --tls-ca-cert file ") && err.contains(missing),
            "names the option and the path: {err}"
        );
        assert!(
            err.contains("PEM file of the certificate authority"),
            "{err}"
        );

        // Text that holds no certificate, a private key alone, bytes that are not text, and a
        // certificate whose base64 is broken.
        let files = [
            (
                "notes.txt",
                b"this is not a certificate\n".to_vec(),
                "holds no PEM certificate",
            ),
            (
                "key.pem",
                b"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n"
                    .to_vec(),
                "holds no PEM certificate",
            ),
            (
                "ca.der",
                vec![0x30, 0x82, 0x01, 0x0a, 0x02, 0x82],
                "looks like a DER file",
            ),
            (
                "broken.pem",
                b"-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n".to_vec(),
                "not valid PEM",
            ),
        ];
        for (name, bytes, says) in files {
            let path = dir.join(name);
            std::fs::write(&path, bytes).unwrap();
            let path = path.to_str().unwrap();
            let (out, err) = expect(&url, &["--tls-ca-cert", path, "show", "x"], 2);
            assert!(out.is_empty(), "{out}");
            assert!(err.contains(path) && err.contains(says), "{name}: {err}");
            assert!(!err.contains("panicked"), "{err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn list_and_show_over_tls_with_the_servers_ca() {
        if skip_without(Feature::Tls, "list_and_show_over_tls_with_the_servers_ca") {
            return;
        }
        let server = RedisServer::start_tls();
        let ca = server.tls_ca_file().unwrap().to_str().unwrap().to_owned();
        let manager = LockManager::builder(server.tls_url())
            .tls_root_certificate(server.ca_pem())
            .connect()
            .await
            .unwrap();
        let guard = manager
            .acquire("invoice:7", &labelled("billing::charge"))
            .await
            .unwrap();
        // An operator's user, with a password that must never be printed.
        let url = server.add_acl_user("ops", "s3cret", &["+@all"]);
        assert!(url.starts_with("rediss://ops:s3cret@"), "{url}");

        let outputs = tokio::task::spawn_blocking({
            let (url, ca) = (url.clone(), ca.clone());
            move || {
                [
                    expect(&url, &["--tls-ca-cert", &ca, "list"], 0),
                    expect(&url, &["--tls-ca-cert", &ca, "list", "--json"], 0),
                    expect(&url, &["show", "invoice:7", "--tls-ca-cert", &ca], 0),
                ]
            }
        })
        .await
        .unwrap();
        let [(table, _), (json, _), (detail, _)] = &outputs;
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[0].starts_with("Redis at rediss://"), "{table}");
        assert!(
            lines[2].starts_with("invoice:7 ") && lines[2].contains("billing::charge"),
            "{table}"
        );
        let json: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(json[0]["key"], "lock:invoice:7");
        assert_eq!(json[0]["holder"]["pid"], std::process::id());
        assert!(detail.contains("label:     billing::charge"), "{detail}");
        for (out, err) in &outputs {
            assert!(!out.contains("s3cret") && !err.contains("s3cret"));
        }

        // The CA from the environment, as a shell profile would set it.
        let output = Command::new(env!("CARGO_BIN_EXE_distlock"))
            .env("REDIS_URL", &url)
            .env("DISTLOCK_TLS_CA_CERT", &ca)
            .args(["show", "invoice:7", "--json"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(json["holder"]["label"], "billing::charge");
        guard.release().await.unwrap();
    }

    /// `--sentinel` with `rediss://` sentinels and `--tls-ca-cert`: the sentinels and the
    /// master they name are read over TLS, trusting the CA.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sentinel_over_tls_lists_a_lock_with_the_ca() {
        if skip_without(Feature::Tls, "sentinel_over_tls_lists_a_lock_with_the_ca") {
            return;
        }
        let set = SentinelSet::start_tls();
        let ca_file = CaFile::new("cli-sentinel-ca", &set.ca_pem());
        let ca = ca_file.path.clone();
        let manager = LockManager::sentinel_builder(&set.sentinel_urls(), SERVICE)
            .tls_root_certificate(set.ca_pem())
            .connect()
            .await
            .unwrap();
        let guard = manager
            .acquire("s:job", &labelled("sentinel tls job"))
            .await
            .unwrap();
        let joined = set.sentinel_urls().join(",");
        let (out, _) = tokio::task::spawn_blocking(move || {
            expect_args(
                &[
                    "--sentinel",
                    SERVICE,
                    "--url",
                    &joined,
                    "--tls-ca-cert",
                    &ca,
                    "list",
                ],
                0,
            )
        })
        .await
        .unwrap();
        assert!(
            out.lines()
                .any(|line| line.starts_with("s:job ") && line.contains("sentinel tls job")),
            "{out}"
        );
        guard.release().await.unwrap();
    }

    /// `doctor` with `rediss://` sentinels reaches the service's master and replica over TLS,
    /// as the library does: on a deployment whose data servers speak only TLS, a plain-text
    /// connection would find them unreachable.
    #[test]
    fn doctor_checks_a_tls_sentinel_services_servers_over_tls() {
        if skip_without(
            Feature::Tls,
            "doctor_checks_a_tls_sentinel_services_servers_over_tls",
        ) {
            return;
        }
        let set = SentinelSet::start_tls();
        let ca = CaFile::new("cli-doctor-sentinel-ca", &set.ca_pem());
        let joined = set.sentinel_urls().join(",");
        let (out, _) = expect_args(
            &[
                "--sentinel",
                SERVICE,
                "--url",
                &joined,
                "--tls-ca-cert",
                &ca.path,
                "doctor",
            ],
            0,
        );
        for (server, role) in [(set.master(), "master"), (set.replica(), "replica")] {
            let line = format!("127.0.0.1:{} (Sentinel {role}) eviction:", server.port());
            assert!(out.contains(&line), "{line} in\n{out}");
        }
        assert!(!out.contains("reachable"), "{out}");
    }

    /// `--tls-ca-cert` reaches every Redlock master: each test server has its own CA, so the
    /// file is a bundle of the three, as `cat ca1.pem ca2.pem ca3.pem` makes one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redlock_over_tls_with_a_bundle_of_the_masters_cas() {
        if skip_without(
            Feature::Tls,
            "redlock_over_tls_with_a_bundle_of_the_masters_cas",
        ) {
            return;
        }
        let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_tls()).collect();
        let bundle: Vec<u8> = servers.iter().flat_map(RedisServer::ca_pem).collect();
        let ca_file = CaFile::new("cli-redlock-ca", &bundle);
        let urls: Vec<String> = servers.iter().map(RedisServer::tls_url).collect();
        let manager = LockManager::redlock_builder(&urls)
            .tls_root_certificate(bundle)
            .connect()
            .await
            .unwrap();
        let guard = manager
            .acquire("invoice:9", &labelled("billing::redlock"))
            .await
            .unwrap();
        let (joined, ca) = (urls.join(","), ca_file.path.clone());
        let (out, _) = tokio::task::spawn_blocking(move || {
            expect_args(
                &[
                    "--redlock",
                    "--url",
                    &joined,
                    "--tls-ca-cert",
                    &ca,
                    "show",
                    "invoice:9",
                ],
                0,
            )
        })
        .await
        .unwrap();
        assert!(out.contains("label:     billing::redlock"), "{out}");
        guard.release().await.unwrap();
    }

    #[test]
    fn a_refused_certificate_says_to_give_the_ca_and_hides_the_password() {
        if skip_without(
            Feature::Tls,
            "a_refused_certificate_says_to_give_the_ca_and_hides_the_password",
        ) {
            return;
        }
        let server = RedisServer::start_tls();
        let url = server.add_acl_user("ops", "s3cret", &["+@all"]);
        let other_dir = unique_temp_dir("cli-other-ca");
        let other = TlsFiles::generate(&other_dir);
        let other_ca = other.ca_cert.to_str().unwrap();

        // The system's roots do not vouch for the test's CA.
        let started = Instant::now();
        let (out, err) = expect(&url, &["list"], 2);
        eprintln!("without the CA: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert!(out.is_empty(), "{out}");
        assert!(
            err.starts_with("error: cannot use Redis at rediss://ops:***@127.0.0.1:"),
            "{err}"
        );
        assert!(err.contains("TLS certificate was not accepted"), "{err}");
        assert!(err.contains("--tls-ca-cert PATH"), "{err}");
        assert!(
            !err.contains("tls_root_certificate"),
            "library advice: {err}"
        );
        assert!(!err.contains("s3cret"), "the password was printed: {err}");

        // Another CA does not vouch for it either, and the message names the file given.
        let (_, err) = expect(&url, &["--tls-ca-cert", other_ca, "show", "x"], 2);
        eprintln!("with another CA: {err}");
        assert!(err.contains("TLS certificate was not accepted"), "{err}");
        assert!(
            err.contains(&format!("--tls-ca-cert {other_ca} did not sign it")),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "the password was printed: {err}");
        let _ = std::fs::remove_dir_all(&other_dir);
    }

    /// The right CA, but a host the certificate was not issued for (it names 127.0.0.1 and
    /// localhost; the server also listens on 127.0.0.2).
    #[test]
    fn a_host_the_certificate_does_not_name_is_a_clear_error() {
        if skip_without(
            Feature::Tls,
            "a_host_the_certificate_does_not_name_is_a_clear_error",
        ) {
            return;
        }
        let server = RedisServer::start_tls_with(&["--bind", "127.0.0.1", "127.0.0.2"]);
        let ca = server.tls_ca_file().unwrap().to_str().unwrap().to_owned();
        let url = format!("rediss://ops:s3cret@127.0.0.2:{}/", server.port());
        let (_, err) = expect(&url, &["--tls-ca-cert", &ca, "list"], 2);
        eprintln!("wrong host: {err}");
        assert!(err.contains("TLS certificate was not accepted"), "{err}");
        assert!(
            err.contains("not a name the certificate was issued for"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "the password was printed: {err}");
    }
}

/// `doctor` on a server that may evict lock keys: ✗ naming `maxmemory-policy` and its fix,
/// exit status 1.
#[test]
fn doctor_fails_a_server_that_may_evict_locks() {
    for policy in ["allkeys-lru", "volatile-lru"] {
        let server =
            RedisServer::start_with(&["--maxmemory", "10mb", "--maxmemory-policy", policy]);
        let (out, _) = expect(&server.url(), &["doctor"], 1);
        let line = out
            .lines()
            .find(|line| line.contains("eviction:"))
            .unwrap_or_else(|| panic!("no eviction line:\n{out}"));
        assert!(line.starts_with('✗'), "{out}");
        assert!(
            line.contains(&format!("maxmemory-policy {policy}")),
            "{out}"
        );
        assert!(
            out.contains("fix: set `maxmemory-policy noeviction`"),
            "{out}"
        );
    }
}

/// A single server with `noeviction` and otherwise default settings passes: its persistence
/// is advice (`?`), not a failure.
#[test]
fn doctor_passes_a_well_configured_single_server() {
    let server =
        RedisServer::start_with(&["--maxmemory", "10mb", "--maxmemory-policy", "noeviction"]);
    let (out, _) = expect(&server.url(), &["doctor"], 0);
    let mark = |check: &str| {
        out.lines()
            .find(|line| line.contains(&format!(") {check}:")))
            .unwrap_or_else(|| panic!("no {check} line:\n{out}"))
            .chars()
            .next()
            .unwrap()
    };
    assert_eq!(mark("eviction"), '✓', "{out}");
    assert_eq!(mark("persistence"), '?', "{out}");
    assert_eq!(mark("version"), '✓', "{out}");
    assert_eq!(mark("latency"), '✓', "{out}");
    assert!(!out.lines().any(|line| line.starts_with('✗')), "{out}");
    assert!(out.ends_with("checks: 0 ✗, 1 ?\n"), "{out}");
}

/// `--json`: one object whose checks a script can read, the failed one among them.
#[test]
fn doctor_json_lists_the_checks() {
    let server =
        RedisServer::start_with(&["--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru"]);
    let (out, _) = expect(&server.url(), &["doctor", "--json"], 1);
    let report: serde_json::Value = serde_json::from_str(&out).expect("doctor --json is JSON");
    assert_eq!(report["ok"], false, "{report}");
    let checks = report["checks"].as_array().expect("checks");
    let names: Vec<&str> = checks.iter().filter_map(|c| c["check"].as_str()).collect();
    for name in [
        "version",
        "eviction",
        "persistence",
        "replicas",
        "acl",
        "latency",
    ] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    let eviction = checks.iter().find(|c| c["check"] == "eviction").unwrap();
    assert_eq!(eviction["status"], "fail", "{eviction}");
    assert!(eviction["fix"].as_str().unwrap().contains("noeviction"));
}

/// A user who may not run `CONFIG` or `RPUSHX`: the eviction policy is unknown (`?`, with how
/// to check by hand), the missing permission a ✗ that names it; the password never shows.
#[test]
fn doctor_names_missing_permissions_without_the_password() {
    let server = RedisServer::start();
    let () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "app", "on", ">s3cret", "~*", "&*", "+@all", "-config", "-rpushx",
            ][..],
        )
        .query(&mut server.conn())
        .unwrap();
    let url = format!("redis://app:s3cret@127.0.0.1:{}", server.port());
    let (out, err) = expect(&url, &["doctor"], 1);
    let line = |check: &str| {
        out.lines()
            .find(|line| line.contains(&format!(") {check}:")))
            .unwrap_or_else(|| panic!("no {check} line:\n{out}"))
            .to_owned()
    };
    assert!(line("eviction").starts_with('?'), "{out}");
    assert!(out.contains("CONFIG GET maxmemory*"), "{out}");
    let acl = line("acl");
    assert!(acl.starts_with('✗') && acl.contains("rpushx"), "{out}");
    assert!(
        !out.contains("s3cret") && !err.contains("s3cret"),
        "{out}{err}"
    );
}

/// On a cluster, every master is checked.
#[test]
fn doctor_checks_every_master_of_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    let (out, _) = expect_args(&["--cluster", "--url", &urls.join(","), "doctor"], 0);
    for master in cluster.masters() {
        let address = format!("127.0.0.1:{} (cluster master) eviction:", master.port());
        assert!(out.contains(&address), "{address} in\n{out}");
    }
}

/// Redlock masters without an append-only file fail the persistence check (a restarted master
/// votes for its locks again); every master is checked.
#[test]
fn doctor_fails_redlock_masters_that_forget_their_locks() {
    let servers = RedisServers::start(3);
    let urls = servers.urls().join(",");
    let (out, _) = expect_args(&["--redlock", "--url", &urls, "doctor"], 1);
    for url in servers.urls() {
        let port = url.rsplit(':').next().unwrap().trim_end_matches('/');
        let line = out
            .lines()
            .find(|line| line.contains(&format!("127.0.0.1:{port} (Redlock master) persistence:")))
            .unwrap_or_else(|| panic!("no persistence line for {port}:\n{out}"));
        assert!(
            line.starts_with('✗') && line.contains("appendonly no"),
            "{out}"
        );
    }
    assert!(out.contains("fix: set `appendonly yes`"), "{out}");
}

/// On Sentinel, the service's master and its replica are both checked.
#[test]
fn doctor_checks_the_sentinel_master_and_its_replica() {
    let set = SentinelSet::start();
    let urls = set.sentinel_urls().join(",");
    let (out, _) = expect_args(&["--sentinel", SERVICE, "--url", &urls, "doctor"], 0);
    let master = format!(
        "127.0.0.1:{} (Sentinel master) eviction:",
        set.master().port()
    );
    let replica = format!(
        "127.0.0.1:{} (Sentinel replica) eviction:",
        set.replica().port()
    );
    assert!(out.contains(&master), "{master} in\n{out}");
    assert!(out.contains(&replica), "{replica} in\n{out}");
}

// `order`: what the applications recorded of the orders in which they took two templates.

#[distlock::distributed_lock(key = "cli-invoice:{id}", ttl = 10)]
async fn charge(id: u32) -> Result<(), LockError> {
    debit(id).await
}

#[distlock::distributed_lock(key = "cli-account:{id}", ttl = 10)]
async fn debit(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distlock::distributed_lock(key = "cli-account:{id}", ttl = 10)]
async fn refund(id: u32) -> Result<(), LockError> {
    credit(id).await
}

#[distlock::distributed_lock(key = "cli-invoice:{id}", ttl = 10)]
async fn credit(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distlock::distributed_lock(key = "cli-trace:{id}", ttl = 10)]
async fn trace(id: u32) -> Result<(), LockError> {
    debit(id).await
}

#[tokio::test(flavor = "current_thread")]
async fn order_lists_the_inversions_then_every_order_seen() {
    let server = RedisServer::start();
    let url = server.url();
    let (out, _) = expect(&url, &["order"], 0);
    assert!(out.contains("no lock order recorded"), "{out}");

    // The only global manager of this binary: its orders are recorded in `server`.
    distlock::init(&url).await.unwrap();
    charge(1).await.unwrap();
    refund(1).await.unwrap();
    trace(1).await.unwrap();
    let manager = LockManager::connect(&url).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while manager.orders().await.unwrap().len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the orders were not recorded: {:?}",
            manager.orders().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (out, _) = expect(&url, &["order"], 0);
    assert!(out.starts_with(&format!("Redis at {url}")), "{out}");
    assert!(out.contains("1 INVERSION"), "{out}");
    assert!(out.contains("cli-account:{id} ⇄ cli-invoice:{id}"), "{out}");
    assert!(
        out.contains(
            "cli::charge held cli-invoice:{id}, then cli::debit waited for cli-account:{id}"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "cli::refund held cli-account:{id}, then cli::credit waited for cli-invoice:{id}"
        ),
        "{out}"
    );
    assert!(
        out.contains(&format!("by pid {}", std::process::id())),
        "{out}"
    );
    let table = out.split("3 order(s) seen:").nth(1).expect("the table");
    let trace_row = table
        .lines()
        .find(|line| line.starts_with("cli-trace:{id}"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(trace_row.ends_with(" -"), "one way only: {trace_row}");

    let (out, _) = expect(&url, &["order", "--json"], 0);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        json["inversions"],
        serde_json::json!([["cli-account:{id}", "cli-invoice:{id}"]])
    );
    let orders = json["orders"].as_array().unwrap();
    assert_eq!(orders.len(), 3, "{json}");
    let forward = orders
        .iter()
        .find(|order| order["first"] == "cli-invoice:{id}")
        .unwrap();
    assert_eq!(forward["holder"], "cli::charge");
    assert_eq!(forward["taker"], "cli::debit");
    assert_eq!(forward["inverted"], true);
    assert!(forward["first_seen_unix_ms"].as_u64().unwrap() > 1_700_000_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_show_give_every_permit_of_a_semaphore_and_every_reader() {
    let server = RedisServer::start();
    let url = server.url();
    let manager = LockManager::connect(&url).await.unwrap();
    let permits = labelled("payments").permits(3);
    let a = manager.acquire("api:pay", &permits).await.unwrap();
    let b = manager.acquire("api:pay", &permits).await.unwrap();
    let read = labelled("catalog").mode(distlock::LockMode::Read);
    let reader = manager.acquire("cat:eu", &read).await.unwrap();

    let (out, _) = expect(&url, &["list"], 0);
    assert!(out.contains("2 of 3 permits: payments (pid"), "{out}");
    assert!(out.contains("1 readers: catalog (pid"), "{out}");
    let (out, _) = expect(&url, &["show", "api:pay"], 0);
    assert!(out.contains("mode:      semaphore of 3 permits"), "{out}");
    assert_eq!(out.matches("holder:    payments (pid").count(), 2, "{out}");
    let (out, _) = expect(&url, &["show", "cat:eu", "--json"], 0);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["mode"], "read (readers share it)", "{out}");
    assert_eq!(json["holders"].as_array().unwrap().len(), 1, "{out}");

    a.release().await.unwrap();
    b.release().await.unwrap();
    reader.release().await.unwrap();
}

/// `release --force` of a semaphore and of readers breaks every holder shown, who is told
/// so, and lets in the waiter at the head of the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_force_breaks_every_permit_and_reader_and_lets_the_line_in() {
    let server = RedisServer::start();
    let url = server.url();
    let manager = LockManager::connect(&url).await.unwrap();
    let waiters = LockManager::connect(&url).await.unwrap();
    let permits = labelled("payments").permits(2);
    let read = labelled("catalog").mode(distlock::LockMode::Read);
    for (name, held, says) in [
        ("api:pay", permits, "2 of 2 permits: payments (pid"),
        ("cat:eu", read, "2 readers: catalog (pid"),
    ] {
        let a = manager.acquire(name, &held).await.unwrap();
        let b = manager.acquire(name, &held).await.unwrap();
        let waiting = if name == "api:pay" {
            held.clone()
        } else {
            labelled("writer")
        };
        let waiter = {
            let waiters = waiters.clone();
            tokio::spawn(async move { waiters.acquire(name, &waiting).await })
        };
        let mut in_line = false;
        for _ in 0..400 {
            let info = manager.inspect(name).await.unwrap().expect("held");
            in_line = info.waiters == 1;
            if in_line {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(in_line, "{name}: the waiter never joined the line");

        let (out, _) = expect(&url, &["release", name, "--force", "--yes"], 0);
        assert!(
            out.contains(&format!("released lock:{name} (it was held by {says}")),
            "{out}"
        );
        let admitted = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter was let in")
            .unwrap()
            .unwrap();
        for broken in [a, b] {
            assert!(
                matches!(
                    broken.release().await,
                    Err(LockError::Lost {
                        cause: distlock::LostCause::ForceReleased,
                        ..
                    })
                ),
                "{name}"
            );
        }
        admitted.release().await.unwrap();
        assert!(!server.exists(&format!("lock:{name}")), "{name}");
    }
}
