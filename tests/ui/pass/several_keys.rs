// `keys = [..]`: several locks taken all or none, with every `on_busy`, a guard, and the
// blocking form; placeholders in each template.
use distlock::{distributed_lock, LockError};

#[distributed_lock(keys = ["account:{from}", "account:{to}"], ttl = 30, guard = lock)]
async fn transfer(from: u32, to: u32, amount: u64) -> Result<u64, LockError> {
    let _held: Vec<&str> = lock.keys();
    Ok(amount)
}

#[distributed_lock(keys = ["seat:{row}:{a}", "seat:{row}:{b}"], on_busy = "skip")]
async fn book(row: u32, a: char, b: char) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(keys = ["stock:{item}", "order:{order}"], on_busy = "fail")]
async fn reserve(item: &str, order: u64) -> Result<Option<u64>, LockError> {
    Ok(Some(order))
}

#[distributed_lock(keys = ["file:{a}", "file:{b}"], guard = lock)]
fn swap(a: &str, b: &str) -> std::io::Result<()> {
    let _held = lock.keys();
    Ok(())
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(transfer(1, 2, 3));
    assert_send(book(1, 'a', 'b'));
    assert_send(reserve("x", 1));
}
