//! The key names' rules, checked for every name and prefix shape.
use std::collections::{HashMap, HashSet};

use super::*;

/// Key prefixes: the default, none, and prefixes that open or close a brace or carry a tag.
const PREFIXES: [&str; 5] = ["lock:", "", "{", "{p}", "}"];

/// The helper words of today and of the helpers to come.
const WORDS: [&str; 10] = [
    "waiters",
    "fence",
    "line",
    "leases",
    "claim",
    "wake",
    "released",
    "waits",
    "releases",
    "forced-leases",
];

/// Lock names with braces in every position: every sequence of three pieces (empty tags,
/// nested braces, `}{`, the helper marker, control and non-ASCII characters), every word of
/// up to four characters over `{`, `}`, `a`, and names of 64 KiB.
fn names() -> Vec<String> {
    const PIECES: [&str; 14] = [
        "",
        "a",
        "{",
        "}",
        "{}",
        "{{",
        "}}",
        "{a}",
        ":distlock:",
        "waiters",
        ":",
        "\u{0}",
        "\u{7f}\u{ffff}",
        "é鍵🔒",
    ];
    let mut names = Vec::new();
    for a in PIECES {
        for b in PIECES {
            for c in PIECES {
                names.push(format!("{a}{b}{c}"));
            }
        }
    }
    let mut words = vec![String::new()];
    for _ in 0..4 {
        words = words
            .iter()
            .flat_map(|word| ["{", "}", "a"].map(|c| format!("{word}{c}")))
            .collect();
        names.extend(words.iter().cloned());
    }
    let long = "x".repeat(1 << 16);
    names.extend([
        long.clone(),
        "}".repeat(1 << 16),
        "{".repeat(1 << 16),
        format!("{{{long}}}"),
        format!("{{{long}"),
        format!("{long}}}"),
        format!("{long}}}{{a}}"),
        format!("{{}}{long}"),
        format!("{{t}}:distlock:waiters:{long}"),
    ]);
    names.sort();
    names.dedup();
    names
}

