//! How locks are shown: the table, the detail view, JSON, durations, and URLs without their
//! password; and the lock orders of `order`.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock::{LockInfo, LockOrder};
use serde_json::{json, Value};

/// "label (pid 42 on host)", or what is known of a lock distlock did not write; printable
/// (see [`cell`]).
pub(crate) fn whose(info: &LockInfo) -> String {
    match &info.holder {
        Some(holder) => format!(
            "{} (pid {} on {})",
            cell(&holder.label),
            holder.pid,
            cell(&holder.host)
        ),
        None => "an unknown holder (not written by distlock)".to_owned(),
    }
}

/// How long the holder has held the lock, by this machine's clock; `None` when unknown.
fn held_for(info: &LockInfo) -> Option<Duration> {
    let holder = info.holder.as_ref()?;
    // A holder whose clock runs ahead shows as just taken, not as an error.
    Some(
        SystemTime::now()
            .duration_since(holder.since)
            .unwrap_or_default(),
    )
}

/// A duration as people read it: `850ms`, `12.3s`, `5m07s`, `2h03m`.
pub(crate) fn duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    if duration < Duration::from_secs(1) {
        format!("{}ms", duration.as_millis())
    } else if secs < 60 {
        format!("{:.1}s", duration.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    }
}

fn ttl_left(info: &LockInfo) -> String {
    info.ttl_left
        .map_or_else(|| "no expiry".to_owned(), duration)
}

/// `text` printable on one line: control characters (a label or a lock name may hold any)
/// are shown escaped, so a hostile one cannot rewrite the terminal, and so are the
/// bidirectional controls, which would reorder what the terminal shows of the row. Quotes and
/// backslashes stay as they are: only what a terminal acts on is escaped.
pub(crate) fn cell(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || is_bidi_control(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The Unicode bidirectional formatting characters: embeddings and overrides (U+202A–U+202E),
/// isolates (U+2066–U+2069), and the marks (U+200E, U+200F, U+061C).
fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}'
    )
}

/// The `list` table: name, holder, held for, time left, waiters, fence.
pub(crate) fn table(locks: &[LockInfo]) -> String {
    let header = ["NAME", "HOLDER", "HELD FOR", "TTL LEFT", "WAITERS", "FENCE"];
    let rows: Vec<[String; 6]> = locks
        .iter()
        .map(|info| {
            [
                cell(&info.name),
                whose(info),
                held_for(info).map_or_else(|| "-".to_owned(), duration),
                ttl_left(info),
                info.waiters.to_string(),
                info.fence
                    .map_or_else(|| "-".to_owned(), |fence| fence.to_string()),
            ]
        })
        .collect();
    columns(&header, &rows)
}

/// `rows` under `header`, in columns as wide as their widest cell, two spaces apart.
fn columns<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(|title| title.chars().count());
    for row in rows {
        for (width, text) in widths.iter_mut().zip(row) {
            *width = (*width).max(text.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header);
    for row in rows {
        line(&row.each_ref().map(String::as_str));
    }
    out
}

/// `show`: one lock, one field a line.
pub(crate) fn detail(info: &LockInfo) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "name:      {}", cell(&info.name));
    let _ = writeln!(out, "key:       {}", cell(&info.key));
    match &info.holder {
        Some(holder) => {
            let _ = writeln!(out, "label:     {}", cell(&holder.label));
            let _ = writeln!(out, "host:      {}", cell(&holder.host));
            let _ = writeln!(out, "pid:       {}", holder.pid);
            let _ = writeln!(
                out,
                "since:     {} ({} ago)",
                humantime::format_rfc3339_seconds(holder.since),
                held_for(info).map_or_else(String::new, duration)
            );
        }
        None => {
            let _ = writeln!(out, "holder:    {}", whose(info));
        }
    }
    let _ = writeln!(out, "ttl left:  {}", ttl_left(info));
    let _ = writeln!(out, "waiters:   {}", info.waiters);
    let fence = info
        .fence
        .map_or_else(|| "-".to_owned(), |fence| fence.to_string());
    let _ = writeln!(out, "fence:     {fence}");
    out
}

/// One lock as JSON: durations in milliseconds, `since` in Unix milliseconds.
pub(crate) fn json(info: &LockInfo) -> Value {
    let millis = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    let holder = info.holder.as_ref().map(|holder| {
        json!({
            "label": holder.label,
            "host": holder.host,
            "pid": holder.pid,
            "since_unix_ms": holder.since.duration_since(UNIX_EPOCH).map_or(0, millis),
            "held_for_ms": held_for(info).map(millis),
        })
    });
    json!({
        "name": info.name,
        "key": info.key,
        "holder": holder,
        "ttl_left_ms": info.ttl_left.map(millis),
        "waiters": info.waiters,
        "fence": info.fence,
    })
}

/// The pairs of templates taken in both orders, each once: (the order whose first template is
/// the lesser, its opposite).
fn inversions(orders: &[LockOrder]) -> Vec<(&LockOrder, &LockOrder)> {
    orders
        .iter()
        .filter(|order| order.first < order.second)
        .filter_map(|order| {
            orders
                .iter()
                .find(|other| order.is_opposite(other))
                .map(|opposite| (order, opposite))
        })
        .collect()
}

