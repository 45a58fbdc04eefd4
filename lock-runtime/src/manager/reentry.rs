//! Re-entry: which locks a task holds, so that asking again for one of them returns at once
//! instead of waiting for a release only this task can make.
//!
//! **Async: by task.** A task holds a lock while it runs inside the scope of that lock's guard:
//! the body of a `#[distributed_lock]` function (`attribute::run` opens the scope), or a future
//! run by [`LockGuard::scope`]. The scope is a `tokio::task_local!`, so it follows the task and
//! not the thread — a task moved between worker threads keeps it, and a task spawned from inside
//! it (`tokio::spawn`) is another owner, which waits as any other holder would. Inside the scope,
//! [`LockManager::acquire`](crate::LockManager::acquire) and `try_acquire` of a lock the task
//! holds (same manager, same name) return a *re-entered* guard at once: no Redis command, no
//! wait. Any name of an `acquire_all` guard counts, not only its first: the guard holds each.
//! A re-entered guard is a view of the lock in effect: its `token` and `fencing_token` are those
//! of the outermost guard (no `fencing_token` for a name other than the first of an
//! `acquire_all` taken by one script), its `key` the name asked for, its `extend` and `is_held`
//! act on that lock,
//! and its `release` and drop do nothing — the lock is released when the outermost guard is. The
//! inner call's options (ttl, fencing, auto-extension) are not applied: the outer hold's are in
//! effect. A lock the task's guard already knows lost is not re-entered: the inner call gets
//! [`LockError::Lost`]. Nor is one past the time its guard knows it lives until (a ttl that
//! ran out without an extension) that Redis, asked once, says is no longer the task's: a
//! re-entered guard of a lock gone to another holder would let the task act as its holder.
//!
//! **Blocking: by thread, and refused.** The lock of a `#[distributed_lock]` plain `fn`
//! belongs to the thread that runs its body, which cannot move to another thread. Waiting for
//! it through `distlock::blocking::LockManager::acquire` on that thread while the body runs is
//! an immediate
//! [`LockError::Config`] that says so, not a wait until the timeout: synchronous code has no
//! scope to tell which calls are the holder's own, and the blocking API does not re-enter
//! (`try_acquire` never waits, so it is not refused: it finds the lock held). A
//! guard of the manual blocking API is not recorded: it may be handed to another thread that
//! releases it while this one waits for the lock again, a wait that ends.
//!
//! **Cost.** A task that holds nothing pays one read of a task-local per acquisition, and the
//! scope a locked body runs in costs no allocation and no lock while the task held nothing
//! before it; a nested scope copies the list of the locks around it.
//!
//! **Modes.** Each entry records the [`Mode`] it is held in, and [`Mode::covers`] compares the
//! mode asked for with the one held: the same or a weaker mode re-enters (a write lock covers a
//! read of the same name, a permit covers a permit); a stronger one — the write lock asked for
//! while the task holds the read lock — is [`LockError::Config`] at once, never a wait for the
//! task's own release (no upgrade). A mutex and a semaphore of one name are two uses of it,
//! refused the same way.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;

use crate::backend::keys::Kind;
use crate::backend::keys::LockKeys;
use crate::hold::held::{Finder, Held};
use crate::support::cold;
use crate::{LockError, LockGuard, LockManager, LostCause};

tokio::task_local! {
    /// The locks the current task holds, innermost first: set only inside a guard's scope.
    static HELD: HeldSet;
}

/// How a lock is held, for re-entry's comparison of the mode asked for with the one held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The mutex, or a read-write lock's writer: one holder at a time.
    Exclusive,
    /// A read-write lock's reader.
    Shared,
    /// A permit of a semaphore of this many permits.
    Permit(u32),
}

impl Mode {
    /// The mode of a lock taken as `kind`.
    pub(crate) fn of(kind: Kind) -> Mode {
        match kind {
            Kind::Mutex => Mode::Exclusive,
            Kind::Read => Mode::Shared,
            Kind::Permits(n) => Mode::Permit(n),
        }
    }

    /// Whether a hold in this mode may serve an acquisition in `wanted` by re-entry: the same
    /// mode (a permit of a semaphore of the same size), or reading under a write lock.
    fn covers(self, wanted: Mode) -> bool {
        match self {
            Mode::Exclusive => matches!(wanted, Mode::Exclusive | Mode::Shared),
            Mode::Shared => matches!(wanted, Mode::Shared),
            Mode::Permit(held) => wanted == Mode::Permit(held),
        }
    }
}

