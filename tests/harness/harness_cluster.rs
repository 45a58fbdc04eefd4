//! Self-tests of the multi-server parts of the harness (`test_support::cluster`,
//! `test_support::tls`): a Redis Cluster with routing, failover and slot migration,
//! independent masters for Redlock, a TLS-only server and ACL users. Each checks a real
//! outcome on real servers, so the tests built on these helpers can be trusted.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use test_support::tls::run_bounded;
use test_support::{
    unique_temp_dir, wait_until, ProxiedCluster, RedisCluster, RedisServer, RedisServers, TlsFiles,
};

/// `GET key` sent to this very node, without following redirections.
fn raw_get(node: &RedisServer, key: &str) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET").arg(key).query(&mut node.conn())
}

/// Asserts that `node` answers a GET on `key` with `kind` (MOVED or ASK) pointing at `to`.
fn assert_redirect(
    node: &RedisServer,
    key: &str,
    kind: redis::ServerErrorKind,
    to: u16,
    slot: u16,
) {
    let error = raw_get(node, key).expect_err("the node should redirect, not answer");
    assert_eq!(
        error.kind(),
        redis::ErrorKind::Server(kind),
        "node {} answered GET {key:?} with {error}",
        node.port()
    );
    let (addr, redirect_slot) = error.redirect_node().expect("a redirection names a node");
    assert_eq!(addr, format!("127.0.0.1:{to}"), "redirection {error}");
    assert_eq!(redirect_slot, slot, "redirection {error}");
}

/// Runs redis-cli with `args`, expecting success, and returns its trimmed stdout.
fn redis_cli(args: &[&str]) -> String {
    let output = run_bounded(
        Command::new("redis-cli").args(args),
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| panic!("redis-cli {args:?}: {e}"));
    assert!(
        output.status.success(),
        "redis-cli {args:?} failed: {output:?}"
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

#[test]
fn a_three_master_cluster_serves_keys_on_the_master_of_their_slot() {
    let started = Instant::now();
    let cluster = RedisCluster::start(3, 0);
    eprintln!("3-master cluster started in {:?}", started.elapsed());

    assert_eq!(cluster.nodes().len(), 3);
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);
    assert_eq!(urls.iter().collect::<BTreeSet<_>>().len(), 3, "{urls:?}");
    assert_eq!(cluster.node_urls(), urls);

    // Thirty keys land on every master; each is served by node_for_key and only by it.
    let keys: Vec<String> = (0..30).map(|i| format!("harness:key:{i}")).collect();
    let mut owners = BTreeSet::new();
    for key in &keys {
        cluster.set(key, &format!("value of {key}"));
        let owner = cluster.node_for_key(key);
        owners.insert(owner.port());
        assert_eq!(
            raw_get(owner, key).unwrap(),
            Some(format!("value of {key}"))
        );
        let slot = cluster.slot_of(key);
        for other in masters.iter().filter(|m| m.port() != owner.port()) {
            assert_redirect(
                other,
                key,
                redis::ServerErrorKind::Moved,
                owner.port(),
                slot,
            );
        }
        assert_eq!(cluster.get(key), Some(format!("value of {key}")));
        assert!(cluster.exists(key));
        assert_eq!(cluster.pttl(key), -1);
    }
    assert_eq!(owners.len(), 3, "30 keys should spread over all 3 masters");
    assert_eq!(cluster.keys("harness:key:*").len(), 30);
    assert!(cluster.del("harness:key:0"));
    assert!(!cluster.exists("harness:key:0"));
    assert_eq!(cluster.get("harness:key:0"), None);

    // Hash tags keep keys together, as distlock relies on.
    assert_eq!(cluster.slot_of("lock:{42}"), cluster.slot_of("fence:{42}"));

    // redis-cli in cluster mode, entering through a master that does not own the key.
    let key = "harness:cli";
    let owner = cluster.node_for_key(key).port();
    let other = masters
        .iter()
        .find(|m| m.port() != owner)
        .unwrap()
        .port()
        .to_string();
    assert_eq!(
        redis_cli(&["-c", "-p", &other, "SET", key, "via-cli"]),
        "OK"
    );
    assert_eq!(redis_cli(&["-c", "-p", &other, "GET", key]), "via-cli");
    assert_eq!(cluster.get(key).as_deref(), Some("via-cli"));
}

#[test]
fn failover_promotes_a_replica_that_serves_the_slot_again() {
    let started = Instant::now();
    let cluster = RedisCluster::start(3, 1);
    eprintln!("3x1 cluster started in {:?}", started.elapsed());
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.masters().len(), 3);
    for master in cluster.masters() {
        assert_eq!(
            cluster.replicas_of(master).len(),
            1,
            "master {}",
            master.port()
        );
    }

    let key = "harness:failover:{a}";
    cluster.set(key, "survives");
    cluster.sync_replicas_of(key);
    let slot = cluster.slot_of(key);
    let old = cluster.node_for_key(key);
    let old_port = old.port();
    let replica_port = cluster.replicas_of(old)[0].port();

    let started = Instant::now();
    let new = cluster.failover_master_of(key);
    eprintln!("failover took {:?}", started.elapsed());

    assert_eq!(
        new.port(),
        replica_port,
        "the replica of the killed master takes over"
    );
    assert!(!old.is_running(), "the old master was killed");
    assert_eq!(cluster.node_for_key(key).port(), replica_port);
    assert_eq!(cluster.get(key).as_deref(), Some("survives"));
    cluster.set("harness:failover:{a}:2", "new write");
    assert_eq!(
        raw_get(new, "harness:failover:{a}:2").unwrap().as_deref(),
        Some("new write")
    );
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    assert!(masters.iter().all(|m| m.port() != old_port));
    let other = masters.iter().find(|m| m.port() != replica_port).unwrap();
    assert_redirect(
        other,
        key,
        redis::ServerErrorKind::Moved,
        replica_port,
        slot,
    );

    // Restarted, the old master comes back empty and rejoins as a replica of the new one.
    let started = Instant::now();
    old.restart();
    wait_until(
        Duration::from_secs(15),
        "the restarted old master to become a replica of the new one",
        || {
            cluster
                .replicas_of(new)
                .iter()
                .any(|r| r.port() == old_port)
        },
    );
    eprintln!(
        "old master rejoined as a replica in {:?}",
        started.elapsed()
    );
    assert_eq!(cluster.masters().len(), 3);
    assert_eq!(cluster.get(key).as_deref(), Some("survives"));
}

