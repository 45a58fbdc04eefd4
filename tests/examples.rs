//! The examples' own Redis: with `--start-redis` (what they do when `REDIS_URL` is unset and
//! nothing answers at the default address) they start a private `redis-server`, run to the end
//! against it, and stop it — also when interrupted; and a named Redis that does not answer gets
//! instructions, without the URL's password.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use test_support::{free_port, send_signal, wait_until};

/// Builds the example (a no-op when it is up to date) and returns its executable.
fn example(name: &str) -> PathBuf {
    let output = Command::new(env!("CARGO"))
        .args([
            "build",
            "--quiet",
            "--example",
            name,
            "--message-format=json",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|error| panic!("cannot run cargo build --example {name}: {error}"));
    assert!(
        output.status.success(),
        "cargo build --example {name} failed"
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["target"]["name"] == name)
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo did not name the executable of example {name}"))
}

/// The pid and port of the private server, from the example's one line about it.
fn private_server(line: &str) -> Option<(u32, u16)> {
    let rest = line.split("started a private redis-server (pid ").nth(1)?;
    let (pid, rest) = rest.split_once(") on port ")?;
    let port = rest.split_whitespace().next()?;
    Some((pid.parse().ok()?, port.parse().ok()?))
}

fn is_running(pid: u32) -> bool {
    // A zombie has exited; only its parent has not reaped it yet.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn answers(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500))
        .is_ok()
}

/// The server the example started is gone, and nothing listens on its port any more.
fn assert_stopped(pid: u32, port: u16) {
    wait_until(
        Duration::from_secs(10),
        "the private redis-server to be gone",
        || !is_running(pid),
    );
    assert!(
        !answers(port),
        "something still answers on the private server's port {port}"
    );
}

fn run(path: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(path)
        .args(args)
        .env_remove("REDIS_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{} did not finish within 120 s", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn process_traces_runs_on_a_private_server_and_stops_it() {
    let output = run(
        &example("process_traces"),
        &[
            "--start-redis",
            "--jobs",
            "300",
            "--workers",
            "2",
            "--tasks",
            "4",
        ],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "failed:\n{stdout}\n{stderr}");
    let (pid, port) = stdout
        .lines()
        .find_map(private_server)
        .unwrap_or_else(|| panic!("no line about the private server:\n{stdout}"));
    let violations = stdout
        .lines()
        .find_map(|line| line.trim().strip_prefix("violations"))
        .map(|count| count.trim().to_owned());
    assert_eq!(violations.as_deref(), Some("0"), "{stdout}");
    assert!(
        stdout.contains("jobs / sections         300 / 300"),
        "{stdout}"
    );
    assert_stopped(pid, port);
}

#[test]
fn quickstart_runs_on_a_private_server_and_stops_it() {
    let output = run(&example("quickstart"), &["--start-redis"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "failed:\n{stdout}");
    assert_eq!(stdout.matches(": done").count(), 4, "{stdout}");
    let (pid, port) = stdout.lines().find_map(private_server).expect("the line");
    assert_stopped(pid, port);
}

/// Pids of the processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the command name in parentheses: state, then the parent's pid.
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1));
        if ppid.and_then(|ppid| ppid.parse().ok()) == Some(parent) {
            children.push(pid);
        }
    }
    children
}

/// Reads `child`'s stdout lines on a thread, so the test can wait for one with a bound.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().unwrap();
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                return;
            }
        }
    });
    receive
}

#[test]
fn process_traces_stops_its_server_and_workers_on_ctrl_c() {
    let mut parent = Command::new(example("process_traces"))
        // Far more work than the test waits for: the run is interrupted mid-way.
        .args([
            "--start-redis",
            "--jobs",
            "200000",
            "--workers",
            "2",
            "--tasks",
            "2",
        ])
        .env_remove("REDIS_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = lines_of(&mut parent);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut server = None;
    while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        server = server.or_else(|| private_server(&line));
        if line.starts_with("process_traces:") {
            break;
        }
    }
    let (pid, port) = server.expect("the line about the private server");
    // Its workers and its server are running.
    let mut workers = Vec::new();
    wait_until(Duration::from_secs(30), "both workers to start", || {
        workers = children_of(parent.id())
            .into_iter()
            .filter(|child| *child != pid)
            .collect();
        workers.len() == 2
    });
    assert!(is_running(pid) && answers(port));

    send_signal(parent.id(), "INT");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = parent.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still running 30 s after Ctrl-C");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        status.code(),
        Some(130),
        "exit status after Ctrl-C: {status}"
    );
    assert_stopped(pid, port);
    wait_until(Duration::from_secs(10), "the workers to be gone", || {
        workers.iter().all(|worker| !is_running(*worker))
    });
}