/// When an order was first seen: `2026-12-03T17:22:09Z (3h05m ago)`.
fn first_seen(order: &LockOrder) -> String {
    let ago = SystemTime::now()
        .duration_since(order.first_seen)
        .unwrap_or_default();
    // Past two days, hours are no longer what a reader counts in.
    let ago = if ago.as_secs() >= 2 * 86_400 {
        format!("{} days", ago.as_secs() / 86_400)
    } else {
        duration(ago)
    };
    format!(
        "{} ({ago} ago)",
        humantime::format_rfc3339_seconds(order.first_seen),
    )
}

/// One order as a sentence: what was held, by which function, and what was then waited for.
fn order_line(order: &LockOrder) -> String {
    format!(
        "{} held {}, then {} waited for {}; first seen {} by {}",
        cell(&order.holder),
        cell(&order.first),
        cell(&order.taker),
        cell(&order.second),
        first_seen(order),
        process(order),
    )
}

/// "pid 42 on host" from the record's `<host> <pid>`.
fn process(order: &LockOrder) -> String {
    match order.process.rsplit_once(' ') {
        Some((host, pid)) => format!("pid {} on {}", cell(pid), cell(host)),
        None => cell(&order.process),
    }
}

/// `order`: the inversions first, each with its two orders, then the table of every order.
pub(crate) fn orders(orders: &[LockOrder]) -> String {
    let mut out = String::new();
    let inverted = inversions(orders);
    if inverted.is_empty() {
        out.push_str("no inversion: no two templates were taken in both orders\n");
    } else {
        let _ = writeln!(
            out,
            "{} INVERSION{}: two templates taken in both orders; two tasks doing both at once wait \
             for each other until one times out. Take them in one order everywhere (or both at \
             once).",
            inverted.len(),
            if inverted.len() == 1 { "" } else { "S" }
        );
        for (order, opposite) in &inverted {
            let _ = writeln!(out, "\n  {} ⇄ {}", cell(&order.first), cell(&order.second));
            let _ = writeln!(out, "    {}", order_line(order));
            let _ = writeln!(out, "    {}", order_line(opposite));
        }
    }
    let _ = writeln!(out, "\n{} order(s) seen:", orders.len());
    let header = [
        "HELD",
        "THEN WAITED FOR",
        "HOLDER",
        "TAKER",
        "FIRST SEEN",
        "BOTH WAYS",
    ];
    let rows: Vec<[String; 6]> = orders
        .iter()
        .map(|order| {
            let both = orders.iter().any(|other| order.is_opposite(other));
            [
                cell(&order.first),
                cell(&order.second),
                cell(&order.holder),
                cell(&order.taker),
                humantime::format_rfc3339_seconds(order.first_seen).to_string(),
                if both { "yes" } else { "-" }.to_owned(),
            ]
        })
        .collect();
    out.push_str(&columns(&header, &rows));
    out
}

/// `order --json`: every order (`inverted` when its opposite was seen too) and the inversions
/// as pairs of templates.
pub(crate) fn orders_json(orders: &[LockOrder]) -> Value {
    let millis = |time: SystemTime| {
        time.duration_since(UNIX_EPOCH).map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
    };
    let all: Vec<Value> = orders
        .iter()
        .map(|order| {
            json!({
                "first": order.first,
                "second": order.second,
                "holder": order.holder,
                "taker": order.taker,
                "process": order.process,
                "first_seen_unix_ms": millis(order.first_seen),
                "inverted": orders.iter().any(|other| order.is_opposite(other)),
            })
        })
        .collect();
    let inverted: Vec<Value> = inversions(orders)
        .into_iter()
        .map(|(order, _)| json!([order.first, order.second]))
        .collect();
    json!({ "orders": all, "inversions": inverted })
}

/// A time of day in UTC, `HH:MM:SS`.
pub(crate) fn clock(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(duration(Duration::from_millis(850)), "850ms");
        assert_eq!(duration(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(duration(Duration::from_secs(307)), "5m07s");
        assert_eq!(duration(Duration::from_secs(7380)), "2h03m");
    }

    #[test]
    fn bidirectional_controls_are_escaped() {
        assert_eq!(cell("evil\u{202E}gpj.exe"), "evil\\u{202e}gpj.exe");
        for c in ('\u{202A}'..='\u{202E}')
            .chain('\u{2066}'..='\u{2069}')
            .chain(['\u{200E}', '\u{200F}', '\u{061C}'])
        {
            let shown = cell(&format!("a{c}b"));
            assert!(!shown.contains(c), "{c:?} printed raw: {shown:?}");
            assert_eq!(shown, format!("a{}b", c.escape_default()));
        }
        // Right-to-left text itself is not a control, and stays as written.
        assert_eq!(cell("שלום"), "שלום");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(cell("a\nb\u{1b}[2J"), "a\\nb\\u{1b}[2J");
        assert_eq!(cell("trace:{\"x\"}\\"), "trace:{\"x\"}\\");
    }
}
