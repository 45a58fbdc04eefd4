//! `LockManager::sentinel_builder` with `rediss://` sentinels (the `tls` feature): against a
//! Sentinel deployment where the master, the replica and the sentinels speak only TLS, locks
//! and hand-offs live on the master, a failover is followed, a certificate the manager does not
//! trust is a clear error in bounded time, and sentinel URLs that mix TLS with plain text are a
//! `Config` error.

#[cfg(feature = "tls")]
mod tls {
    use std::time::Duration;

    use distlock::{LockError, LockManager};
    use test_support::sentinel::SERVICE;
    use test_support::{skip_without, unique_temp_dir, Feature, SentinelSet, TlsFiles};
    use tokio::time::Instant;

    use crate::sentinel::{
        assert_handed_at_once, assert_lives_on_the_master, hand_off_through_the_sentinels,
        run_through_failover, MasterReads,
    };

    /// A TLS Sentinel set, or `None` (after saying so) on a server built without TLS.
    fn tls_set(test: &str) -> Option<SentinelSet> {
        (!skip_without(Feature::Tls, test)).then(SentinelSet::start_tls)
    }

    /// What the master holds at `key`, asked over TLS (`None` for a missing key).
    fn master_get(set: &SentinelSet, key: &str) -> Option<String> {
        let reply = set.master().tls_cli(&["GET", key]);
        (!reply.is_empty()).then_some(reply)
    }

    /// The master read over TLS.
    const OVER_TLS: MasterReads = MasterReads {
        get: master_get,
        has_line: |set| !set.master().tls_cli(&["KEYS", "*line*"]).is_empty(),
    };

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn locks_live_on_the_tls_master_the_sentinels_name() {
        let Some(set) = tls_set("locks_live_on_the_tls_master_the_sentinels_name") else {
            return;
        };
        assert!(set.sentinel_urls()[0].starts_with("rediss://"));
        assert_lives_on_the_master(&hand_off_through_the_sentinels(&set, &OVER_TLS).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_through_tls_sentinels_hands_the_lock_to_a_waiter_at_once() {
        let Some(set) =
            tls_set("a_release_through_tls_sentinels_hands_the_lock_to_a_waiter_at_once")
        else {
            return;
        };
        assert_handed_at_once(&hand_off_through_the_sentinels(&set, &OVER_TLS).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fencing_tokens_rise_across_a_hand_off_through_tls_sentinels() {
        let Some(set) = tls_set("fencing_tokens_rise_across_a_hand_off_through_tls_sentinels")
        else {
            return;
        };
        let (fence, next_fence) = hand_off_through_the_sentinels(&set, &OVER_TLS).await.fences;
        assert!(next_fence > fence);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mutual_exclusion_holds_through_a_sentinel_failover_over_tls() {
        let Some(set) = tls_set("mutual_exclusion_holds_through_a_sentinel_failover_over_tls")
        else {
            return;
        };
        run_through_failover(&set, "SENTINEL FAILOVER over TLS", |set| {
            let old = set.master();
            set.failover();
            old
        })
        .await;
    }

    /// Not trusting the set's CA — the system roots, or another CA — is refused with the
    /// message of a refused certificate, within the connect's bound, not a hang.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_untrusted_certificate_is_a_clear_error_not_a_hang() {
        let Some(set) = tls_set("an_untrusted_certificate_is_a_clear_error_not_a_hang") else {
            return;
        };
        let other_dir = unique_temp_dir("other-ca");
        let other = TlsFiles::generate(&other_dir);
        for (trust, what) in [
            (None, "the system roots"),
            (Some(other.ca_pem()), "another CA"),
        ] {
            let builder = LockManager::sentinel_builder(&set.sentinel_urls(), SERVICE)
                .connect_timeout(Duration::from_secs(2));
            let builder = match trust {
                Some(pem) => builder.tls_root_certificate(pem),
                None => builder,
            };
            let started = Instant::now();
            let result = tokio::time::timeout(Duration::from_secs(60), builder.connect())
                .await
                .unwrap_or_else(|_| panic!("trusting {what}, connect hangs"));
            let error = result.expect_err(what);
            let message = error.to_string();
            eprintln!("trusting {what}: {message} after {:?}", started.elapsed());
            assert!(
                matches!(error, LockError::Redis(_)),
                "trusting {what}: expected LockError::Redis, got {error:?}"
            );
            assert!(
                message.contains("certificate") && message.contains("tls_root_certificate"),
                "trusting {what}, the message says the certificate was not accepted and what \
                 to do: {message}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "trusting {what}, took {:?}",
                started.elapsed()
            );
        }
        let _ = std::fs::remove_dir_all(&other_dir);
    }

    /// Sentinel URLs that mix `rediss://` with `redis://` cannot say how to reach the master:
    /// a `Config` error that says to use one scheme, before any connection.
    #[tokio::test]
    async fn mixed_schemes_among_the_sentinels_are_a_config_error() {
        let urls = [
            "rediss://127.0.0.1:26379".to_owned(),
            "redis://:hunter2@127.0.0.1:26380".to_owned(),
        ];
        let error = LockManager::sentinel_builder(&urls, SERVICE)
            .connect()
            .await
            .expect_err("mixed schemes are refused");
        let LockError::Config(message) = &error else {
            panic!("expected LockError::Config, got {error:?}");
        };
        assert!(
            message.contains("1 of the 2 sentinel URLs are `rediss://`")
                && message.contains("same scheme"),
            "{message}"
        );
        assert!(!message.contains("hunter2"), "{message}");
    }
}
