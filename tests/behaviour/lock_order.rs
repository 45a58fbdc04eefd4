//! Lock order across the fleet, against a real Redis: two processes that take two key
//! templates in opposite orders (one after the other, never deadlocking) — the second is warned
//! once, naming both templates and the four functions, and the record in Redis lists the
//! inversion and expires; a repeat warns no more; the in-process backend warns and lists as
//! Redis does; the blocking form orders its templates by thread; a full record keeps its cap
//! and still tells a new order's opposite.
//!
//! Each case runs in worker processes of its own, with a redis-server of its own: the record
//! of orders is per process (a process warns once per pair for its life) and per key prefix.

use std::future::Future;
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager, LockOrder};
use test_support::{spawn_worker, wait_all, RedisServer};

use crate::traced::{self, Recorder};

/// The worker's Redis URL.
const URL: &str = "DISTLOCK_ORDER_WORKER_URL";
/// Which part of the two-process case the worker plays: `charge` or `refund`.
const ROLE: &str = "DISTLOCK_ORDER_WORKER_ROLE";
/// The pid of the process that played `charge`, for the `refund` worker.
const OTHER_PID: &str = "DISTLOCK_ORDER_OTHER_PID";
/// The fleet's record of orders for the default key prefix `lock:`.
const ORDERS_KEY: &str = "{lock:}:distlock:orders";
/// How long a worker waits for what the background record does.
const SETTLE: Duration = Duration::from_secs(20);

fn env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is set by the test that starts this worker"))
}

/// The lock-order warnings recorded so far that name `template`.
fn warnings_naming(template: &str) -> Vec<String> {
    traced::events()
        .into_iter()
        .filter(|event| {
            event.starts_with("WARN distlock ")
                && event.contains("lock order inversion")
                && event.contains(template)
        })
        .collect()
}

/// Runs `body` on a one-thread runtime, with the recording subscriber as this thread's: every
/// task of the body runs here, and distlock's background record warns to the subscriber of
/// the thread that took the lock.
fn traced<F: Future>(body: F) -> F::Output {
    let _tracing = tracing::subscriber::set_default(Recorder);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(body)
}

