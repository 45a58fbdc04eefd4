//! Who holds a lock: [`LockInfo`] and [`Holder`], read by [`LockManager::inspect`] and
//! [`LockManager::list`].
//!
//! Everything shown comes from what acquisitions write anyway — the lock's value names its
//! holder (see [`LockGuard::token`](crate::LockGuard::token)), the line holds its waiters, the
//! fencing counter its last token, and the script that grants a lock to a holder that waited
//! records when (the value, made before the wait, cannot say) — so inspection adds no command
//! to a lock. It only reads: one script per lock, and `SCAN` (never `KEYS`, which blocks a
//! server) to find locks.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, SystemTime};

use futures_util::stream::{self, Stream};

use crate::backend::keys::{Kind, LockKeys};
use crate::backend::{Look, Scan};
use crate::{LockError, LockManager};

/// One held lock, as [`LockManager::inspect`] and [`LockManager::list`] see it.
///
/// ```no_run
/// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
/// if let Some(info) = manager.inspect("trace:abc").await? {
///     match &info.holder {
///         Some(holder) => println!("{} holds it: pid {} on {}", holder.label, holder.pid, holder.host),
///         None => println!("held by something other than distlock"),
///     }
///     println!("{:?} left, {} waiting, fence {:?}", info.ttl_left, info.waiters, info.fence);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's name (its key without the manager's prefix).
    pub name: String,
    /// The full Redis key.
    pub key: String,
    /// Who holds it — for a semaphore or readers, the first of [`LockInfo::holders`]; `None`
    /// when its value was not written by distlock (a hand-written lock sharing the key,
    /// another library).
    pub holder: Option<Holder>,
    /// How long until it expires unless extended; `None` when the key has no expiry. For a
    /// lock released within its `hold_at_least` and kept for the waiters in line, how long
    /// until the hold ends (zero once it has, until the first waiter takes it over).
    pub ttl_left: Option<Duration>,
    /// How many waiters hold a live place in its line in Redis. Tasks of one process that
    /// share a [`LockManager`] queue in the process behind one of them, so this counts waiting
    /// managers (usually processes), not tasks. Always 0 on Redlock, whose masters keep no
    /// line.
    pub waiters: u64,
    /// The last fencing token issued for this key, if any ever was.
    pub fence: Option<u64>,
    /// How the lock is held: by one holder, by a semaphore's permits or by readers.
    pub mode: HeldMode,
    /// Every holder: the one of a mutex or writer (when distlock wrote its value), each permit
    /// of a semaphore, each reader — the earliest lease to run out first. `holder` is the
    /// first of them.
    pub holders: Vec<Holder>,
    /// The lock key's value as it was read (`None`: not UTF-8), for
    /// [`LockManager::force_release`], which breaks the lock only if it still holds it.
    value: Option<String>,
    /// Every permit's or reader's value as it was read, for [`LockManager::force_release`],
    /// which breaks only these; `None` when one of them is not UTF-8 text (not written by
    /// distlock), which `force_release` refuses rather than break the others and leave it.
    leases: Option<Vec<String>>,
}

/// Who holds a lock, as it wrote itself into the lock's value when it took it.
///
/// ```no_run
/// # fn example(holder: &distlock::Holder) {
/// let held_for = holder.since.elapsed().unwrap_or_default();
/// println!("{} (pid {} on {}) for {held_for:?}", holder.label, holder.pid, holder.host);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's host name (cut to 255 bytes).
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// Its [`LockOptions::label`](crate::LockOptions::label) (`#[distributed_lock]`: the
    /// function's path and key template); the lock's name when none was set.
    pub label: String,
    /// When the holder got the lock, so that `now - since` is how long it has held it, never
    /// counting its wait. A lock taken by its first try shows the time its value was made, just
    /// before that `SET`, by the holder's clock; a lock that a holder got after waiting (handed
    /// over by the previous holder's release, or found free by a later look) shows the time of
    /// that grant, recorded by the script that made it, by the Redis server's clock (on
    /// Redlock, the earliest among the masters that hold it; in-process, this process's).
    pub since: SystemTime,
    /// How long until this holder's lease runs out unless extended: a semaphore's permits and
    /// readers each have their own; for a mutex, the lock's `ttl_left`.
    pub ttl_left: Option<Duration>,
}

