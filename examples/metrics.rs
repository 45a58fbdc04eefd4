//! distlock's metrics on `/metrics` for Prometheus, while a small workload runs:
//! `cargo run --example metrics --features metrics` (needs Redis; set `REDIS_URL` if not
//! local), then `curl http://127.0.0.1:9898/metrics`. `METRICS_ADDR` moves the endpoint,
//! `SECONDS` sets how long the workload runs (default 60).
//!
//! The exporter only renders here, and a few lines of tokio serve the text, so that the
//! example does not build an HTTP stack; a service that already runs one (axum, hyper) serves
//! `handle.render()` from it the same way, and one that runs none can turn on the exporter's
//! `http-listener` feature and call `PrometheusBuilder::new().with_http_listener(addr).install()`.
use std::time::Duration;

use distlock::{LockError, LockManager, LockOptions};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let addr = std::env::var("METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:9898".into());
    let seconds: u64 = std::env::var("SECONDS").map_or(Ok(60), |s| s.parse())?;

    // Install the recorder before the first lock: metrics recorded earlier go nowhere.
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)?;
    let listener = TcpListener::bind(&addr).await?;
    println!("serving http://{addr}/metrics for {seconds} s");
    tokio::spawn(serve(listener, handle.clone()));
    tokio::spawn(async move {
        // Histograms are summarised over a window: keep it moving.
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            handle.run_upkeep();
        }
    });

    let manager = LockManager::connect(&url).await?;
    let workers: Vec<_> = (0..4)
        .map(|worker| tokio::spawn(work(manager.clone(), worker)))
        .collect();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    for worker in workers {
        worker.abort();
    }
    Ok(())
}

/// Four workers on three invoices: they wait for each other, and sometimes give up.
async fn work(manager: LockManager, worker: u64) -> Result<(), LockError> {
    let options = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .timeout(Duration::from_millis(150))
        // The label names the code path and the key template, never the invoice: one time
        // series per label, however many invoices there are.
        .label("billing::charge invoice:{id}");
    for round in 0u64.. {
        let invoice = (worker + round) % 3;
        match manager
            .acquire(&format!("invoice:{invoice}"), &options)
            .await
        {
            Ok(guard) => {
                tokio::time::sleep(Duration::from_millis(20 + 10 * (round % 5))).await;
                guard.release().await?;
            }
            Err(LockError::Timeout { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Answers every request with the current metrics, in Prometheus' text format.
async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            let body = handle.render();
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
        });
    }
}
