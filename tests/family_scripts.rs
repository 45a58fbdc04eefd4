//! The server side of semaphores, read-write locks and multi-key locks, script by script,
//! against a real redis-server: the Lua files under `lock-runtime/src/backend/scripts/`
//! (`family_prelude.lua`, `semaphore_*.lua`, `rw_*.lua`, `multi_*.lua`) are loaded here as the
//! runtime will load them (prelude first, then the script) and run with redis-rs, before any
//! Rust API drives them. `docs/family.md` describes the data and the protocol they implement.
//!
//! Every test has names of its own on the one server this binary shares.

use std::time::Duration;

use redis::{Connection, RedisResult, Script, Value};
use test_support::{keys, shared_server};

const PRELUDE: &str = include_str!("../lock-runtime/src/backend/scripts/family_prelude.lua");
const RW_LINE: &str = include_str!("../lock-runtime/src/backend/scripts/rw_line.lua");

/// A script made of the family prelude and `parts`, in that order.
fn script(parts: &[&str]) -> Script {
    Script::new(&[&[PRELUDE], parts].concat().concat())
}

fn semaphore_acquire() -> Script {
    script(&[include_str!(
        "../lock-runtime/src/backend/scripts/semaphore_acquire.lua"
    )])
}

fn semaphore_release() -> Script {
    script(&[include_str!(
        "../lock-runtime/src/backend/scripts/semaphore_release.lua"
    )])
}

fn semaphore_extend() -> Script {
    script(&[include_str!(
        "../lock-runtime/src/backend/scripts/semaphore_extend.lua"
    )])
}

fn rw_acquire() -> Script {
    script(&[
        RW_LINE,
        include_str!("../lock-runtime/src/backend/scripts/rw_acquire.lua"),
    ])
}

fn rw_release() -> Script {
    script(&[
        RW_LINE,
        include_str!("../lock-runtime/src/backend/scripts/rw_release.lua"),
    ])
}

fn multi_acquire() -> Script {
    script(&[include_str!(
        "../lock-runtime/src/backend/scripts/multi_acquire.lua"
    )])
}

fn multi_release() -> Script {
    script(&[include_str!(
        "../lock-runtime/src/backend/scripts/multi_release.lua"
    )])
}

fn multi_extend() -> Script {
    script(&[include_str!(
        "../lock-runtime/src/backend/scripts/multi_extend.lua"
    )])
}

fn leased_inspect() -> Script {
    script(&[include_str!(
        "../lock-runtime/src/backend/scripts/semaphore_inspect.lua"
    )])
}

/// The mutex's own contended acquisition, exactly as the runtime builds it.
fn mutex_acquire() -> Script {
    Script::new(
        &[
            include_str!("../lock-runtime/src/backend/scripts/line_prelude.lua"),
            include_str!("../lock-runtime/src/backend/scripts/acquire.lua"),
        ]
        .concat(),
    )
}

const TTL: u64 = 10_000;
const LEASE: u64 = 3_000;
const CLAIM: u64 = 3_000;

/// A holder's value of the shape distlock writes (a reader's carries `;m=r`).
fn value(name: &str, who: &str) -> String {
    format!("{name}-{who};h=test;p=1;t=0")
}

fn reader(name: &str, who: &str) -> String {
    format!("{}{}", value(name, who), ";m=r")
}

/// The keys a semaphore's scripts take: the lock key, its line, its fencing counter, its
/// holders' fencing tokens.
fn semaphore_keys(name: &str) -> [String; 4] {
    let lock = keys::default_key(name);
    [
        lock.clone(),
        keys::helper(&lock, "permit-line"),
        keys::helper(&lock, "fence"),
        keys::helper(&lock, "permit-fences"),
    ]
}

/// The keys a read-write lock's scripts take: the lock key, the mutex's line, the fencing
/// counter, the readers' fencing tokens.
fn rw_keys(name: &str) -> [String; 4] {
    let lock = keys::default_key(name);
    [
        lock.clone(),
        keys::helper(&lock, "line"),
        keys::helper(&lock, "fence"),
        keys::helper(&lock, "permit-fences"),
    ]
}

fn sem_acquire(
    conn: &mut Connection,
    keys: &[String; 4],
    token: &str,
    ttl: u64,
    permits: u32,
    action: &str,
) -> RedisResult<Vec<i64>> {
    semaphore_acquire()
        .key(&keys[..])
        .arg(token)
        .arg(ttl)
        .arg("0")
        .arg(channel_of(token))
        .arg(LEASE)
        .arg(CLAIM)
        .arg(permits)
        .arg(action)
        .arg("1")
        .invoke(conn)
}

fn sem_release(conn: &mut Connection, keys: &[String; 4], token: &str) -> i64 {
    semaphore_release()
        .key(&keys[..])
        .arg(token)
        .arg(CLAIM)
        .arg("0")
        .arg("0")
        .invoke(conn)
        .expect("semaphore release")
}

fn rw_acquire_as(
    conn: &mut Connection,
    keys: &[String; 4],
    token: &str,
    action: &str,
) -> RedisResult<Vec<i64>> {
    rw_acquire()
        .key(&keys[..])
        .arg(token)
        .arg(TTL)
        .arg("0")
        .arg("")
        .arg(LEASE)
        .arg(CLAIM)
        .arg(action)
        .arg("0")
        .invoke(conn)
}

fn rw_release_as(conn: &mut Connection, keys: &[String; 4], token: &str) -> i64 {
    rw_release()
        .key(&keys[..])
        .arg(token)
        .arg(CLAIM)
        .arg("0")
        .arg("0")
        .invoke(conn)
        .expect("read-write release")
}

