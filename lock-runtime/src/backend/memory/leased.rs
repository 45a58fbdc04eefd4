//! Semaphores and readers in the in-process table, with the rules of the leased-set scripts
//! (docs/family.md): each holder a lease of its own; a semaphore's waiters in a line of their
//! own, each free permit going to the head of it before any newcomer; readers and writers in
//! the mutex's one line, the readers at its head let in together, a writer never overtaken by
//! a reader that came after it; a name used in two ways, or callers that disagree on n,
//! refused without touching anything.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{LockRow, Memory, Table, TableWaiter};
use crate::backend::failure::{self, Failure};
use crate::backend::grants::Grant;
use crate::backend::keys::{Kind, LockKeys};
use crate::backend::{Attempt, LeasedLook, Look, Ownership, Released, Wait, CLAIM, LEASE};
use crate::LostCause;

/// The holders of a semaphore or of a read lock.
pub(super) struct Leases {
    /// `Kind::Permits(n)` (n as the first caller gave it, lowered by a caller with fewer) or
    /// `Kind::Read`.
    pub(super) kind: Kind,
    pub(super) holders: Vec<Lease>,
}

/// One holder's lease.
pub(super) struct Lease {
    pub(super) token: Arc<str>,
    pub(super) expires: Instant,
    pub(super) fence: u64,
}

/// Whether `token` is a reader's value (see `identity::as_reader`).
pub(super) fn is_reader(token: &str) -> bool {
    token.ends_with(crate::support::identity::READER_FIELD) || token.contains(";m=r;")
}

impl Leases {
    fn of(&self, token: &str) -> Option<&Lease> {
        self.holders.iter().find(|lease| &*lease.token == token)
    }
}

impl LockRow {
    /// The lease `token` holds, if any.
    fn lease(&mut self, token: &str) -> Option<&mut Lease> {
        self.leases
            .as_mut()?
            .holders
            .iter_mut()
            .find(|lease| &*lease.token == token)
    }

    /// The line a lock taken as `kind` waits in.
    fn line_of(&mut self, kind: Kind) -> &mut VecDeque<TableWaiter> {
        match kind {
            Kind::Permits(_) => &mut self.permit_line,
            Kind::Read | Kind::Mutex => &mut self.line,
        }
    }
}

impl Memory {
    /// One attempt to take a permit or a read lock, as `semaphore_acquire.lua` and
    /// `rw_acquire.lua` run it.
    pub(crate) fn try_lease(
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
        let key = &keys.lock;
        let row = table.row(key, now);
        check_use(row, keys)?;
        if let Some(lease) = row.lease(token) {
            return Ok(Attempt::Acquired {
                fence: fencing.then_some(lease.fence),
                expires_in: lease.expires.saturating_duration_since(now),
            });
        }
        // The line first: whoever waits is served before the caller.
        self.admit(table, key, now, keys.kind);
        let row = table.row(key, now);
        if let Some(lease) = row.lease(token) {
            return Ok(Attempt::Acquired {
                fence: fencing.then_some(lease.fence),
                expires_in: lease.expires.saturating_duration_since(now),
            });
        }
        let line_empty = row.line_of(keys.kind).is_empty();
        let room = match keys.kind {
            Kind::Permits(_) if row.leases.is_none() => true,
            Kind::Permits(_) => free_permits(row) > 0,
            Kind::Read | Kind::Mutex => row.holder.is_none(),
        };
        if room && line_empty {
            let fence = if fencing { table.next_fence(key) } else { 0 };
            let row = table.row(key, now);
            row.leases
                .get_or_insert_with(|| Leases {
                    kind: keys.kind,
                    holders: Vec::new(),
                })
                .holders
                .push(Lease {
                    token: Arc::from(token),
                    expires: now + ttl,
                    fence,
                });
            return Ok(Attempt::Acquired {
                fence: fencing.then_some(fence),
                expires_in: ttl,
            });
        }
        let row = table.row(key, now);
        let line = row.line_of(keys.kind);
        let ahead = line
            .iter()
            .position(|place| &*place.token == token)
            .unwrap_or(line.len());
        if let Wait::InLine { channel, .. } = wait {
            let place = TableWaiter {
                token: Arc::from(token),
                lease_until: now + LEASE,
                ttl,
                fencing,
                listening: channel.is_some(),
            };
            match line.iter_mut().find(|place| &*place.token == token) {
                Some(existing) => *existing = place,
                None => line.push_back(place),
            }
        }
        // The first in line watches the earliest expiry; the others look at their renewal.
        let remaining = if ahead > 0 {
            Some(LEASE)
        } else {
            let leases = row.leases.iter().flat_map(|leases| leases.holders.iter());
            let writer = row.holder.iter().map(|holder| holder.expires);
            leases
                .map(|lease| lease.expires)
                .chain(writer)
                .min()
                .map(|at| at.saturating_duration_since(now))
        };
        Ok(Attempt::Held { remaining })
    }

