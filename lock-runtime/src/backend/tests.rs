//! What each store declares it can do.
use super::*;

#[test]
fn each_store_declares_what_it_can_do() {
    let in_process = Backend::in_process().capabilities();
    assert_eq!(in_process, Memory::CAPABILITIES);
    assert!(in_process.fencing && !in_process.hands_over);
    // Redlock: no common counter, and a release only wakes a waiter.
    let redlock = Quorum::CAPABILITIES;
    assert!(!redlock.fencing && !redlock.hands_over);
}

#[test]
fn a_place_is_kept_through_a_dropped_connection_only_where_declared() {
    let dropped = Failure::from(redis::RedisError::from(std::io::Error::from(
        std::io::ErrorKind::ConnectionReset,
    )));
    let refused = Failure::from(redis::RedisError::from(std::io::Error::from(
        std::io::ErrorKind::ConnectionRefused,
    )));
    let keeps = Capabilities {
        keeps_place_on_drop: true,
        ..Memory::CAPABILITIES
    };
    assert!(keeps.keeps_place_through(&dropped));
    assert!(!keeps.keeps_place_through(&refused));
    assert!(!Memory::CAPABILITIES.keeps_place_through(&dropped));
}
