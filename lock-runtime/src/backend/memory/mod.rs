//! The in-process backend: the lock table in this process's memory, no server.
//!
//! It keeps the line protocol of a single Redis endpoint ([`super::line`] with the scripts in
//! `scripts.rs`), step for step, so that a manager on it behaves as one on Redis: a lock is a
//! token with an expiry; a release frees it only for the token that holds it and hands it to the
//! first live waiter in line; waiters renew their place within the lease; fencing tokens come
//! from one counter per key. The difference is the transport: the hand-off's message goes to
//! the waiter's mailbox directly, and the waiter, rather than trust it, reads the table (a map
//! lookup) — so this store declares no hand-off in its `Capabilities`.
//!
//! There is one table per process, shared by every in-process manager — as every client of a
//! Redis shares its keys — so two managers exclude each other, and one lock is never held twice
//! in the process. It is never shared with another process: that needs Redis.
//!
//! Expiries are on the real clock (`std::time::Instant`), not tokio's (which a test may pause):
//! a lock expires when its ttl has passed, whichever runtime looks.

mod leased;
mod waits;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use super::{failure, Attempt, Capabilities, Look, Ownership, Unlock, Wait, CLAIM, LEASE};
use crate::backend::grants::{Grant, GrantHub};
use crate::backend::keys::Kind;
use crate::backend::keys::LockKeys;
use crate::LostCause;

/// How long a force-released holder's token is kept in its lock's `forced` mark, as on Redis.
pub(super) const FORCED_KEPT: Duration = Duration::from_secs(24 * 60 * 60);

/// The process's lock table.
pub(crate) struct Memory {
    table: &'static Mutex<Table>,
    hub: GrantHub,
}

#[derive(Default)]
struct Table {
    locks: HashMap<Arc<str>, LockRow>,
    /// The last fencing token issued for each key that ever had one: one counter per key, as
    /// Redis keeps (and, like Redis, never forgets), so that a key's tokens count its own
    /// acquisitions and inspection shows its counter under any holder. Only fenced
    /// acquisitions add one, so this grows with the names locked with fencing, not with every
    /// name.
    fences: HashMap<Arc<str>, u64>,
    /// Number of rows after the last sweep of expired ones: the next sweep runs at twice it.
    swept_at: usize,
    /// The `forced` marks: per key, the token of the holder an operator force-released last,
    /// and until when it is kept (see `scripts::FORCE_RELEASE`).
    forced: HashMap<Arc<str>, (Arc<str>, Instant)>,
    /// The `forced-leases` marks: the tokens of permits and readers an operator broke, each
    /// with until when it is kept (see `scripts::LEASED_FORCE_RELEASE`).
    forced_leases: HashMap<Arc<str>, Instant>,
    /// The wait records (see `backend::waits`), by lock key: per field, the record's text (or
    /// `None`, an end mark) and until when it lives.
    waits: HashMap<Arc<str>, waits::Fields>,
}

/// One lock: its holder, and who waits for it.
#[derive(Default)]
struct LockRow {
    holder: Option<TableHolder>,
    line: VecDeque<TableWaiter>,
    /// A semaphore's permits or a read-write lock's readers, as the leased set on Redis.
    leases: Option<leased::Leases>,
    /// A semaphore's line, apart from the mutex's as on Redis.
    permit_line: VecDeque<TableWaiter>,
}

/// Who holds a lock in the table: its token, until when, and its fencing token.
struct TableHolder {
    token: Arc<str>,
    expires: Instant,
    fence: u64,
    /// When it got the lock, for a holder that waited first (as the `since` record on Redis):
    /// its value was made before the wait.
    granted: Option<SystemTime>,
}

/// A waiter's place in line: what a hand-off needs to give it the lock.
struct TableWaiter {
    token: Arc<str>,
    lease_until: Instant,
    ttl: Duration,
    fencing: bool,
    /// Whether it listens for a hand-off (else it finds the grant by looking again).
    listening: bool,
}