    /// Gives back a permit or a read lock, letting in the next in line; with `leave`, also
    /// takes `token` out of the line.
    pub(crate) fn unlock_lease(
        &self,
        keys: &LockKeys,
        token: &str,
        leave: bool,
    ) -> failure::Result<Released> {
        let now = Instant::now();
        let mut table = self.table();
        let table = &mut *table;
        let key = &keys.lock;
        let row = table.row(key, now);
        if leave {
            row.line_of(keys.kind)
                .retain(|place| &*place.token != token);
        }
        if row.holder.is_some() && keys.kind != Kind::Read {
            return Err(failure::used_otherwise(keys, Kind::Mutex));
        }
        let ours = match &mut row.leases {
            Some(leases) => {
                let before = leases.holders.len();
                leases.holders.retain(|lease| &*lease.token != token);
                let ours = leases.holders.len() < before;
                if leases.holders.is_empty() {
                    row.leases = None;
                }
                ours
            }
            None => false,
        };
        let admitted = self.admit(table, key, now, keys.kind);
        table.tidy(key);
        Ok(match (ours, admitted) {
            (false, _) => Released::NotOurs(lease_lost(table, token, now)),
            (true, 0) => Released::Freed,
            (true, _) => Released::HandedOver,
        })
    }

    /// Sets a permit's or reader's lease to end `ttl` from now, if it is still `token`'s.
    pub(crate) fn extend_lease(&self, keys: &LockKeys, token: &str, ttl: Duration) -> Ownership {
        let now = Instant::now();
        let mut table = self.table();
        let row = table.row(&keys.lock, now);
        match row.lease(token) {
            Some(lease) => {
                lease.expires = now + ttl;
                Ownership::Ours
            }
            None => {
                table.tidy(&keys.lock);
                Ownership::Lost(lease_lost(&mut table, token, now))
            }
        }
    }

    /// Breaks, for an operator, the permits or readers of `keys` whose tokens are in `seen`,
    /// keeping each token in the `forced-leases` marks, and lets in the head of the line, as
    /// `leased_force_release.lua` does; `true` if any was broken.
    pub(crate) fn force_unlock_leases(&self, keys: &LockKeys, seen: &[String]) -> bool {
        let now = Instant::now();
        let mut table = self.table();
        let table = &mut *table;
        let key = &keys.lock;
        let row = table.row(key, now);
        let Some(leases) = row.leases.as_mut().filter(|leases| {
            matches!(
                (leases.kind, keys.kind),
                (Kind::Permits(_), Kind::Permits(_)) | (Kind::Read, Kind::Read)
            )
        }) else {
            return false;
        };
        let mut broken = Vec::new();
        leases.holders.retain(|lease| {
            let seen = seen.iter().any(|value| **value == *lease.token);
            if seen {
                broken.push(Arc::clone(&lease.token));
            }
            !seen
        });
        let kind = leases.kind;
        if leases.holders.is_empty() {
            row.leases = None;
        }
        table.forced_leases.retain(|_, until| *until > now);
        for token in &broken {
            table
                .forced_leases
                .insert(Arc::clone(token), now + super::FORCED_KEPT);
        }
        if !broken.is_empty() {
            self.admit(table, key, now, kind);
        }
        table.tidy(key);
        !broken.is_empty()
    }