impl Mode {
    fn described(self) -> &'static str {
        match self {
            Mode::Exclusive => "a mutex (or a write lock)",
            Mode::Shared => "a read lock",
            Mode::Permit(_) => "a semaphore's permit",
        }
    }
}

/// One lock the task holds.
#[derive(Clone)]
struct Entry {
    held: Arc<Held>,
    /// The locks of the other parts of an `acquire_all` taken one by one: held by this task
    /// too, for deadlock detection's wait records.
    parts: Vec<Arc<Held>>,
    mode: Mode,
    class: Option<Arc<str>>,
}

impl Entry {
    fn of(guard: &LockGuard) -> Entry {
        Entry {
            held: Arc::clone(guard.held()),
            parts: guard.helds().skip(1).cloned().collect(),
            mode: Mode::of(guard.held().keys.kind),
            class: guard.reentry.class.clone(),
        }
    }

    /// A re-entered guard of this lock, asked for in `wanted` by its full key `key` (one of
    /// the keys it holds, which errors name).
    async fn reenter(&self, wanted: Mode, key: &str) -> Result<LockGuard, LockError> {
        if !self.mode.covers(wanted) {
            return Err(LockError::config(match (self.mode, wanted) {
                (Mode::Shared, Mode::Exclusive) => format!(
                    "lock `{key}` is held by this task to read, and asked for to write: a read \
                     lock is not upgraded, as the write lock would wait for this task's own \
                     release; release the read lock first, or take the write lock from the start"
                ),
                (Mode::Permit(held), Mode::Permit(asked)) => format!(
                    "lock `{key}` is held by this task as a semaphore of {held} permits, and \
                     asked for with {asked} permits: give every caller of the name the same \
                     number of permits"
                ),
                _ => format!(
                    "lock `{key}` is held by this task as {}, and asked for as {}: every use of \
                     a name must be the same; use another name for one of them",
                    self.mode.described(),
                    wanted.described()
                ),
            }));
        }
        if self.held.is_lost() {
            return Err(self.held.lost_error());
        }
        // Past the time the lock is known to live until (no auto-extension, or one that could
        // not renew it), it may have expired and gone to another holder: only Redis can say
        // whether it is still ours, and a lock that is not is lost, not re-entered.
        if Instant::now() >= self.held.expiry().valid_until {
            self.held.not_inherited()?;
            let ours = self
                .held
                .shared
                .backend
                .is_held(&self.held.keys, &self.held.token)
                .await?;
            if !ours {
                return Err(self.held.lost(
                    LostCause::Expired,
                    "it was no longer ours when re-entered",
                    Finder::Holder,
                ));
            }
        }
        tracing::debug!(target: "distlock", key = %self.held.keys.lock, "re-entered: this task already holds the lock");
        Ok(LockGuard::reentered(Arc::clone(&self.held)))
    }
}

/// The full key by which `held` holds the lock `name` of `manager`, if it does: the same
/// manager's inside (its backend), and one of its full keys.
fn key_of<'h>(held: &'h Held, manager: &LockManager, name: &str) -> Option<&'h Arc<str>> {
    let backend = manager.backend().ok()?;
    if !std::ptr::eq(&raw const held.shared.backend, backend) {
        return None;
    }
    held.keys
        .every()
        .map(|keys| &keys.lock)
        .find(|key| key.strip_prefix(manager.key_prefix()) == Some(name))
}

/// The locks of one task's scope: the innermost, then those of the scopes around it.
struct HeldSet {
    innermost: Entry,
    /// Outermost first. Empty (not allocated) for the first lock a task takes.
    around: Vec<Entry>,
}

impl HeldSet {
    fn entries(&self) -> impl Iterator<Item = &Entry> {
        std::iter::once(&self.innermost).chain(self.around.iter().rev())
    }
}

/// The held set of a new scope for `entry`, inside the current one, if any.
fn opened(entry: Entry) -> HeldSet {
    let around = HELD
        .try_with(|outer| {
            let mut around = Vec::with_capacity(outer.around.len() + 1);
            around.extend(outer.around.iter().cloned());
            around.push(outer.innermost.clone());
            around
        })
        .unwrap_or_default();
    HeldSet {
        innermost: entry,
        around,
    }
}

