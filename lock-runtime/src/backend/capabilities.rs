//! What a store can do, declared once per store and read by the manager by name: the seam's
//! answer to "which store is this?", which the manager never asks.

use super::Failure;

/// What a store can do: each store declares its own (`Node::capabilities`,
/// `Quorum::CAPABILITIES`, `Memory::CAPABILITIES`), and the manager reads them here rather than
/// asking which store it has.
// Independent yes-or-no declarations, each read by name where it matters: not a state that
// enums would model better.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// Fencing tokens can be issued: they need one counter that every acquisition increments
    /// in order, which independent masters cannot provide.
    pub(crate) fencing: bool,
    /// A release hands the lock to a waiter by a message. A Redlock master cannot (a lock is
    /// held only by a majority's grants), so there a message is only a wake-up.
    pub(crate) hands_over: bool,
    /// The connection may send a command again after losing its reply (a cluster connection
    /// does, on a dropped connection or a response timeout), so that a command can run twice.
    pub(crate) resends_commands: bool,
    /// A lock write counts only once replicas acknowledged it (`wait_for_replicas`).
    pub(crate) waits_for_replicas: bool,
    /// A waiter whose attempt failed on a dropped connection keeps its token and its place in
    /// line (see [`Capabilities::keeps_place_through`]).
    pub(crate) keeps_place_on_drop: bool,
    /// Semaphores and read locks can be given with the mutex's guarantees: they need one
    /// line and one count of holders, which independent masters cannot keep.
    pub(crate) leases: bool,
    /// Which keys `acquire_all` can take together in one atomic script; the others are taken
    /// one by one, in the order of their full keys.
    pub(crate) together: Together,
    /// A waiter that holds locks can find a wait-for cycle through the holders' wait records
    /// (`waits`). Not on Redlock: a lock there is a majority's, and a record on one master
    /// says nothing of the others (docs/deadlocks.md).
    pub(crate) detects_deadlocks: bool,
}

/// Which locks a store takes together, all or none, in one atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Together {
    /// None: each is taken on its own (Redlock's majorities, the in-process table).
    Never,
    /// Those whose keys share a cluster slot, which one script reaches.
    SameSlot,
    /// Any: one server holds every key.
    Always,
}

impl Capabilities {
    /// Whether a waiter whose attempt failed with `error` keeps its token and its place in
    /// line: when the connection dropped (an idle timeout, a network blip; see
    /// `classify::connection_dropped`) on a standalone server or a Sentinel master. Its next
    /// attempt, on the connection made anew, is a renewal under the same token, which finds
    /// whatever the failed one did — the place it took, the lock it was handed — so a blip
    /// costs no place in line. (A cluster connection sends such a command again by itself, and
    /// Redlock re-sends each master's vote.)
    pub(crate) fn keeps_place_through(self, error: &Failure) -> bool {
        self.keeps_place_on_drop && error.connection_dropped()
    }
}
