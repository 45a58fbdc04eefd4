//! Read-write locks (`LockOptions::mode`, attribute `mode = "read" | "write"`) against a real
//! Redis: readers share, a writer excludes everyone, the line is fair (a writer is not
//! overtaken by readers that come after it, readers at the head are let in together), and a
//! task holding the read lock that asks for the write lock is refused at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError, LockManager, LockMode, LockOptions};
use test_support::{connect, eventually, global_server, keys, shared_server};

fn read() -> LockOptions {
    LockOptions::new()
        .mode(LockMode::Read)
        .ttl(Duration::from_secs(20))
        .timeout(Duration::from_secs(30))
}

fn write() -> LockOptions {
    LockOptions::new()
        .mode(LockMode::Write)
        .ttl(Duration::from_secs(20))
        .timeout(Duration::from_secs(30))
}

/// How many entries the lock `name`'s line holds (readers and writers wait in the mutex's).
fn line_length(name: &str) -> usize {
    redis::cmd("LLEN")
        .arg(keys::named(name).line())
        .query(&mut shared_server().conn())
        .unwrap()
}

#[tokio::test]
async fn readers_share_and_a_writer_waits_for_them() {
    let server = shared_server();
    let (a, b, w) = (
        connect(server).await,
        connect(server).await,
        connect(server).await,
    );
    let first = a.acquire("rw:share", &read()).await.unwrap();
    let second = b
        .try_acquire("rw:share", &read())
        .await
        .unwrap()
        .expect("a second reader shares the lock");
    assert!(
        w.try_acquire("rw:share", &write()).await.unwrap().is_none(),
        "no writer while readers hold it"
    );
    assert!(
        w.try_acquire("rw:share", &LockOptions::new())
            .await
            .unwrap()
            .is_none(),
        "a mutex of the name is its writer"
    );
    let writer = tokio::spawn(async move { w.acquire("rw:share", &write()).await });
    eventually(Duration::from_secs(10), "the writer is in line", || {
        line_length("rw:share") == 1
    })
    .await;
    first.release().await.unwrap();
    assert!(
        w_waits(&writer).await,
        "the writer still waits while one reader holds the lock"
    );
    second.release().await.unwrap();
    let writer = writer
        .await
        .unwrap()
        .expect("the writer gets it once the readers are gone");
    assert!(
        a.try_acquire("rw:share", &read()).await.unwrap().is_none(),
        "no reader while the writer holds it"
    );
    writer.release().await.unwrap();
    assert!(!server.exists("lock:rw:share"));
}

