// `ttl` and `timeout` in every accepted form.
use distlock::distributed_lock;

type Result<T> = std::io::Result<T>;

#[distributed_lock(key = "a", ttl = 60)]
async fn integer_seconds() -> Result<()> {
    Ok(())
}

#[distributed_lock(key = "b", ttl = 0.5, timeout = 2.5)]
async fn float_seconds() -> Result<()> {
    Ok(())
}

#[distributed_lock(key = "c", ttl = "500ms", timeout = "250ms")]
async fn milliseconds() -> Result<()> {
    Ok(())
}

#[distributed_lock(key = "d", ttl = "2s", timeout = "1.5s")]
async fn seconds_with_unit() -> Result<()> {
    Ok(())
}

#[distributed_lock(key = "e", ttl = "5m", timeout = "1m")]
async fn minutes() -> Result<()> {
    Ok(())
}

#[distributed_lock(key = "f", ttl = "1h", timeout = "0.5h")]
async fn hours() -> Result<()> {
    Ok(())
}

#[distributed_lock(key = "g", timeout = 0)]
async fn single_attempt() -> Result<()> {
    Ok(())
}

#[distributed_lock(key = "h", ttl = "1ms", timeout = "0s")]
async fn smallest() -> Result<()> {
    Ok(())
}

#[distributed_lock(timeout = 30, ttl = 120, key = "i")]
async fn any_order() -> Result<()> {
    Ok(())
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(integer_seconds());
    assert_send(float_seconds());
    assert_send(milliseconds());
    assert_send(seconds_with_unit());
    assert_send(minutes());
    assert_send(hours());
    assert_send(single_attempt());
    assert_send(smallest());
    assert_send(any_order());
}
