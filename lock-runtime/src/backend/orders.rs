//! The fleet's lock-order record: the orders in which tasks took locks of two key templates
//! (`hold::order` decides when to record one and what to warn about), kept in Redis in one hash
//! per key prefix (`keys::orders_key`), so that a process can learn that another took the two
//! templates in the opposite order.
//!
//! A field is `"<first>\n<second>"` (a template held, then one waited for), its value
//! `"<first seen, Redis time in ms>\n<host> <pid>\n<holder function>\n<taker function>"`. The
//! first record of an order is kept. The hash holds at most [`MAX_ORDERS`] orders and expires
//! [`ORDERS_KEPT`] after the last record, so it neither grows nor lives for ever: a fleet whose
//! templates make more orders than that records the first ones, and still learns of the
//! opposite of each order it records.
//!
//! On one endpoint (standalone, Sentinel, Cluster: one key, one slot) the record is one script.
//! On Redlock it is made on every master, and an order is known when any of them has it: a
//! record is advice, not a lock, so no majority is needed. In process, the process's own
//! memory of the orders is the whole fleet: nothing is recorded here.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::line::Node;
use super::quorum::Master;
use super::{failure, scripts, Backend, Locks};

/// The most orders the record of one key prefix keeps.
pub(crate) const MAX_ORDERS: usize = 10_000;
/// How long the record lives after its last write.
pub(crate) const ORDERS_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// One recorded order, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeenOrder {
    /// The template held.
    pub(crate) first: String,
    /// The template then waited for.
    pub(crate) second: String,
    /// The function that held `first`.
    pub(crate) holder: String,
    /// The function that then waited for `second`.
    pub(crate) taker: String,
    /// `<host> <pid>` of the process that recorded it first.
    pub(crate) process: String,
    /// When it was recorded first (the server's clock).
    pub(crate) first_seen: SystemTime,
}

/// What recording an order found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// Whether the order is in the record (false: the record is full).
    pub(crate) kept: bool,
    /// The opposite order, when some process recorded it.
    pub(crate) opposite: Option<SeenOrder>,
}

/// The field of the order `first` → `second`; `None` when a template holds the separator.
fn field(first: &str, second: &str) -> Option<String> {
    (!first.contains('\n') && !second.contains('\n')).then(|| format!("{first}\n{second}"))
}

/// An order from its field and value; `None` for one of another shape (written by hand).
fn parse(field: &[u8], value: &[u8]) -> Option<SeenOrder> {
    let (first, second) = std::str::from_utf8(field).ok()?.split_once('\n')?;
    let mut value = std::str::from_utf8(value).ok()?.splitn(4, '\n');
    let millis: u64 = value.next()?.parse().ok()?;
    let (process, holder, taker) = (value.next()?, value.next()?, value.next()?);
    Some(SeenOrder {
        first: first.to_owned(),
        second: second.to_owned(),
        holder: holder.to_owned(),
        taker: taker.to_owned(),
        process: process.to_owned(),
        first_seen: UNIX_EPOCH.checked_add(Duration::from_millis(millis))?,
    })
}

impl Node {
    /// Records `first` → `second` in `key` (see `scripts::ORDER_RECORD`).
    async fn record_order(
        &self,
        key: &str,
        this: &str,
        opposite: &str,
        who: &str,
    ) -> failure::Result<(bool, Option<Vec<u8>>)> {
        let mut connection = self.connection().await?;
        let (cap, kept) = (MAX_ORDERS.to_string(), ORDERS_KEPT.as_millis().to_string());
        let mut cmd = scripts::evalsha(&scripts::ORDER_RECORD, &[key], 5, 0);
        cmd.arg(this).arg(opposite).arg(who).arg(cap).arg(kept);
        let (kept, opposite): (i64, Option<Vec<u8>>) =
            scripts::invoke(&scripts::ORDER_RECORD, &cmd, &mut connection).await?;
        Ok((kept == 1, opposite))
    }

    /// Every order in `key`, as fields and values.
    async fn read_orders(&self, key: &str) -> failure::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut connection = self.connection().await?;
        Ok(redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut connection)
            .await?)
    }
}

