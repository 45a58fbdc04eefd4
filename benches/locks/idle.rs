//! Keeps the CPUs from going idle while the bench runs, without taking time from it.
//!
//! Some virtual machines halt an idle vCPU at once (e.g. Firecracker guests booted with
//! `haltpoll.guest_halt_poll_ns=0`), and waking a halted vCPU goes through the host: every
//! blocking wait then costs tens to hundreds of microseconds, several times a Redis round
//! trip. A lock cycle blocks twice (client waiting for Redis, Redis waiting for the client), so
//! on such a machine the figures would measure the hypervisor, and would change with whatever
//! else happens to keep the machine busy.
//!
//! [`IdleSpinners::start`] runs one thread per CPU under `SCHED_IDLE`, the Linux policy for
//! work that runs only when nothing else wants the CPU: any other thread that wakes up takes
//! the CPU from it at once. The threads only spin, so a vCPU never halts, and what remains is
//! the cost of the bench's own work. Where `SCHED_IDLE` cannot be set (not Linux, or refused),
//! no thread spins: a spinner at normal priority would steal time from the bench.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The spinner threads; they stop when this is dropped.
pub(crate) struct IdleSpinners {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Kernel thread ids (`/proc/self/task/<tid>`) of the spinners that run.
    tids: Arc<Mutex<Vec<String>>>,
}

impl IdleSpinners {
    /// Starts `count` spinners; [`running`](Self::running) says how many got `SCHED_IDLE`.
    pub(crate) fn start(count: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tids = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let threads = (0..count)
            .filter_map(|n| {
                let (stop, tids, ready) = (Arc::clone(&stop), Arc::clone(&tids), ready_tx.clone());
                std::thread::Builder::new()
                    .name(format!("idle-spinner-{n}"))
                    .spawn(move || {
                        let idle = set_sched_idle();
                        if idle {
                            if let Ok(path) = std::fs::read_link("/proc/thread-self") {
                                if let Some(tid) = path.file_name() {
                                    let mut tids = tids
                                        .lock()
                                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                                    tids.push(tid.to_string_lossy().into_owned());
                                }
                            }
                        }
                        let _ = ready.send(());
                        while idle && !stop.load(Ordering::Relaxed) {
                            std::hint::spin_loop();
                        }
                    })
                    .ok()
            })
            .collect::<Vec<_>>();
        for _ in 0..threads.len() {
            let _ = ready_rx.recv();
        }
        IdleSpinners {
            stop,
            threads,
            tids,
        }
    }

    /// How many spinners run (0 where `SCHED_IDLE` is not available).
    pub(crate) fn running(&self) -> usize {
        self.tids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether `tid` (a name in `/proc/self/task`) is a spinner, whose CPU time is not the
    /// bench's.
    pub(crate) fn is_spinner(&self, tid: &str) -> bool {
        self.tids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .any(|spinner| spinner == tid)
    }
}

impl Drop for IdleSpinners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Puts the calling thread under `SCHED_IDLE`; `false` if that is not possible.
#[cfg(target_os = "linux")]
// The workspace denies `unsafe_code`; std has no way to change a thread's scheduling policy,
// and this bench-only helper is not worth a dependency.
#[allow(unsafe_code)]
fn set_sched_idle() -> bool {
    /// `struct sched_param` of `<sched.h>`.
    #[repr(C)]
    struct SchedParam {
        sched_priority: i32,
    }
    /// `SCHED_IDLE` of `<sched.h>` (Linux).
    const SCHED_IDLE: i32 = 5;
    extern "C" {
        // glibc and musl both provide it; std links the C library already.
        fn sched_setscheduler(pid: i32, policy: i32, param: *const SchedParam) -> i32;
    }
    let param = SchedParam { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid `struct sched_param` that
    // outlives the call; the function only reads it.
    unsafe { sched_setscheduler(0, SCHED_IDLE, &raw const param) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn set_sched_idle() -> bool {
    false
}
