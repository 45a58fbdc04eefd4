//! The value a lock key holds: an unguessable token followed by who holds the lock.
//!
//! `<uuid v4>;h=<host>;p=<pid>;t=<since, Unix ms>[;l=<label>]`
//!
//! Writing who holds a lock into the value the lock key holds anyway costs no command: the
//! first try is still one `SET NX PX`, and compare-and-delete still compares the whole value,
//! whose UUID alone makes it unguessable. The value must contain no whitespace (the line's
//! entries and the hand-off messages are space-separated, and the scripts match a token with
//! Lua's `%S+`), so host and label are percent-escaped: every byte that is not printable ASCII,
//! and `%` and `;`, becomes `%XX`. Both are cut to a bounded length first (at a character
//! boundary), so a huge label cannot make every command of every acquisition huge.
//!
//! A value of another shape (a lock written by hand, by another library) is no error: it has
//! no holder to show ([`parse`] gives `None`).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use once_cell::sync::Lazy;

/// The longest host name recorded, in bytes (DNS names are at most 253).
pub(crate) const MAX_HOST: usize = 255;
/// The longest label recorded, in bytes: a function path and a key template fit easily.
pub(crate) const MAX_LABEL: usize = 200;

/// This host, escaped once: `;h=<host>`.
static HOST: Lazy<String> = Lazy::new(|| {
    let mut text = String::from(";h=");
    escape_into(&mut text, bounded(&host_name(), MAX_HOST));
    text
});

/// This host's name as lock values record it (cut and escaped), for the lock-order record.
pub(crate) fn host() -> &'static str {
    &HOST[";h=".len()..]
}

/// A label as it is stored: cut to [`MAX_LABEL`] bytes and escaped. Computed when the options
/// are built, not per acquisition.
pub(crate) fn encode_label(label: &str) -> Arc<str> {
    let mut text = String::new();
    escape_into(&mut text, bounded(label, MAX_LABEL));
    Arc::from(text)
}

/// A fresh lock value: a new UUID v4, this host, process `pid` (the caller's: it knows it, and
/// a process forked without exec is another holder than its parent), the time now, and `label`
/// (escaped, from [`encode_label`]) when there is one.
///
/// Every acquisition makes one, so the part that stays the same, `;h=<host>;p=<pid>;t=`, is
/// kept per thread, for the `pid` it was made with: a forked child passes its own pid and
/// makes its own. The value is written into a buffer kept per thread too, then copied once
/// into the `Arc`: no allocation but the `Arc`'s own, and no `fmt` machinery for the numbers.
pub(crate) fn new_value(label: Option<&str>, pid: u32) -> Arc<str> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Scratch> = const {
            std::cell::RefCell::new(Scratch { pid: None, holder: String::new(), value: String::new() })
        };
    }
    let mut buffer = uuid::Uuid::encode_buffer();
    let uuid = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buffer);
    // Milliseconds since 1970 fit a `u64` for 584 million years; its division is the CPU's,
    // where a `u128`'s is a library call per digit.
    let since = super::units::millis(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO),
    );
    SCRATCH.with(|scratch| {
        // Never re-entered (nothing here calls back into it); should that change, a value
        // made without the cache is still right.
        let Ok(mut scratch) = scratch.try_borrow_mut() else {
            return Arc::from(Scratch::write(
                &mut String::new(),
                uuid,
                &holder(pid),
                since,
                label,
            ));
        };
        let Scratch {
            pid: made_for,
            holder: cached,
            value,
        } = &mut *scratch;
        if *made_for != Some(pid) {
            *cached = holder(pid);
            *made_for = Some(pid);
        }
        Arc::from(Scratch::write(value, uuid, cached, since, label))
    })
}

/// What [`new_value`] keeps per thread.
struct Scratch {
    /// The process `holder` was made for.
    pid: Option<u32>,
    /// `;h=<host>;p=<pid>;t=`
    holder: String,
    /// The buffer values are written into.
    value: String,
}

impl Scratch {
    fn write<'a>(
        value: &'a mut String,
        uuid: &str,
        holder: &str,
        since: u64,
        label: Option<&str>,
    ) -> &'a str {
        value.clear();
        value.push_str(uuid);
        value.push_str(holder);
        push_decimal(value, since);
        if let Some(label) = label {
            value.push_str(";l=");
            value.push_str(label);
        }
        value
    }
}

