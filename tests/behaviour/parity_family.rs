//! Semaphores and read-write locks, written once and run against every backend as `parity`'s
//! tests are: `parity_redis.rs` and `parity_in_process.rs` call `family_parity_tests!`.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{LockError, LockManager, LockMode, LockOptions, LostCause};

/// Tests of one backend, each calling the body of the same name below.
macro_rules! family_parity_tests {
    ($connect:path) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn permits_let_in_n_at_once() {
            parity_family::permits_let_in_n_at_once($connect).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn permit_waiters_are_served_in_arrival_order() {
            parity_family::permit_waiters_are_served_in_arrival_order($connect).await;
        }
        #[tokio::test]
        async fn a_permit_is_a_lease() {
            parity_family::a_permit_is_a_lease($connect).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_force_release_breaks_every_permit_or_reader_and_lets_the_line_in() {
            parity_family::a_force_release_breaks_every_permit_or_reader_and_lets_the_line_in(
                $connect,
            )
            .await;
        }
        #[tokio::test]
        async fn when_every_permit_runs_out_the_line_is_let_in() {
            parity_family::when_every_permit_runs_out_the_line_is_let_in($connect).await;
        }
        #[tokio::test]
        async fn a_name_used_two_ways_and_another_n_are_refused() {
            parity_family::a_name_used_two_ways_and_another_n_are_refused($connect).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn readers_share_writers_wait_and_are_not_overtaken() {
            parity_family::readers_share_writers_wait_and_are_not_overtaken($connect).await;
        }
    };
}
pub(crate) use family_parity_tests;

/// A name of this test's own on a store shared by the binary's tests.
fn name(test: &str) -> String {
    static RUN: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let run = RUN.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    });
    format!("family-parity:{test}:{run}")
}

fn permits(n: u32) -> LockOptions {
    LockOptions::new()
        .permits(n)
        .ttl(Duration::from_secs(20))
        .timeout(Duration::from_secs(30))
}

pub(crate) async fn permits_let_in_n_at_once<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let name = name("n-at-once");
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (manager, name) = (connect().await, name.clone());
        let (inside, most) = (inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                let guard = manager.acquire(&name, &permits(2)).await?;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for task in tasks {
        task.await
            .unwrap()
            .expect("every permit was had and given back");
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "two holders at once, never three"
    );
}

pub(crate) async fn permit_waiters_are_served_in_arrival_order<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let name = name("fifo");
    let holder = connect().await;
    let held = holder.acquire(&name, &permits(2)).await.unwrap();
    let other = holder.acquire(&name, &permits(2)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for waiter in 0..3 {
        let (manager, asked, order) = (connect().await, name.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = manager.acquire(&asked, &permits(2)).await.unwrap();
            order.lock().unwrap().push(waiter);
            // Held a while: the order seen is the order of the grants, not of the wake-ups.
            tokio::time::sleep(Duration::from_millis(100)).await;
            guard.release().await.unwrap();
        }));
        // In line before the next comes, however slowly a loaded machine lets it get there.
        test_support::waiting_in_line(&holder, &name, waiter + 1).await;
    }
    assert!(
        holder
            .try_acquire(&name, &permits(2))
            .await
            .unwrap()
            .is_none(),
        "a newcomer does not overtake the line"
    );
    held.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    other.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
}

pub(crate) async fn a_permit_is_a_lease<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let name = name("lease");
    let manager = connect().await;
    let options = permits(2).ttl(Duration::from_millis(400)).fencing(true);
    let kept = manager.acquire(&name, &options).await.unwrap();
    let dropped = manager.acquire(&name, &options).await.unwrap();
    assert!(dropped.fencing_token() > kept.fencing_token());
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        kept.extend(Duration::from_millis(400)).await.unwrap();
    }
    assert!(kept.is_held().await.unwrap());
    assert!(!dropped.is_held().await.unwrap(), "its lease ran out");
    assert!(matches!(
        dropped.release().await,
        Err(LockError::Lost { .. })
    ));
    let inspected = manager.inspect(&name).await.unwrap().expect("held");
    assert_eq!(inspected.holders.len(), 1, "{inspected:?}");
    kept.release().await.unwrap();
    assert!(manager.inspect(&name).await.unwrap().is_none());
}

