#![allow(dead_code, unused_variables, unused_imports)]

use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "none")]
async fn returns_nothing() {}

#[distributed_lock(key = "unit")]
async fn returns_unit() -> () {}

#[distributed_lock(key = "option")]
async fn returns_option() -> Option<u32> {
    None
}

#[distributed_lock(key = "string")]
async fn returns_string() -> String {
    String::new()
}

#[distributed_lock(key = "ref")]
async fn returns_reference<'a>(text: &'a str) -> &'a str {
    text
}

fn main() {}