#[test]
fn migrate_slot_moves_the_keys_and_redirects_with_ask_then_moved() {
    let cluster = RedisCluster::start(3, 0);
    let key = "harness:migrate:{m}";
    let with_ttl = "harness:migrate:{m}:ttl";
    cluster.set(key, "moved along");
    cluster.set(with_ttl, "expiring");
    let source = cluster.node_for_key(key);
    redis::cmd("PEXPIRE")
        .arg(with_ttl)
        .arg(60_000)
        .query::<()>(&mut source.conn())
        .unwrap();
    let slot = cluster.slot_of(key);
    let source_port = source.port();
    let to = cluster
        .masters()
        .iter()
        .position(|m| m.port() != source_port)
        .unwrap();
    let target_port = cluster.masters()[to].port();

    let started = Instant::now();
    std::thread::scope(|scope| {
        let migration =
            scope.spawn(|| cluster.migrate_slot_of_holding(key, to, Duration::from_millis(1500)));
        // While the slot is half-moved the source sends clients to the target with ASK.
        wait_until(Duration::from_secs(10), "the source to answer ASK", || {
            matches!(raw_get(source, key),
                Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask))
        });
        assert_redirect(source, key, redis::ServerErrorKind::Ask, target_port, slot);
        // The routed helpers follow the ASK.
        assert_eq!(cluster.get(key).as_deref(), Some("moved along"));
        let moved_to = migration.join().expect("the migration should succeed");
        assert_eq!(moved_to.port(), target_port);
    });
    eprintln!("migration (holding 1.5 s) took {:?}", started.elapsed());

    assert_eq!(cluster.node_for_key(key).port(), target_port);
    assert_redirect(
        source,
        key,
        redis::ServerErrorKind::Moved,
        target_port,
        slot,
    );
    let target = cluster.node_for_key(key);
    assert_eq!(
        raw_get(target, key).unwrap().as_deref(),
        Some("moved along")
    );
    assert_eq!(cluster.get(with_ttl).as_deref(), Some("expiring"));
    let ttl = cluster.pttl(with_ttl);
    assert!(
        ttl > 0 && ttl <= 60_000,
        "the TTL moves with the key: {ttl}"
    );
    let left: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(10)
        .query(&mut source.conn())
        .unwrap();
    assert!(left.is_empty(), "keys left on the source: {left:?}");

    // Without a hold, and back again.
    let back = cluster
        .masters()
        .iter()
        .position(|m| m.port() == source_port)
        .unwrap();
    let started = Instant::now();
    cluster.migrate_slot_of(key, back);
    eprintln!("migration back took {:?}", started.elapsed());
    assert_eq!(cluster.node_for_key(key).port(), source_port);
    assert_eq!(cluster.get(key).as_deref(), Some("moved along"));
}