/// Waits until `manager`'s record lists `first` → `second`, and returns it.
async fn recorded(manager: &LockManager, first: &str, second: &str) -> LockOrder {
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        let orders = manager.orders().await.expect("the record of orders");
        if let Some(order) = orders
            .into_iter()
            .find(|order| order.first == first && order.second == second)
        {
            return order;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{first} → {second} not recorded after {SETTLE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_names(warning: &str, named: &[&str]) {
    for named in named {
        assert!(warning.contains(named), "`{named}` missing from {warning}");
    }
}

fn run_workers(worker: &str, env: &[(&str, String)]) -> u32 {
    let child = spawn_worker(worker, env);
    let pid = child.id();
    for status in wait_all(vec![child], Duration::from_secs(120)) {
        assert!(status.success(), "the worker {worker} failed: {status}");
    }
    pid
}

// ---------------------------------------------------------------------------------------------
// Two processes, opposite orders
// ---------------------------------------------------------------------------------------------

#[distributed_lock(key = "fleet-invoice:{id}", ttl = 10)]
async fn charge(id: u32) -> Result<(), LockError> {
    debit(id).await
}

#[distributed_lock(key = "fleet-account:{id}", ttl = 10)]
async fn debit(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "fleet-account:{id}", ttl = 10)]
async fn refund(id: u32) -> Result<(), LockError> {
    credit(id).await
}

#[distributed_lock(key = "fleet-invoice:{id}", ttl = 10)]
async fn credit(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

/// One process of the fleet: `charge` takes invoice then account, `refund` account then
/// invoice, after it.
pub(crate) fn fleet_worker() {
    let url = env(URL);
    traced(async {
        distlock::init(&url).await.unwrap();
        let manager = distlock::global().unwrap();
        match env(ROLE).as_str() {
            "charge" => {
                charge(1).await.unwrap();
                recorded(manager, "fleet-invoice:{id}", "fleet-account:{id}").await;
                assert!(
                    warnings_naming("fleet-invoice:{id}").is_empty(),
                    "one order is no inversion: {:?}",
                    warnings_naming("fleet-invoice:{id}")
                );
            }
            "refund" => {
                refund(1).await.unwrap();
                test_support::eventually(SETTLE, "the fleet's lock-order warning", || {
                    !warnings_naming("fleet-invoice:{id}").is_empty()
                })
                .await;
                // Again, and the other way round (which this process now sees for the first
                // time): the pair was warned about, so neither warns again.
                refund(2).await.unwrap();
                charge(3).await.unwrap();
                recorded(manager, "fleet-account:{id}", "fleet-invoice:{id}").await;
                // The repeat's record, made in the background, answers meanwhile.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let warned = warnings_naming("fleet-invoice:{id}");
                assert_eq!(warned.len(), 1, "once per pair: {warned:?}");
                assert_names(
                    &warned[0],
                    &[
                        "fleet-account:{id}",
                        "`behaviour::lock_order::refund`",
                        "`behaviour::lock_order::credit`",
                        "`behaviour::lock_order::charge`",
                        "`behaviour::lock_order::debit`",
                        &format!(" {}` (first seen", env(OTHER_PID)),
                    ],
                );
            }
            role => panic!("no role {role:?}"),
        }
    });
}

#[test]
fn two_processes_taking_two_templates_in_opposite_orders_are_warned_once_and_listed() {
    let server = RedisServer::start();
    let charged = run_workers(
        "lock_order::fleet_worker",
        &[(URL, server.url()), (ROLE, "charge".into())],
    );
    let refunded = run_workers(
        "lock_order::fleet_worker",
        &[
            (URL, server.url()),
            (ROLE, "refund".into()),
            (OTHER_PID, charged.to_string()),
        ],
    );

    let orders = test_support::runtime(1)
        .block_on(async { test_support::connect(&server).await.orders().await.unwrap() });
    let find = |first: &str| {
        orders
            .iter()
            .find(|order| order.first == first)
            .unwrap_or_else(|| panic!("no order from {first}: {orders:?}"))
    };
    let (forward, backward) = (find("fleet-invoice:{id}"), find("fleet-account:{id}"));
    assert_eq!(orders.len(), 2, "{orders:?}");
    assert!(forward.is_opposite(backward), "{orders:?}");
    assert_eq!(
        (forward.holder.as_str(), forward.taker.as_str()),
        (
            "behaviour::lock_order::charge",
            "behaviour::lock_order::debit"
        )
    );
    assert!(
        forward.process.ends_with(&format!(" {charged}")),
        "{forward:?}"
    );
    assert_eq!(
        (backward.holder.as_str(), backward.taker.as_str()),
        (
            "behaviour::lock_order::refund",
            "behaviour::lock_order::credit"
        )
    );
    assert!(
        backward.process.ends_with(&format!(" {refunded}")),
        "{backward:?}"
    );
    // Kept a week after its last write, so it does not live for ever.
    let week = 7 * 24 * 3600 * 1000;
    let pttl = server.pttl(ORDERS_KEY);
    assert!(pttl > week - 600_000 && pttl <= week, "{pttl}");
}

// ---------------------------------------------------------------------------------------------
// In process
// ---------------------------------------------------------------------------------------------

pub(crate) fn in_process_worker() {
    traced(async {
        distlock::init_with(LockManager::in_process()).unwrap();
        charge(1).await.unwrap();
        assert!(warnings_naming("fleet-invoice:{id}").is_empty());
        refund(1).await.unwrap();
        let warned = warnings_naming("fleet-invoice:{id}");
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert_names(
            &warned[0],
            &[
                "fleet-account:{id}",
                "`behaviour::lock_order::refund`",
                "`behaviour::lock_order::credit`",
                "`behaviour::lock_order::charge`",
                "`behaviour::lock_order::debit`",
            ],
        );
        charge(2).await.unwrap();
        refund(2).await.unwrap();
        assert_eq!(warnings_naming("fleet-invoice:{id}").len(), 1);

        let orders = distlock::global().unwrap().orders().await.unwrap();
        let pid = format!(" {}", std::process::id());
        let inverted: Vec<&LockOrder> = orders
            .iter()
            .filter(|order| orders.iter().any(|other| order.is_opposite(other)))
            .collect();
        assert_eq!(inverted.len(), 2, "{orders:?}");
        assert!(inverted.iter().all(|order| order.process.ends_with(&pid)));
    });
}

#[test]
fn in_process_the_process_is_the_fleet() {
    run_workers("lock_order::in_process_worker", &[]);
}

// ---------------------------------------------------------------------------------------------
// Blocking
// ---------------------------------------------------------------------------------------------

#[distributed_lock(key = "blocking-invoice:{id}", ttl = 10)]
fn settle(id: u32) -> Result<(), LockError> {
    settle_account(id)
}

#[distributed_lock(key = "blocking-account:{id}", ttl = 10)]
fn settle_account(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "blocking-account:{id}", ttl = 10)]
fn reverse(id: u32) -> Result<(), LockError> {
    reverse_invoice(id)
}

#[distributed_lock(key = "blocking-invoice:{id}", ttl = 10)]
fn reverse_invoice(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

pub(crate) fn blocking_worker() {
    let _tracing = tracing::subscriber::set_default(Recorder);
    distlock::blocking::init(&env(URL)).unwrap();
    settle(1).unwrap();
    assert!(warnings_naming("blocking-invoice:{id}").is_empty());
    reverse(1).unwrap();
    reverse(2).unwrap();
    let warned = warnings_naming("blocking-invoice:{id}");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_names(
        &warned[0],
        &[
            "blocking-account:{id}",
            "`behaviour::lock_order::settle`",
            "`behaviour::lock_order::settle_account`",
            "`behaviour::lock_order::reverse`",
            "`behaviour::lock_order::reverse_invoice`",
        ],
    );
    // And the fleet's record has both.
    let manager = distlock::blocking::global().unwrap().as_async().clone();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let forward =
                recorded(&manager, "blocking-invoice:{id}", "blocking-account:{id}").await;
            let backward =
                recorded(&manager, "blocking-account:{id}", "blocking-invoice:{id}").await;
            assert!(forward.is_opposite(&backward));
        });
}

#[test]
fn locked_plain_fns_order_their_templates_by_thread() {
    let server = RedisServer::start();
    run_workers("lock_order::blocking_worker", &[(URL, server.url())]);
}

// ---------------------------------------------------------------------------------------------
// The cap
// ---------------------------------------------------------------------------------------------

#[distributed_lock(key = "cap-invoice:{id}", ttl = 10)]
async fn capped_charge(id: u32) -> Result<(), LockError> {
    capped_debit(id).await
}

#[distributed_lock(key = "cap-account:{id}", ttl = 10)]
async fn capped_debit(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

pub(crate) fn cap_worker() {
    let url = env(URL);
    traced(async {
        distlock::init(&url).await.unwrap();
        capped_charge(1).await.unwrap();
        test_support::eventually(
            SETTLE,
            "the warning of an order the full record holds",
            || !warnings_naming("cap-invoice:{id}").is_empty(),
        )
        .await;
        assert_names(
            &warnings_naming("cap-invoice:{id}")[0],
            &[
                "`app::refund`",
                "`app::credit`",
                "`behaviour::lock_order::capped_charge`",
                "`other-host 7`",
            ],
        );
    });
}

#[test]
fn a_full_record_keeps_its_cap_and_still_tells_the_opposite_order() {
    const CAP: usize = 10_000;
    let server = RedisServer::start();
    let mut conn = server.conn();
    let mut fields: Vec<(String, String)> = (1..CAP)
        .map(|n| {
            (
                format!("filler-{n}:{{id}}\nother:{{id}}"),
                "1\nh 1\na::f\na::g".to_owned(),
            )
        })
        .collect();
    fields.push((
        "cap-account:{id}\ncap-invoice:{id}".to_owned(),
        "1700000000000\nother-host 7\napp::refund\napp::credit".to_owned(),
    ));
    for chunk in fields.chunks(1000) {
        let mut hset = redis::cmd("HSET");
        hset.arg(ORDERS_KEY);
        for (field, value) in chunk {
            hset.arg(field).arg(value);
        }
        hset.query::<()>(&mut conn).unwrap();
    }

    run_workers("lock_order::cap_worker", &[(URL, server.url())]);

    let len: usize = redis::cmd("HLEN").arg(ORDERS_KEY).query(&mut conn).unwrap();
    assert_eq!(len, CAP);
    let kept: bool = redis::cmd("HEXISTS")
        .arg(ORDERS_KEY)
        .arg("cap-invoice:{id}\ncap-account:{id}")
        .query(&mut conn)
        .unwrap();
    assert!(!kept, "a new order past the cap is not recorded");
}
