//! What distlock does, against a real Redis: the manual API, the attribute, auto-extension,
//! mutual exclusion, hand-offs, fencing, `on_busy` and `hold_at_least`, TLS and ACL users, and
//! inspection (who holds a lock).
//!
//! One binary, so the harness and the facade compile once for all of them. The attribute tests
//! share one redis-server and the one global client (`test_support::global_server`); every
//! other test starts its own servers and managers. The 100 000-cycle leak check has a binary of
//! its own (`no_leaks`): it loads both cores for a minute while bounding what the managers hold,
//! and beside the timing bounds of these tests each would break the other's.

mod attribute;
mod auto_extend;
mod fencing;
mod hold_at_least;
mod inspect;
mod manual_api;
mod mutual_exclusion;
mod on_busy;
mod tls_acl;
mod wake_on_release;