/// How a lock is held, as [`LockInfo::mode`] shows it.
///
/// ```no_run
/// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
/// use distlock::HeldMode;
///
/// if let Some(info) = manager.inspect("payments:api").await? {
///     if let HeldMode::Semaphore { permits } = info.mode {
///         println!("{} of {permits} permits taken", info.holders.len());
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldMode {
    /// One holder: a mutex, or a read-write lock's writer.
    Exclusive,
    /// A semaphore's permits ([`LockOptions::permits`](crate::LockOptions::permits)).
    Semaphore {
        /// How many permits the semaphore has.
        permits: u32,
    },
    /// A read-write lock's readers ([`LockMode::Read`](crate::LockMode::Read)).
    Read,
}

impl LockManager {
    /// Who holds the lock `name` now, how long it has left, who waits; `None` when it is free.
    ///
    /// One read-only script on the lock's node (on Redlock, on every master: the lock is
    /// shown when a majority hold the same value, with the shortest time left among them).
    ///
    /// # Errors
    /// [`LockError::Redis`] if Redis could not be asked (or, on Redlock, fewer than a majority
    /// of masters answered), or the key holds something other than a string;
    /// [`LockError::Config`] for a name distlock refuses as a lock key.
    ///
    /// ```no_run
    /// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
    /// match manager.inspect("trace:abc").await? {
    ///     Some(info) => println!("held: {info:?}"),
    ///     None => println!("free"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<Option<LockInfo>, LockError> {
        let mut key = String::with_capacity(self.key_prefix().len() + name.len());
        key.push_str(self.key_prefix());
        key.push_str(name);
        let keys = LockKeys::new(key)?;
        let look = self.backend()?.inspect(&keys).await?;
        Ok(look.map(|look| info(name, &keys, look)))
    }

    /// Every held lock whose name matches `pattern`, a Redis glob (`*` any text, `?` one
    /// character, `[abc]` a set, `\` escapes): `"*"` for all, `"trace:*"` for the traces.
    ///
    /// Locks are found with `SCAN` on the server — on a cluster, on every master; on Redlock,
    /// on every master, each lock shown as [`LockManager::inspect`] shows it — so a big
    /// keyspace is walked in steps without blocking Redis, and a lock taken or released while
    /// the walk runs may or may not appear. Each lock is shown once, though `SCAN` may return
    /// a key twice, Redlock's masters share their locks and a cluster slot may move to a
    /// master not yet scanned: the names found are kept until the walk ends. A lock found by
    /// the scan and free by the time it is looked at, or by then holding another type than a
    /// string, is skipped; a lock whose line or fencing counter holds another type is not
    /// (it may be held): the walk ends with the error that names that key, as
    /// [`LockManager::inspect`] answers. With an empty key prefix every string key that matches is taken for
    /// a lock (distlock cannot tell them apart); its holder is `None`.
    ///
    /// The stream ends after its first error.
    ///
    /// ```no_run
    /// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
    /// use futures_util::StreamExt;
    ///
    /// let mut locks = std::pin::pin!(manager.list("trace:*"));
    /// while let Some(info) = locks.next().await {
    ///     let info = info?;
    ///     println!("{} ({:?} left, {} waiting)", info.name, info.ttl_left, info.waiters);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn list(
        &self,
        pattern: &str,
    ) -> impl Stream<Item = Result<LockInfo, LockError>> + Send + 'static {
        let mut glob = String::with_capacity(self.key_prefix().len() * 2 + pattern.len());
        for c in self.key_prefix().chars() {
            // The prefix is literal text, not part of the pattern.
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                glob.push('\\');
            }
            glob.push(c);
        }
        glob.push_str(pattern);
        let walk = Walk {
            manager: self.clone(),
            glob,
            targets: None,
            cursor: 0,
            found: VecDeque::new(),
            seen: HashSet::new(),
            done: false,
        };
        stream::unfold(walk, |mut walk| async move {
            match walk.next().await {
                Ok(Some(info)) => Some((Ok(info), walk)),
                Ok(None) => None,
                Err(error) => {
                    walk.done = true;
                    Some((Err(error), walk))
                }
            }
        })
    }
}