/// The grant channel a test gives a waiter: one per token.
fn channel_of(token: &str) -> String {
    format!("grants:{}", token.split(';').next().unwrap_or(token))
}

/// The holders of a leased set (its members but the marker).
fn holders(conn: &mut Connection, lock: &str) -> Vec<String> {
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(lock)
        .arg(0)
        .arg(-1)
        .query(conn)
        .expect("ZRANGE");
    members
        .into_iter()
        .filter(|m| !m.starts_with('#'))
        .collect()
}

fn is_holder(conn: &mut Connection, lock: &str, token: &str) -> bool {
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(lock)
        .arg(token)
        .query(conn)
        .expect("ZSCORE");
    score.is_some()
}

fn line_of(conn: &mut Connection, line: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(line)
        .arg(0)
        .arg(-1)
        .query(conn)
        .expect("LRANGE")
}

/// The code and the text after it of a script's error reply (`MODE string permits ...`).
fn refusal(error: &redis::RedisError) -> (String, String) {
    (
        error.code().unwrap_or_default().to_owned(),
        error.detail().unwrap_or_default().to_owned(),
    )
}

fn get(conn: &mut Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(conn).expect("GET")
}

#[test]
fn a_semaphore_never_lets_in_more_than_n() {
    let mut conn = shared_server().conn();
    let name = "family:at-most-n";
    let keys = semaphore_keys(name);
    let tokens: Vec<String> = (0..5).map(|i| value(name, &i.to_string())).collect();
    let granted: Vec<bool> = tokens
        .iter()
        .map(|token| {
            sem_acquire(&mut conn, &keys, token, TTL, 3, "first").expect("acquire")[0] == 1
        })
        .collect();
    assert_eq!(granted, [true, true, true, false, false]);
    assert_eq!(holders(&mut conn, &keys[0]).len(), 3);

    // The two left out wait in line, in order; asking again changes nothing for the holders.
    for (index, token) in tokens[3..].iter().enumerate() {
        let reply = sem_acquire(&mut conn, &keys, token, TTL, 3, "join").expect("join");
        assert_eq!(reply[0], 0, "a fourth permit was given: {reply:?}");
        assert_eq!(reply[3], i64::try_from(index).expect("small"));
    }
    for token in &tokens[..3] {
        let reply = sem_acquire(&mut conn, &keys, token, TTL, 3, "renew").expect("again");
        assert_eq!(
            reply[0], 1,
            "a holder asking again is told it holds a permit"
        );
    }
    assert_eq!(holders(&mut conn, &keys[0]).len(), 3);
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query(&mut conn)
        .expect("PTTL");
    assert!(
        pttl > 0 && pttl <= i64::try_from(TTL).expect("small"),
        "the set expires with its last lease: {pttl}"
    );
}

#[test]
fn an_expired_lease_is_reclaimed() {
    let mut conn = shared_server().conn();
    let name = "family:expired-lease";
    let keys = semaphore_keys(name);
    let (a, b, c) = (value(name, "a"), value(name, "b"), value(name, "c"));
    assert_eq!(
        sem_acquire(&mut conn, &keys, &a, 150, 2, "first").expect("a")[0],
        1
    );
    assert_eq!(
        sem_acquire(&mut conn, &keys, &b, TTL, 2, "first").expect("b")[0],
        1
    );
    assert_eq!(
        sem_acquire(&mut conn, &keys, &c, TTL, 2, "first").expect("c")[0],
        0
    );
    std::thread::sleep(Duration::from_millis(300));
    // a's holder died: its lease ran out, and its permit is c's.
    assert_eq!(
        sem_acquire(&mut conn, &keys, &c, TTL, 2, "first").expect("c")[0],
        1
    );
    let mut now = holders(&mut conn, &keys[0]);
    now.sort();
    assert_eq!(now, [b.clone(), c.clone()]);
    assert_eq!(
        sem_release(&mut conn, &keys, &a),
        0,
        "a's permit is no longer a's"
    );
    assert_eq!(
        semaphore_extend()
            .key(&[&keys[0], &keys[2]])
            .arg(&a)
            .arg(TTL)
            .invoke::<i64>(&mut conn)
            .expect("extend"),
        0
    );
}