#[test]
fn a_named_redis_that_does_not_answer_gets_instructions_without_the_password() {
    let output = Command::new(example("process_traces"))
        .env(
            "REDIS_URL",
            format!("redis://app:s3cret-pw@127.0.0.1:{}", free_port()),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{stdout}{stderr}");
    assert!(
        stderr.contains("no Redis answers at redis://***@127.0.0.1:"),
        "{stderr}"
    );
    assert!(stderr.contains("unset REDIS_URL"), "{stderr}");
    assert!(
        !stderr.contains("s3cret") && !stdout.contains("s3cret"),
        "password printed"
    );
    assert!(
        !stdout.contains("started a private"),
        "must not start a server in its place"
    );
}

/// Ctrl-C during the quickstart's run stops its private server and exits with 130. The run
/// lasts about 600 ms after the line that names the server; on a loaded machine the signal
/// (sent through `sh -c kill`) can land after it has ended, which shows as a normal exit (0,
/// its server stopped too): the run is then made again, up to 3 times.
#[test]
fn quickstart_stops_its_server_on_ctrl_c() {
    for attempt in 1..=3 {
        let mut child = Command::new(example("quickstart"))
            .arg("--start-redis")
            .env_remove("REDIS_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let lines = lines_of(&mut child);
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the first line");
        let (pid, port) =
            private_server(&line).unwrap_or_else(|| panic!("not about the server: {line}"));
        // The run takes three 200 ms sections in turn after this line: interrupt it within them.
        send_signal(child.id(), "INT");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "still running 30 s after Ctrl-C");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_stopped(pid, port);
        if status.code() == Some(0) && attempt < 3 {
            eprintln!("attempt {attempt}: the run ended before Ctrl-C landed; again");
            continue;
        }
        assert_eq!(
            status.code(),
            Some(130),
            "exit status after Ctrl-C: {status}"
        );
        return;
    }
}

/// A directory holding a `redis-server` that starts, records its pid, and never answers (a
/// hung or wrong binary first on `PATH`), and the file it writes its pid to.
fn silent_redis_server(test: &str) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("distlock-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pid_file = dir.join("pid");
    let _ = std::fs::remove_file(&pid_file);
    let program = dir.join("redis-server");
    // `exec` keeps the pid the example sees as its child's.
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\necho $$ > '{}.tmp' && mv '{0}.tmp' '{0}'\nexec sleep 120\n",
            pid_file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, pid_file)
}

fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(paths).unwrap()
}

fn silent_server_pid(pid_file: &Path) -> u32 {
    let mut pid = None;
    wait_until(
        Duration::from_secs(30),
        "the example to start redis-server",
        || {
            pid = std::fs::read_to_string(pid_file)
                .ok()
                .and_then(|text| text.trim().parse().ok());
            pid.is_some()
        },
    );
    pid.unwrap()
}

#[test]
fn a_private_server_that_never_answers_is_stopped_before_the_instructions() {
    let (dir, pid_file) = silent_redis_server("never-answers");
    let mut child = Command::new(example("process_traces"))
        .arg("--start-redis")
        .env_remove("REDIS_URL")
        .env("PATH", path_with(&dir))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = silent_server_pid(&pid_file);
    // The example gives the server a bounded time to answer, then gives up.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still waiting after 60 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let running = is_running(pid);
    if running {
        send_signal(pid, "KILL");
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(status.code(), Some(2), "exit status: {status}");
    assert!(
        !running,
        "the redis-server it started (pid {pid}) was left running"
    );
}

#[test]
fn ctrl_c_while_the_private_server_starts_stops_it() {
    for name in ["process_traces", "quickstart"] {
        ctrl_c_while_starting(name);
    }
}

fn ctrl_c_while_starting(name: &str) {
    let (dir, pid_file) = silent_redis_server(&format!("ctrl-c-at-start-{name}"));
    let mut child = Command::new(example(name))
        .arg("--start-redis")
        .env_remove("REDIS_URL")
        .env("PATH", path_with(&dir))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = silent_server_pid(&pid_file);
    // The example is waiting for its server's first answer: interrupt it (the example alone, as
    // `kill -INT` or a supervisor does, not the whole process group as a terminal does).
    send_signal(child.id(), "INT");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still running 30 s after Ctrl-C");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Reaped by the example, or orphaned and reaped by init: either way, gone in time if stopped.
    let stopped = wait_until_gone(pid, Duration::from_secs(10));
    if !stopped {
        send_signal(pid, "KILL");
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        stopped,
        "the redis-server {name} was starting (pid {pid}) was left running after Ctrl-C ({status})"
    );
    assert_eq!(
        status.code(),
        Some(130),
        "exit status of {name} after Ctrl-C: {status}"
    );
}

fn wait_until_gone(pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if !is_running(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}