impl LockManager {
    /// Breaks the lock that `info` (from [`LockManager::inspect`] or [`LockManager::list`])
    /// shows, for an operator clearing a lock whose holder is stuck: it is released as its
    /// holder would release it — handed to the next waiter in line, if any — but only if it
    /// still holds the value it held when inspected, so a lock that has passed to someone
    /// else since is never broken. Returns whether it was.
    ///
    /// The holder is not told at once: it runs on, believing it holds the lock, until its next
    /// `extend` (with `auto_extend`, the watchdog's, within a third of the ttl), `is_held` or
    /// release finds it lost. Its token is kept for a day in the lock's `forced` mark
    /// (`{<key>}:distlock:forced`), so that `extend` and release answer
    /// [`LockError::Lost`] with [`LostCause::ForceReleased`](crate::LostCause::ForceReleased) —
    /// never `Ok`, as if the holder had released the lock itself. (On Redlock, which keeps no
    /// mark, the cause given is `Expired`.) Use it on holders that are gone or hung.
    ///
    /// A semaphore's permits or a read lock's readers ([`HeldMode::Semaphore`],
    /// [`HeldMode::Read`]) are broken together: every holder in [`LockInfo::holders`] whose
    /// lease is still there loses it (a holder that came in after the inspection keeps its
    /// own), each is told `Lost` with `ForceReleased` the same way (their tokens kept for a day
    /// in `{<key>}:distlock:forced-leases`), and the permits or the read lock go to the head
    /// of the line as their releases would give them. `true` if any lease was broken.
    ///
    /// # Errors
    /// [`LockError::Redis`] if Redis could not be asked; [`LockError::Config`] when the lock's
    /// value, or one permit's or reader's, is not UTF-8 text (not written by distlock: delete
    /// the key by hand).
    ///
    /// ```no_run
    /// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
    /// if let Some(info) = manager.inspect("nightly-report").await? {
    ///     if manager.force_release(&info).await? {
    ///         println!("broke {} (held by {:?})", info.key, info.holder);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn force_release(&self, info: &LockInfo) -> Result<bool, LockError> {
        let keys = LockKeys::new(info.key.clone())?;
        let leased = match info.mode {
            HeldMode::Exclusive => None,
            HeldMode::Semaphore { permits } => Some(Kind::Permits(permits)),
            HeldMode::Read => Some(Kind::Read),
        };
        if let Some(kind) = leased {
            let Some(leases) = &info.leases else {
                return Err(LockError::config(format!(
                    "a lease of `{}` is not UTF-8 text, so distlock did not write it; delete the \
                     key by hand (`redis-cli DEL`) if you are sure nothing holds it",
                    info.key
                )));
            };
            let keys = keys.with_kind(kind);
            return Ok(self.backend()?.force_unlock(&keys, leases).await?);
        }
        let Some(value) = &info.value else {
            return Err(LockError::config(format!(
                "the value of `{}` is not UTF-8 text, so distlock did not write it; delete the \
                 key by hand (`redis-cli DEL`) if you are sure nothing holds it",
                info.key
            )));
        };
        Ok(self
            .backend()?
            .force_unlock(&keys, std::slice::from_ref(value))
            .await?)
    }
}