/// Every generated full key: each name under each prefix.
fn full_keys() -> Vec<String> {
    let mut keys: Vec<String> = PREFIXES
        .iter()
        .flat_map(|prefix| {
            names()
                .into_iter()
                .map(move |name| format!("{prefix}{name}"))
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The shape of a helper key, as the docs define it: `{`, then text up to the first `}`,
/// then `:distlock:`.
fn has_helper_shape(key: &str) -> bool {
    let Some(rest) = key.strip_prefix('{') else {
        return false;
    };
    rest.find('}')
        .is_some_and(|close| rest[close + 1..].starts_with(":distlock:"))
}

/// The helper word and the lock key of a helper key, read as the docs say.
fn decode(helper: &str) -> (&str, &str) {
    let rest = helper.strip_prefix('{').expect("a helper starts with `{`");
    let (tag, after) = rest.split_once('}').expect("a helper's tag is closed");
    let after = after
        .strip_prefix(":distlock:")
        .expect("`:distlock:` follows the tag");
    match after.split_once(':') {
        Some((word, lock)) => (word, lock),
        None => (after, tag),
    }
}

#[test]
fn slots_are_computed_as_redis_computes_them() {
    // Values from `CLUSTER KEYSLOT` on redis-server 7.0.
    for (key, expected) in [
        ("somekey", 11058),
        ("foo{hash_tag}", 2515),
        ("bar{hash_tag}", 2515),
        ("", 0),
        ("foo{}{bar}", 8363),
        ("foo{{bar}}zap", 4015),
        ("{bar", 4015),
        ("foo{bar}{zap}", 5061),
        ("bar", 5061),
        ("x}{y", 9970),
        ("{}x", 10595),
        ("order:a}b", 13027),
        ("}", 12090),
    ] {
        assert_eq!(slot(key.as_bytes()), expected, "{key:?}");
    }
}

#[test]
fn every_helper_key_lies_in_its_lock_keys_slot() {
    for key in full_keys() {
        let Ok(keys) = LockKeys::new(key.clone()) else {
            continue;
        };
        let lock_slot = slot(key.as_bytes());
        for word in WORDS {
            let helper = keys.helper(word);
            assert_eq!(
                slot(helper.as_bytes()),
                lock_slot,
                "helper {helper:?} of {key:?}"
            );
            // The same name, written straight into a command.
            let mut cmd = redis::Cmd::new();
            cmd.arg(keys.helper_arg(word));
            let written: Vec<_> = cmd.args_iter().collect();
            assert!(
                matches!(written[..], [redis::Arg::Simple(name)] if name == helper.as_bytes()),
                "{written:?} is not {helper:?}"
            );
            assert_eq!(keys.helper_arg(word).len(), helper.len());
        }
        assert_eq!(keys.wake_list(), keys.helper("wake"));
        assert_eq!(keys.line(), keys.helper("line"));
        assert_eq!(keys.leases(), keys.helper("leases"));
        assert_eq!(keys.fence(), keys.helper("fence"));
        assert_eq!(keys.released(), keys.helper("released"));
    }
}

/// A helper name too long for the stack (a long lock key) is written the slower way, and
/// is the same name.
#[test]
fn long_helper_names_are_written_whole() {
    for lock in [
        "lock:".to_owned() + &"x".repeat(400),
        format!("lock:{{{}}}", "y".repeat(300)),
    ] {
        let keys = LockKeys::new(lock).unwrap();
        let mut cmd = redis::Cmd::new();
        cmd.arg(keys.helper_arg("line"))
            .arg(keys.helper_arg("leases"));
        let written: Vec<_> = cmd.args_iter().collect();
        let (line, leases) = (keys.line(), keys.leases());
        assert!(line.len() > STACK_NAME, "{}", line.len());
        assert!(
            matches!(written[..], [redis::Arg::Simple(a), redis::Arg::Simple(b)]
                if a == line.as_bytes() && b == leases.as_bytes()),
            "{written:?}"
        );
    }
}

#[test]
fn no_helper_key_is_a_lock_key_or_another_locks_helper() {
    let keys = full_keys();
    let locks: HashSet<&str> = keys
        .iter()
        .map(String::as_str)
        .filter(|key| LockKeys::new((*key).to_owned()).is_ok())
        .collect();
    let mut owners: HashMap<String, (&str, &str)> = HashMap::new();
    for &lock in &locks {
        let lock_keys = LockKeys::new(lock.to_owned()).unwrap();
        for word in WORDS {
            let helper = lock_keys.helper(word);
            assert!(
                !locks.contains(helper.as_str()),
                "helper {helper:?} of {lock:?} is also a lock key"
            );
            assert!(
                LockKeys::new(helper.clone()).is_err(),
                "helper {helper:?} of {lock:?} would be accepted as a lock key"
            );
            assert_eq!(decode(&helper), (word, lock), "{helper:?} reads back");
            if let Some(other) = owners.insert(helper.clone(), (word, lock)) {
                panic!("{helper:?} is the {other:?} helper and the {word} helper of {lock:?}");
            }
        }
    }
    assert!(locks.len() > 10_000, "{} locks", locks.len());
}

#[test]
fn exactly_the_keys_of_the_helper_shape_and_the_empty_key_are_refused() {
    let mut refused = 0;
    for key in full_keys() {
        let expected = key.is_empty() || has_helper_shape(&key);
        let result = LockKeys::new(key.clone());
        assert_eq!(result.is_err(), expected, "{key:?}");
        if let Err(error) = result {
            refused += 1;
            let LockError::Config(message) = &error else {
                panic!("{key:?}: {error:?}");
            };
            assert!(
                message.contains("use another lock name or key prefix"),
                "{message}"
            );
        }
    }
    assert!(refused > 100, "{refused} keys refused");
}

#[test]
fn every_slot_has_a_short_alphanumeric_tag_of_that_slot() {
    let tags = SlotTags::build();
    let mut longest = 0;
    for number in 0..16384 {
        let tag = tags.tag(number);
        assert!(
            (1..=4).contains(&tag.len()) && tag.bytes().all(|b| b.is_ascii_alphanumeric()),
            "slot {number}: {tag:?}"
        );
        assert_eq!(slot(tag.as_bytes()), number, "{tag:?}");
        longest = longest.max(tag.len());
    }
    assert_eq!(longest, 3, "three characters cover every slot");
    assert_eq!(
        SLOT_TAGS.text, tags.text,
        "the table is the same every time"
    );
}

/// The name a helper key must have, spelt out as the module docs give it, independently of
/// `HelperKey`: `{<tag>}:distlock:<word>`, then `:<lock key>` unless the tag is the whole
/// lock key.
fn documented_helper(lock: &str, word: &str) -> String {
    match hash_tag(lock.as_bytes()) {
        Some((start, end)) => format!("{{{}}}:distlock:{word}:{lock}", &lock[start..end]),
        None if !lock.contains('}') => format!("{{{lock}}}:distlock:{word}"),
        None => format!(
            "{{{}}}:distlock:{word}:{lock}",
            SLOT_TAGS.tag(slot(lock.as_bytes()))
        ),
    }
}

/// Names whose helper keys are just below, at and just above the length assembled on the
/// stack, for each kind of tag (the whole key, its own hash tag, the table's tag of its
/// slot) and with multi-byte characters: the bytes written into a command, after other
/// arguments and through `to_redis_args`, are the documented name.
#[test]
fn helper_names_around_the_stack_length_are_written_exactly() {
    let mut checked = 0;
    for word in WORDS {
        for shape in 0..4 {
            for len in (STACK_NAME - 24)..=(STACK_NAME + 8) {
                let lock = match shape {
                    // The whole key is the tag: `{` + key + `}:distlock:` + word.
                    0 => "w".repeat(len.saturating_sub(2 + MARKER.len() + word.len())),
                    // Its own hash tag, then the key again.
                    1 => format!("lock:{{u}}:{}", "o".repeat(len / 2)),
                    // A `}` but no hash tag: the slot's tag.
                    2 => format!("lock:a}}{}", "s".repeat(len / 2)),
                    // Multi-byte characters across the boundary.
                    _ => format!("lock:{}", "é".repeat(len / 4)),
                };
                let keys = LockKeys::new(lock.clone()).unwrap();
                let expected = documented_helper(&lock, word);
                assert_eq!(keys.helper(word), expected, "{lock:?}");
                let arg = keys.helper_arg(word);
                assert_eq!(arg.len(), expected.len(), "{lock:?}");
                let mut cmd = redis::Cmd::new();
                cmd.arg("EVALSHA").arg(arg).arg(&*keys.lock).arg(arg);
                let written: Vec<_> = cmd.args_iter().collect();
                assert!(
                    matches!(written[..], [_, redis::Arg::Simple(a), _, redis::Arg::Simple(b)]
                        if a == expected.as_bytes() && b == expected.as_bytes()),
                    "{lock:?}: {written:?}"
                );
                assert_eq!(
                    redis::ToRedisArgs::to_redis_args(&arg),
                    vec![expected.clone().into_bytes()],
                    "{lock:?}"
                );
                if expected.len() == STACK_NAME || expected.len() == STACK_NAME + 1 {
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 0, "no name at the stack's length");
}

#[test]
fn common_names_keep_readable_helpers() {
    let keys = LockKeys::new("lock:trace:1".to_owned()).unwrap();
    assert_eq!(keys.wake_list(), "{lock:trace:1}:distlock:wake");
    assert_eq!(keys.fence(), "{lock:trace:1}:distlock:fence");
    let keys = LockKeys::new("lock:{user:7}:cart".to_owned()).unwrap();
    assert_eq!(keys.fence(), "{user:7}:distlock:fence:lock:{user:7}:cart");
    assert_eq!(
        keys.wake_list(),
        "{user:7}:distlock:wake:lock:{user:7}:cart"
    );
    // A `}` without a hash tag: a tag of the key's slot, then the key.
    let keys = LockKeys::new("lock:order:a}b".to_owned()).unwrap();
    let tag = SLOT_TAGS.tag(slot(b"lock:order:a}b"));
    assert_eq!(
        keys.wake_list(),
        format!("{{{tag}}}:distlock:wake:lock:order:a}}b")
    );
}

#[test]
fn the_orders_key_is_a_helper_of_its_prefix_and_no_lock_s() {
    assert_eq!(
        orders_key("lock:").as_deref(),
        Some("{lock:}:distlock:orders")
    );
    assert_eq!(
        orders_key("app:{eu}:").as_deref(),
        Some("{eu}:distlock:orders:app:{eu}:")
    );
    assert_eq!(orders_key("").as_deref(), Some("{}:distlock:orders"));
    assert_eq!(orders_key("{t}:distlock:x"), None);
    for prefix in ["lock:", "app:{eu}:", "", "a}b"] {
        let key = orders_key(prefix).unwrap();
        assert!(has_helper_shape(&key), "{key}");
        assert!(LockKeys::new(key.clone()).is_err(), "{key} is no lock key");
    }
}