/// The re-entry of `name` if the current task holds that lock of `manager`: the future of its
/// re-entered guard, boxed apart (re-entering is rare beside a first acquisition, whose future
/// it would otherwise enlarge, see `support::cold`); `None` (go and acquire it) otherwise.
/// Outside any scope this is one task-local read, and no future is made.
pub(crate) fn reenter(
    manager: &LockManager,
    name: &str,
    options: &crate::LockOptions,
) -> Option<impl Future<Output = Result<LockGuard, LockError>>> {
    // Any lock of a guard: its own, one taken together with it by one script, or a part's.
    let (entry, key) = HELD
        .try_with(|set| held_lock(set, manager, name))
        .ok()
        .flatten()?;
    let wanted = Mode::of(super::kind_of(options));
    Some(cold::boxed(move || async move {
        entry
            .reenter(wanted, &key)
            .await
            .map(|guard| guard.showing(key))
    }))
}

/// The re-entered guards of those of `names` (distinct, taken as mutexes by `acquire_all`)
/// the current task holds — one per lock held, however many of the names it holds — and the
/// names it does not hold, in their order. A name held as a read lock or a permit is
/// [`LockError::Config`], as for [`reenter`]. Outside any scope this is one task-local read.
pub(crate) async fn reenter_all<'n>(
    manager: &LockManager,
    names: &[&'n str],
) -> Result<(Vec<LockGuard>, Vec<&'n str>), LockError> {
    let found: Vec<Option<(Entry, Arc<str>)>> = HELD
        .try_with(|set| {
            names
                .iter()
                .map(|name| held_lock(set, manager, name))
                .collect()
        })
        .unwrap_or_default();
    if found.iter().all(Option::is_none) {
        return Ok((Vec::new(), names.to_vec()));
    }
    let mut guards: Vec<LockGuard> = Vec::new();
    let mut rest = Vec::new();
    for (name, entry) in names.iter().zip(found) {
        match entry {
            None => rest.push(*name),
            // One guard per lock: names taken together by one script share it.
            Some((entry, _)) if guards.iter().any(|g| Arc::ptr_eq(g.held(), &entry.held)) => {}
            Some((entry, key)) => guards.push(entry.reenter(Mode::Exclusive, &key).await?),
        }
    }
    Ok((guards, rest))
}

/// The lock `name` of `manager` in `set`, as an entry of its own, with the full key it holds
/// `name` by: a guard's lock, a lock taken together with it by one script (same token), or one
/// of its parts; still held (a lock lost while its scope still runs holds nothing to re-enter).
fn held_lock(set: &HeldSet, manager: &LockManager, name: &str) -> Option<(Entry, Arc<str>)> {
    set.entries().find_map(|entry| {
        std::iter::once(&entry.held)
            .chain(&entry.parts)
            .filter(|held| !held.is_closed())
            .find_map(|held| Some((held, Arc::clone(key_of(held, manager, name)?))))
            .map(|(held, key)| {
                let entry = Entry {
                    held: Arc::clone(held),
                    parts: Vec::new(),
                    mode: Mode::of(held.keys.kind),
                    class: None,
                };
                (entry, key)
            })
    })
}

/// The locks of `manager` the current task holds, still held: each lock's keys and token,
/// for deadlock detection's wait records. Empty (no allocation) outside a scope.
pub(crate) fn held_by_task(manager: &LockManager) -> Vec<(LockKeys, Arc<str>)> {
    HELD.try_with(|set| {
        let Ok(backend) = manager.backend() else {
            return Vec::new();
        };
        // Every lock of a guard: its own, those taken with it by one script (one token for
        // all), and its parts'; a cycle may pass through any of them.
        set.entries()
            .flat_map(|entry| std::iter::once(&entry.held).chain(&entry.parts))
            .filter(|held| {
                !held.is_closed() && std::ptr::eq(&raw const held.shared.backend, backend)
            })
            .flat_map(|held| {
                held.keys
                    .every()
                    .map(|keys| (keys.clone(), Arc::clone(&held.token)))
            })
            .collect()
    })
    .unwrap_or_default()
}

/// Calls `each` with the lock-order class of every lock the current task holds, unless it
/// holds `name` of `manager` itself (then the acquisition is a re-entry, which orders nothing).
/// Nothing at all outside a scope.
pub(crate) fn for_each_class_held(manager: &LockManager, name: &str, mut each: impl FnMut(&str)) {
    let _ = HELD.try_with(|set| {
        if held_lock(set, manager, name).is_some() {
            return;
        }
        for entry in set.entries() {
            if let Some(class) = &entry.class {
                each(class);
            }
        }
    });
}

/// Runs `body` in the scope of `guard`'s lock (see the module). A re-entered guard's lock is
/// in the task's scope already: its body runs as it is.
pub(crate) async fn within<F: Future>(guard: &LockGuard, body: F) -> F::Output {
    if guard.reentry.reentered {
        return body.await;
    }
    HELD.scope(opened(Entry::of(guard)), body).await
}