/// Where a [`LockManager::list`] is in its scan.
struct Walk {
    manager: LockManager,
    glob: String,
    /// The servers left to scan, the current one last; `None` until asked for.
    targets: Option<Vec<Scan>>,
    cursor: u64,
    /// Names found and not yet looked at.
    found: VecDeque<String>,
    /// Names already found, so that none is shown twice.
    seen: HashSet<String>,
    done: bool,
}

impl Walk {
    async fn next(&mut self) -> Result<Option<LockInfo>, LockError> {
        if self.done {
            return Ok(None);
        }
        loop {
            while let Some(name) = self.found.pop_front() {
                let mut key = String::with_capacity(self.manager.key_prefix().len() + name.len());
                key.push_str(self.manager.key_prefix());
                key.push_str(&name);
                let keys = LockKeys::new(key)?;
                match self.manager.backend()?.inspect(&keys).await {
                    Ok(Some(look)) => return Ok(Some(info(&name, &keys, look))),
                    Ok(None) => {}
                    // Found as a string by the scan, another type by now: no lock, as a key
                    // of another type is not one when the scan meets it. A helper key of
                    // another type is no reason to hide a lock that is held: its error,
                    // naming that key, is the operator's to act on.
                    Err(error) if error.is_lock_key_of_another_type() => {}
                    Err(error) => return Err(error.into()),
                }
            }
            if self.targets.is_none() {
                let mut targets = self.manager.backend()?.scan_targets().await?;
                targets.reverse();
                self.targets = Some(targets);
            }
            let Some(target) = self.targets.as_ref().and_then(|targets| targets.last()) else {
                self.done = true;
                return Ok(None);
            };
            let (cursor, keys) = self
                .manager
                .backend()?
                .scan(target, self.cursor, &self.glob)
                .await?;
            self.cursor = cursor;
            if cursor == 0 {
                self.targets.as_mut().map(Vec::pop);
            }
            let prefix = self.manager.key_prefix();
            for key in keys {
                // Keys that cannot be a lock: not text, or distlock's own helpers.
                let Ok(key) = String::from_utf8(key) else {
                    continue;
                };
                if crate::backend::keys::has_helper_shape(&key) {
                    continue;
                }
                let Some(name) = key.strip_prefix(prefix) else {
                    continue;
                };
                // Shown once: Redlock's masters share their locks, and a cluster slot that
                // moves during the walk shows its locks on the master it left and the one it
                // reached.
                if !self.seen.insert(name.to_owned()) {
                    continue;
                }
                self.found.push_back(name.to_owned());
            }
        }
    }
}

fn info(name: &str, keys: &LockKeys, look: Look) -> LockInfo {
    let holder_of = |value: &[u8], granted: Option<SystemTime>, ttl_left: Option<Duration>| {
        crate::support::identity::parse(value).map(|identity| Holder {
            host: identity.host,
            pid: identity.pid,
            label: identity.label.unwrap_or_else(|| name.to_owned()),
            // A holder that waited wrote its value before the wait: the grant's record tells.
            since: granted.unwrap_or(identity.since),
            ttl_left,
        })
    };
    let (mode, holders) = match &look.leased {
        Some(leased) => (
            leased
                .permits
                .map_or(HeldMode::Read, |permits| HeldMode::Semaphore { permits }),
            leased
                .holders
                .iter()
                .filter_map(|(value, left)| holder_of(value, None, Some(*left)))
                .collect(),
        ),
        None => (
            HeldMode::Exclusive,
            holder_of(&look.value, look.granted, look.ttl_left)
                .into_iter()
                .collect::<Vec<_>>(),
        ),
    };
    LockInfo {
        name: name.to_owned(),
        key: keys.lock.to_string(),
        holder: holders.first().cloned(),
        holders,
        mode,
        ttl_left: look.ttl_left,
        waiters: look.waiters,
        fence: look.fence,
        leases: look
            .leased
            .iter()
            .flat_map(|leased| &leased.holders)
            .map(|(value, _)| String::from_utf8(value.clone()).ok())
            .collect(),
        value: String::from_utf8(look.value).ok(),
    }
}
