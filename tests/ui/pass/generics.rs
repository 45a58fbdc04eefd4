// Generics, `where` clauses, lifetimes and `impl Trait` arguments.
use std::fmt::Display;

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "item:{id}")]
async fn generic<T: Display + Send + Sync>(id: T) -> Result<String, LockError> {
    Ok(id.to_string())
}

#[distributed_lock(key = "item:{id}:{tag}")]
async fn with_where<T, U>(id: &T, tag: U) -> Result<usize, LockError>
where
    T: Display + Sync + ?Sized,
    U: AsRef<str> + Display,
{
    Ok(id.to_string().len() + tag.as_ref().len())
}

#[distributed_lock(key = "slice:{name}")]
async fn lifetimes<'a, 'b: 'a>(name: &'a str, rest: &'b [u8]) -> Result<&'a str, LockError> {
    let _ = rest;
    Ok(name)
}

#[distributed_lock(key = "elided:{name}")]
async fn elided(name: &str) -> Result<&str, LockError> {
    Ok(name)
}

#[distributed_lock(key = "impl:{id}")]
async fn impl_trait(
    id: impl Display + Send,
    items: impl IntoIterator<Item = u32>,
) -> Result<u32, LockError> {
    let _ = id;
    Ok(items.into_iter().sum())
}

#[distributed_lock(key = "const:{name}")]
async fn const_generic<const N: usize>(name: &str, value: [u8; N]) -> Result<usize, LockError> {
    Ok(name.len() + value.len())
}

#[distributed_lock(key = "opaque:{id}")]
async fn opaque_output(id: u32) -> Result<impl Display, LockError> {
    Ok(id + 1)
}

struct Cache<'a, K> {
    name: &'a str,
    keys: Vec<K>,
}

impl<'a, K: Display + Send + Sync> Cache<'a, K> {
    #[distributed_lock(key = "cache:{self.name}:{key}")]
    async fn insert(&mut self, key: K) -> Result<&'a str, LockError> {
        self.keys.push(key);
        Ok(self.name)
    }
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(generic(1));
    assert_send(with_where("x", String::from("y")));
    assert_send(lifetimes("a", b"b"));
    assert_send(elided("a"));
    assert_send(opaque_output(1));
    assert_send(impl_trait(1, vec![1, 2]));
    assert_send(const_generic("a", [0u8; 4]));
    let mut cache = Cache {
        name: "c",
        keys: Vec::new(),
    };
    assert_send(cache.insert(1));
}
