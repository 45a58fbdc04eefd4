//! A server that may evict lock keys under memory pressure is named at connect: one `tracing`
//! warning (target `distlock`) with the policy, what it does to locks and the fix; none for a
//! server that keeps them; a server that refuses `CONFIG` is said to be unchecked. Every
//! master of a cluster is checked, and a Sentinel service's new master after a failover.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::LockManager;
use test_support::sentinel::SERVICE;
use test_support::{RedisCluster, RedisServer, SentinelSet};

/// One event: its level and its message with its fields.
#[derive(Debug, Clone)]
struct Event {
    level: tracing::Level,
    text: String,
}

/// Keeps every `distlock` event of the thread it is the default of.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<Event>>>);

impl Captured {
    fn events(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }

    /// The events of `level` whose text holds `needle`.
    fn find(&self, level: tracing::Level, needle: &str) -> Vec<String> {
        self.events()
            .into_iter()
            .filter(|event| event.level == level && event.text.contains(needle))
            .map(|event| event.text)
            .collect()
    }
}

struct Text(String);

impl tracing::field::Visit for Text {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?}"));
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl tracing::Subscriber for Captured {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "distlock"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut text = Text(String::new());
        event.record(&mut text);
        self.0.lock().unwrap().push(Event {
            level: *event.metadata().level(),
            text: text.0,
        });
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Connects to `url` on a runtime of this thread only, whose events `Captured` keeps (the
/// check runs in a task of that runtime, on this thread); returns what it kept.
fn connect_capturing(connect: impl std::future::Future<Output = LockManager>) -> Captured {
    let captured = Captured::default();
    let _default = tracing::subscriber::set_default(captured.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let manager = connect.await;
        // The first connection is checked before `connect` returns: nothing to wait for.
        // A lock round trip on the same connection must not warn again.
        let guard = manager
            .acquire("eviction-check", &distlock::LockOptions::new())
            .await
            .unwrap();
        guard.release().await.unwrap();
    });
    captured
}

fn server_with_policy(policy: &str) -> RedisServer {
    RedisServer::start_with(&["--maxmemory", "10mb", "--maxmemory-policy", policy])
}

fn warns_for(policy: &str) {
    let server = server_with_policy(policy);
    let url = server.url();
    let captured = connect_capturing(async { LockManager::connect(&url).await.unwrap() });
    let address = format!("127.0.0.1:{}", server.port());
    let warnings = captured.find(tracing::Level::WARN, "may evict lock keys");
    assert_eq!(warnings.len(), 1, "one warning: {:?}", captured.events());
    let warning = &warnings[0];
    for needle in [
        address.as_str(),
        policy,
        "second holder",
        "fencing",
        "maxmemory-policy noeviction",
        "a Redis of their own",
    ] {
        assert!(warning.contains(needle), "{needle:?} in {warning}");
    }
}

#[test]
fn allkeys_lru_with_a_memory_limit_is_warned_about_at_connect() {
    warns_for("allkeys-lru");
}

/// `volatile-*` evicts keys with an expiry, and every lock key has one.
#[test]
fn volatile_lru_with_a_memory_limit_is_warned_about_at_connect() {
    warns_for("volatile-lru");
}

#[test]
fn noeviction_and_no_limit_are_not_warned_about() {
    for server in [
        server_with_policy("noeviction"),
        RedisServer::start_with(&["--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"]),
    ] {
        let url = server.url();
        let captured = connect_capturing(async { LockManager::connect(&url).await.unwrap() });
        let said: Vec<Event> = captured
            .events()
            .into_iter()
            .filter(|event| event.text.contains("evict"))
            .filter(|event| event.level <= tracing::Level::INFO)
            .collect();
        assert!(said.is_empty(), "{said:?}");
    }
}

/// An ACL without `CONFIG` (as managed services give): connect works, and says once that the
/// policy could not be checked and how to check it by hand; the password is never shown.
#[test]
fn a_server_that_refuses_config_is_said_to_be_unchecked() {
    let server = server_with_policy("allkeys-lru");
    let () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "app", "on", ">s3cret", "~*", "&*", "+@all", "-config",
            ][..],
        )
        .query(&mut server.conn())
        .unwrap();
    let url = format!("redis://app:s3cret@127.0.0.1:{}", server.port());
    let captured = connect_capturing(async { LockManager::connect(&url).await.unwrap() });
    let unchecked = captured.find(tracing::Level::INFO, "could not check");
    assert_eq!(unchecked.len(), 1, "{:?}", captured.events());
    assert!(
        unchecked[0].contains("CONFIG GET maxmemory*"),
        "{}",
        unchecked[0]
    );
    assert!(
        captured.find(tracing::Level::WARN, "may evict").is_empty(),
        "nothing is known, so nothing is claimed: {:?}",
        captured.events()
    );
    assert!(
        captured
            .events()
            .iter()
            .all(|event| !event.text.contains("s3cret")),
        "{:?}",
        captured.events()
    );
}

