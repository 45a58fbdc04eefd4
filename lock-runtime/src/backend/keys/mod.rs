//! Names of the Redis keys and channels that belong to one lock.
//!
//! A lock `L` (the full key, `key_prefix + name`) has helper keys: its line of waiters and the
//! lease table of that line's renewed places, its fencing counter, on a cluster the marker of
//! its last release, when its holder got it (for a holder that waited), the token of a holder
//! an operator force-released, the wait records of holders that wait for other locks, and on
//! each Redlock master its wake list, each named by a fixed word `s` (`line`, `leases`,
//! `fence`, `released`, `since`, `forced`, `waits`, `wake`). Two rules
//! hold for every name and prefix:
//!
//! - **One slot.** Every helper of `L` hashes to `L`'s Redis Cluster slot, so that one script
//!   can touch them all. Redis hashes a key by its hash tag — the text between the first `{`
//!   and the first `}` after it, when that text is not empty — or else by the whole key
//!   (CRC16-XMODEM modulo 16384; [`slot`]).
//! - **Namespaces that cannot meet.** No helper key is a lock key, and no two locks share a
//!   helper. Otherwise a waiter on one lock could overwrite another lock's token, a release
//!   could delete another lock, and a lock held under a helper's name would break fencing.
//!
//! The helper `s` of `L` is
//!
//! ```text
//! "{" + T + "}" + ":distlock:" + s              when T = L
//! "{" + T + "}" + ":distlock:" + s + ":" + L    otherwise
//! ```
//!
//! where the tag `T` is
//! - `L`'s own hash tag when it has one (`lock:{user:7}:cart` →
//!   `{user:7}:distlock:fence:lock:{user:7}:cart`);
//! - else `L` itself when `L` contains no `}` — the common case, kept readable:
//!   `lock:trace:1` → `{lock:trace:1}:distlock:line`. `L` is then hashed whole, and so is
//!   `T` inside the braces;
//! - else (a `}` but no hash tag, as in `order:a}b`, `x}{y`, `{}x`) a short alphanumeric tag
//!   with `L`'s slot, from a table of one tag per slot built once, on first use.
//!
//! So `T` is never empty (an empty `L` is refused) and the helper's own hash tag is `T`, whose
//! slot is `L`'s.
//!
//! **Reading a helper back.** `T` never contains `}`, so the helper's first `}` ends `T`; then
//! come `:distlock:` and `s`, a word without `:`; then either the end (and `L = T`) or `:` and
//! `L`. A helper therefore names exactly one `(s, L)`: two locks never share a helper, and one
//! lock's helpers are distinct. Every helper contains `L`, so a `SCAN` for `*<lock key>*` finds
//! a lock's helpers too.
//!
//! **Lock keys of the helper shape are refused.** Every helper starts with `{` and has
//! `:distlock:` right after its first `}`; a lock key of that shape is refused with
//! [`LockError::Config`], and so the lock keys and the helper keys are disjoint sets. With the
//! default prefix `lock:` (or any prefix that does not start with `{`) no name is ever refused;
//! an empty prefix, or one that starts with `{`, makes names like `{t}:distlock:waiters` reach
//! that shape. The empty key is refused too: it has no text to give its helpers its slot.
//!
//! distlock never writes into a key that someone else holds: waiting is recorded in a key of its
//! own, so a lock key holds exactly its holder's token, and clients that share the keys and
//! compare `GET` with their token (a hand-written Python lock during a migration, say) keep
//! working next to distlock.

use std::sync::Arc;

use once_cell::sync::Lazy;

use crate::LockError;

/// What follows a helper's tag, before its word.
const MARKER: &str = ":distlock:";
/// The longest helper key name assembled on the stack (see `HelperKey`'s `ToRedisArgs`).
const STACK_NAME: usize = 256;
/// The end of a helper key's tag and the marker after it, as one piece.
const CLOSE_MARKER: &str = "}:distlock:";

/// Number of Redis Cluster hash slots.
const SLOTS: usize = 16384;
/// [`SLOTS`] as the type of a slot.
const SLOT_COUNT: u16 = 16384;

/// The names derived from one full lock key. Cheap to clone: the key is shared, the tag is a
/// position in it or a slot number, and the helper names are made when an operation needs them.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// The lock key itself: `prefix + name`. Shared, not copied, with the in-process queue that
    /// is keyed by it.
    pub(crate) lock: Arc<str>,
    /// The tag `T` of the helper keys (see the module docs).
    tag: Tag,
    /// What the lock is taken as: which scripts and helper keys its operations use.
    pub(crate) kind: Kind,
    /// The other locks taken together with this one, all or none, by one script each time
    /// (`acquire_all` with every key in this one's slot); `None` for a lock taken alone.
    pub(crate) together: Option<Arc<[LockKeys]>>,
}

