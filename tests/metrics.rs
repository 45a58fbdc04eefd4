// A binary of its own: it installs the process's one global metrics recorder.
//! Metrics (feature `metrics`): a scripted workload against a real server, read back through
//! `metrics-util`'s debugging recorder — exact counts per label and outcome, and no rendered
//! key in any label.

use std::collections::BTreeMap;
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager, LockOptions};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use test_support::{eventually, RedisServer};

const LABEL: &str = "metrics::job k:{id}";
const HOLDER: &str = "metrics::holder";

/// `(name, sorted labels)` → the value: a counter's count, a gauge's value, a histogram's
/// number of samples.
type Seen = BTreeMap<(String, Vec<(String, String)>), i64>;

fn read(snapshotter: &metrics_util::debugging::Snapshotter) -> Seen {
    let mut seen = Seen::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|label| (label.key().to_owned(), label.value().to_owned()))
            .collect();
        labels.sort();
        let value = match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(count)) => i64::try_from(count).unwrap(),
            // The gauge counts whole locks: it only ever moves by 1.
            #[allow(clippy::cast_possible_truncation)]
            (MetricKind::Gauge, DebugValue::Gauge(value)) => value.into_inner().round() as i64,
            (MetricKind::Histogram, DebugValue::Histogram(samples)) => {
                i64::try_from(samples.len()).unwrap()
            }
            (kind, value) => panic!("{kind:?} with {value:?}"),
        };
        seen.insert((key.name().to_owned(), labels), value);
    }
    seen
}

fn get(seen: &Seen, name: &str, labels: &[(&str, &str)]) -> i64 {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    seen.get(&(name.to_owned(), labels)).copied().unwrap_or(0)
}