#[test]
fn a_release_hands_the_permit_to_the_head_waiter() {
    let server = shared_server();
    let mut conn = server.conn();
    let name = "family:hand-off";
    let keys = semaphore_keys(name);
    let [first, second, head, next] = ["a", "b", "c", "d"].map(|who| value(name, who));
    for holder in [&first, &second] {
        assert_eq!(
            sem_acquire(&mut conn, &keys, holder, TTL, 2, "first").expect("hold")[0],
            1
        );
    }
    let mut listener = server.conn();
    let mut pubsub = listener.as_pubsub();
    pubsub.subscribe(channel_of(&head)).expect("subscribe");
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    for waiter in [&head, &next] {
        assert_eq!(
            sem_acquire(&mut conn, &keys, waiter, TTL, 2, "join").expect("join")[0],
            0
        );
    }

    assert_eq!(sem_release(&mut conn, &keys, &first), 2, "handed over");
    assert!(
        is_holder(&mut conn, &keys[0], &head),
        "the head waiter holds the permit given back"
    );
    assert!(
        !is_holder(&mut conn, &keys[0], &next),
        "the next waiter is still behind"
    );
    assert_eq!(holders(&mut conn, &keys[0]).len(), 2);
    let line = line_of(&mut conn, &keys[1]);
    assert_eq!(line.len(), 1);
    assert!(line[0].starts_with(&format!("{next} ")), "{line:?}");
    let message = pubsub
        .get_message()
        .expect("the grant reaches the head waiter");
    let payload: String = message.get_payload().expect("text");
    assert_eq!(payload, format!("{head} 0"));
    // The head waiter's lease is the claim until it confirms its ttl.
    let score: f64 = redis::cmd("ZSCORE")
        .arg(&keys[0])
        .arg(&head)
        .query(&mut conn)
        .expect("ZSCORE");
    let now: (u64, u64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
    let left = score - (now.0 * 1000 + now.1 / 1000) as f64;
    assert!(left <= CLAIM as f64 && left > 0.0, "{left}");
    // A newcomer finds no permit while the next waiter waits.
    let newcomer = value(name, "e");
    assert_eq!(
        sem_acquire(&mut conn, &keys, &newcomer, TTL, 2, "first").expect("e")[0],
        0
    );
}

#[test]
fn callers_that_disagree_on_n_are_refused_with_both_values() {
    let mut conn = shared_server().conn();
    let name = "family:disagree";
    let keys = semaphore_keys(name);
    let token = |who: &str| value(name, who);
    assert_eq!(
        sem_acquire(&mut conn, &keys, &token("a"), TTL, 3, "first").expect("a")[0],
        1
    );

    let error = sem_acquire(&mut conn, &keys, &token("b"), TTL, 2, "first")
        .expect_err("n = 2 against n = 3");
    let (code, text) = refusal(&error);
    assert_eq!(code, "PERMITS", "{error}");
    assert!(
        text.starts_with("3 2 "),
        "the semaphore's n, then the caller's: {text}"
    );
    assert!(
        text.contains("3 permits") && text.contains("asks for 2"),
        "{text}"
    );
    // The semaphore keeps the smaller value: the callers with 3 are refused now, naming both.
    let error = sem_acquire(&mut conn, &keys, &token("c"), TTL, 3, "first")
        .expect_err("n = 3 against the lowered 2");
    let (code, text) = refusal(&error);
    assert_eq!(code, "PERMITS", "{error}");
    assert!(text.starts_with("2 3 "), "{text}");
    // Nobody gets in beyond 2.
    assert_eq!(
        sem_acquire(&mut conn, &keys, &token("d"), TTL, 2, "first").expect("d")[0],
        1
    );
    assert_eq!(
        sem_acquire(&mut conn, &keys, &token("e"), TTL, 2, "first").expect("e")[0],
        0
    );
    assert_eq!(holders(&mut conn, &keys[0]).len(), 2);
}

#[test]
fn a_writer_in_line_is_not_overtaken_by_a_later_reader() {
    let mut conn = shared_server().conn();
    let name = "family:fair-writer";
    let keys = rw_keys(name);
    let (r1, r2, w) = (reader(name, "r1"), reader(name, "r2"), value(name, "w"));
    assert_eq!(
        rw_acquire_as(&mut conn, &keys, &r1, "first").expect("r1")[0],
        1
    );
    let waiting = rw_acquire_as(&mut conn, &keys, &w, "join").expect("w");
    assert_eq!(
        (waiting[0], waiting[3]),
        (0, 0),
        "the writer waits first in line"
    );
    // Readers hold the lock, but a writer waits: a later reader waits behind it.
    assert_eq!(
        rw_acquire_as(&mut conn, &keys, &r2, "first").expect("r2")[0],
        0
    );
    let behind = rw_acquire_as(&mut conn, &keys, &r2, "join").expect("r2");
    assert_eq!((behind[0], behind[3]), (0, 1));
    assert_eq!(holders(&mut conn, &keys[0]), std::slice::from_ref(&r1));

    assert_eq!(
        rw_release_as(&mut conn, &keys, &r1),
        2,
        "handed to the writer"
    );
    assert_eq!(
        get(&mut conn, &keys[0]),
        Some(w.clone()),
        "the writer holds it, alone"
    );
    assert_eq!(
        rw_acquire_as(&mut conn, &keys, &r2, "renew").expect("r2")[0],
        0
    );
    assert_eq!(
        rw_release_as(&mut conn, &keys, &w),
        2,
        "handed to the reader"
    );
    assert!(is_holder(&mut conn, &keys[0], &r2));
}

#[test]
fn readers_at_the_head_are_let_in_together() {
    let mut conn = shared_server().conn();
    let name = "family:readers-together";
    let keys = rw_keys(name);
    let (w1, w2) = (value(name, "w1"), value(name, "w2"));
    let (r1, r2, r3) = (reader(name, "r1"), reader(name, "r2"), reader(name, "r3"));
    assert_eq!(
        rw_acquire_as(&mut conn, &keys, &w1, "first").expect("w1")[0],
        1
    );
    assert_eq!(
        get(&mut conn, &keys[0]),
        Some(w1.clone()),
        "a writer is a plain mutex key"
    );
    for waiter in [&r1, &r2, &w2, &r3] {
        assert_eq!(
            rw_acquire_as(&mut conn, &keys, waiter, "join").expect("join")[0],
            0
        );
    }

    assert_eq!(rw_release_as(&mut conn, &keys, &w1), 2);
    let mut inside = holders(&mut conn, &keys[0]);
    inside.sort();
    assert_eq!(
        inside,
        [r1.clone(), r2.clone()],
        "both head readers, and only them"
    );
    let line = line_of(&mut conn, &keys[1]);
    assert_eq!(line.len(), 2);
    assert!(line[0].starts_with(&format!("{w2} ")), "{line:?}");

    assert_eq!(rw_release_as(&mut conn, &keys, &r1), 1, "r2 still reads");
    assert_eq!(
        rw_acquire_as(&mut conn, &keys, &w2, "renew").expect("w2")[0],
        0
    );
    assert_eq!(rw_release_as(&mut conn, &keys, &r2), 2);
    assert_eq!(get(&mut conn, &keys[0]), Some(w2.clone()));
    assert!(line_of(&mut conn, &keys[1])[0].starts_with(&format!("{r3} ")));
}

/// The keys `multi_*.lua` take for `names` (one slot: every name carries the tag `{acct}`).
fn multi_keys(names: &[&str]) -> Vec<String> {
    let locks: Vec<String> = names.iter().map(|name| keys::default_key(name)).collect();
    let mut all = locks.clone();
    all.extend(locks.iter().map(|lock| keys::helper(lock, "line")));
    all.extend(locks.iter().map(|lock| keys::helper(lock, "fence")));
    all
}

fn multi_try(conn: &mut Connection, names: &[&str], token: &str, fencing: bool) -> Value {
    multi_acquire()
        .key(multi_keys(names))
        .arg(token)
        .arg(TTL)
        .arg(if fencing { "1" } else { "0" })
        .arg("")
        .arg(LEASE)
        .arg("first")
        .arg(CLAIM)
        .arg("0")
        .invoke(conn)
        .expect("multi acquire")
}

fn ints(value: &Value) -> Vec<i64> {
    match value {
        Value::Array(items) => items
            .iter()
            .flat_map(|item| match item {
                Value::Int(n) => vec![*n],
                other => ints(other),
            })
            .collect(),
        Value::Int(n) => vec![*n],
        other => panic!("not a reply of integers: {other:?}"),
    }
}

#[test]
fn several_keys_are_taken_all_or_none_and_a_repeated_name_counts_once() {
    let mut conn = shared_server().conn();
    let (a, b, c) = ("family:{acct}:a", "family:{acct}:b", "family:{acct}:c");
    let token = value("family:multi", "t");
    let other = value("family:multi", "other");
    redis::cmd("SET")
        .arg(keys::default_key(b))
        .arg(&other)
        .arg("PX")
        .arg(TTL)
        .query::<()>(&mut conn)
        .expect("SET");

    let refused = ints(&multi_try(&mut conn, &[a, b], &token, false));
    assert_eq!(refused[0], 0);
    assert_eq!(refused[3], 2, "b is the busy one");
    assert_eq!(
        get(&mut conn, &keys::default_key(a)),
        None,
        "a was not taken alone"
    );

    let granted = ints(&multi_try(&mut conn, &[c, a, a], &token, true));
    assert_eq!(granted[0], 1, "{granted:?}");
    let fences = &granted[1..4];
    assert!(fences.iter().all(|&fence| fence > 0), "{fences:?}");
    assert_eq!(fences[1], fences[2], "a repeated name has one token");
    for name in [a, c] {
        assert_eq!(
            get(&mut conn, &keys::default_key(name)),
            Some(token.clone())
        );
    }
    let fence_of_a: i64 = redis::cmd("GET")
        .arg(keys::helper(&keys::default_key(a), "fence"))
        .query(&mut conn)
        .expect("GET");
    assert_eq!(fence_of_a, 1, "a's counter counted a once");

    let extended = ints(
        &multi_extend()
            .key([a, a, c].map(keys::default_key).to_vec())
            .arg(&token)
            .arg(TTL)
            .invoke(&mut conn)
            .expect("extend"),
    );
    assert_eq!(extended, [2, 0]);
    let released = ints(
        &multi_release()
            .key(multi_keys(&[a, c, a]))
            .arg(&token)
            .arg(CLAIM)
            .arg("0")
            .arg("0")
            .invoke(&mut conn)
            .expect("release"),
    );
    assert_eq!(released, [2, 0, 0], "two distinct keys freed");
    assert_eq!(get(&mut conn, &keys::default_key(a)), None);
    assert_eq!(get(&mut conn, &keys::default_key(c)), None);
    assert_eq!(get(&mut conn, &keys::default_key(b)), Some(other));
}

#[test]
fn a_multi_key_waiter_waits_in_the_first_busy_line_and_is_handed_it() {
    let mut conn = shared_server().conn();
    let (a, b) = ("family:{wait}:a", "family:{wait}:b");
    let token = value("family:multi-wait", "t");
    let holder = value("family:multi-wait", "holder");
    let lock_a = keys::default_key(a);
    redis::cmd("SET")
        .arg(&lock_a)
        .arg(&holder)
        .query::<()>(&mut conn)
        .expect("SET");
    let waiting = ints(
        &multi_acquire()
            .key(multi_keys(&[b, a]))
            .arg(&token)
            .arg(TTL)
            .arg("0")
            .arg("")
            .arg(LEASE)
            .arg("join")
            .arg(CLAIM)
            .arg("0")
            .invoke(&mut conn)
            .expect("join"),
    );
    assert_eq!(
        (waiting[0], waiting[3], waiting[4]),
        (0, 2, 0),
        "{waiting:?}"
    );
    // The holder of a (a plain mutex, here by multi_release's hand-off) hands it to the waiter.
    let released = ints(
        &multi_release()
            .key(multi_keys(&[a]))
            .arg(&holder)
            .arg(CLAIM)
            .arg("0")
            .arg("0")
            .invoke(&mut conn)
            .expect("release"),
    );
    assert_eq!(released, [0, 1, 0]);
    assert_eq!(get(&mut conn, &lock_a), Some(token.clone()));
    let granted = ints(&multi_try(&mut conn, &[b, a], &token, false));
    assert_eq!(granted[0], 1);
    assert_eq!(get(&mut conn, &keys::default_key(b)), Some(token));
}

/// A waiter handed a key while an earlier key (in canonical order) was free, which someone has
/// taken since, gives the later key back at its look: it never holds a key after the one it
/// waits for, so two multi-key waiters cannot each hold what the other waits for.
#[test]
fn a_multi_key_waiter_gives_back_a_key_that_comes_after_the_one_it_waits_for() {
    let mut conn = shared_server().conn();
    let (a, b, c) = ("family:{cycle}:a", "family:{cycle}:b", "family:{cycle}:c");
    let token = value("family:multi-cycle", "t");
    let holder = value("family:multi-cycle", "holder");
    let (lock_a, lock_b, lock_c) = (
        keys::default_key(a),
        keys::default_key(b),
        keys::default_key(c),
    );
    // b was handed to the waiter; a has been taken by someone else since; c is free.
    for (lock, value) in [(&lock_b, &token), (&lock_a, &holder)] {
        redis::cmd("SET")
            .arg(lock)
            .arg(value)
            .arg("PX")
            .arg(TTL)
            .query::<()>(&mut conn)
            .expect("SET");
    }
    let waiting = ints(
        &multi_acquire()
            .key(multi_keys(&[c, b, a]))
            .arg(&token)
            .arg(TTL)
            .arg("0")
            .arg("")
            .arg(LEASE)
            .arg("renew")
            .arg(CLAIM)
            .arg("0")
            .invoke(&mut conn)
            .expect("renew"),
    );
    assert_eq!((waiting[0], waiting[3]), (0, 3), "waits for a: {waiting:?}");
    assert_eq!(get(&mut conn, &lock_b), None, "b, after a, was given back");
    assert_eq!(get(&mut conn, &lock_a), Some(holder), "a is untouched");
    assert_eq!(get(&mut conn, &lock_c), None, "nothing else taken");
    assert!(line_of(&mut conn, &keys::helper(&lock_a, "line"))[0].starts_with(&format!("{token} ")));
}

#[test]
fn a_name_held_as_a_mutex_is_refused_by_the_semaphore_and_the_other_way() {
    let mut conn = shared_server().conn();
    let name = "family:two-ways";
    let keys = semaphore_keys(name);
    let mutex = value(name, "mutex");
    redis::cmd("SET")
        .arg(&keys[0])
        .arg(&mutex)
        .arg("PX")
        .arg(TTL)
        .query::<()>(&mut conn)
        .expect("SET");
    let error = sem_acquire(&mut conn, &keys, &value(name, "s"), TTL, 3, "first")
        .expect_err("a mutex is no semaphore");
    let (code, text) = refusal(&error);
    assert_eq!(code, "MODE", "{error}");
    assert!(text.starts_with("string permits "), "{text}");
    assert_eq!(
        get(&mut conn, &keys[0]),
        Some(mutex),
        "the mutex is untouched"
    );

    let name = "family:two-ways-b";
    let keys = semaphore_keys(name);
    assert_eq!(
        sem_acquire(&mut conn, &keys, &value(name, "s"), TTL, 3, "first").expect("s")[0],
        1
    );
    let lock = keys::default_key(name);
    let first_try: Option<String> = redis::cmd("SET")
        .arg(&lock)
        .arg(value(name, "m"))
        .arg("NX")
        .arg("PX")
        .arg(TTL)
        .query(&mut conn)
        .expect("SET NX");
    assert_eq!(
        first_try, None,
        "a mutex's first try finds the semaphore held"
    );
    let helpers = keys::named(name);
    let error = mutex_acquire()
        .key(&[
            lock.clone(),
            helpers.line(),
            helpers.fence(),
            helpers.since(),
            helpers.forced(),
            helpers.leases(),
        ])
        .arg(value(name, "m"))
        .arg(TTL)
        .arg("0")
        .arg("")
        .arg(LEASE)
        .arg(CLAIM)
        .arg("join")
        .arg("0")
        .invoke::<Value>(&mut conn)
        .expect_err("a semaphore is no mutex");
    assert!(error.to_string().contains("WRONGTYPE"), "{error}");
    let error = rw_acquire_as(&mut conn, &rw_keys(name), &reader(name, "r"), "first")
        .expect_err("a semaphore is no read-write lock");
    let (code, text) = refusal(&error);
    assert_eq!(code, "MODE", "{error}");
    assert!(text.starts_with("permits read "), "{text}");
    assert_eq!(
        holders(&mut conn, &lock).len(),
        1,
        "the semaphore is untouched"
    );
}

/// What inspection reads of a leased set: the kind, n, the holders with their time left, the
/// live waiters, the fencing counter.
type Inspected = (String, i64, Vec<(String, i64)>, i64, Option<i64>);

fn inspect(conn: &mut Connection, name: &str) -> Value {
    let lock = keys::default_key(name);
    leased_inspect()
        .key(&[
            lock.clone(),
            keys::helper(&lock, "permit-line"),
            keys::helper(&lock, "line"),
            keys::helper(&lock, "fence"),
        ])
        .invoke(conn)
        .expect("inspect")
}

#[test]
fn inspection_shows_every_permit_and_reader_with_its_lease() {
    let mut conn = shared_server().conn();
    let name = "family:inspect-permits";
    let keys = semaphore_keys(name);
    let [first, second, waiter] = ["a", "b", "c"].map(|who| value(name, who));
    assert_eq!(
        sem_acquire(&mut conn, &keys, &first, 5_000, 2, "first").expect("a")[0],
        1
    );
    assert_eq!(
        sem_acquire(&mut conn, &keys, &second, TTL, 2, "first").expect("b")[0],
        1
    );
    assert_eq!(
        sem_acquire(&mut conn, &keys, &waiter, TTL, 2, "join").expect("c")[0],
        0
    );
    let (kind, permits, holders, waiters, fence): Inspected =
        redis::FromRedisValue::from_redis_value(inspect(&mut conn, name)).expect("a leased set");
    assert_eq!(
        (kind.as_str(), permits, waiters, fence),
        ("permits", 2, 1, None)
    );
    let names: Vec<&str> = holders.iter().map(|(holder, _)| holder.as_str()).collect();
    assert_eq!(
        names,
        [first.as_str(), second.as_str()],
        "earliest lease first"
    );
    assert!(holders[0].1 > 0 && holders[0].1 <= 5_000, "{holders:?}");
    assert!(
        holders[1].1 > 5_000 && holders[1].1 <= 10_000,
        "{holders:?}"
    );

    let name = "family:inspect-readers";
    let keys = rw_keys(name);
    let (r1, r2) = (reader(name, "r1"), reader(name, "r2"));
    for token in [&r1, &r2] {
        assert_eq!(
            rw_acquire_as(&mut conn, &keys, token, "first").expect("read")[0],
            1
        );
    }
    let (kind, _, holders, waiters, _): Inspected =
        redis::FromRedisValue::from_redis_value(inspect(&mut conn, name)).expect("a leased set");
    assert_eq!((kind.as_str(), holders.len(), waiters), ("read", 2, 0));

    // A writer (a mutex) is a string: inspection leaves it to the mutex's script.
    assert_eq!(rw_release_as(&mut conn, &keys, &r1), 1);
    assert_eq!(rw_release_as(&mut conn, &keys, &r2), 1);
    assert!(
        matches!(inspect(&mut conn, name), Value::Nil),
        "free once both readers left"
    );
    let writer = value(name, "w");
    assert_eq!(
        rw_acquire_as(&mut conn, &keys, &writer, "first").expect("write")[0],
        1
    );
    let kind: Vec<String> =
        redis::FromRedisValue::from_redis_value(inspect(&mut conn, name)).expect("a kind");
    assert_eq!(kind, ["string"]);
}

#[test]
fn every_permit_gets_a_higher_fencing_token_and_a_repeated_call_keeps_its_own() {
    let mut conn = shared_server().conn();
    let name = "family:fenced-permits";
    let keys = semaphore_keys(name);
    let fenced = |conn: &mut Connection, token: &str| -> Vec<i64> {
        semaphore_acquire()
            .key(&keys[..])
            .arg(token)
            .arg(TTL)
            .arg("1")
            .arg("")
            .arg(LEASE)
            .arg(CLAIM)
            .arg(3)
            .arg("first")
            .arg("1")
            .invoke(conn)
            .expect("fenced acquire")
    };
    let [a, b, c] = ["a", "b", "c"].map(|who| value(name, who));
    let tokens: Vec<i64> = [&a, &b, &c]
        .iter()
        .map(|token| fenced(&mut conn, token)[1])
        .collect();
    assert_eq!(tokens, [1, 2, 3], "one token per permit, rising");
    assert_eq!(
        fenced(&mut conn, &b)[1],
        2,
        "a call sent twice answers the same token"
    );
    assert_eq!(sem_release(&mut conn, &keys, &a), 1);
    let again = value(name, "d");
    assert_eq!(
        fenced(&mut conn, &again)[1],
        4,
        "above every earlier permit's"
    );
}

#[test]
fn a_permit_nobody_hears_goes_on_to_the_next_live_waiter() {
    let server = shared_server();
    let mut conn = server.conn();
    let name = "family:unheard";
    let keys = semaphore_keys(name);
    let [holder, deaf, listening] = ["a", "b", "c"].map(|who| value(name, who));
    assert_eq!(
        sem_acquire(&mut conn, &keys, &holder, TTL, 1, "first").expect("a")[0],
        1
    );
    let mut listener = server.conn();
    let mut pubsub = listener.as_pubsub();
    pubsub.subscribe(channel_of(&listening)).expect("subscribe");
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    // Both take a place naming a channel; nobody listens on the first one's (its process died).
    for waiter in [&deaf, &listening] {
        assert_eq!(
            sem_acquire(&mut conn, &keys, waiter, TTL, 1, "join").expect("join")[0],
            0
        );
    }
    let handed: i64 = semaphore_release()
        .key(&keys[..])
        .arg(&holder)
        .arg(CLAIM)
        .arg("0")
        .arg("1")
        .invoke(&mut conn)
        .expect("release");
    assert_eq!(handed, 2);
    assert_eq!(
        holders(&mut conn, &keys[0]),
        std::slice::from_ref(&listening)
    );
    assert!(
        line_of(&mut conn, &keys[1]).is_empty(),
        "the unheard place is gone"
    );
    let payload: String = pubsub
        .get_message()
        .expect("the grant reaches the live waiter")
        .get_payload()
        .expect("text");
    assert_eq!(payload, format!("{listening} 0"));
}

#[test]
fn a_reader_handed_the_lock_by_the_mutex_release_lets_the_readers_behind_in_at_its_next_look() {
    let mut conn = shared_server().conn();
    let name = "family:mutex-to-reader";
    let keys = rw_keys(name);
    let helpers = keys::named(name);
    let mutex = value(name, "m");
    let (r1, r2) = (reader(name, "r1"), reader(name, "r2"));
    assert_eq!(
        rw_acquire_as(&mut conn, &keys, &mutex, "first").expect("m")[0],
        1
    );
    for token in [&r1, &r2] {
        assert_eq!(
            rw_acquire_as(&mut conn, &keys, token, "join").expect("join")[0],
            0
        );
    }
    // The mutex's own release, which knows nothing of readers.
    let release = Script::new(
        &[
            include_str!("../lock-runtime/src/backend/scripts/release_uncontended.lua"),
            include_str!("../lock-runtime/src/backend/scripts/line_prelude.lua"),
            include_str!("../lock-runtime/src/backend/scripts/not_ours.lua"),
            include_str!("../lock-runtime/src/backend/scripts/release_contended.lua"),
        ]
        .concat(),
    );
    let handed: i64 = release
        .key(&[
            helpers.lock().to_owned(),
            helpers.line(),
            helpers.fence(),
            helpers.since(),
            helpers.forced(),
            helpers.released(),
            helpers.leases(),
        ])
        .arg(&mutex)
        .arg(CLAIM)
        .arg("0")
        .arg("")
        .arg("0")
        .arg("")
        .invoke(&mut conn)
        .expect("mutex release");
    assert_eq!(handed, 2);
    assert_eq!(
        get(&mut conn, &keys[0]),
        Some(r1.clone()),
        "the reader holds it alone"
    );
    // Its next look moves its lease into the readers' set and lets in the readers behind it.
    assert_eq!(
        rw_acquire_as(&mut conn, &keys, &r1, "first").expect("r1")[0],
        1
    );
    let mut both = holders(&mut conn, &keys[0]);
    both.sort();
    let mut expected = vec![r1.clone(), r2.clone()];
    expected.sort();
    assert_eq!(both, expected, "every reader in line is in");
    assert_eq!(
        semaphore_extend()
            .key(&[&keys[0], &keys[3]])
            .arg(&r1)
            .arg(TTL)
            .invoke::<i64>(&mut conn)
            .expect("extend"),
        1,
        "its lease is extended in the set"
    );
    assert_eq!(
        rw_release_as(&mut conn, &keys, &r1),
        1,
        "released; the other reader still holds it"
    );
    assert_eq!(holders(&mut conn, &keys[0]), std::slice::from_ref(&r2));
}

#[test]
fn a_free_key_that_others_wait_for_is_busy_for_a_multi_key_newcomer() {
    let mut conn = shared_server().conn();
    let (a, b) = ("family:{queue}:a", "family:{queue}:b");
    let lock_a = keys::default_key(a);
    let waiter = value("family:multi-queue", "waiter");
    // Someone waits in a's line (its holder just expired, and the waiter has not looked yet).
    let deadline: (u64, u64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
    let entry = format!(
        "{waiter} {} {TTL} 0 ",
        deadline.0 * 1000 + deadline.1 / 1000 + LEASE
    );
    redis::cmd("RPUSH")
        .arg(keys::helper(&lock_a, "line"))
        .arg(entry)
        .query::<()>(&mut conn)
        .expect("RPUSH");
    let newcomer = value("family:multi-queue", "newcomer");
    let refused = ints(&multi_try(&mut conn, &[b, a], &newcomer, false));
    assert_eq!(
        (refused[0], refused[1], refused[3]),
        (0, -3, 2),
        "{refused:?}"
    );
    assert_eq!(
        get(&mut conn, &keys::default_key(b)),
        None,
        "b was not taken alone"
    );

    // A key used as a semaphore is refused by name.
    let sem = semaphore_keys(b);
    assert_eq!(
        sem_acquire(&mut conn, &sem, &value(b, "s"), TTL, 2, "first").expect("s")[0],
        1
    );
    let error = multi_acquire()
        .key(multi_keys(&[b, a]))
        .arg(&newcomer)
        .arg(TTL)
        .arg("0")
        .arg("")
        .arg(LEASE)
        .arg("first")
        .arg(CLAIM)
        .arg("0")
        .invoke::<Value>(&mut conn)
        .expect_err("a semaphore is not a key to take with others");
    let (code, text) = refusal(&error);
    assert_eq!(code, "MODE", "{error}");
    assert!(text.starts_with("permits multi "), "{text}");
}

#[test]
fn concurrent_callers_never_hold_more_than_n_permits() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    const PERMITS: usize = 3;
    const SECTIONS: usize = 30;
    let name = "family:concurrent";
    let keys = Arc::new(semaphore_keys(name));
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..6)
        .map(|worker| {
            let (keys, inside, most) = (keys.clone(), inside.clone(), most.clone());
            std::thread::spawn(move || {
                let mut conn = shared_server().conn();
                for section in 0..SECTIONS {
                    let token = value(name, &format!("{worker}-{section}"));
                    let mut action = "join";
                    let deadline = std::time::Instant::now() + Duration::from_secs(30);
                    while sem_acquire(&mut conn, &keys, &token, TTL, 3, action).expect("acquire")[0]
                        != 1
                    {
                        assert!(std::time::Instant::now() < deadline, "no permit in 30 s");
                        action = "renew";
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert_ne!(sem_release(&mut conn, &keys, &token), 0, "lost a permit");
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a worker panicked");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= PERMITS,
        "{most} holders at once, for {PERMITS} permits"
    );
    assert!(most > 1, "the permits were never shared: {most}");
    assert!(holders(&mut shared_server().conn(), &keys[0]).is_empty());
}

/// A release run twice where it may be (the marks passed): the second run answers as the first,
/// for two permits released side by side; the marks vouch for no other token, and a release
/// without them answers "not ours" the second time, as before.
#[test]
fn a_release_run_twice_with_the_marks_answers_as_the_first() {
    let mut conn = shared_server().conn();
    let name = "family:released-twice";
    let keys = semaphore_keys(name);
    let marks = keys::helper(&keys[0], "releases");
    let forced = keys::helper(&keys[0], "forced-leases");
    let with_marks: Vec<String> = keys
        .iter()
        .cloned()
        .chain([forced, marks.clone()])
        .collect();
    let release = |conn: &mut Connection, token: &str, marked: bool| -> i64 {
        semaphore_release()
            .key(if marked { &with_marks[..] } else { &keys[..] })
            .arg(token)
            .arg(CLAIM)
            .arg("0")
            .arg("0")
            .arg(if marked { "5000" } else { "" })
            .invoke(conn)
            .expect("semaphore release")
    };
    let (one, two, other) = (value(name, "1"), value(name, "2"), value(name, "other"));
    for token in [&one, &two] {
        assert_eq!(
            sem_acquire(&mut conn, &keys, token, TTL, 2, "first").unwrap()[0],
            1
        );
    }
    assert_eq!(release(&mut conn, &one, true), 1);
    assert_eq!(release(&mut conn, &two, true), 1);
    assert_eq!(
        release(&mut conn, &one, true),
        1,
        "re-sent: answered as the first run"
    );
    assert_eq!(
        release(&mut conn, &two, true),
        1,
        "re-sent: answered as the first run"
    );
    assert_eq!(
        release(&mut conn, &other, true),
        0,
        "never released: not ours"
    );
    let pttl: i64 = redis::cmd("PTTL").arg(&marks).query(&mut conn).unwrap();
    assert!(pttl > 0 && pttl <= 5000, "the marks expire: {pttl}");

    // Readers, and several keys, the same way.
    let rw = rw_keys("family:released-twice:rw");
    let rw_marks: Vec<String> = rw
        .iter()
        .cloned()
        .chain([
            keys::helper(&rw[0], "forced-leases"),
            keys::helper(&rw[0], "releases"),
        ])
        .collect();
    let reader = reader(name, "r");
    assert_eq!(
        rw_acquire_as(&mut conn, &rw, &reader, "first").unwrap()[0],
        1
    );
    for run in ["first", "re-sent"] {
        let released: i64 = rw_release()
            .key(&rw_marks[..])
            .arg(&reader)
            .arg(CLAIM)
            .arg("0")
            .arg("0")
            .arg("5000")
            .invoke(&mut conn)
            .unwrap();
        assert_eq!(released, 1, "reader, {run} run");
    }
    let names = ["family:{twice}:a", "family:{twice}:b"];
    let token = value(name, "multi");
    assert_eq!(ints(&multi_try(&mut conn, &names, &token, false))[0], 1);
    let mut multi = multi_keys(&names);
    multi.push(keys::helper(&keys::default_key(names[0]), "releases"));
    for (run, expected) in [("first", vec![2, 0, 0]), ("re-sent", vec![0, 0, 0])] {
        let released: Vec<i64> = multi_release()
            .key(&multi[..])
            .arg(&token)
            .arg(CLAIM)
            .arg("0")
            .arg("0")
            .arg("5000")
            .invoke(&mut conn)
            .unwrap();
        assert_eq!(released, expected, "several keys, {run} run");
    }

    // Unmarked, as a standalone release on a connection in use is: "not ours" the second time.
    assert_eq!(
        sem_acquire(&mut conn, &keys, &one, TTL, 2, "first").unwrap()[0],
        1
    );
    assert_eq!(release(&mut conn, &one, false), 1);
    assert_eq!(release(&mut conn, &one, false), 0);
}

/// The order the multi-key script takes its keys in is the byte order every client sorts by,
/// compared byte by byte in the script (`bytes_before`), not by Lua's `<`, which follows the
/// server's locale: a shorter prefix first, and bytes compared unsigned (`é`'s UTF-8 bytes and
/// `\xff` after every ASCII byte).
#[test]
fn the_scripts_compare_keys_byte_by_byte() {
    let mut conn = shared_server().conn();
    let before = script(&["return bytes_before(ARGV[1], ARGV[2]) and 1 or 0"]);
    let cases: [(&[u8], &[u8], i64); 8] = [
        (b"lock:{a}:1", b"lock:{a}:2", 1),
        (b"lock:{a}:2", b"lock:{a}:1", 0),
        (b"lock:{a}", b"lock:{a}:1", 1),
        (b"lock:{a}:1", b"lock:{a}", 0),
        (b"same", b"same", 0),
        (b"Zebra", b"apple", 1),
        (b"a-b", b"ab", 1),
        ("lock:z".as_bytes(), "lock:\u{e9}".as_bytes(), 1),
    ];
    for (a, b, expected) in cases {
        let got: i64 = before
            .arg(a)
            .arg(b)
            .invoke(&mut conn)
            .expect("bytes_before");
        assert_eq!(
            got,
            expected,
            "bytes_before({:?}, {:?})",
            String::from_utf8_lossy(a),
            String::from_utf8_lossy(b)
        );
    }
    let high: i64 = before
        .arg(&b"lock:\x7f"[..])
        .arg(&b"lock:\xff"[..])
        .invoke(&mut conn)
        .expect("bytes_before");
    assert_eq!(high, 1, "a byte above 0x7f sorts after 0x7f");
}
