//! Lock-order warnings, in this process, before the first deadlock: the orders in which tasks
//! take the locks of `#[distributed_lock]` functions, by key template.
//!
//! A lock's *class* is its key template (`invoice:{id}`), as the attribute writes it into the
//! lock's label (`path::to::function invoice:{id}`). When a task that holds a lock of class A
//! starts waiting for one of class B, the order A → B is recorded; when B → A has been recorded
//! too, two tasks doing both at once can deadlock each other (each waits for the other until
//! its timeout), even if it never happened yet: one `tracing` warning (target `distlock`) names
//! both templates and the functions that took them in each order, once per pair of classes for
//! the life of the process, and the `distlock_lock_order_inversions_total` counter counts it.
//!
//! Limits, chosen for a check that costs nothing to a task that holds nothing:
//! - only waiting acquisitions are recorded (`on_busy = "skip"` and `"fail"` make one attempt
//!   and cannot wait, so they cannot close a deadlock);
//! - two locks of the same template (`invoice:{a}` then `invoice:{b}`) are not an order: the
//!   template does not say which id comes first;
//! - locks taken through the manual API have no template and are not recorded.

use std::collections::HashMap;
use std::sync::{LazyLock, PoisonError, RwLock};

/// A recorded order: the first functions seen taking it.
struct Taken {
    /// The function that held the first lock.
    holder: Box<str>,
    /// The function that then waited for the second.
    taker: Box<str>,
}

/// Held template → taken template → who did it first.
type Orders = HashMap<Box<str>, HashMap<Box<str>, Taken>>;

static ORDERS: LazyLock<RwLock<Orders>> = LazyLock::new(RwLock::default);

/// The function and the template of an attribute's label (`path::function template`).
fn split(label: &str) -> (&str, &str) {
    label.split_once(' ').unwrap_or((label, label))
}

/// A task holding the lock labelled `held` waits for the one labelled `taken`: records the
/// order, and warns if the opposite order was recorded before.
pub(crate) fn record(held: &str, taken: &str) {
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
    orders.entry(first.into()).or_default().insert(
        second.into(),
        Taken {
            holder: holder.into(),
            taker: taker.into(),
        },
    );
    // This order is new, so the pair is warned about here or never: once per pair.
    let Some(opposite) = orders.get(second).and_then(|then| then.get(first)) else {
        return;
    };
    tracing::warn!(
        target: "distlock",
        first = %first,
        second = %second,
        "lock order inversion: `{taker}` waits for `{second}` while holding `{first}` (taken by \
         `{holder}`), and `{opposite_taker}` waits for `{first}` while holding `{second}` (taken \
         by `{opposite_holder}`); two tasks doing both at once wait for each other until one \
         times out: take these locks in one order everywhere (or take both at once)",
        opposite_taker = opposite.taker,
        opposite_holder = opposite.holder,
    );
    crate::meters::order_inversion(first, second);
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
        record("m::charge unit-a:{id}", "m::charge unit-b:{id}");
        assert!(!inverted("unit-a:{id}", "unit-b:{id}"));
        record("m::refund unit-b:{id}", "m::refund unit-a:{id}");
        assert!(inverted("unit-a:{id}", "unit-b:{id}"));
    }

    #[test]
    fn one_template_twice_is_no_order() {
        record("m::f unit-same:{id}", "m::g unit-same:{id}");
        assert!(ORDERS.read().unwrap().get("unit-same:{id}").is_none());
    }

    #[test]
    fn the_template_is_what_follows_the_function() {
        assert_eq!(split("a::b::f k:{x y}"), ("a::b::f", "k:{x y}"));
    }
}