impl Backend {
    /// Whether this store keeps a record of the fleet's orders: not in process, where this
    /// process's own memory of them is the record.
    pub(crate) fn records_orders(&self) -> bool {
        !matches!(self.locks, Locks::Memory(_))
    }

    /// The endpoints that keep the record: the one endpoint, or every Redlock master; `None`
    /// in process.
    fn record_nodes(&self) -> Option<Vec<&Node>> {
        match &self.locks {
            Locks::Single(node) => Some(vec![node]),
            Locks::Quorum(quorum) => Some(quorum.nodes().iter().map(Master::node).collect()),
            Locks::Memory(_) => None,
        }
    }

    /// Records that a task of process `process` (`<host> <pid>`), in `holder`, held a lock of
    /// template `first` and, in `taker`, waited for one of `second`, in the record `key`, and
    /// reads the opposite order. `None` where nothing is recorded (in process, or a template
    /// that holds a line break).
    pub(crate) async fn record_order(
        &self,
        key: &str,
        order: &SeenOrder,
    ) -> failure::Result<Option<Recorded>> {
        let (Some(this), Some(opposite)) = (
            field(&order.first, &order.second),
            field(&order.second, &order.first),
        ) else {
            return Ok(None);
        };
        let who = format!("{}\n{}\n{}", order.process, order.holder, order.taker);
        let Some(nodes) = self.record_nodes() else {
            return Ok(None);
        };
        let replies = futures_util::future::join_all(
            nodes
                .iter()
                .map(|node| node.record_order(key, &this, &opposite, &who)),
        )
        .await;
        let mut recorded = Recorded {
            kept: false,
            opposite: None,
        };
        let mut failed = None;
        let mut answered = false;
        for reply in replies {
            match reply {
                Ok((kept, seen)) => {
                    answered = true;
                    recorded.kept |= kept;
                    if recorded.opposite.is_none() {
                        recorded.opposite =
                            seen.and_then(|value| parse(opposite.as_bytes(), &value));
                    }
                }
                Err(error) => failed = Some(error),
            }
        }
        match failed {
            Some(error) if !answered => Err(error),
            _ => Ok(Some(recorded)),
        }
    }

    /// Every order recorded in `key`, by template pair; `None` in process (the process's own
    /// memory is the record there). On Redlock, the union of the masters' records, each order
    /// with its earliest record.
    pub(crate) async fn orders(&self, key: &str) -> failure::Result<Option<Vec<SeenOrder>>> {
        let Some(nodes) = self.record_nodes() else {
            return Ok(None);
        };
        let mut orders: Vec<SeenOrder> = Vec::new();
        let mut failed = None;
        let mut answered = false;
        for node in nodes {
            match node.read_orders(key).await {
                Ok(fields) => {
                    answered = true;
                    orders.extend(
                        fields
                            .iter()
                            .filter_map(|(field, value)| parse(field, value)),
                    );
                }
                Err(error) => failed = Some(error),
            }
        }
        if let Some(error) = failed.filter(|_| !answered) {
            return Err(error);
        }
        orders.sort_by(|a, b| {
            (&a.first, &a.second, a.first_seen).cmp(&(&b.first, &b.second, b.first_seen))
        });
        orders.dedup_by(|later, earlier| {
            later.first == earlier.first && later.second == earlier.second
        });
        Ok(Some(orders))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let order = parse(
            b"invoice:{id}\naccount:{id}",
            b"1700000000123\nweb-1 42\napp::charge\napp::debit",
        )
        .unwrap();
        assert_eq!(order.first, "invoice:{id}");
        assert_eq!(order.second, "account:{id}");
        assert_eq!(order.process, "web-1 42");
        assert_eq!(order.holder, "app::charge");
        assert_eq!(order.taker, "app::debit");
        assert_eq!(
            order.first_seen,
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)
        );
        assert_eq!(parse(b"no separator", b"1\na\nb\nc"), None);
        assert_eq!(parse(b"a\nb", b"not a time\na\nb\nc"), None);
    }

    #[test]
    fn a_template_with_a_line_break_has_no_field() {
        assert_eq!(field("a\nb", "c"), None);
        assert_eq!(field("a", "c").as_deref(), Some("a\nc"));
    }
}
