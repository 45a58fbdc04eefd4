//! A first try that ran, whose reply was lost with its connection, is sent once more on a
//! connection made anew — and that connection is refused (nothing listens for a moment: a
//! proxy, a load balancer or the server restarting). The acquisition fails, and must still
//! release what its first send took: the refusal says its own request did not run, not that
//! the first one did not.
//!
//! `test_support::FaultProxy` refuses by accepting and closing, which a client sees as a
//! dropped connection; a refusal proper needs the port closed, which this proxy does.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{LockManager, LockOptions};
use test_support::{keys, RedisServer};

const TTL: Duration = Duration::from_secs(30);

/// What the proxy's threads share.
struct State {
    upstream: u16,
    port: u16,
    needle: Mutex<Option<Vec<u8>>>,
    /// Asked by a connection that lost a reply: close the listening socket.
    close: AtomicBool,
    closed: AtomicBool,
    reopen: AtomicBool,
    fired: AtomicBool,
    /// Set when the proxy is dropped: the accept thread ends.
    stopped: AtomicBool,
}

/// A proxy that, once a request containing its armed needle went through, drops the reply,
/// closes its listening port and then the connection, so that the client's reconnect is
/// refused until `reopen`.
struct RefusingProxy(Arc<State>);

impl RefusingProxy {
    fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            upstream,
            port,
            needle: Mutex::new(None),
            close: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            reopen: AtomicBool::new(false),
            fired: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        });
        let s = Arc::clone(&state);
        std::thread::spawn(move || accept_loop(listener, &s));
        RefusingProxy(state)
    }
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.0.port)
    }
    fn arm(&self, needle: &str) {
        *self.0.needle.lock().unwrap() = Some(needle.as_bytes().to_vec());
    }
    fn fired(&self) -> bool {
        self.0.fired.load(Ordering::SeqCst)
    }
    fn reopen(&self) {
        self.0.reopen.store(true, Ordering::SeqCst);
    }
}

impl Drop for RefusingProxy {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::SeqCst);
    }
}

fn accept_loop(listener: TcpListener, state: &Arc<State>) {
    let mut listener = Some(listener);
    while !state.stopped.load(Ordering::SeqCst) {
        match &listener {
            Some(l) => {
                l.set_nonblocking(true).unwrap();
                if state.close.load(Ordering::SeqCst) {
                    listener = None; // the port now refuses connections
                    state.closed.store(true, Ordering::SeqCst);
                    continue;
                }
                match l.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let upstream = TcpStream::connect(("127.0.0.1", state.upstream)).unwrap();
                        serve(client, upstream, state);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
            None => {
                if state.reopen.swap(false, Ordering::SeqCst) {
                    state.close.store(false, Ordering::SeqCst);
                    state.closed.store(false, Ordering::SeqCst);
                    listener = Some(TcpListener::bind(("127.0.0.1", state.port)).unwrap());
                } else {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

fn serve(client: TcpStream, upstream: TcpStream, state: &Arc<State>) {
    let losing = Arc::new(AtomicBool::new(false));
    let (mut c_read, mut u_write) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
    let (s, l) = (Arc::clone(state), Arc::clone(&losing));
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        loop {
            let n = match c_read.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            {
                let mut needle = s.needle.lock().unwrap();
                if needle
                    .as_ref()
                    .is_some_and(|w| chunk.windows(w.len()).any(|x| x == &w[..]))
                {
                    *needle = None;
                    l.store(true, Ordering::SeqCst);
                }
            }
            if u_write.write_all(chunk).is_err() {
                return;
            }
        }
    });
    let (mut u_read, mut c_write) = (upstream, client);
    let s = Arc::clone(state);
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        loop {
            let n = match u_read.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if losing.load(Ordering::SeqCst) {
                // The command ran; its reply is dropped. Close the port first, then the
                // connection: the client's reconnect is refused.
                s.close.store(true, Ordering::SeqCst);
                while !s.closed.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                s.fired.store(true, Ordering::SeqCst);
                let _ = c_write.shutdown(Shutdown::Both);
                let _ = u_read.shutdown(Shutdown::Both);
                return;
            }
            if c_write.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    });
}

async fn run(name: &str, options: LockOptions, waiting: bool) {
    let server = RedisServer::start();
    let proxy = RefusingProxy::start(server.port());
    let manager = LockManager::connect(&proxy.url()).await.unwrap();
    let lock = keys::default_key(name);
    // Warm the scripts (an EVALSHA answered NOSCRIPT takes nothing).
    let warm = format!("{name}-warm");
    let guard = manager.acquire(&warm, &options).await.unwrap();
    guard.release().await.unwrap();
    proxy.arm(&lock);
    let result = if waiting {
        manager.acquire(name, &options).await.map(Some)
    } else {
        manager.try_acquire(name, &options).await
    };
    assert!(proxy.fired(), "the proxy never lost the reply");
    assert!(
        result.is_err(),
        "the resend was refused, yet the acquisition returned {:?}",
        result.map(|guard| guard.is_some())
    );
    // The network is back at once.
    proxy.reopen();
    test_support::eventually(
        Duration::from_secs(3),
        &format!("{lock}, taken by the first send, released after the acquisition failed"),
        || !server.exists(&lock),
    )
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_first_try_whose_resend_is_refused_leaves_no_lock() {
    run("resend-refused-mutex", LockOptions::new().ttl(TTL), false).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_read_first_try_whose_resend_is_refused_leaves_no_lock() {
    let options = LockOptions::new().ttl(TTL).mode(distlock::LockMode::Read);
    run("resend-refused-read", options, false).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_waiting_acquire_whose_resend_is_refused_leaves_no_lock() {
    let options = LockOptions::new()
        .ttl(TTL)
        .timeout(Duration::from_millis(200));
    run("resend-refused-wait", options, true).await;
}