/// Whether the writer's acquisition is still waiting, a moment after the last change.
async fn w_waits<T>(writer: &tokio::task::JoinHandle<T>) -> bool {
    tokio::time::sleep(Duration::from_millis(100)).await;
    !writer.is_finished()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writer_is_not_starved_by_a_stream_of_readers() {
    let server = shared_server();
    let readers = connect(server).await;
    let writer_manager = connect(server).await;
    let first = readers.acquire("rw:starve", &read()).await.unwrap();
    let writer_in = Arc::new(AtomicUsize::new(0));
    let writer = {
        let writer_in = writer_in.clone();
        tokio::spawn(async move {
            let guard = writer_manager.acquire("rw:starve", &write()).await?;
            writer_in.store(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            writer_in.store(2, Ordering::SeqCst);
            guard.release().await
        })
    };
    eventually(Duration::from_secs(10), "the writer is in line", || {
        line_length("rw:starve") == 1
    })
    .await;
    // Readers keep coming while the first still reads: none gets in ahead of the writer.
    let mut later = Vec::new();
    for _ in 0..5 {
        let (readers, writer_in) = (readers.clone(), writer_in.clone());
        later.push(tokio::spawn(async move {
            let guard = readers.acquire("rw:starve", &read()).await?;
            let seen = writer_in.load(Ordering::SeqCst);
            guard.release().await?;
            Ok::<usize, LockError>(seen)
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        line_length("rw:starve") >= 2,
        "the later readers wait behind the writer, though a reader holds the lock"
    );
    first.release().await.unwrap();
    writer.await.unwrap().expect("the writer got the lock");
    for reader in later {
        assert_eq!(
            reader.await.unwrap().unwrap(),
            2,
            "a reader that came after the writer got in only after it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_at_the_head_are_let_in_together() {
    let server = shared_server();
    let holder = connect(server).await;
    let writer = holder.acquire("rw:together", &write()).await.unwrap();
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut readers = Vec::new();
    for n in 0..3 {
        let manager = connect(server).await;
        let (inside, most) = (inside.clone(), most.clone());
        readers.push(tokio::spawn(async move {
            let guard = manager.acquire("rw:together", &read()).await?;
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            // Each stays until all three are in (or a while has passed).
            let until = Instant::now() + Duration::from_secs(5);
            while most.load(Ordering::SeqCst) < 3 && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await
        }));
        eventually(Duration::from_secs(10), "the reader is in line", || {
            line_length("rw:together") == n + 1
        })
        .await;
    }
    writer.release().await.unwrap();
    for reader in readers {
        reader.await.unwrap().expect("every reader got in");
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        3,
        "the writer's release let every reader in line in at once"
    );
    assert!(!server.exists("lock:rw:together"));
}

#[tokio::test]
async fn a_task_holding_the_read_lock_is_refused_the_write_lock_at_once() {
    let manager = connect(shared_server()).await;
    let reader = manager.acquire("rw:upgrade", &read()).await.unwrap();
    let started = Instant::now();
    let error = reader
        .scope(async { manager.acquire("rw:upgrade", &write()).await })
        .await
        .expect_err("no upgrade");
    assert!(
        matches!(&error, LockError::Config(message) if message.contains("not upgraded")),
        "{error:?}"
    );
    assert!(
        started.elapsed() < write().timeout_duration(),
        "refused, not waited for until the timeout"
    );
    // The same mode re-enters.
    let again = reader
        .scope(async { manager.acquire("rw:upgrade", &read()).await })
        .await
        .expect("the same mode re-enters");
    again.release().await.unwrap();
    reader.release().await.unwrap();

    // A write lock covers a read of the same name.
    let writer = manager.acquire("rw:upgrade", &write()).await.unwrap();
    let inner = writer
        .scope(async { manager.acquire("rw:upgrade", &read()).await })
        .await
        .expect("a weaker mode re-enters");
    assert_eq!(inner.token(), writer.token());
    inner.release().await.unwrap();
    writer.release().await.unwrap();
}

#[tokio::test]
async fn a_name_used_as_semaphore_and_read_lock_is_refused() {
    let manager = connect(shared_server()).await;
    let permit = manager
        .acquire("rw:two-ways", &LockOptions::new().permits(2))
        .await
        .unwrap();
    let error = manager
        .acquire("rw:two-ways", &read().timeout(Duration::from_secs(5)))
        .await
        .expect_err("a reader on a semaphore");
    assert!(
        matches!(&error, LockError::Config(message) if message.contains("semaphore") && message.contains("read")),
        "{error:?}"
    );
    permit.release().await.unwrap();
}

#[distributed_lock(key = "rw:attr:{shop}", mode = "read", guard = lock)]
async fn read_catalog(shop: &str, manager: &LockManager) -> Result<bool, LockError> {
    // Another reader gets in beside this one; a writer does not.
    let other = manager
        .try_acquire(&format!("rw:attr:{shop}"), &read())
        .await?;
    let writer = manager
        .try_acquire(&format!("rw:attr:{shop}"), &write())
        .await?;
    let shared = other.is_some() && writer.is_none();
    if let Some(other) = other {
        other.release().await?;
    }
    Ok(shared && lock.token().ends_with(";m=r"))
}

#[tokio::test]
async fn the_attribute_takes_the_read_lock() {
    let server = global_server().await;
    let manager = connect(server).await;
    assert!(read_catalog("north", &manager).await.unwrap());
    assert!(
        !server.exists("lock:rw:attr:north"),
        "released after the body"
    );
}

/// Writers that take the lock while readers come and go, each reader's lease ending a moment
/// after it began: a writer's plain attempt can meet a leased set of readers that is gone (or
/// a writer's string) by the time it looks at what the set is. Such a writer waits and gets
/// the lock; it is never refused as if the name were used in two ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_among_churning_readers_are_never_refused() {
    const NAME: &str = "rw:churn";
    const WRITES: usize = 200;
    let server = shared_server();
    let stop = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    for _ in 0..3 {
        let (manager, stop) = (connect(server).await, stop.clone());
        readers.push(tokio::spawn(async move {
            let mut cycles = 0_usize;
            while stop.load(Ordering::SeqCst) == 0 {
                let guard = manager.acquire(NAME, &read()).await?;
                guard.release().await?;
                cycles += 1;
            }
            Ok::<usize, LockError>(cycles)
        }));
    }
    let mut writers = Vec::new();
    for _ in 0..2 {
        let manager = connect(server).await;
        writers.push(tokio::spawn(async move {
            for _ in 0..WRITES {
                let guard = manager.acquire(NAME, &write()).await?;
                guard.release().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    let mut refused = Vec::new();
    for writer in writers {
        if let Err(error) = writer.await.unwrap() {
            refused.push(error.to_string());
        }
    }
    stop.store(1, Ordering::SeqCst);
    let mut cycles = 0;
    for reader in readers {
        cycles += reader
            .await
            .unwrap()
            .expect("a reader is never refused either");
    }
    assert!(
        refused.is_empty(),
        "writers among {cycles} reader cycles were refused: {refused:?}"
    );
    assert!(cycles > 0, "the readers took the lock meanwhile");
    assert!(!server.exists("lock:rw:churn"), "everything was given back");
}