    /// Whether `token` holds a permit or a read lock now.
    pub(crate) fn holds_lease(&self, keys: &LockKeys, token: &str) -> bool {
        let now = Instant::now();
        let mut table = self.table();
        let held = table
            .row(&keys.lock, now)
            .leases
            .as_ref()
            .is_some_and(|leases| leases.of(token).is_some());
        table.tidy(&keys.lock);
        held
    }

    /// Lets in whoever the line's head may have: free permits to the first live waiters of a
    /// semaphore; readers at the head of a read-write lock's line while no writer holds it,
    /// or one writer once nobody does. Returns how many were let in.
    ///
    /// `asked`: how the caller takes the name. A semaphore whose every lease ran out is
    /// forgotten with them, its n too (as its key expires in Redis), but not its line: the
    /// caller's n lets in the head of that line then, as `semaphore_acquire.lua` does.
    fn admit(&self, table: &mut Table, key: &Arc<str>, now: Instant, asked: Kind) -> usize {
        let row = table.row(key, now);
        let kind = match (&row.leases, asked) {
            (Some(leases), _) => Some(leases.kind),
            (None, Kind::Permits(_)) if !row.permit_line.is_empty() => Some(asked),
            (None, _) => None,
        };
        if let Some(Kind::Permits(n)) = kind {
            let mut admitted = 0;
            loop {
                let row = table.row(key, now);
                let free = match row.leases {
                    Some(_) => free_permits(row),
                    None => usize::try_from(n).unwrap_or(usize::MAX),
                };
                if free == 0 {
                    break;
                }
                let Some(place) = row.permit_line.pop_front() else {
                    break;
                };
                self.grant_lease(table, key, now, &place, Kind::Permits(n));
                admitted += 1;
            }
            return admitted;
        }
        if row.holder.is_some() {
            return 0;
        }
        match row.line.front() {
            Some(place) if is_reader(&place.token) => {
                let place = table.row(key, now).line.pop_front();
                place.map_or(0, |place| {
                    self.admit_readers(table, key, now, &place, None);
                    1
                })
            }
            Some(_) if row.leases.is_none() => {
                usize::from(self.hand_off(table, key, now, None, None).is_some())
            }
            _ => 0,
        }
    }

    /// Lets in `first`, a reader popped off the line, and every reader behind it up to the next
    /// writer: the mutex's `hand_off` when its next waiter is a reader. Returns the first
    /// reader's token, fencing token and lease, as `hand_off` does.
    pub(super) fn admit_readers(
        &self,
        table: &mut Table,
        key: &Arc<str>,
        now: Instant,
        first: &TableWaiter,
        quiet: Option<&str>,
    ) -> (Arc<str>, u64, Duration) {
        let claim = first.ttl.min(CLAIM);
        let token = Arc::clone(&first.token);
        let fence = self.grant_lease_quietly(table, key, now, first, Kind::Read, quiet);
        while table
            .row(key, now)
            .line
            .front()
            .is_some_and(|place| is_reader(&place.token))
        {
            if let Some(place) = table.row(key, now).line.pop_front() {
                self.grant_lease(table, key, now, &place, Kind::Read);
            }
        }
        (token, fence, claim)
    }

    fn grant_lease(
        &self,
        table: &mut Table,
        key: &Arc<str>,
        now: Instant,
        place: &TableWaiter,
        kind: Kind,
    ) -> u64 {
        self.grant_lease_quietly(table, key, now, place, kind, None)
    }