impl LockGuard {
    /// Runs `future` as the holder of this lock: inside it, this task asking the same manager
    /// for the same lock again (directly, or through a function it calls) gets it at once, as a
    /// *re-entered* guard — no Redis command, no wait — instead of waiting for its own release
    /// until the timeout.
    ///
    /// A re-entered guard shows the outer lock (`key`, `token`, `fencing_token` are this
    /// guard's), its `extend` and `is_held` act on that lock, and its `release` and drop do
    /// nothing: the lock stays held until this guard is released. The scope belongs to the
    /// task: a task spawned inside it is another owner and waits for the lock as any other
    /// holder does. The scope's future borrows the guard, so the guard cannot be released
    /// (nor the future spawned away from it) while the scope runs: what the scope says the
    /// task holds stays true. The body of a `#[distributed_lock]` function runs in such a scope
    /// already.
    /// A wait inside it for another lock is watched for a wait-for cycle across processes: see
    /// [`LockError::Deadlock`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::LockError> {
    /// use distlock::{LockManager, LockOptions};
    ///
    /// let manager = LockManager::in_process();
    /// let options = LockOptions::new();
    /// let outer = manager.acquire("invoice:42", &options).await?;
    /// outer
    ///     .scope(async {
    ///         // e.g. a helper that takes the lock itself: re-entered, no wait
    ///         let inner = manager.acquire("invoice:42", &options).await?;
    ///         assert_eq!(inner.token(), outer.token());
    ///         inner.release().await // releases nothing: the outer guard still holds it
    ///     })
    ///     .await?;
    /// assert!(manager.try_acquire("invoice:42", &options).await?.is_none());
    /// outer.release().await
    /// # }
    /// ```
    pub fn scope<'a, F: Future + 'a>(&'a self, future: F) -> impl Future<Output = F::Output> + 'a {
        let entry = Entry::of(self);
        // The scopes around it are read when the future first runs, in the task that runs it.
        async move { HELD.scope(opened(entry), future).await }
    }
}

/// The locks held by the locked plain `fn`s running on one thread.
type ThreadList = Arc<Mutex<Vec<Arc<Held>>>>;

thread_local! {
    /// The locks held by the locked plain `fn`s running on this thread.
    static THREAD_HELD: ThreadList = ThreadList::default();
}

/// A locked plain `fn`'s entries in the list of its thread's locks: removed when dropped,
/// after the locks' release.
pub(crate) struct ThreadHold {
    list: ThreadList,
    /// The guard's own lock and its parts' (several keys taken one by one).
    helds: Vec<Arc<Held>>,
}

impl ThreadHold {
    /// Records that the current thread holds every lock of `guard`; `None` on a thread that
    /// is exiting (its list is gone, and it takes no more locks).
    pub(crate) fn record(guard: &LockGuard) -> Option<ThreadHold> {
        let helds: Vec<Arc<Held>> = guard.helds().cloned().collect();
        THREAD_HELD
            .try_with(|list| {
                list.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .extend(helds.iter().cloned());
                ThreadHold {
                    list: Arc::clone(list),
                    helds,
                }
            })
            .ok()
    }
}

impl Drop for ThreadHold {
    fn drop(&mut self) {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        for mine in &self.helds {
            if let Some(at) = list.iter().position(|held| Arc::ptr_eq(held, mine)) {
                list.swap_remove(at);
            }
        }
    }
}

/// An error if a locked plain `fn` running on the current thread holds the lock `name` of
/// `manager`: taking it again would wait for a release only this thread can make.
pub(crate) fn refuse_if_thread_holds(
    manager: &LockManager,
    name: &str,
    call: &str,
) -> Result<(), LockError> {
    let held = THREAD_HELD
        .try_with(|list| {
            let list = list.lock().unwrap_or_else(PoisonError::into_inner);
            list.iter()
                .find_map(|held| key_of(held, manager, name))
                .map(ToString::to_string)
        })
        .ok()
        .flatten();
    match held {
        None => Ok(()),
        Some(key) => Err(LockError::config(format!(
            "distlock::blocking::{call}: lock `{key}` is already held by this thread, by a \
             `#[distributed_lock]` function whose body is running; asking for it again would \
             wait for its release, which only this thread can make, until the timeout. The \
             blocking API does not re-enter: pass the guard down (`guard = name`) instead of \
             taking the lock again"
        ))),
    }
}
