//! Helpers for tests that need more than one OS process: free ports, signals, and running the
//! current test binary again as a worker.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Returns a TCP port on 127.0.0.1 that was free a moment ago.
///
/// The port is found by binding port 0 and dropping the listener, so another process can take
/// it before the caller binds it; callers that start a server on it must retry with a new port
/// when the bind fails (as [`RedisServer::start`](crate::RedisServer::start) does).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0 to find a free port: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("cannot read the address of a bound listener: {e}"))
        .port()
}

/// Sends `signal` (a name such as `"STOP"`, `"CONT"`, `"KILL"`, `"TERM"`) to process `pid`.
///
/// Goes through the shell's `kill` builtin because the tests may use std only (no libc), and
/// `sh` exists wherever `redis-server` does. Panics if the signal could not be delivered, e.g.
/// because the process is gone: a test that signals a process expects it to be there. A
/// `"STOP"` returns once every thread of the process is stopped (see `wait_stopped`).
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("sh")
        .args(["-c", "kill -s \"$1\" \"$2\"", "send_signal"])
        .arg(signal)
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run `sh` to send SIG{signal} to {pid}: {e}"));
    assert!(
        status.success(),
        "`kill -s {signal} {pid}` failed ({status})"
    );
    if signal == "STOP" {
        wait_stopped(pid);
    }
}

/// Waits until every thread of process `pid` is stopped (up to 10 s; panics past it).
///
/// `kill` returns once the signal is queued, not once the process stops: the kernel wakes one
/// thread to take a `SIGSTOP`, and only when that thread gets a CPU does it stop the others.
/// On a loaded machine the process's other threads run meanwhile — they can read a reply, take
/// a lock handed to them — so a test that acts "after the stop" must wait for it. Read from
/// `/proc/<pid>/task/*/stat` (state `T`); where there is no `/proc`, this returns at once.
fn wait_stopped(pid: u32) {
    let tasks = format!("/proc/{pid}/task");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let Ok(entries) = std::fs::read_dir(&tasks) else {
            return;
        };
        let running = entries.flatten().any(|task| {
            std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
                // `<tid> (<comm>) <state> ...`: the name may hold spaces and parentheses.
                let state = stat
                    .rfind(')')
                    .and_then(|end| stat[end + 1..].split_whitespace().next());
                !matches!(state, Some("T" | "t" | "Z" | "X"))
            })
        });
        if !running {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "process {pid} has threads still running 10 s after SIGSTOP"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Name of the environment variable that tells a test binary's worker entry which worker to
/// run (see [`run_worker`]).
const WORKER_VARIABLE: &str = "DISTLOCK_TEST_WORKER";

/// Name of the worker entry every test binary that starts workers defines at its root (see
/// [`run_worker`]).
const WORKER_ENTRY: &str = "worker";

/// Runs the current test binary again as the worker process `name`, one of those its `worker`
/// entry passes to [`run_worker`].
///
/// The child gets the given environment variables on top of the parent's. Its stdout and
/// stderr are forwarded line by line, prefixed with `[worker <pid>]`, to the calling test's
/// stderr: like the test's own output, they are shown when the test fails (or under
/// `--nocapture`) and hidden when it passes, so an expected worker panic does not clutter a
/// green run. A worker reports failure by panicking: its exit status is then not success.
///
/// ```ignore
/// let workers = (0..4)
///     .map(|_| spawn_worker("counter::counter_worker", &[("COUNTER_URL", server.url())]))
///     .collect();
/// for status in wait_all(workers, Duration::from_secs(60)) {
///     assert!(status.success(), "a worker failed: {status}");
/// }
/// ```
pub fn spawn_worker(name: &str, env: &[(&str, String)]) -> Child {
    let mut env = env.to_vec();
    env.push((WORKER_VARIABLE, name.to_owned()));
    spawn_test(WORKER_ENTRY, &["--ignored"], &env)
}

/// Runs the worker that [`spawn_worker`] named, from `workers` (name, function): the body of
/// the one worker entry of a test binary. A worker is not a test, so the entry is ignored —
/// a plain `cargo test` lists it as ignored rather than as a passing test — and `spawn_worker`
/// runs it with `--ignored`:
///
/// ```ignore
/// #[test]
/// #[ignore = "the entry of worker processes, which tests start with spawn_worker"]
/// fn worker() {
///     test_support::run_worker(&[("counter::counter_worker", counter::counter_worker)]);
/// }
/// ```
///
/// Run by hand (`--include-ignored`), without a worker named, it does nothing.
pub fn run_worker(workers: &[(&str, fn())]) {
    let Ok(name) = std::env::var(WORKER_VARIABLE) else {
        return;
    };
    let (_, worker) = workers
        .iter()
        .find(|(known, _)| *known == name)
        .unwrap_or_else(|| {
            let known: Vec<&str> = workers.iter().map(|(known, _)| *known).collect();
            panic!("no worker is called {name:?}; this binary's workers are {known:?}")
        });
    worker();
}

/// Runs the current test binary again as a child process that executes only `test_name`,
/// with `extra_args` for the test harness and `env` on top of the parent's environment; the
/// child's output is forwarded as [`spawn_worker`] says.
fn spawn_test(test_name: &str, extra_args: &[&str], env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe()
        .unwrap_or_else(|e| panic!("cannot find the current test binary: {e}"));
    let mut command = Command::new(&exe);
    command
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {} {test_name}: {e}", exe.display()));
    let prefix = format!("[worker {}]", child.id());
    if let Some(stdout) = child.stdout.take() {
        forward_lines(stdout, prefix.clone());
    }
    if let Some(stderr) = child.stderr.take() {
        forward_lines(stderr, prefix);
    }
    child
}

/// Copies `source` line by line to this thread's stderr, each line after `prefix`.
///
/// Runs in a thread spawned from the test's thread, which inherits the test harness's output
/// capture, so the lines land in the calling test's captured output. The thread ends when the
/// worker exits (its end of the pipe closes) and is not joined: reading a pipe never hangs it
/// longer than the worker lives.
fn forward_lines(source: impl Read + Send + 'static, prefix: String) {
    let spawned = std::thread::Builder::new()
        .name(format!("{prefix} output"))
        .spawn(move || {
            let mut reader = BufReader::new(source);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line);
                        eprintln!("{prefix} {}", text.trim_end_matches(['\r', '\n']));
                    }
                }
            }
        });
    if let Err(e) = spawned {
        // Without a reader the worker would block once the pipe fills up, and hang.
        panic!("cannot start a thread to forward worker output: {e}");
    }
}

