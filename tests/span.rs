// A binary of its own: it installs the process's one global tracing subscriber.
//! The `distlock.lock` span of a locked call: key, label, wait and fencing token, with
//! distlock's events and the body's own events inside it — read by a test subscriber.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager, LockOptions};
use test_support::global_server;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// A span's name and fields.
type SpanData = (String, BTreeMap<String, String>);

#[derive(Default)]
struct Captured {
    next_id: AtomicU64,
    /// Span id → name and fields.
    spans: Mutex<HashMap<u64, SpanData>>,
    /// Span id → its metadata, for `current_span` (how `Span::current()` finds the span).
    metadata: Mutex<HashMap<u64, &'static Metadata<'static>>>,
    /// Each event: its target, its message, and the id of the span it happened in.
    events: Mutex<Vec<(String, String, Option<u64>)>>,
}

thread_local! {
    /// The spans entered on this thread, innermost last.
    static ENTERED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for &'static Captured {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut fields = BTreeMap::new();
        span.record(&mut Fields(&mut fields));
        self.metadata.lock().unwrap().insert(id, span.metadata());
        self.spans
            .lock()
            .unwrap()
            .insert(id, (span.metadata().name().to_owned(), fields));
        Id::from_u64(id)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some((_, fields)) = self.spans.lock().unwrap().get_mut(&span.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let parent = match event.parent() {
            Some(parent) => Some(parent.into_u64()),
            None if event.is_contextual() => {
                ENTERED.with(|entered| entered.borrow().last().copied())
            }
            None => None,
        };
        self.events.lock().unwrap().push((
            event.metadata().target().to_owned(),
            fields.remove("message").unwrap_or_default(),
            parent,
        ));
    }
    fn current_span(&self) -> tracing_core::span::Current {
        let current = ENTERED.with(|entered| entered.borrow().last().copied());
        match current.and_then(|id| Some((id, *self.metadata.lock().unwrap().get(&id)?))) {
            Some((id, metadata)) => tracing_core::span::Current::new(Id::from_u64(id), metadata),
            None => tracing_core::span::Current::none(),
        }
    }
    fn enter(&self, span: &Id) {
        ENTERED.with(|entered| entered.borrow_mut().push(span.into_u64()));
    }
    fn exit(&self, span: &Id) {
        ENTERED.with(|entered| {
            let mut entered = entered.borrow_mut();
            if let Some(at) = entered.iter().rposition(|id| *id == span.into_u64()) {
                entered.remove(at);
            }
        });
    }
}

fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<&'static Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured: &'static Captured = Box::leak(Box::default());
        tracing::subscriber::set_global_default(captured).expect("the only subscriber here");
        captured
    })
}

/// The `distlock.lock` spans whose key is `key`: (id, fields).
fn spans_for(key: &str) -> Vec<(u64, BTreeMap<String, String>)> {
    captured()
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, (name, fields))| {
            name == "distlock.lock" && fields.get("key").map(String::as_str) == Some(key)
        })
        .map(|(id, (_, fields))| (*id, fields.clone()))
        .collect()
}

fn events_in(span: u64) -> Vec<(String, String)> {
    captured()
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, parent)| *parent == Some(span))
        .map(|(target, message, _)| (target.clone(), message.clone()))
        .collect()
}

#[distributed_lock(key = "span:{id}", ttl = 5, timeout = 20, fencing = true, guard = lock)]
async fn fenced(id: u32) -> Result<Option<u64>, LockError> {
    tracing::info!(target: "app", "working on {id}");
    Ok(lock.fencing_token())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_call_runs_in_its_span_with_key_label_wait_and_fence() {
    captured();
    let server = global_server().await;
    let fence = fenced(7).await.unwrap().expect("a fencing token");

    let spans = spans_for("span:7");
    assert_eq!(spans.len(), 1, "one span per call: {spans:?}");
    let (id, fields) = &spans[0];
    assert_eq!(fields["label"], "span::fenced span:{id}");
    assert_eq!(fields["fence"], fence.to_string());
    let wait: f64 = fields["wait_ms"].parse().expect("wait_ms is a number");
    assert!((0.0..10_000.0).contains(&wait), "{wait}");
    let events = events_in(*id);
    assert!(
        events.contains(&("app".to_owned(), "working on 7".to_owned())),
        "the body's event is inside the span: {events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(target, message)| target == "distlock" && message == "acquired"),
        "distlock's own event is inside the span: {events:?}"
    );

    // Contended: the wait shows in the span, and so does the "contended" event.
    let holder = LockManager::connect(&server.url()).await.unwrap();
    let held = holder
        .acquire("span:8", &LockOptions::new().label("other"))
        .await
        .unwrap();
    let call = tokio::spawn(fenced(8));
    tokio::time::sleep(Duration::from_millis(400)).await;
    held.release().await.unwrap();
    call.await.unwrap().unwrap();
    let spans = spans_for("span:8");
    assert_eq!(spans.len(), 1, "{spans:?}");
    let (id, fields) = &spans[0];
    let wait: f64 = fields["wait_ms"].parse().unwrap();
    assert!(wait >= 300.0, "waited {wait} ms for a lock held 400 ms");
    let events = events_in(*id);
    assert!(
        events
            .iter()
            .any(|(_, message)| message == "contended; waiting"),
        "{events:?}"
    );
}

#[distributed_lock(key = "span-skip:{id}", ttl = 5, fencing = true, on_busy = "skip", guard = lock)]
async fn skip_fenced(id: u32) -> Result<Option<u64>, LockError> {
    Ok(lock.fencing_token())
}

#[distributed_lock(key = "span-fail:{id}", ttl = 5, fencing = true, on_busy = "fail", guard = lock)]
async fn fail_fenced(id: u32) -> Result<Option<u64>, LockError> {
    Ok(lock.fencing_token())
}

#[distributed_lock(key = "span-sync:{id}", ttl = 5, timeout = 20, fencing = true, guard = lock)]
fn sync_fenced(id: u32) -> Result<Option<u64>, LockError> {
    Ok(lock.fencing_token())
}

/// A call that takes the lock in one attempt (`on_busy = "skip"` or `"fail"`), or a plain `fn`
/// that takes it, holds it as any other does: its span carries the fencing token and the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_attempt_that_gets_the_lock_records_wait_and_fence() {
    captured();
    let _server = global_server().await;
    let skipped = skip_fenced(1).await.unwrap();
    let failed = fail_fenced(1).await.unwrap();
    // A plain `fn` takes it through the blocking manager, in the same span.
    let synced = std::thread::spawn(|| sync_fenced(1))
        .join()
        .unwrap()
        .unwrap();
    for (key, fence) in [
        ("span-skip:1", skipped),
        ("span-fail:1", failed),
        ("span-sync:1", synced),
    ] {
        let fence = fence.expect("a fencing token");
        let spans = spans_for(key);
        assert_eq!(spans.len(), 1, "{spans:?}");
        let fields = &spans[0].1;
        assert_eq!(
            fields.get("fence"),
            Some(&fence.to_string()),
            "{key}: {fields:?}"
        );
        let wait: f64 = fields
            .get("wait_ms")
            .unwrap_or_else(|| panic!("{key}: no wait_ms in {fields:?}"))
            .parse()
            .unwrap();
        assert!((0.0..10_000.0).contains(&wait), "{wait}");
    }
}