/// The one-node cluster behind a proxy: a cluster client that is given the proxy's URL is sent
/// back to the proxy by the topology (so every connection crosses it), and a command whose reply
/// the proxy loses is sent again by redis-rs and runs twice — the fault the tests of re-sent
/// lock commands build on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_cluster_routes_every_connection_through_its_proxy() {
    let started = Instant::now();
    let cluster = ProxiedCluster::start();
    eprintln!(
        "one-node proxied cluster started in {:?}",
        started.elapsed()
    );
    let (node, proxy) = (cluster.node(), cluster.proxy());
    assert!(node.info("cluster").contains("cluster_enabled:1"));
    let slots = redis_cli(&["-p", &node.port().to_string(), "CLUSTER", "SLOTS"]);
    assert_eq!(
        slots.lines().collect::<Vec<_>>()[..4],
        ["0", "16383", "127.0.0.1", &proxy.port().to_string()],
        "CLUSTER SLOTS points at the proxy: {slots}"
    );
    assert_eq!(cluster.urls(), vec![proxy.url()]);

    let mut connection = redis::cluster::ClusterClientBuilder::new(cluster.urls())
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let n: i64 = redis::cmd("INCR")
        .arg("harness:proxied")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(node.get("harness:proxied").as_deref(), Some("1"));
    assert!(
        proxy.connection_count() >= 1,
        "the cluster client bypassed the proxy"
    );
    // Connections the client drops (a seed it no longer needs) leave both counts a moment apart.
    wait_until(
        Duration::from_secs(5),
        "every client connection of the node to come through the proxy",
        || node.client_count() == proxy.connection_count(),
    );

    proxy.lose_next_reply_to("harness:proxied");
    let n: i64 = redis::cmd("INCR")
        .arg("harness:proxied")
        .query_async(&mut connection)
        .await
        .expect("redis-rs sends the command again on a new connection");
    assert_eq!(proxy.replies_lost(), 1);
    assert_eq!(
        n, 3,
        "the first send ran, its reply was lost, and the re-sent one ran too"
    );
    assert_eq!(node.get("harness:proxied").as_deref(), Some("3"));
}

#[test]
fn redis_servers_are_independent_masters() {
    let started = Instant::now();
    let servers = RedisServers::start(5);
    eprintln!("5 servers started in {:?}", started.elapsed());
    assert_eq!(servers.len(), 5);
    let urls = servers.urls();
    assert_eq!(urls.iter().collect::<BTreeSet<_>>().len(), 5, "{urls:?}");
    for server in servers.iter() {
        let info = server.info("replication");
        assert!(info.contains("role:master"), "{info}");
        assert!(server.info("cluster").contains("cluster_enabled:0"));
    }
    servers[2].set("harness:redlock", "only here");
    assert_eq!(servers.holders("harness:redlock"), vec![2]);
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(server.exists("harness:redlock"), i == 2);
    }
    servers[0].set("harness:redlock", "here too");
    servers[2].kill();
    assert_eq!(servers.holders("harness:redlock"), vec![0]);
    assert_eq!(servers.urls().len(), 5, "killed servers keep their URL");
}