    /// Gives `place` a lease of the shorter of its ttl and the claim, with its fencing token,
    /// and tells it unless it is `quiet`. `kind` is the set's when it is made here.
    fn grant_lease_quietly(
        &self,
        table: &mut Table,
        key: &Arc<str>,
        now: Instant,
        place: &TableWaiter,
        kind: Kind,
        quiet: Option<&str>,
    ) -> u64 {
        let fence = if place.fencing {
            table.next_fence(key)
        } else {
            0
        };
        let row = table.row(key, now);
        row.leases
            .get_or_insert_with(|| Leases {
                kind,
                holders: Vec::new(),
            })
            .holders
            .push(Lease {
                token: Arc::clone(&place.token),
                expires: now + place.ttl.min(CLAIM),
                fence,
            });
        if place.listening && Some(&*place.token) != quiet {
            self.hub.hand_over(&place.token, Grant::Granted { fence });
        }
        fence
    }
}

/// What inspection shows of `leases`, the holders of `row`: every lease still running, the
/// earliest to end first.
pub(super) fn look(
    leases: &Leases,
    row: &LockRow,
    fence: Option<u64>,
    now: Instant,
) -> Option<Look> {
    let mut holders: Vec<(Vec<u8>, Duration)> = leases
        .holders
        .iter()
        .filter(|lease| lease.expires > now)
        .map(|lease| {
            (
                lease.token.as_bytes().to_vec(),
                lease.expires.saturating_duration_since(now),
            )
        })
        .collect();
    holders.sort_by_key(|(_, left)| *left);
    let last = holders.last()?.1;
    let line = match leases.kind {
        Kind::Permits(_) => &row.permit_line,
        Kind::Read | Kind::Mutex => &row.line,
    };
    Some(Look {
        value: holders[0].0.clone(),
        ttl_left: Some(last),
        waiters: u64::try_from(line.len()).unwrap_or(u64::MAX),
        fence,
        granted: None,
        leased: Some(LeasedLook {
            permits: match leases.kind {
                Kind::Permits(n) => Some(n),
                Kind::Read | Kind::Mutex => None,
            },
            holders,
        }),
    })
}

/// Why `token` holds no lease: an operator broke it (the `forced-leases` marks hold it), or
/// it ran out.
fn lease_lost(table: &mut Table, token: &str, now: Instant) -> LostCause {
    table.forced_leases.retain(|_, until| *until > now);
    if table.forced_leases.contains_key(token) {
        LostCause::ForceReleased
    } else {
        LostCause::Expired
    }
}

/// How many permits of a semaphore are free (0 for anything else).
fn free_permits(row: &LockRow) -> usize {
    match &row.leases {
        Some(Leases {
            kind: Kind::Permits(n),
            holders,
        }) => usize::try_from(*n)
            .unwrap_or(usize::MAX)
            .saturating_sub(holders.len()),
        _ => 0,
    }
}

/// Refuses a permit or a reader on a name held another way, and a semaphore whose callers
/// disagree on n (keeping the smaller n from then on, as `semaphore_acquire.lua` does).
fn check_use(row: &mut LockRow, keys: &LockKeys) -> failure::Result<()> {
    let wanted = keys.kind;
    if row.holder.is_some() && wanted != Kind::Read {
        return Err(failure::used_otherwise(keys, Kind::Mutex));
    }
    let Some(leases) = &mut row.leases else {
        return Ok(());
    };
    match (leases.kind, wanted) {
        (Kind::Permits(stored), Kind::Permits(asked)) if stored != asked => {
            let keep = stored.min(asked);
            leases.kind = Kind::Permits(keep);
            Err(Failure::Usage(format!(
                "the semaphore {} has {stored} permits and this caller asks for {asked}; it now \
                 lets in at most {keep} until its last lease is gone: give every caller the \
                 same number of permits",
                keys.lock
            )))
        }
        (Kind::Permits(_), Kind::Permits(_)) | (Kind::Read, Kind::Read) => Ok(()),
        (found, _) => Err(failure::used_otherwise(keys, found)),
    }
}
