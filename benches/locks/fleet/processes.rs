//! The parent side of the fleet workload: starts the worker processes, lets them go together,
//! collects their reports, and never leaves one behind.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::monotonic_ns;
use super::worker::{WorkerReport, WorkerSpec, WORKER_ENV};

/// How long the workers get to start, connect and warm up: 16 processes starting at once on a
/// shared 2-core machine can take seconds.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How far ahead of the `go` line the common start lies: long enough for every worker to read
/// its line and be asleep until then, however the 2 cores are shared out among them.
const START_LEAD: Duration = Duration::from_millis(100);
/// How long a run may take from the start to the last report. A run takes a second or two; a
/// worker stuck past this is a bug to report, not a figure.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the workers get to exit once they have reported.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// A line from a worker's stdout, or its end (`None`).
type Event = (usize, Option<String>);

/// The worker processes of one run. Dropping it kills those still running (a panic of the
/// bench, a failed run), so no worker outlives its run.
pub(super) struct Workers {
    children: Vec<Child>,
    /// Held open until the workers have exited: each worker takes the end of its stdin for the
    /// end of the bench.
    stdins: Vec<ChildStdin>,
    events: Receiver<Event>,
}

impl Workers {
    /// Starts one worker per spec; each runs this same binary with [`WORKER_ENV`] set.
    pub(super) fn spawn(specs: &[WorkerSpec]) -> Self {
        let exe = std::env::current_exe().expect("fleet: cannot find the bench binary");
        let (sender, events) = mpsc::channel();
        let mut workers = Workers {
            children: Vec::with_capacity(specs.len()),
            stdins: Vec::with_capacity(specs.len()),
            events,
        };
        for (index, spec) in specs.iter().enumerate() {
            let json = serde_json::to_string(spec).expect("fleet: cannot encode a worker spec");
            let mut child = Command::new(&exe)
                .env(WORKER_ENV, json)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                // A worker's panic message goes straight to the bench's stderr.
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap_or_else(|error| panic!("fleet: cannot start worker {index}: {error}"));
            let stdin = child.stdin.take().expect("stdin is piped");
            let stdout = child.stdout.take().expect("stdout is piped");
            // Pushed before anything else can fail, so that drop kills this one too.
            workers.children.push(child);
            workers.stdins.push(stdin);
            let sender = sender.clone();
            std::thread::Builder::new()
                .name(format!("fleet-worker-{index}-stdout"))
                .spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        if sender.send((index, Some(line))).is_err() {
                            return;
                        }
                    }
                    let _ = sender.send((index, None));
                })
                .expect("fleet: cannot start a thread to read a worker");
        }
        workers
    }

    /// Waits until every worker has printed `ready`.
    pub(super) fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut ready = vec![false; self.children.len()];
        while !ready.iter().all(|ready| *ready) {
            let (index, line) = self.next_event(deadline, "to be ready");
            match line.as_deref() {
                Some("ready") => ready[index] = true,
                Some(other) => panic!("fleet: worker {index} said {other:?} instead of `ready`"),
                None => self.died(index, "before it was ready"),
            }
        }
    }

    /// Tells every worker to start at the same moment, a little from now.
    pub(super) fn go(&mut self) {
        let start =
            monotonic_ns() + u64::try_from(START_LEAD.as_nanos()).expect("a lead of centuries");
        for (index, stdin) in self.stdins.iter_mut().enumerate() {
            writeln!(stdin, "go {start}")
                .and_then(|()| stdin.flush())
                .unwrap_or_else(|error| panic!("fleet: cannot start worker {index}: {error}"));
        }
    }

    /// Every worker's report, in worker order, once all have printed one; then waits for them to
    /// exit, and checks that they exited well.
    pub(super) fn reports(&mut self) -> Vec<WorkerReport> {
        let deadline = Instant::now() + RUN_TIMEOUT;
        let mut reports: Vec<Option<WorkerReport>> =
            (0..self.children.len()).map(|_| None).collect();
        while reports.iter().any(Option::is_none) {
            let (index, line) = self.next_event(deadline, "to finish their sections");
            match line {
                Some(line) => {
                    let report = serde_json::from_str(&line).unwrap_or_else(|error| {
                        panic!("fleet: worker {index} sent a bad report ({error}): {line:.200}")
                    });
                    reports[index] = Some(report);
                }
                // A worker's output ends when it exits, which it does right after its report.
                None if reports[index].is_some() => {}
                None => self.died(index, "without a report"),
            }
        }
        reports.into_iter().flatten().collect()
    }

    /// Waits (bounded) for every worker to exit, and checks that each succeeded.
    pub(super) fn wait_exit(mut self) {
        let deadline = Instant::now() + EXIT_TIMEOUT;
        for index in 0..self.children.len() {
            loop {
                let child = &mut self.children[index];
                match child.try_wait() {
                    Ok(Some(status)) if status.success() => break,
                    Ok(Some(status)) => panic!("fleet: worker {index} exited with {status}"),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Ok(None) => {
                        panic!("fleet: worker {index} did not exit within {EXIT_TIMEOUT:?}")
                    }
                    Err(error) => panic!("fleet: cannot wait for worker {index}: {error}"),
                }
            }
        }
        // Dropping `self` now closes the stdins and kills nothing: all have exited.
    }

    fn next_event(&self, deadline: Instant, waiting_for: &str) -> Event {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.events.recv_timeout(left) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout) => {
                panic!("fleet: timed out waiting for the workers {waiting_for}")
            }
            Err(RecvTimeoutError::Disconnected) => {
                panic!("fleet: every worker's output ended while waiting for them {waiting_for}")
            }
        }
    }

    /// Panics with how worker `index` ended (its own message is already on stderr).
    fn died(&mut self, index: usize, when: &str) -> ! {
        let child = &mut self.children[index];
        // Its stdout has closed: it exits now, if it has not already.
        let deadline = Instant::now() + Duration::from_secs(5);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status.to_string(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => break "still running".to_owned(),
                Err(error) => break format!("unknown ({error})"),
            }
        };
        panic!(
            "fleet: worker {index} (pid {}) ended {when}: {status}",
            child.id()
        );
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.children {
            if let Ok(None) = child.try_wait() {
                // SIGKILL: a worker cannot ignore it, and `wait` then reaps it at once.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