#[test]
fn tls_server_answers_over_tls_only() {
    if test_support::skip_without(
        test_support::Feature::Tls,
        "tls_server_answers_over_tls_only",
    ) {
        return;
    }
    let started = Instant::now();
    let server = RedisServer::start_tls();
    eprintln!(
        "TLS server (with certificates) started in {:?}",
        started.elapsed()
    );
    let port = server.port();
    assert_eq!(server.tls_url(), format!("rediss://127.0.0.1:{port}/"));
    assert!(String::from_utf8(server.ca_pem())
        .unwrap()
        .starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(server.tls_cli(&["PING"]), "PONG");
    assert_eq!(server.tls_cli(&["SET", "k", "v"]), "OK");
    assert_eq!(server.tls_cli(&["GET", "k"]), "v");

    // Plain text on the TLS port gets nowhere, with redis-rs or redis-cli.
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let plain = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .and_then(|mut conn| {
            conn.set_read_timeout(Some(Duration::from_secs(2)))?;
            redis::cmd("PING").query::<String>(&mut conn)
        });
    assert!(plain.is_err(), "a plain-text PING was answered: {plain:?}");
    let output = run_bounded(
        Command::new("redis-cli").args(["-p", &port.to_string(), "PING"]),
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains("PONG"),
        "plain redis-cli got an answer: {output:?}"
    );

    // The certificate is really checked: a client trusting another CA is refused.
    let other_dir = unique_temp_dir("other-ca");
    let other = TlsFiles::generate(&other_dir);
    let output = run_bounded(
        Command::new("redis-cli")
            .arg("--tls")
            .arg("--cacert")
            .arg(&other.ca_cert)
            .args(["-p", &port.to_string(), "PING"]),
        Duration::from_secs(10),
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&other_dir);
    assert!(
        !output.status.success() && !String::from_utf8_lossy(&output.stdout).contains("PONG"),
        "a client trusting another CA got through: {output:?}"
    );

    // The server certificate names 127.0.0.1 and localhost and chains to the CA.
    let tls = server.dir().join("tls");
    let verify = run_bounded(
        Command::new("openssl")
            .arg("verify")
            .arg("-CAfile")
            .arg(tls.join("ca.crt"))
            .arg(tls.join("server.crt")),
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(verify.status.success(), "{verify:?}");
    let text = run_bounded(
        Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(tls.join("server.crt")),
        Duration::from_secs(10),
    )
    .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("IP Address:127.0.0.1") && text.contains("DNS:localhost"),
        "{text}"
    );

    // A restart checks readiness over TLS again and keeps the certificates.
    server.restart();
    assert_eq!(server.tls_cli(&["PING"]), "PONG");
    assert_eq!(
        server.tls_cli(&["GET", "k"]),
        "",
        "a restarted server is empty"
    );

    // ACL users work over TLS too.
    let url = server.add_acl_user("tls-user", "pw", &["ping"]);
    assert_eq!(url, format!("rediss://tls-user:pw@127.0.0.1:{port}/"));
    let as_user = |args: &[&str]| {
        let mut all = vec!["--user", "tls-user", "--pass", "pw", "--no-auth-warning"];
        all.extend_from_slice(args);
        server.tls_cli(&all)
    };
    assert_eq!(as_user(&["PING"]), "PONG");
    assert!(as_user(&["GET", "k"]).starts_with("NOPERM"));
}

#[test]
fn acl_user_may_run_only_the_allowed_commands() {
    let server = RedisServer::start();
    let url = server.add_acl_user("locker", "s3cret pw:@/", &["get", "set", "ping"]);
    assert_eq!(
        url,
        format!(
            "redis://locker:s3cret%20pw%3A%40%2F@127.0.0.1:{}/",
            server.port()
        )
    );
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .expect("the ACL user logs in");
    redis::cmd("SET")
        .arg("acl:k")
        .arg("v")
        .query::<()>(&mut conn)
        .expect("SET is allowed");
    let got: Option<String> = redis::cmd("GET").arg("acl:k").query(&mut conn).unwrap();
    assert_eq!(got.as_deref(), Some("v"));
    let whoami = redis::cmd("ACL").arg("WHOAMI").query::<String>(&mut conn);
    let denied = redis::cmd("DEL").arg("acl:k").query::<i64>(&mut conn);
    for result in [whoami.map(|_| 0), denied] {
        let error = result.expect_err("a command outside the list is refused");
        assert_eq!(error.code(), Some("NOPERM"), "{error}");
    }
    assert_eq!(server.get("acl:k").as_deref(), Some("v"), "DEL did not run");

    let wrong = format!("redis://locker:wrong@127.0.0.1:{}/", server.port());
    let refused = redis::Client::open(wrong.as_str())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
    assert!(refused.is_err(), "a wrong password was accepted");

    // Calling it again replaces the user's rules.
    server.add_acl_user("locker", "s3cret pw:@/", &["ping", "del"]);
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    assert_eq!(
        redis::cmd("DEL")
            .arg("acl:k")
            .query::<i64>(&mut conn)
            .unwrap(),
        1
    );
    assert!(redis::cmd("GET")
        .arg("acl:k")
        .query::<Option<String>>(&mut conn)
        .is_err());
}