/// What a lock is taken as. The store's operations branch on it, so that the mutex keeps its
/// own commands and a semaphore or a reader gets the leased set's (docs/family.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The mutex, and a read-write lock's writer: one holder.
    Mutex,
    /// A semaphore of this many permits (at least 2).
    Permits(u32),
    /// A read-write lock's reader.
    Read,
}

/// Where the helper keys' tag `T` comes from.
#[derive(Debug, Clone, Copy)]
enum Tag {
    /// The lock key's own hash tag, at these byte offsets of it.
    Own { start: usize, end: usize },
    /// The whole lock key: it has no hash tag and no `}`.
    Whole,
    /// The table's tag for this slot: the lock key has a `}` but no hash tag.
    OfSlot(u16),
}

impl LockKeys {
    /// The keys of the lock whose full key is `lock`.
    ///
    /// # Errors
    /// [`LockError::Config`] when `lock` is empty or has the shape of a helper key.
    pub(crate) fn new(lock: String) -> Result<Self, LockError> {
        if lock.is_empty() {
            return Err(LockError::config(
                "the lock key is empty (an empty name under an empty key prefix): distlock's \
                 helper keys take their cluster slot from the lock key's text, and there is \
                 none; use another lock name or key prefix",
            ));
        }
        if has_helper_shape(&lock) {
            return Err(LockError::config(format!(
                "lock key `{lock}` is reserved for distlock's helper keys: a key that starts \
                 with `{{`, whose first `}}` is followed by `:distlock:`, names the waiters or \
                 fencing counter of another lock; use another lock name or key prefix"
            )));
        }
        let tag = match hash_tag(lock.as_bytes()) {
            Some((start, end)) => Tag::Own { start, end },
            None if !lock.contains('}') => Tag::Whole,
            None => Tag::OfSlot(slot(lock.as_bytes())),
        };
        Ok(LockKeys {
            lock: Arc::from(lock),
            tag,
            kind: Kind::Mutex,
            together: None,
        })
    }

    /// Every lock of these keys: this one, then those taken together with it by one script.
    pub(crate) fn every(&self) -> impl Iterator<Item = &LockKeys> {
        std::iter::once(self).chain(self.together.iter().flat_map(|together| together.iter()))
    }

