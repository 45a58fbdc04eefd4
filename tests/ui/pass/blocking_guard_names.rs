// An item of a blocking body named like its guard is the body's: inside the body it is what the
// name means, as in the async form, and it compiles. Runs on the in-process backend (no Redis).
#![allow(non_upper_case_globals, non_camel_case_types)]

use distlock::{distributed_lock, LockError};

mod helpers {
    pub fn lock() -> u32 {
        9
    }
}

#[distributed_lock(key = "names:fn", guard = lock)]
fn a_function() -> Result<u32, LockError> {
    fn lock() -> u32 {
        7
    }
    Ok(lock())
}

#[distributed_lock(key = "names:use", guard = lock)]
fn an_import() -> Result<u32, LockError> {
    use helpers::lock;
    Ok(lock())
}

#[distributed_lock(key = "names:static", guard = lock)]
fn a_static() -> Result<u32, LockError> {
    static lock: u32 = 3;
    Ok(lock)
}

#[distributed_lock(key = "names:const", guard = lock)]
fn a_const() -> Result<u32, LockError> {
    const lock: u32 = 4;
    Ok(lock)
}

#[distributed_lock(key = "names:struct", guard = guard)]
fn a_unit_struct() -> Result<u32, LockError> {
    struct guard;
    impl guard {
        fn number(&self) -> u32 {
            5
        }
    }
    Ok(guard.number())
}

fn main() {
    distlock::blocking::init_with(distlock::blocking::LockManager::in_process()).unwrap();
    assert_eq!(a_function().unwrap(), 7);
    assert_eq!(an_import().unwrap(), 9);
    assert_eq!(a_static().unwrap(), 3);
    assert_eq!(a_const().unwrap(), 4);
    assert_eq!(a_unit_struct().unwrap(), 5);
}
