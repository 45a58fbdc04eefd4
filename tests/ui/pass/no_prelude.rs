// The generated code names everything by its full path: it compiles in a module without the
// prelude, for every form of key and for the blocking form.
#[no_implicit_prelude]
mod without_prelude {
    use ::distlock::{distributed_lock, LockError};

    #[distributed_lock(key = "fixed")]
    pub async fn fixed() -> ::std::result::Result<(), LockError> {
        ::std::result::Result::Ok(())
    }

    #[distributed_lock(key = "item:{id}")]
    pub async fn placeholder(id: u64) -> ::std::result::Result<u64, LockError> {
        ::std::result::Result::Ok(id)
    }

    #[distributed_lock(keys = ["a:{id}", "b"])]
    pub async fn several(id: u64) -> ::std::result::Result<u64, LockError> {
        ::std::result::Result::Ok(id)
    }

    #[distributed_lock(key = "blocking")]
    pub fn blocking() -> ::std::result::Result<(), LockError> {
        ::std::result::Result::Ok(())
    }
}

fn main() {
    // Without a global manager every call fails at once, with the error that says so.
    assert!(matches!(
        without_prelude::blocking(),
        Err(distlock::LockError::NotInitialized)
    ));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let not_initialized = |result: Result<_, distlock::LockError>| {
            matches!(result, Err(distlock::LockError::NotInitialized))
        };
        assert!(not_initialized(without_prelude::fixed().await));
        assert!(not_initialized(without_prelude::placeholder(1).await.map(drop)));
        assert!(not_initialized(without_prelude::several(1).await.map(drop)));
    });
}
