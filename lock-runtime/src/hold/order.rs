//! Lock-order warnings, before the first deadlock: the orders in which tasks take the locks of
//! `#[distributed_lock]` functions, by key template, in this process and across the fleet.
//!
//! A lock's *class* is its key template (`invoice:{id}`), as the attribute writes it into the
//! lock's label (`path::to::function invoice:{id}`). When a task that holds a lock of class A
//! starts waiting for one of class B, the order A → B is recorded; when B → A has been recorded
//! too, two tasks doing both at once can deadlock each other (each waits for the other until
//! its timeout), even if it never happened yet: one `tracing` warning (target `distlock`) names
//! both templates and the functions that took them in each order, once per pair of classes for
//! the life of the process, and the `distlock_lock_order_inversions_total` counter counts it.
//!
//! **Across the fleet.** The first time this process sees an order, it also records it in
//! Redis (`backend::orders`: one hash per key prefix, capped and expiring) and reads whether any
//! process recorded the opposite one; if one did, the warning names that process's functions.
//! The record is written in the background, once per order per process, bounded in number
//! ([`MAX_IN_FLIGHT`]): it never delays or fails the lock, and a failed write is a debug event.
//! An order this process has seen costs what it cost before: one read of a process-wide map, no
//! command, no allocation. The in-process backend records nothing: this process is its fleet.
//!
//! **Blocking.** A locked plain `fn` holds its lock on its thread while its body runs
//! ([`ThreadClass`]): a locked `fn` it calls on that thread orders the two templates as a task
//! does.
//!
//! Limits, chosen for a check that costs nothing to a task that holds nothing:
//! - only waiting acquisitions are recorded (`on_busy = "skip"` and `"fail"` make one attempt
//!   and cannot wait, so they cannot close a deadlock);
//! - two locks of the same template (`invoice:{a}` then `invoice:{b}`) are not an order: the
//!   template does not say which id comes first;
//! - locks taken through the manual API have no template and are not recorded.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use tracing::instrument::WithSubscriber;

use crate::backend::keys::orders_key;
use crate::backend::orders::SeenOrder;
use crate::shared::Shared;

/// A recorded order: the first functions seen taking it, and when.
struct Taken {
    /// The function that held the first lock.
    holder: Box<str>,
    /// The function that then waited for the second.
    taker: Box<str>,
    first_seen: SystemTime,
}

/// Held template → taken template → who did it first.
type Orders = HashMap<Box<str>, HashMap<Box<str>, Taken>>;

static ORDERS: LazyLock<RwLock<Orders>> = LazyLock::new(RwLock::default);

/// The pairs of templates warned about, each as (lesser, greater): once per pair, whether the
/// opposite order was seen here or elsewhere in the fleet.
static WARNED: LazyLock<Mutex<HashSet<Pair>>> = LazyLock::new(Mutex::default);

/// Two templates, the lesser first.
type Pair = (Box<str>, Box<str>);

/// The most records of new orders in flight to Redis at once; past it, a new order is not
/// recorded in Redis (a debug event says so) rather than queued without bound.
pub(crate) const MAX_IN_FLIGHT: usize = 64;

/// Records of new orders in flight to Redis.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// The function and the template of an attribute's label (`path::function template`).
fn split(label: &str) -> (&str, &str) {
    label.split_once(' ').unwrap_or((label, label))
}

/// A task holding the lock labelled `held` waits for the one labelled `taken`: records the
/// order, and warns if the opposite order was recorded before. `fleet`: the manager's inside
/// (as made, not yet asked which one works in this process: only a new order needs it), whose
/// Redis records a new order for the other processes of the fleet.
pub(crate) fn record(fleet: Option<&Arc<Shared>>, held: &str, taken: &str) {
    let (holder, first) = split(held);
    let (taker, second) = split(taken);
    if first == second {
        return;
    }
    let known = |orders: &Orders| {
        orders
            .get(first)
            .is_some_and(|then| then.contains_key(second))
    };
    // The common case, an order seen before, only reads.
    if known(&ORDERS.read().unwrap_or_else(PoisonError::into_inner)) {
        return;
    }
    let mut orders = ORDERS.write().unwrap_or_else(PoisonError::into_inner);
    if known(&orders) {
        return;
    }
    let first_seen = SystemTime::now();
    orders.entry(first.into()).or_default().insert(
        second.into(),
        Taken {
            holder: holder.into(),
            taker: taker.into(),
            first_seen,
        },
    );
    // This order is new here, so the pair is warned about here or by the fleet's answer.
    let opposite = orders
        .get(second)
        .and_then(|then| then.get(first))
        .map(|opposite| (opposite.holder.to_string(), opposite.taker.to_string()));
    drop(orders);
    let order = SeenOrder {
        first: first.to_owned(),
        second: second.to_owned(),
        holder: holder.to_owned(),
        taker: taker.to_owned(),
        process: this_process(),
        first_seen,
    };
    if let Some((opposite_holder, opposite_taker)) = opposite {
        warn(
            &order,
            &SeenOrder {
                holder: opposite_holder,
                taker: opposite_taker,
                ..order.clone()
            },
            false,
        );
    }
    if let Some(shared) = fleet {
        record_in_fleet(shared, order);
    }
}