/// On a cluster every master is checked, each named once.
#[test]
fn every_master_of_a_cluster_is_checked() {
    let cluster = RedisCluster::start(3, 0);
    let evicting: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|node| {
            for (name, value) in [("maxmemory", "10mb"), ("maxmemory-policy", "volatile-lru")] {
                let () = redis::cmd("CONFIG")
                    .arg("SET")
                    .arg(name)
                    .arg(value)
                    .query(&mut node.conn())
                    .unwrap();
            }
            format!("127.0.0.1:{}", node.port())
        })
        .collect();
    let urls = cluster.urls();
    let captured =
        connect_capturing(async { LockManager::cluster_builder(&urls).connect().await.unwrap() });
    let warnings = captured.find(tracing::Level::WARN, "may evict lock keys");
    for address in &evicting {
        let named = warnings
            .iter()
            .filter(|warning| warning.contains(&format!("Redis at {address} ")))
            .count();
        assert_eq!(named, 1, "{address}: {:#?}", captured.events());
    }
    assert_eq!(warnings.len(), evicting.len(), "{warnings:#?}");
}

/// A Sentinel failover to a server that may evict lock keys is warned about when the manager
/// follows it: the new master is checked at the first connection made to it.
#[test]
fn a_sentinel_failover_to_an_evicting_master_is_warned_about() {
    let set = SentinelSet::start();
    let replica = set.replica();
    for (name, value) in [("maxmemory", "10mb"), ("maxmemory-policy", "allkeys-lru")] {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut replica.conn())
            .unwrap();
    }
    let promoted = format!("127.0.0.1:{}", replica.port());
    let captured = Captured::default();
    let _default = tracing::subscriber::set_default(captured.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let manager = runtime.block_on(async {
        LockManager::sentinel_builder(&set.sentinel_urls(), SERVICE)
            .connect()
            .await
            .unwrap()
    });
    assert!(
        captured.find(tracing::Level::WARN, "may evict").is_empty(),
        "the master keeps lock keys: {:?}",
        captured.events()
    );
    let new = set.failover();
    assert_eq!(new.port(), replica.port());
    runtime.block_on(async {
        let options = distlock::LockOptions::new().timeout(Duration::from_secs(20));
        let guard = manager.acquire("after-failover", &options).await.unwrap();
        guard.release().await.unwrap();
        // Checked once the acquire had its connection: it did not wait for the check.
        for _ in 0..100 {
            if !captured.find(tracing::Level::WARN, "may evict").is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let warnings = captured.find(tracing::Level::WARN, "may evict lock keys");
    assert_eq!(warnings.len(), 1, "{:?}", captured.events());
    assert!(
        warnings[0].contains(&format!("Redis at {promoted} ")),
        "{}",
        warnings[0]
    );
}