    /// These keys, taken as `kind`.
    pub(crate) fn with_kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }

    /// A semaphore's line of waiters, in the mutex line's format; a helper of its own so that a
    /// mutex's release never finds a permit's waiter in its line.
    pub(crate) fn permit_line(&self) -> String {
        self.helper("permit-line")
    }

    /// The fencing tokens of a leased set's holders (permits, readers): a hash token → fence.
    pub(crate) fn permit_fences(&self) -> String {
        self.helper("permit-fences")
    }

    /// Redlock only: the waiters to wake on this master, a sorted set of `"<channel> <token>"`
    /// scored by the deadline of each waiter's lease (see `scripts::QUORUM_ACQUIRE`).
    pub(crate) fn wake_list(&self) -> String {
        self.helper("wake")
    }

    /// The line of waiters: a list of their entries (token, lease, ttl, fencing, grant
    /// channel), oldest first.
    pub(crate) fn line(&self) -> String {
        self.helper("line")
    }

    /// The lease table of the line: a sorted set of the tokens whose places in line were
    /// renewed, each scored by the lease deadline its last renewal gave (see
    /// `scripts::LINE_PRELUDE`). Expires two leases after the last renewal, as the line does.
    pub(crate) fn leases(&self) -> String {
        self.helper("leases")
    }

    /// The fencing counter: never expires, so tokens keep increasing across lock lifetimes.
    pub(crate) fn fence(&self) -> String {
        self.helper("fence")
    }

    /// The token of the lock's last release, kept for as long as a cluster connection may send
    /// that release again, so that a second run is known for what it is (see `RELEASE`).
    pub(crate) fn released(&self) -> String {
        self.helper("released")
    }

    /// The tokens of the lock's recent releases of permits, readers or keys taken together:
    /// a sorted set scored by when each is forgotten, kept for as long as a connection may
    /// send that release again (see `family_prelude.lua`). A set, where the mutex's
    /// [`LockKeys::released`] keeps one token: several leases are released side by side.
    pub(crate) fn releases(&self) -> String {
        self.helper("releases")
    }

    /// The token of the lock's last holder that an operator force-released, kept for a day
    /// (see `scripts::FORCE_RELEASE`): that holder's next extension or release learns why the
    /// lock is no longer its.
    pub(crate) fn forced(&self) -> String {
        self.helper("forced")
    }

    /// The tokens of a semaphore's permits or readers that an operator force-released, a
    /// sorted set scored by when each is forgotten (a day on; see
    /// `scripts::LEASED_FORCE_RELEASE`): each holder's next extension or release learns why
    /// its lease is gone. A set, where the mutex's [`LockKeys::forced`] keeps one token.
    pub(crate) fn forced_leases(&self) -> String {
        self.helper("forced-leases")
    }

    /// When the lock's holder got it, for a holder that waited first (see `granted` in
    /// `scripts.rs`): its UUID and the grant's Redis time in ms; lives as long as the lock.
    pub(crate) fn since(&self) -> String {
        self.helper("since")
    }

    /// The wait records of the lock's holders (its mutex's or writer's, or its readers), while
    /// they wait for other locks (see `backend::waits`): a hash, one field per wait and lock
    /// waited for, written by the holder only, each with a short expiry (in the value) it
    /// renews while it waits.
    pub(crate) fn waits(&self) -> String {
        self.helper("waits")
    }

    /// The helper key `word` of this lock (see the module docs); `word` must not contain `:`.
    /// Built by hand into one allocation of the right size, not with `format!`: the release of
    /// every lock names its line or wake list.
    pub(crate) fn helper(&self, word: &str) -> String {
        let key = self.helper_arg(word);
        let mut name = Vec::with_capacity(key.len());
        // Into a `Vec`, which cannot fail; from `&str`s, so UTF-8.
        let _ = key.write_to(&mut name);
        String::from_utf8(name).unwrap_or_default()
    }

    /// The helper key `word` of this lock as a command argument, written straight into the
    /// command: no `String` of its own (every release names five of them).
    pub(crate) fn helper_arg<'a>(&'a self, word: &'a str) -> HelperKey<'a> {
        debug_assert!(!word.contains(':'), "a helper word without `:`: {word:?}");
        let lock = &*self.lock;
        let (tag, names_lock) = match self.tag {
            Tag::Own { start, end } => (&lock[start..end], true),
            Tag::Whole => (lock, false),
            Tag::OfSlot(slot) => (SLOT_TAGS.tag(slot), true),
        };
        HelperKey {
            tag,
            word,
            lock: if names_lock { lock } else { "" },
        }
    }
}

/// A helper key's name in pieces (see [`LockKeys::helper_arg`]):
/// `{<tag>}:distlock:<word>[:<lock key>]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HelperKey<'a> {
    tag: &'a str,
    word: &'a str,
    /// The lock key, or empty when the tag is the whole lock key.
    lock: &'a str,
}

impl HelperKey<'_> {
    /// The name's length in bytes.
    pub(crate) fn len(&self) -> usize {
        let lock = if self.lock.is_empty() {
            0
        } else {
            1 + self.lock.len()
        };
        1 + self.tag.len() + CLOSE_MARKER.len() + self.word.len() + lock
    }

    /// Writes the name to `out`: a piece at a time, as few pieces as can be.
    fn write_to(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        out.write_all(b"{")?;
        out.write_all(self.tag.as_bytes())?;
        out.write_all(CLOSE_MARKER.as_bytes())?;
        out.write_all(self.word.as_bytes())?;
        if !self.lock.is_empty() {
            out.write_all(b":")?;
            out.write_all(self.lock.as_bytes())?;
        }
        Ok(())
    }
}

impl redis::ToRedisArgs for HelperKey<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        // Assembled on the stack, then copied into the command at once: cheaper than a write
        // through the command's `io::Write` per piece, and no allocation. A longer name (a
        // long lock key) takes the slower way.
        let mut name = [0u8; STACK_NAME];
        let len = self.len();
        match name.get_mut(..len) {
            Some(mut rest) => {
                // Exactly `len` bytes: cannot run out.
                let _ = self.write_to(&mut rest);
                out.write_arg(&name[..len]);
            }
            // Into the command's own buffer, which cannot fail.
            None => drop(self.write_to(&mut out.writer_for_next_arg())),
        }
    }
}

/// The word of the lock-order record's helper key, which no lock's helper uses.
const ORDERS: &str = "orders";

