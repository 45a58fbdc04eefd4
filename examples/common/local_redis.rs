//! The examples' Redis: the one at `REDIS_URL`; else the one at the default address; else, when
//! `redis-server` is installed, a private one started on a free port for this run only, stopped
//! when the example ends — also on Ctrl-C. When none of these works, the example exits with
//! instructions (never with the URL's password: only `host:port` is printed).
//!
//! Your own program connects to its own Redis: it needs none of this.

// Each example compiles this module on its own and uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Where the examples look when `REDIS_URL` is not set.
pub(crate) const DEFAULT_URL: &str = "redis://127.0.0.1:6379";
/// How long a private server may take to answer its first PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The Redis an example runs against; stops the private server, if it started one, on drop.
pub(crate) struct LocalRedis {
    url: String,
    /// Shared with the Ctrl-C watcher of [`LocalRedis::or_exit`].
    private: Arc<Mutex<Option<PrivateServer>>>,
}

struct PrivateServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl LocalRedis {
    /// The URL to connect to.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Finds a Redis as the module docs say. `url`: the one the user named (`--redis-url`),
    /// else `REDIS_URL`; `start`: start a private server without looking anywhere else
    /// (`--start-redis`). `Err` carries the exit code, after the instructions were printed.
    pub(crate) async fn find_or_start(
        example: &str,
        url: Option<String>,
        start: bool,
    ) -> Result<LocalRedis, ExitCode> {
        if !start {
            let named = url.or_else(|| std::env::var("REDIS_URL").ok());
            let candidate = named.clone().unwrap_or_else(|| DEFAULT_URL.to_owned());
            match ping(&candidate).await {
                Ok(()) => {
                    return Ok(LocalRedis {
                        url: candidate,
                        private: Arc::default(),
                    })
                }
                // The user named this server: use it or say why not, never another one.
                Err(error) if named.is_some() => {
                    eprintln!(
                        "error: no Redis answers at {} ({error}).\n\n\
                         Start one there, or unset REDIS_URL to let `{example}` start a \
                         private redis-server for its run.",
                        redacted(&candidate)
                    );
                    return Err(ExitCode::from(2));
                }
                Err(_) => {}
            }
        }
        // Until the server answers, Ctrl-C drops the start, and with it the server.
        let started = tokio::select! {
            started = PrivateServer::start_and_wait() => started,
            () = interrupted() => {
                eprintln!("interrupted while starting a private redis-server: stopped it");
                return Err(ExitCode::from(130));
            }
        };
        match started {
            Ok(server) => {
                if !start {
                    print!("no Redis answers at {}: ", redacted(DEFAULT_URL));
                }
                println!(
                    "started a private redis-server (pid {}) on port {} for this run; it stops \
                     when {example} ends",
                    server.child.id(),
                    server.port
                );
                Ok(LocalRedis {
                    url: format!("redis://127.0.0.1:{}", server.port),
                    private: Arc::new(Mutex::new(Some(server))),
                })
            }
            Err(why) => {
                eprintln!(
                    "error: no Redis answers at {} and {why}.\n\n\
                     Install Redis (Debian/Ubuntu: `apt-get install -y redis-server`; macOS: \
                     `brew install redis`) and run `{example}` again: it starts a private \
                     redis-server for its run. Or point it at a running Redis with \
                     REDIS_URL=redis://host:port.",
                    redacted(DEFAULT_URL)
                );
                Err(ExitCode::from(2))
            }
        }
    }

    /// For a short example: [`LocalRedis::find_or_start`] (`--start-redis` read from the command
    /// line), exiting with instructions when there is no Redis; on Ctrl-C or SIGTERM the
    /// private server is stopped and the process exits.
    pub(crate) async fn or_exit(example: &str) -> LocalRedis {
        let start = std::env::args().any(|arg| arg == "--start-redis");
        // On `Err` the instructions are printed and any server it started is stopped already.
        let redis = match LocalRedis::find_or_start(example, None, start).await {
            Ok(redis) => redis,
            Err(code) => exit_with(code),
        };
        let private = Arc::clone(&redis.private);
        tokio::spawn(async move {
            interrupted().await;
            stop(&private);
            std::process::exit(130);
        });
        redis
    }

    /// Runs `work` until it completes, or until the process is told to stop (Ctrl-C, SIGTERM):
    /// `None` then, and `work` is dropped, so what it started is stopped.
    pub(crate) async fn until_interrupted<F: std::future::Future>(
        &self,
        work: F,
    ) -> Option<F::Output> {
        tokio::select! {
            output = work => Some(output),
            () = interrupted() => {
                eprintln!("interrupted: stopping");
                None
            }
        }
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        stop(&self.private);
    }
}

fn stop(private: &Mutex<Option<PrivateServer>>) {
    let server = private
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    drop(server);
}

impl PrivateServer {
    /// Starts a server and waits until it answers. A port found free can be taken by someone
    /// else before the server binds it: the server then exits, and another port is tried.
    async fn start_and_wait() -> Result<PrivateServer, String> {
        let mut last = String::new();
        for _ in 0..3 {
            let mut server = PrivateServer::start()?;
            let url = format!("redis://127.0.0.1:{}", server.port);
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                if ping(&url).await.is_ok() {
                    return Ok(server);
                }
                if let Ok(Some(status)) = server.child.try_wait() {
                    last = format!("the redis-server it started exited ({status})");
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "the redis-server it started did not answer within {START_TIMEOUT:?}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Err(last)
    }

    /// Starts `redis-server` on a free port, persisting nothing, in a directory of its own.
    /// `Err` says why not.
    fn start() -> Result<PrivateServer, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|error| format!("no free port could be found ({error})"))?
            .port();
        let dir =
            std::env::temp_dir().join(format!("distlock-example-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|error| format!("{} could not be created ({error})", dir.display()))?;
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| match error.kind() {
                std::io::ErrorKind::NotFound => {
                    "`redis-server` is not installed (not on PATH)".to_owned()
                }
                _ => format!("`redis-server` could not be started ({error})"),
            });
        match child {
            Ok(child) => Ok(PrivateServer { child, port, dir }),
            Err(why) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(why)
            }
        }
    }
}

/// However a server goes away — stopped at the end, given up on, its start abandoned — the
/// process is stopped with it, so no `redis-server` outlives the example.
impl Drop for PrivateServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Exits with `code` (2: no Redis; 130: interrupted).
fn exit_with(code: ExitCode) -> ! {
    std::process::exit(if code == ExitCode::from(130) { 130 } else { 2 })
}

/// Completes at Ctrl-C (SIGINT) or SIGTERM.
async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// One PING, bounded.
async fn ping(url: &str) -> Result<(), redis::RedisError> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(1)));
    let client = redis::Client::open(url)?;
    let mut connection = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    redis::cmd("PING").query_async(&mut connection).await
}

/// `url` without its user name and password.
pub(crate) fn redacted(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, _)), Some(at)) => format!("{scheme}://***@{}", &url[at + 1..]),
        _ => url.to_owned(),
    }
}