/// `;h=<host>;p=<pid>;t=`: the part of a value that stays the same in one process.
fn holder(pid: u32) -> String {
    let mut text = String::with_capacity(HOST.len() + 16);
    text.push_str(&HOST);
    let _ = write!(text, ";p={pid};t=");
    text
}

/// Appends `number` in decimal.
fn push_decimal(out: &mut String, mut number: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        // The remainder of a division by 10 is below 10: it fits in a `u8`.
        digits[at] = b'0' + u8::try_from(number % 10).unwrap_or(0);
        number /= 10;
        if number == 0 {
            break;
        }
    }
    // ASCII digits only: always UTF-8.
    out.push_str(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}

/// Who holds a lock, as read back from its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) label: Option<String>,
    pub(crate) since: SystemTime,
}

/// Reads who holds a lock from its value; `None` for a value distlock did not write.
pub(crate) fn parse(value: &[u8]) -> Option<Identity> {
    let text = std::str::from_utf8(value).ok()?;
    let (uuid, rest) = text.split_at_checked(36)?;
    uuid::Uuid::try_parse(uuid).ok()?;
    let rest = rest.strip_prefix(';')?;
    let (mut host, mut pid, mut since, mut label) = (None, None, None, None);
    for field in rest.split(';') {
        let (name, content) = field.split_once('=')?;
        match name {
            "h" => host = Some(unescape(content)),
            "p" => pid = Some(content.parse().ok()?),
            // Checked: the value is anyone's to write, and a time past what `SystemTime` holds
            // is no holder's.
            "t" => since = UNIX_EPOCH.checked_add(Duration::from_millis(content.parse().ok()?)),
            "l" => label = Some(unescape(content)),
            // A field a later version adds is no reason to hide the holder.
            _ => {}
        }
    }
    Some(Identity {
        host: host?,
        pid: pid?,
        label,
        since: since?,
    })
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub(crate) fn bounded(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn escape_into(out: &mut String, text: &str) {
    for byte in text.bytes() {
        if byte.is_ascii_graphic() && byte != b'%' && byte != b';' {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

/// Undoes [`escape_into`]; a malformed escape is kept as it is, and bytes that are not UTF-8
/// are shown as U+FFFD.
fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            if let Some(byte) = text
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The name of this host: the kernel's (Linux), else `HOSTNAME` or `COMPUTERNAME`, else
/// `"unknown"`. Read without a system call binding: inspection only shows it.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_reads_back_its_holder() {
        let label = encode_label("my_app::jobs::process_trace trace:{trace_id}");
        let value = new_value(Some(&label), std::process::id());
        let identity = parse(value.as_bytes()).expect("a value distlock wrote");
        assert_eq!(
            identity.label.as_deref(),
            Some("my_app::jobs::process_trace trace:{trace_id}")
        );
        assert_eq!(identity.pid, std::process::id());
        assert_eq!(identity.host, bounded(&host_name(), MAX_HOST));
        let age = SystemTime::now().duration_since(identity.since).unwrap();
        assert!(age < Duration::from_secs(60), "{age:?}");
        assert!(parse(new_value(None, std::process::id()).as_bytes())
            .unwrap()
            .label
            .is_none());
    }

    /// A lock kept for the line after a release within `hold_at_least` carries `;hold=<end>`
    /// after its token (see `HOLD` in `scripts.rs`): the holder still reads back, and the
    /// label, the token's last field, ends before it.
    #[test]
    fn a_value_with_a_hold_suffix_reads_back_its_holder_and_label() {
        for label in ["nightly report", "a;hold=1", "50%;l=x"] {
            let value = format!(
                "{};hold=1764610000000",
                new_value(Some(&encode_label(label)), std::process::id())
            );
            let identity = parse(value.as_bytes()).expect("a value distlock wrote");
            assert_eq!(identity.label.as_deref(), Some(label), "{value}");
            assert_eq!(identity.pid, std::process::id());
        }
        let value = format!("{};hold=1764610000000", new_value(None, std::process::id()));
        assert!(parse(value.as_bytes()).unwrap().label.is_none());
    }

    #[test]
    fn values_carry_no_whitespace_and_hostile_labels_read_back() {
        let hostile = [
            "a b\tc\nd\re",
            "50%;l=forged;p=1",
            "é鍵🔒 \u{0}\u{7f}",
            "{braces}}{",
            "%zz%4",
        ];
        for label in hostile {
            let value = new_value(Some(&encode_label(label)), std::process::id());
            assert!(
                value.bytes().all(|byte| byte.is_ascii_graphic()),
                "{value:?} has whitespace or non-ASCII"
            );
            assert_eq!(
                parse(value.as_bytes()).unwrap().label.as_deref(),
                Some(label)
            );
        }
    }

    #[test]
    fn huge_labels_are_cut_at_a_character_boundary() {
        let huge = "é".repeat(1 << 16);
        let value = new_value(Some(&encode_label(&huge)), std::process::id());
        assert!(
            value.len() < 36 + MAX_HOST * 3 + MAX_LABEL * 3 + 64,
            "{}",
            value.len()
        );
        let label = parse(value.as_bytes()).unwrap().label.unwrap();
        assert_eq!(label, "é".repeat(MAX_LABEL / 2));
    }

    #[test]
    fn numbers_are_written_in_decimal_and_each_pid_gets_its_own_holder() {
        for number in [0, 7, 10, 1_764_610_000_000, u64::MAX] {
            let mut text = String::from("x");
            push_decimal(&mut text, number);
            assert_eq!(text, format!("x{number}"));
        }
        // A forked child passes its own pid: the per-thread holder must not keep the parent's.
        for pid in [1, 42, 1, u32::MAX] {
            let value = new_value(None, pid);
            assert_eq!(parse(value.as_bytes()).unwrap().pid, pid, "{value}");
        }
    }

    /// The per-thread buffer is reused: a value after a much longer one (a long label, then a
    /// short one, then none, then another pid) is exactly what `format!` makes of its parts,
    /// with nothing of the longer one left over.
    #[test]
    fn a_short_value_after_a_long_one_on_the_same_thread_keeps_nothing_of_it() {
        let long = encode_label(&"l".repeat(MAX_LABEL));
        let short = encode_label("s");
        let me = std::process::id();
        for (label, pid) in [
            (Some(&*long), me),
            (Some(&*short), me),
            (None, me),
            (Some(&*long), 7),
            (None, 7),
            (Some(&*short), me),
        ] {
            let value = new_value(label, pid);
            let (uuid, rest) = value.split_at(36);
            uuid::Uuid::try_parse(uuid).unwrap();
            let holder = format!("{};p={pid};t=", &*HOST);
            let since = rest
                .strip_prefix(&holder)
                .unwrap_or_else(|| panic!("{value} after {holder}"));
            let digits = since.bytes().take_while(u8::is_ascii_digit).count();
            assert!(digits >= 13, "{value}");
            let tail = label.map_or_else(String::new, |label| format!(";l={label}"));
            assert_eq!(&since[digits..], tail, "{value}");
            assert_eq!(
                value.len(),
                36 + holder.len() + digits + tail.len(),
                "{value}"
            );
        }
    }

    #[test]
    fn values_are_fresh_uuids_first() {
        let (a, b) = (
            new_value(None, std::process::id()),
            new_value(None, std::process::id()),
        );
        assert_ne!(a, b);
        let uuid = uuid::Uuid::try_parse(&a[..36]).unwrap();
        assert_eq!(uuid.get_version_num(), 4);
    }

    #[test]
    fn values_written_by_others_have_no_holder() {
        for value in [
            &b"hand-written-token"[..],
            b"",
            b"\xff\xfe",
            b"6f1c9a52-6d2e-4d7a-9d1b-0c5a2f4e8b11",
            b"6f1c9a52-6d2e-4d7a-9d1b-0c5a2f4e8b11;h=x",
            b"6f1c9a52-6d2e-4d7a-9d1b-0c5a2f4e8b11;h=x;p=notanumber;t=1",
            b"not-a-uuid-but-36-characters-long-xx;h=x;p=1;t=1",
        ] {
            assert_eq!(parse(value), None, "{value:?}");
        }
    }
}