/// `<host> <pid>` of this process, as the fleet's record names it.
fn this_process() -> String {
    format!(
        "{} {}",
        crate::support::identity::host(),
        std::process::id()
    )
}

/// A record in flight to Redis, counted in [`IN_FLIGHT`] until dropped (done, or dropped with
/// the runtime that ran it).
struct InFlight;

impl InFlight {
    /// A place among the records in flight; `None` when all [`MAX_IN_FLIGHT`] are taken.
    fn take() -> Option<InFlight> {
        if IN_FLIGHT.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
            IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(InFlight)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Records a new order in the fleet's record, in the background, and warns when another
/// process recorded the opposite one.
fn record_in_fleet(shared: &Arc<Shared>, order: SeenOrder) {
    // The manager as it works in this process (made anew in a forked one): asked here, on a
    // new order only, rather than by every acquisition.
    let Ok(shared) = shared.current().map(Arc::clone) else {
        return;
    };
    let Some(key) = orders_key(&shared.key_prefix).filter(|_| shared.backend.records_orders())
    else {
        return;
    };
    let Some(in_flight) = InFlight::take() else {
        tracing::debug!(target: "distlock", first = %order.first, second = %order.second, "lock order not recorded in Redis: {MAX_IN_FLIGHT} records already in flight");
        return;
    };
    // The warning goes where the caller's events go, though it is made on another thread.
    let write = async move {
        match shared.backend.record_order(&key, &order).await {
            Ok(Some(recorded)) => {
                if !recorded.kept {
                    tracing::debug!(target: "distlock", key = %key, first = %order.first, second = %order.second, "lock order not recorded in Redis: the record is full ({} orders)", crate::backend::orders::MAX_ORDERS);
                }
                if let Some(opposite) = recorded.opposite {
                    warn(&order, &opposite, true);
                }
            }
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(target: "distlock", key = %key, first = %order.first, second = %order.second, %error, "lock order not recorded in Redis");
            }
        }
        drop(in_flight);
    };
    crate::support::background::spawn(write.with_current_subscriber());
}

/// Warns, once per pair of templates, that `order` and `opposite` (the same templates, the
/// other way round) were both seen; `elsewhere` when `opposite` was seen by another process.
fn warn(order: &SeenOrder, opposite: &SeenOrder, elsewhere: bool) {
    let (first, second) = (order.first.as_str(), order.second.as_str());
    let pair = if first < second {
        (first.into(), second.into())
    } else {
        (second.into(), first.into())
    };
    if !WARNED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(pair)
    {
        return;
    }
    let where_seen = if elsewhere {
        let ago = SystemTime::now()
            .duration_since(opposite.first_seen)
            .unwrap_or_default();
        format!(
            " in process `{}` (first seen {} ago)",
            opposite.process,
            rough(ago)
        )
    } else {
        String::new()
    };
    tracing::warn!(
        target: "distlock",
        first = %first,
        second = %second,
        "lock order inversion: `{taker}` waits for `{second}` while holding `{first}` (taken by \
         `{holder}`), and `{opposite_taker}` waits for `{first}` while holding `{second}` (taken \
         by `{opposite_holder}`){where_seen}; two tasks doing both at once wait for each other \
         until one times out: take these locks in one order everywhere (or take both at once)",
        taker = order.taker,
        holder = order.holder,
        opposite_taker = opposite.taker,
        opposite_holder = opposite.holder,
    );
    crate::meters::order_inversion(first, second);
}

/// A duration to the unit people would say: `40 s`, `12 min`, `5 h`, `3 days`.
fn rough(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0..120 => format!("{secs} s"),
        120..7200 => format!("{} min", secs / 60),
        7200..172_800 => format!("{} h", secs / 3600),
        _ => format!("{} days", secs / 86_400),
    }
}

