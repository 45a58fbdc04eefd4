// Return types: any path ending in `Result`; `return` and `?` in the body keep their meaning.
use std::error::Error;

use distlock::distributed_lock;

#[derive(Debug)]
enum AppError {
    Lock(distlock::LockError),
    Parse(std::num::ParseIntError),
    Invalid,
}

impl From<distlock::LockError> for AppError {
    fn from(error: distlock::LockError) -> Self {
        AppError::Lock(error)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(error: std::num::ParseIntError) -> Self {
        AppError::Parse(error)
    }
}

type AppResult<T> = Result<T, AppError>;

#[distributed_lock(key = "io:{path}")]
async fn io_result(path: &str) -> std::io::Result<Vec<u8>> {
    if path.is_empty() {
        return Err(std::io::Error::other("empty path"));
    }
    Ok(path.as_bytes().to_vec())
}

#[distributed_lock(key = "boxed")]
async fn boxed_error() -> Result<u32, Box<dyn Error + Send + Sync>> {
    let parsed: u32 = "42".parse()?;
    Ok(parsed)
}

#[distributed_lock(key = "alias:{input}")]
async fn alias(input: &str) -> AppResult<u32> {
    let value: u32 = input.parse()?;
    if value == 0 {
        return Err(AppError::Invalid);
    }
    Ok(value)
}

#[distributed_lock(key = "full:{input}")]
async fn full_path(input: String) -> ::core::result::Result<u64, AppError> {
    // `?` converts through `From`, inferred from the declared return type.
    let value = input.parse::<u64>()?;
    Ok(value * 2)
}

#[distributed_lock(key = "early")]
async fn early_return(flag: bool) -> Result<&'static str, AppError> {
    if flag {
        return Ok("early");
    }
    let inner = async { 1 }.await;
    match inner {
        1 => Ok("late"),
        _ => Err(AppError::Invalid),
    }
}

#[distributed_lock(key = "question")]
async fn question_mark() -> Result<(), AppError> {
    let _: u8 = "7".parse()?;
    alias("3").await?;
    Ok(())
}

#[distributed_lock(key = "unit")]
async fn unit_ok() -> Result<(), std::io::Error> {
    Ok(())
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(io_result("x"));
    assert_send(boxed_error());
    assert_send(alias("1"));
    assert_send(full_path("2".to_owned()));
    assert_send(early_return(true));
    assert_send(question_mark());
    assert_send(unit_ok());
    let _ = AppError::Invalid;
}
