//! What distlock traced, for tests that check its events: a `tracing` subscriber that records
//! every event of the thread that sets it as one line, `LEVEL target field=value ...`.

use std::fmt::Write as _;
use std::sync::Mutex;

/// Every event recorded so far, by every thread that set a [`Recorder`].
static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The subscriber: set it with `tracing::subscriber::set_default(Recorder)`.
pub(crate) struct Recorder;

/// The events recorded so far.
pub(crate) fn events() -> Vec<String> {
    EVENTS.lock().unwrap().clone()
}

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let metadata = event.metadata();
        let mut line = format!("{} {}", metadata.level(), metadata.target());
        event.record(&mut Fields(&mut line));
        EVENTS.lock().unwrap().push(line);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