/// The one helper key of a key prefix rather than of a lock: the orders in which the fleet's
/// tasks took locks of two key templates (see `backend::orders`). It is the helper `orders` of
/// the prefix read as if it were a lock key (`lock:` → `{lock:}:distlock:orders`), so the rules
/// of the module hold for it too: it has the helper shape, which no lock key has, and its word
/// is no lock's, so it is no lock's helper; it names its prefix, so two prefixes never share it.
/// The empty prefix, which no lock key can be, has `{}:distlock:orders`. `None` for a prefix
/// of the helper shape: every lock key under it is refused, so it records no order.
pub(crate) fn orders_key(prefix: &str) -> Option<String> {
    if prefix.is_empty() {
        return Some(format!("{{}}{MARKER}{ORDERS}"));
    }
    LockKeys::new(prefix.to_owned())
        .ok()
        .map(|keys| keys.helper(ORDERS))
}

/// Whether `key` has the shape of a helper key: it starts with `{`, and its first `}` is
/// followed by `:distlock:`.
pub(crate) fn has_helper_shape(key: &str) -> bool {
    key.starts_with('{')
        && key
            .find('}')
            .is_some_and(|close| key[close + 1..].starts_with(MARKER))
}

/// The byte offsets of `key`'s hash tag, as Redis Cluster finds it: the text after the first
/// `{` up to the first `}` after it, when that text is not empty.
fn hash_tag(key: &[u8]) -> Option<(usize, usize)> {
    let start = key.iter().position(|&byte| byte == b'{')? + 1;
    let len = key[start..].iter().position(|&byte| byte == b'}')?;
    (len > 0).then_some((start, start + len))
}

/// The Redis Cluster hash slot of `key`: CRC16-XMODEM, modulo 16384, of its hash tag, or of the
/// whole key when it has none.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let hashed = match hash_tag(key) {
        Some((start, end)) => &key[start..end],
        None => key,
    };
    // 16384 is a power of two: the remainder is the low 14 bits, as in Redis.
    crc16::State::<crc16::XMODEM>::calculate(hashed) % SLOT_COUNT
}

/// One short alphanumeric tag per slot, for lock keys with a `}` but no hash tag. Built on
/// first use, in a few milliseconds: most deployments never need it.
static SLOT_TAGS: Lazy<SlotTags> = Lazy::new(SlotTags::build);

/// The tags of all slots, one after the other in one string.
struct SlotTags {
    text: String,
    /// Where the tag of slot `i` starts in `text`; entry `SLOTS` is `text.len()`.
    starts: Vec<u32>,
}

impl SlotTags {
    /// Enumerates alphanumeric words, shortest first and in a fixed order, keeping the first
    /// word found for each slot, until every slot has one. 62³ words of three characters cover
    /// almost every slot; four characters are enough for the rest.
    fn build() -> SlotTags {
        const ALPHABET: &[u8; 62] =
            b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        const LONGEST: usize = 4;
        let mut found: Vec<Option<([u8; LONGEST], usize)>> = vec![None; SLOTS];
        let mut missing = SLOTS;
        for len in 1..=LONGEST {
            let mut digits = [0usize; LONGEST];
            'words: loop {
                let mut word = [0u8; LONGEST];
                for (byte, &digit) in word.iter_mut().zip(&digits[..len]) {
                    *byte = ALPHABET[digit];
                }
                let entry = &mut found[usize::from(slot(&word[..len]))];
                if entry.is_none() {
                    *entry = Some((word, len));
                    missing -= 1;
                    if missing == 0 {
                        break;
                    }
                }
                // The next word of this length, the first character counting fastest.
                for digit in &mut digits[..len] {
                    *digit += 1;
                    if *digit < ALPHABET.len() {
                        continue 'words;
                    }
                    *digit = 0;
                }
                break;
            }
            if missing == 0 {
                break;
            }
        }
        let mut text = String::with_capacity(SLOTS * 3);
        let mut starts = Vec::with_capacity(SLOTS + 1);
        for entry in found {
            let (word, len) =
                entry.expect("alphanumeric words of up to 4 characters cover every slot");
            starts.push(u32::try_from(text.len()).expect("the table is small"));
            text.extend(word[..len].iter().map(|&byte| char::from(byte)));
        }
        starts.push(u32::try_from(text.len()).expect("the table is small"));
        SlotTags { text, starts }
    }

    /// The tag of `slot`, which hashes to `slot`.
    fn tag(&self, slot: u16) -> &str {
        let slot = usize::from(slot);
        &self.text[self.starts[slot] as usize..self.starts[slot + 1] as usize]
    }
}

#[cfg(test)]
mod tests;
