// `crate = "..."` for a renamed or re-exported facade.
use distlock as dl;

mod deps {
    pub use distlock;
}

extern crate distlock as renamed;

#[dl::distributed_lock(key = "job:{id}", crate = "dl")]
async fn via_use(id: u32) -> Result<(), dl::LockError> {
    let _ = id;
    Ok(())
}

#[deps::distlock::distributed_lock(key = "job", crate = "crate::deps::distlock")]
async fn via_reexport() -> Result<(), deps::distlock::LockError> {
    Ok(())
}

#[renamed::distributed_lock(key = "job", crate = "renamed", guard = lock)]
async fn via_extern_crate() -> Result<(), renamed::LockError> {
    let _: &renamed::LockGuard = lock;
    Ok(())
}

#[distlock::distributed_lock(key = "job", crate = "::distlock")]
async fn explicit_default() -> Result<(), distlock::LockError> {
    Ok(())
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(via_use(1));
    assert_send(via_reexport());
    assert_send(via_extern_crate());
    assert_send(explicit_default());
}