/// An operator's `force_release` of a semaphore, and of a read lock: every holder inspected
/// loses its lease and is told so (`ForceReleased`) by its extension or release, and the
/// waiter at the head of the line is let in at once, long before the leases would run out.
pub(crate) async fn a_force_release_breaks_every_permit_or_reader_and_lets_the_line_in<F, Fut>(
    connect: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let (holders, operator, waiters) = (connect().await, connect().await, connect().await);
    let reader = LockOptions::new()
        .mode(LockMode::Read)
        .ttl(Duration::from_secs(60))
        .timeout(Duration::from_secs(30));
    let cases = [
        (
            "semaphore",
            permits(2).ttl(Duration::from_secs(60)),
            permits(2),
        ),
        (
            "readers",
            reader,
            LockOptions::new().timeout(Duration::from_secs(30)),
        ),
    ];
    for (what, held, waiting) in cases {
        let name = name(&format!("forced-{what}"));
        let first = holders.acquire(&name, &held).await.unwrap();
        let second = holders.acquire(&name, &held).await.unwrap();
        let (waiters, waiter_name) = (waiters.clone(), name.clone());
        let waiter = tokio::spawn(async move { waiters.acquire(&waiter_name, &waiting).await });
        let info = test_support::waiting_in_line(&operator, &name, 1).await;
        assert_eq!(info.holders.len(), 2, "{what}: {info:?}");
        assert!(
            operator.force_release(&info).await.unwrap(),
            "{what}: broke it"
        );
        let admitted = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("{what}: the waiter was not let in"))
            .unwrap()
            .unwrap_or_else(|error| panic!("{what}: the waiter's acquire: {error}"));
        let told = [
            first.extend(Duration::from_secs(60)).await,
            second.release().await,
            first.release().await,
        ];
        for told in told {
            assert!(
                matches!(
                    told,
                    Err(LockError::Lost {
                        cause: LostCause::ForceReleased,
                        ..
                    })
                ),
                "{what}: {told:?}"
            );
        }
        // Again with the same look (on Redis, a call re-sent: it answers as the first did):
        // only the holders seen are broken, and the waiter let in since keeps its lease.
        operator.force_release(&info).await.unwrap();
        assert!(admitted.is_held().await.unwrap(), "{what}");
        admitted.release().await.unwrap();
    }
}

/// Every permit's holder stops renewing (hung, or gone without a release): the waiters in the
/// semaphore's line get their permits when the leases run out, though nobody releases.
pub(crate) async fn when_every_permit_runs_out_the_line_is_let_in<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let name = name("all-run-out");
    let (holders, waiters) = (connect().await, connect().await);
    let short = permits(2).ttl(Duration::from_millis(300));
    let first = holders.acquire(&name, &short).await.unwrap();
    let second = holders.acquire(&name, &short).await.unwrap();
    let waiting = |waiters: LockManager, name: String| {
        tokio::spawn(async move {
            waiters
                .acquire(&name, &permits(2).timeout(Duration::from_secs(10)))
                .await
        })
    };
    let one = waiting(waiters.clone(), name.clone());
    let two = waiting(waiters.clone(), name.clone());
    let (one, two) = (one.await.unwrap(), two.await.unwrap());
    let (one, two) = (
        one.expect("the first waiter is let in once the leases ran out"),
        two.expect("the second waiter is let in once the leases ran out"),
    );
    assert!(!first.is_held().await.unwrap() && !second.is_held().await.unwrap());
    assert!(one.is_held().await.unwrap() && two.is_held().await.unwrap());
    for lost in [first, second] {
        assert!(matches!(lost.release().await, Err(LockError::Lost { .. })));
    }
    one.release().await.unwrap();
    two.release().await.unwrap();
}

pub(crate) async fn a_name_used_two_ways_and_another_n_are_refused<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let name = name("two-ways");
    let (one, other) = (connect().await, connect().await);
    let quick = |options: LockOptions| options.timeout(Duration::from_secs(2));
    let semaphore = one.acquire(&name, &permits(4)).await.unwrap();
    for (options, says) in [
        (quick(LockOptions::new()), "mutex"),
        (quick(LockOptions::new().mode(LockMode::Read)), "read"),
        (quick(permits(2)), "same number of permits"),
    ] {
        let error = other.acquire(&name, &options).await.expect_err("refused");
        assert!(
            matches!(&error, LockError::Config(message) if message.contains(says)),
            "{says}: {error:?}"
        );
    }
    semaphore.release().await.unwrap();
}

pub(crate) async fn readers_share_writers_wait_and_are_not_overtaken<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let name = name("rw");
    let read = LockOptions::new()
        .mode(LockMode::Read)
        .timeout(Duration::from_secs(30));
    let write = LockOptions::new().timeout(Duration::from_secs(30));
    let (a, b, w) = (connect().await, connect().await, connect().await);
    let first = a.acquire(&name, &read).await.unwrap();
    let second = b
        .try_acquire(&name, &read)
        .await
        .unwrap()
        .expect("readers share");
    assert!(w.try_acquire(&name, &write).await.unwrap().is_none());
    let writer = {
        let (name, write) = (name.clone(), write.clone());
        tokio::spawn(async move { w.acquire(&name, &write).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        b.try_acquire(&name, &read).await.unwrap().is_none(),
        "a reader that comes after a waiting writer does not overtake it"
    );
    first.release().await.unwrap();
    second.release().await.unwrap();
    let writer = writer
        .await
        .unwrap()
        .expect("the writer gets in after the readers");
    assert!(a.try_acquire(&name, &read).await.unwrap().is_none());
    writer.release().await.unwrap();
    let again = a.try_acquire(&name, &read).await.unwrap();
    assert!(again.is_some(), "free again");
    again.unwrap().release().await.unwrap();
}