/// Waits for every child to exit, within `timeout` in total, and returns their exit statuses
/// in the same order.
///
/// A child still running at the deadline is killed (and reaped), then this panics naming the
/// pids that overran, so a hung worker fails the test instead of hanging it.
pub fn wait_all(mut children: Vec<Child>, timeout: Duration) -> Vec<ExitStatus> {
    let deadline = Instant::now() + timeout;
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; children.len()];
    loop {
        for (child, status) in children.iter_mut().zip(statuses.iter_mut()) {
            if status.is_none() {
                *status = child
                    .try_wait()
                    .unwrap_or_else(|e| panic!("cannot poll child {}: {e}", child.id()));
            }
        }
        if statuses.iter().all(Option::is_some) {
            return statuses.into_iter().flatten().collect();
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut overran = Vec::new();
    for (child, status) in children.iter_mut().zip(&statuses) {
        if status.is_none() {
            overran.push(child.id());
            // SIGKILL cannot be ignored and reaches stopped processes too, so wait() returns.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    panic!(
        "{} of {} child processes did not exit within {timeout:?} and were killed: pids {overran:?}",
        overran.len(),
        children.len()
    );
}

/// The variable that tells a child started by [`in_own_process`] which test it is to run, and
/// where to leave the proof that it ran.
const OWN_PROCESS_VARIABLE: &str = "DISTLOCK_OWN_PROCESS";

/// How long a test run by [`in_own_process`] may take before it is killed and fails: bounds that
/// hold for the slowest of them (the cancellation storm) on a slow shared machine.
const OWN_PROCESS_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs a test in a process of its own and tells the caller whether it is that process.
///
/// Some tests install what a process has only one of — the global lock manager
/// (`distlock::init_with`), the global `tracing` subscriber — so they cannot share their test
/// binary's process with the other tests that do. Such a test starts with
///
/// ```ignore
/// if !test_support::in_own_process(module_path!(), "this_tests_name") {
///     return;
/// }
/// ```
///
/// In the test binary's own run this spawns the binary again for exactly that test, waits for it
/// and panics unless it passed, then returns `false`; in the spawned process it returns `true`
/// and the test does its work. `module` is the test's `module_path!()` (its first segment, the
/// binary's crate, is not part of the test's name). The child leaves a file behind when it runs,
/// so a name that matches no test fails here instead of passing with zero tests run.
pub fn in_own_process(module: &str, test: &str) -> bool {
    let path = match module.split_once("::") {
        Some((_crate, inner)) => format!("{inner}::{test}"),
        None => test.to_owned(),
    };
    if let Ok(value) = std::env::var(OWN_PROCESS_VARIABLE) {
        if let Some(proof) = value.strip_prefix(&format!("{path}=")) {
            std::fs::write(proof, b"ran").unwrap_or_else(|e| panic!("cannot write {proof}: {e}"));
            return true;
        }
    }
    let dir = crate::unique_temp_dir("own-process");
    let proof = dir.join("ran");
    let child = spawn_test(
        &path,
        &[],
        &[(OWN_PROCESS_VARIABLE, format!("{path}={}", proof.display()))],
    );
    let status = wait_all(vec![child], OWN_PROCESS_TIMEOUT)[0];
    let ran = proof.exists();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        status.success(),
        "{path} failed in its own process: {status}"
    );
    assert!(
        ran,
        "no test is called {path}: the name given to in_own_process is wrong"
    );
    false
}