impl LockRow {
    /// Forgets a holder whose ttl ran out and places whose lease ran out.
    fn expire(&mut self, now: Instant) {
        if self
            .holder
            .as_ref()
            .is_some_and(|holder| holder.expires <= now)
        {
            self.holder = None;
        }
        self.line.retain(|place| place.lease_until >= now);
        self.permit_line.retain(|place| place.lease_until >= now);
        if let Some(leases) = &mut self.leases {
            leases.holders.retain(|lease| lease.expires > now);
            if leases.holders.is_empty() {
                self.leases = None;
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.holder.is_none()
            && self.line.is_empty()
            && self.leases.is_none()
            && self.permit_line.is_empty()
    }

    fn held_by(&self, token: &str) -> bool {
        self.holder
            .as_ref()
            .is_some_and(|holder| &*holder.token == token)
    }

    fn remaining(&self, now: Instant) -> Option<Duration> {
        self.holder
            .as_ref()
            .map(|holder| holder.expires.saturating_duration_since(now))
    }
}

impl Table {
    /// Why `token` does not hold the lock `key`, as the scripts tell it: force-released when
    /// the key's `forced` mark names it, taken when someone else holds it, expired otherwise.
    fn why_not_ours(&mut self, key: &Arc<str>, token: &str, now: Instant) -> LostCause {
        self.forced.retain(|_, (_, until)| *until > now);
        if self
            .forced
            .get(key)
            .is_some_and(|(forced, _)| &**forced == token)
        {
            LostCause::ForceReleased
        } else if self.row(key, now).holder.is_some() {
            LostCause::Taken
        } else {
            LostCause::Expired
        }
    }

    /// The next fencing token of `key`.
    fn next_fence(&mut self, key: &Arc<str>) -> u64 {
        let fence = self.fences.entry(Arc::clone(key)).or_default();
        *fence += 1;
        *fence
    }

    /// The last fencing token issued for `key`, if any ever was.
    fn last_fence(&self, key: &str) -> Option<u64> {
        self.fences.get(key).copied()
    }

    /// The row of `key`, with what has expired forgotten.
    fn row(&mut self, key: &Arc<str>, now: Instant) -> &mut LockRow {
        if self.locks.len() >= (2 * self.swept_at).max(64) {
            // Locks nobody touches again (a holder that died, a name used once) would otherwise
            // stay: sweep when the table has doubled, so the cost per operation stays constant.
            self.locks.retain(|_, row| {
                row.expire(now);
                !row.is_empty()
            });
            self.swept_at = self.locks.len();
        }
        let row = self.locks.entry(Arc::clone(key)).or_default();
        row.expire(now);
        row
    }

    /// Removes the row of `key` once nothing is in it.
    fn tidy(&mut self, key: &str) {
        if self.locks.get(key).is_some_and(LockRow::is_empty) {
            self.locks.remove(key);
        }
    }
}

impl Memory {
    /// What the in-process table can do: fencing tokens from its own counter. Its message to a
    /// waiter is not trusted as a hand-off: the waiter looks at the table, which costs no round
    /// trip. No connection, so nothing is re-sent and no connection drops.
    pub(crate) const CAPABILITIES: Capabilities = Capabilities {
        fencing: true,
        hands_over: false,
        resends_commands: false,
        waits_for_replicas: false,
        keeps_place_on_drop: false,
        leases: true,
        // Taken one by one in the order of their keys (see `manager::all`).
        together: crate::backend::Together::Never,
        detects_deadlocks: true,
    };

    pub(crate) fn new() -> Self {
        static TABLE: once_cell::sync::Lazy<Mutex<Table>> =
            once_cell::sync::Lazy::new(Mutex::default);
        Memory {
            table: &TABLE,
            hub: GrantHub::in_process(),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One attempt, as the acquire script runs it: ours already (a hand-off not heard yet),
    /// free (the first live waiter in line gets it, else the caller), or held (the caller takes
    /// or renews its place in line when `wait` says so).
    pub(crate) fn try_lock(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl: Duration,
        fencing: bool,
        wait: &Wait,
    ) -> failure::Result<Attempt> {
        let now = Instant::now();
        let mut table = self.table();
        let table = &mut *table;
        let row = table.row(&keys.lock, now);
        if let Some(holder) = row.holder.as_ref().filter(|holder| &*holder.token == token) {
            return Ok(Attempt::Acquired {
                fence: fencing.then_some(holder.fence),
                expires_in: holder.expires.saturating_duration_since(now),
            });
        }
        if let Some(found) = row.leases.as_ref().map(|leases| leases.kind) {
            if found != Kind::Read {
                return Err(failure::used_otherwise(keys, found));
            }
        }
        if row.holder.is_none() && row.leases.is_none() {
            match self.hand_off(table, &keys.lock, now, None, Some(token)) {
                None => {
                    let fence = if fencing {
                        table.next_fence(&keys.lock)
                    } else {
                        0
                    };
                    let row = table.row(&keys.lock, now);
                    row.holder = Some(TableHolder {
                        token: Arc::from(token),
                        expires: now + ttl,
                        fence,
                        granted: (*wait != Wait::FirstTry).then(SystemTime::now),
                    });
                    return Ok(Attempt::Acquired {
                        fence: fencing.then_some(fence),
                        expires_in: ttl,
                    });
                }
                Some((winner, fence, expires_in)) if &*winner == token => {
                    return Ok(Attempt::Acquired {
                        fence: fencing.then_some(fence),
                        expires_in,
                    });
                }
                Some(_) => {}
            }
        }
        let row = table.row(&keys.lock, now);
        let remaining = row.remaining(now);
        if let Wait::InLine { channel, .. } = wait {
            let place = TableWaiter {
                token: Arc::from(token),
                lease_until: now + LEASE,
                ttl,
                fencing,
                listening: channel.is_some(),
            };
            // A renewal whose place lapsed joins again at the end, as on Redis.
            match row.line.iter_mut().find(|place| &*place.token == token) {
                Some(existing) => *existing = place,
                None => row.line.push_back(place),
            }
        }
        Ok(Attempt::Held { remaining })
    }

    /// Frees the lock if `token` holds it, handing it to the first live waiter in line;
    /// `false` if it was not ours (nothing touched). [`Unlock::Leave`] also takes `token` out of
    /// the line.
    pub(crate) fn unlock(&self, keys: &LockKeys, token: &str, why: Unlock) -> Ownership {
        let leave = why == Unlock::Leave;
        let now = Instant::now();
        let mut table = self.table();
        let table = &mut *table;
        let row = table.row(&keys.lock, now);
        if leave {
            row.line.retain(|place| &*place.token != token);
        }
        let ours = if row.held_by(token) {
            row.holder = None;
            self.hand_off(table, &keys.lock, now, Some(token), None);
            Ownership::Ours
        } else {
            Ownership::Lost(table.why_not_ours(&keys.lock, token, now))
        };
        table.tidy(&keys.lock);
        ours
    }

    /// Breaks the lock if `value` holds it, as its holder's release would, and keeps `value`
    /// in the key's `forced` mark for a day, as `scripts::FORCE_RELEASE` does; `true` if it
    /// broke it.
    pub(crate) fn force_unlock(&self, keys: &LockKeys, value: &str) -> bool {
        let now = Instant::now();
        let mut table = self.table();
        let table = &mut *table;
        let row = table.row(&keys.lock, now);
        let broken = row.held_by(value);
        if broken {
            row.holder = None;
            self.hand_off(table, &keys.lock, now, Some(value), None);
            table.forced.insert(
                Arc::clone(&keys.lock),
                (Arc::from(value), now + FORCED_KEPT),
            );
        }
        table.tidy(&keys.lock);
        broken
    }

    /// Sets the lock's remaining ttl if `token` holds it.
    pub(crate) fn extend(&self, keys: &LockKeys, token: &str, ttl: Duration) -> Ownership {
        let now = Instant::now();
        let mut table = self.table();
        let row = table.row(&keys.lock, now);
        if let Some(holder) = row.holder.as_mut().filter(|holder| &*holder.token == token) {
            holder.expires = now + ttl;
            return Ownership::Ours;
        }
        let why = table.why_not_ours(&keys.lock, token, now);
        table.tidy(&keys.lock);
        Ownership::Lost(why)
    }

    /// Leaves the lock to expire `keep` from now if `token` holds it (`false` if not), and tells
    /// the first waiter in line to look again, so that it sleeps until that expiry rather than
    /// until the ttl it last saw — as the `HOLD` script does on Redis.
    pub(crate) fn hold(&self, keys: &LockKeys, token: &str, keep: Duration) -> Ownership {
        let now = Instant::now();
        let mut table = self.table();
        let row = table.row(&keys.lock, now);
        let Some(holder) = row.holder.as_mut().filter(|holder| &*holder.token == token) else {
            let why = table.why_not_ours(&keys.lock, token, now);
            table.tidy(&keys.lock);
            return Ownership::Lost(why);
        };
        holder.expires = now + keep;
        if let Some(first) = row.line.front().filter(|place| place.listening) {
            self.hub.wake(&first.token);
        }
        Ownership::Ours
    }

    /// Whether `token` holds the lock now.
    pub(crate) fn is_held(&self, keys: &LockKeys, token: &str) -> bool {
        let now = Instant::now();
        let mut table = self.table();
        let held = table.row(&keys.lock, now).held_by(token);
        table.tidy(&keys.lock);
        held
    }

    /// Gives the free lock to the first live waiter in line other than `except`, for the
    /// shorter of its ttl and the claim, and tells it unless it is `quiet` (the caller, which
    /// learns from the reply). Returns the new holder's token, fencing token and ttl; `None`
    /// when nobody waits.
    fn hand_off(
        &self,
        table: &mut Table,
        key: &Arc<str>,
        now: Instant,
        except: Option<&str>,
        quiet: Option<&str>,
    ) -> Option<(Arc<str>, u64, Duration)> {
        loop {
            let place = table.row(key, now).line.pop_front()?;
            if Some(&*place.token) == except {
                continue;
            }
            if leased::is_reader(&place.token) {
                return Some(self.admit_readers(table, key, now, &place, quiet));
            }
            let fence = if place.fencing {
                table.next_fence(key)
            } else {
                0
            };
            let claim = place.ttl.min(CLAIM);
            table.row(key, now).holder = Some(TableHolder {
                token: Arc::clone(&place.token),
                expires: now + claim,
                fence,
                granted: Some(SystemTime::now()),
            });
            if place.listening && Some(&*place.token) != quiet {
                self.hub.hand_over(&place.token, Grant::Granted { fence });
            }
            return Some((place.token, fence, claim));
        }
    }

    /// One look at the lock as inspection shows it; `None` when it is free.
    pub(crate) fn inspect(&self, keys: &LockKeys) -> Option<Look> {
        let now = Instant::now();
        let mut table = self.table();
        let fence = table.last_fence(&keys.lock);
        let row = table.row(&keys.lock, now);
        let look = match &row.leases {
            Some(leases) => leased::look(leases, row, fence, now),
            None => row.holder.as_ref().map(|holder| Look {
                value: holder.token.as_bytes().to_vec(),
                ttl_left: Some(holder.expires.saturating_duration_since(now)),
                waiters: u64::try_from(row.line.len()).unwrap_or(u64::MAX),
                fence,
                granted: holder.granted,
                leased: None,
            }),
        };
        table.tidy(&keys.lock);
        look
    }

    /// The keys of the locks held now that match the Redis glob `pattern`.
    pub(crate) fn held_keys(&self, pattern: &str) -> Vec<Vec<u8>> {
        let now = Instant::now();
        let table = self.table();
        table
            .locks
            .iter()
            .filter(|(_, row)| {
                row.holder.as_ref().is_some_and(|h| h.expires > now)
                    || row.leases.as_ref().is_some_and(|leases| {
                        leases.holders.iter().any(|lease| lease.expires > now)
                    })
            })
            .filter(|(key, _)| glob_matches(pattern.as_bytes(), key.as_bytes()))
            .map(|(key, _)| key.as_bytes().to_vec())
            .collect()
    }

    /// How many locks are held or awaited in the process (for leak tests).
    #[cfg(feature = "resource-counts")]
    pub(crate) fn len(&self) -> usize {
        let now = Instant::now();
        let mut table = self.table();
        table.locks.retain(|_, row| {
            row.expire(now);
            !row.is_empty()
        });
        table.locks.len()
    }
}

/// Whether `text` matches the Redis glob `pattern`: `*` any run, `?` one byte, `[abc]`,
/// `[^a]` and `[a-z]` sets, `\\` escapes the next byte (as `SCAN MATCH` reads it).
fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| glob_matches(rest, &text[skip..])),
        Some((b'?', rest)) => !text.is_empty() && glob_matches(rest, &text[1..]),
        Some((b'[', rest)) => {
            let Some((&byte, text_rest)) = text.split_first() else {
                return false;
            };
            let (negate, mut set) = match rest.split_first() {
                Some((b'^', set)) => (true, set),
                _ => (false, rest),
            };
            let mut found = false;
            loop {
                match set {
                    [] => return false,
                    [b']', after @ ..] => return found != negate && glob_matches(after, text_rest),
                    [b'\\', escaped, after @ ..] => {
                        found |= *escaped == byte;
                        set = after;
                    }
                    [low, b'-', high, after @ ..] if *high != b']' => {
                        found |= (*low.min(high)..=*low.max(high)).contains(&byte);
                        set = after;
                    }
                    [single, after @ ..] => {
                        found |= *single == byte;
                        set = after;
                    }
                }
            }
        }
        Some((b'\\', [escaped, rest @ ..]) | (escaped, rest)) => {
            text.first() == Some(escaped) && glob_matches(rest, &text[1..])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_redis_scan_reads_them() {
        for (pattern, text, expected) in [
            ("*", "anything", true),
            ("lock:*", "lock:trace:1", true),
            ("lock:*", "other:1", false),
            ("lock:?", "lock:a", true),
            ("lock:?", "lock:ab", false),
            ("lock:[ab]", "lock:b", true),
            ("lock:[^ab]", "lock:b", false),
            ("lock:[a-c]x", "lock:bx", true),
            ("lock:[a-c]x", "lock:dx", false),
            ("\\[x\\]\\*:*", "[x]*:q", true),
            ("\\[x\\]\\*:*", "x*:q", false),
        ] {
            assert_eq!(
                glob_matches(pattern.as_bytes(), text.as_bytes()),
                expected,
                "{pattern:?} {text:?}"
            );
        }
    }

    fn keys(name: &str) -> LockKeys {
        LockKeys::new(format!("lock:memory-test:{name}")).unwrap()
    }

    fn in_line(channel: bool) -> Wait {
        Wait::InLine {
            channel: channel.then(|| Arc::from("in-process")),
            renewing: false,
        }
    }

    #[test]
    fn a_release_hands_over_to_the_first_live_waiter_and_skips_a_lapsed_one() {
        let memory = Memory::new();
        let lock = keys("hand-off");
        let ttl = Duration::from_secs(30);
        assert!(matches!(
            memory.try_lock(&lock, "holder", ttl, false, &Wait::FirstTry),
            Ok(Attempt::Acquired { .. })
        ));
        for waiter in ["lapsed", "next", "last"] {
            assert!(matches!(
                memory.try_lock(&lock, waiter, ttl, true, &in_line(false)),
                Ok(Attempt::Held { .. })
            ));
        }
        // The first waiter stopped renewing: its place ran out.
        let now = Instant::now();
        memory.table().row(&lock.lock, now).line[0].lease_until = now;
        std::thread::sleep(Duration::from_millis(1));
        assert!(memory.unlock(&lock, "holder", Unlock::Release).is_ours());
        assert!(
            memory.is_held(&lock, "next"),
            "handed to the first live waiter"
        );
        assert!(!memory.is_held(&lock, "lapsed"));
        // Its grant is found by looking again, with the fencing token issued at the hand-off.
        let Attempt::Acquired {
            fence: Some(first),
            expires_in,
        } = memory
            .try_lock(&lock, "next", ttl, true, &in_line(false))
            .unwrap()
        else {
            panic!("the hand-off is found by looking again");
        };
        assert!(
            expires_in <= CLAIM,
            "a hand-off lasts the claim until confirmed"
        );
        assert!(
            !memory.unlock(&lock, "holder", Unlock::Release).is_ours(),
            "not the holder's any more"
        );
        assert!(memory.unlock(&lock, "next", Unlock::Release).is_ours());
        let Attempt::Acquired {
            fence: Some(second),
            ..
        } = memory
            .try_lock(&lock, "last", ttl, true, &in_line(false))
            .unwrap()
        else {
            panic!("handed to the last waiter");
        };
        assert!(second > first);
        assert!(memory.unlock(&lock, "last", Unlock::Release).is_ours());
        assert!(
            !memory.table().locks.contains_key(&lock.lock),
            "nothing left"
        );
    }

    #[test]
    fn expired_locks_nobody_touches_again_do_not_pile_up() {
        let memory = Memory::new();
        // Rounds of names used once, whose holders never release (they died).
        for round in 0..5 {
            for n in 0..1000 {
                let lock = keys(&format!("sweep:{round}:{n}"));
                let _ = memory.try_lock(
                    &lock,
                    "gone",
                    Duration::from_millis(1),
                    false,
                    &Wait::FirstTry,
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let kept = memory
            .table()
            .locks
            .keys()
            .filter(|key| key.starts_with("lock:memory-test:sweep:"))
            .count();
        // Swept whenever the table doubles: never more than twice what was live at a sweep.
        assert!(
            kept <= 2 * 1000 + 64,
            "{kept} of 5000 expired locks were kept"
        );
    }
}