fn labelled(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).label(LABEL)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_workload_gives_exact_counts_per_label_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let other = LockManager::connect(&server.url()).await.unwrap();
    let long = Duration::from_secs(30);

    // Three acquired and released.
    for id in 1..=3 {
        let guard = manager
            .acquire(&format!("k:{id}"), &labelled(long))
            .await
            .unwrap();
        guard.release().await.unwrap();
    }
    // Held by another: one attempt finds it busy, a short wait times out.
    let holder = other
        .acquire("k:busy", &LockOptions::new().label(HOLDER))
        .await
        .unwrap();
    assert!(manager
        .try_acquire("k:busy", &labelled(long))
        .await
        .unwrap()
        .is_none());
    let waited = manager
        .acquire(
            "k:busy",
            &labelled(long).timeout(Duration::from_millis(200)),
        )
        .await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    holder.release().await.unwrap();
    // Lost: its ttl ran out before the release.
    let lost = manager
        .acquire("k:lost", &labelled(Duration::from_millis(100)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(lost.release().await, Err(LockError::Lost { .. })));
    // Dropped: released in the background.
    drop(manager.acquire("k:dropped", &labelled(long)).await.unwrap());
    eventually(
        Duration::from_secs(10),
        "the dropped guard's release",
        || !server.exists("lock:k:dropped"),
    )
    .await;
    // Refused: a release, then an acquisition, that the server's ACL forbids.
    let refused = manager.acquire("k:acl", &labelled(long)).await.unwrap();
    let acl = |rules: &[&str]| {
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg(rules)
            .query(&mut server.conn())
            .unwrap();
    };
    acl(&["-eval", "-evalsha", "-set"]);
    assert!(matches!(refused.release().await, Err(LockError::Redis(_))));
    let failed = manager
        .acquire(
            "k:refused",
            &labelled(long).timeout(Duration::from_millis(500)),
        )
        .await;
    assert!(matches!(failed, Err(LockError::Redis(_))), "{failed:?}");
    acl(&["+@all"]);
    // No label.
    manager
        .acquire("plain:1", &LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    let seen = read(&snapshotter);
    let outcome = |label, outcome| {
        get(
            &seen,
            "distlock_acquisitions_total",
            &[("label", label), ("outcome", outcome)],
        )
    };
    assert_eq!(outcome(LABEL, "acquired"), 6, "{seen:#?}");
    assert_eq!(outcome(LABEL, "busy"), 1, "{seen:#?}");
    assert_eq!(outcome(LABEL, "timeout"), 1, "{seen:#?}");
    assert_eq!(outcome(LABEL, "error"), 1, "{seen:#?}");
    assert_eq!(outcome(HOLDER, "acquired"), 1, "{seen:#?}");
    assert_eq!(outcome("unlabelled", "acquired"), 1, "{seen:#?}");
    let label = [("label", LABEL)];
    assert_eq!(get(&seen, "distlock_wait_seconds", &label), 6, "{seen:#?}");
    assert_eq!(get(&seen, "distlock_hold_seconds", &label), 6, "{seen:#?}");
    assert_eq!(get(&seen, "distlock_lost_total", &label), 1, "{seen:#?}");
    assert_eq!(
        get(&seen, "distlock_release_failures_total", &label),
        1,
        "{seen:#?}"
    );
    for label in [LABEL, HOLDER, "unlabelled"] {
        assert_eq!(
            get(&seen, "distlock_held", &[("label", label)]),
            0,
            "{seen:#?}"
        );
    }
    assert_eq!(get(&seen, "distlock_hold_seconds", &[("label", HOLDER)]), 1);
    // The server keeps lock keys (no memory limit), as the check at connect found.
    let address = format!("127.0.0.1:{}", server.port());
    let risk = [("server", address.as_str())];
    assert!(
        seen.contains_key(&(
            "distlock_eviction_risk".to_owned(),
            vec![("server".to_owned(), address.clone())]
        )),
        "{seen:#?}"
    );
    assert_eq!(get(&seen, "distlock_eviction_risk", &risk), 0, "{seen:#?}");

    // Every label is a label, an outcome or a server's address: never a rendered key.
    for (name, labels) in seen.keys() {
        assert!(name.starts_with("distlock_"), "{name}");
        for (key, value) in labels {
            let allowed = match key.as_str() {
                "label" => [LABEL, HOLDER, "unlabelled"].contains(&value.as_str()),
                "outcome" => ["acquired", "busy", "timeout", "error"].contains(&value.as_str()),
                "server" => name == "distlock_eviction_risk" && *value == address,
                _ => false,
            };
            assert!(allowed, "{name} has the label {key}={value:?}");
        }
    }

    // Held now: up while held, down after. (Each snapshot drains what it read, so the second
    // and third read the change since the one before.)
    let guard = manager.acquire("k:gauge", &labelled(long)).await.unwrap();
    assert_eq!(get(&read(&snapshotter), "distlock_held", &label), 1);
    guard.release().await.unwrap();
    assert_eq!(get(&read(&snapshotter), "distlock_held", &label), -1);

    // A server that may evict lock keys: its gauge is 1 once connected.
    let evicting =
        RedisServer::start_with(&["--maxmemory", "10mb", "--maxmemory-policy", "volatile-lru"]);
    let _evicting_manager = LockManager::connect(&evicting.url()).await.unwrap();
    let address = format!("127.0.0.1:{}", evicting.port());
    assert_eq!(
        get(
            &read(&snapshotter),
            "distlock_eviction_risk",
            &[("server", address.as_str())]
        ),
        1
    );
}

/// A label longer than the lock's value keeps (a label built from data, by mistake) is cut in
/// the metrics as in the value, so the series `distlock list` names by its label is the one
/// the metrics name, and a huge label does not ride along with every sample.
#[test]
fn a_huge_label_is_cut_in_the_metrics_as_in_the_lock_value() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let huge = "é".repeat(1 << 16);
    let server = RedisServer::start();
    let shown = metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let manager = LockManager::connect(&server.url()).await.unwrap();
            let guard = manager
                .acquire("k:huge", &LockOptions::new().label(huge.as_str()))
                .await
                .unwrap();
            let shown = manager.inspect("k:huge").await.unwrap().unwrap();
            guard.release().await.unwrap();
            shown.holder.unwrap().label
        })
    });
    assert!(shown.len() <= 200, "{}", shown.len());
    let seen = read(&snapshotter);
    let labels: Vec<_> = seen
        .keys()
        .flat_map(|(_, labels)| labels)
        .filter(|(name, _)| name == "label")
        .map(|(_, value)| value.clone())
        .collect();
    assert!(!labels.is_empty(), "{seen:#?}");
    for label in labels {
        assert_eq!(
            label, shown,
            "the metrics' label is not the one inspection shows"
        );
    }
}

#[distributed_lock(key = "metrics-order-a:{id}", ttl = 10)]
async fn a_then_b(id: u32) -> Result<(), LockError> {
    b_alone(id).await
}

#[distributed_lock(key = "metrics-order-b:{id}", ttl = 10)]
async fn b_alone(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "metrics-order-b:{id}", ttl = 10)]
async fn b_then_a(id: u32) -> Result<(), LockError> {
    a_alone(id).await
}

#[distributed_lock(key = "metrics-order-a:{id}", ttl = 10)]
async fn a_alone(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

/// Two key templates taken in both orders count one inversion, however often either order
/// runs afterwards.
#[test]
fn a_lock_order_inversion_is_counted_once_per_pair() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            test_support::global_server().await;
            for id in 0..3 {
                a_then_b(id).await.unwrap();
                b_then_a(id).await.unwrap();
            }
        });
    });
    let seen = read(&snapshotter);
    assert_eq!(
        get(
            &seen,
            "distlock_lock_order_inversions_total",
            &[
                ("first", "metrics-order-b:{id}"),
                ("second", "metrics-order-a:{id}")
            ]
        ),
        1,
        "{seen:#?}"
    );
}