/// The orders this process has seen, by template pair: the in-process backend's whole record.
pub(crate) fn seen_here() -> Vec<SeenOrder> {
    let process = this_process();
    let orders = ORDERS.read().unwrap_or_else(PoisonError::into_inner);
    let mut seen: Vec<SeenOrder> = orders
        .iter()
        .flat_map(|(first, then)| {
            then.iter().map(|(second, taken)| SeenOrder {
                first: first.to_string(),
                second: second.to_string(),
                holder: taken.holder.to_string(),
                taker: taken.taker.to_string(),
                process: process.clone(),
                first_seen: taken.first_seen,
            })
        })
        .collect();
    seen.sort_by(|a, b| (&a.first, &a.second).cmp(&(&b.first, &b.second)));
    seen
}

thread_local! {
    /// The labels of the locks the locked plain `fn`s running on this thread hold, outermost
    /// first.
    static THREAD_CLASSES: RefCell<Vec<Arc<str>>> = const { RefCell::new(Vec::new()) };
}

/// A locked plain `fn`'s lock in its thread's list of lock-order classes, until dropped.
pub(crate) struct ThreadClass(Arc<str>);

impl ThreadClass {
    /// The current thread holds a lock labelled `label` while the body of a locked plain `fn`
    /// runs; `None` on a thread that is exiting.
    pub(crate) fn enter(label: Arc<str>) -> Option<ThreadClass> {
        THREAD_CLASSES
            .try_with(|classes| classes.borrow_mut().push(Arc::clone(&label)))
            .ok()
            .map(|()| ThreadClass(label))
    }
}

impl Drop for ThreadClass {
    fn drop(&mut self) {
        let _ = THREAD_CLASSES.try_with(|classes| {
            let mut classes = classes.borrow_mut();
            if let Some(at) = classes
                .iter()
                .rposition(|class| Arc::ptr_eq(class, &self.0))
            {
                classes.remove(at);
            }
        });
    }
}

/// A locked plain `fn` on this thread waits for the lock labelled `taken`: records its order
/// after each lock the thread's locked `fn`s hold. Nothing when they hold none.
pub(crate) fn record_on_thread(fleet: Option<&Arc<Shared>>, taken: &str) {
    let _ = THREAD_CLASSES.try_with(|classes| {
        // One class at a time, borrowed only to take it: recording may log, and a subscriber
        // may take a lock of its own on this thread. No copy of the list, so a repeated order
        // allocates nothing.
        for at in 0.. {
            // Its own statement, so that the borrow ends before the record.
            let class = classes.borrow().get(at).cloned();
            let Some(class) = class else { break };
            record(fleet, &class, taken);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inverted(first: &str, second: &str) -> bool {
        let orders = ORDERS.read().unwrap();
        orders
            .get(first)
            .is_some_and(|then| then.contains_key(second))
            && orders
                .get(second)
                .is_some_and(|then| then.contains_key(first))
    }

    #[test]
    fn an_order_and_its_opposite_make_an_inversion() {
        record(None, "m::charge unit-a:{id}", "m::charge unit-b:{id}");
        assert!(!inverted("unit-a:{id}", "unit-b:{id}"));
        record(None, "m::refund unit-b:{id}", "m::refund unit-a:{id}");
        assert!(inverted("unit-a:{id}", "unit-b:{id}"));
        assert!(WARNED
            .lock()
            .unwrap()
            .contains(&("unit-a:{id}".into(), "unit-b:{id}".into())));
    }

    #[test]
    fn one_template_twice_is_no_order() {
        record(None, "m::f unit-same:{id}", "m::g unit-same:{id}");
        assert!(ORDERS.read().unwrap().get("unit-same:{id}").is_none());
    }

    #[test]
    fn the_template_is_what_follows_the_function() {
        assert_eq!(split("a::b::f k:{x y}"), ("a::b::f", "k:{x y}"));
    }

    #[test]
    fn a_thread_s_classes_are_those_of_the_fns_running_on_it() {
        let outer = ThreadClass::enter(Arc::from("m::outer unit-thread-a:{id}")).unwrap();
        record_on_thread(None, "m::inner unit-thread-b:{id}");
        drop(outer);
        record_on_thread(None, "m::other unit-thread-c:{id}");
        let seen = seen_here();
        assert!(seen
            .iter()
            .any(|order| order.first == "unit-thread-a:{id}" && order.taker == "m::inner"));
        assert!(!seen
            .iter()
            .any(|order| order.second == "unit-thread-c:{id}"));
    }

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(rough(Duration::from_secs(40)), "40 s");
        assert_eq!(rough(Duration::from_secs(720)), "12 min");
        assert_eq!(rough(Duration::from_secs(5 * 3600)), "5 h");
        assert_eq!(rough(Duration::from_secs(3 * 86_400)), "3 days");
    }
}
