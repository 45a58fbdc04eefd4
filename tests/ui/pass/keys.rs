// Key templates: `{p}`, `{p.field.sub}`, `<p>`, `<p.field>`, tuple fields, `{{ }}` escapes,
// literal `<`, and a fixed key.
use distlock::distributed_lock;

#[derive(Debug)]
struct AppError(String);

impl From<distlock::LockError> for AppError {
    fn from(error: distlock::LockError) -> Self {
        AppError(error.to_string())
    }
}

struct Region {
    name: String,
}

struct Owner {
    region: Region,
    id: u64,
}

struct Order {
    owner: Owner,
    number: u32,
}

#[distributed_lock(key = "trace:{trace_id}")]
async fn brace(trace_id: &str) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "order:{order.owner.region.name}:{order.owner.id}:{order.number}")]
async fn fields(order: &Order) -> Result<u32, AppError> {
    Ok(order.number)
}

#[distributed_lock(key = "trace:<trace_id>")]
async fn angle(trace_id: String) -> Result<String, AppError> {
    Ok(trace_id)
}

#[distributed_lock(key = "owner:<order.owner.id>/<attempt>")]
async fn angle_fields(order: Order, attempt: u8) -> Result<(), AppError> {
    let _ = (order.number, attempt);
    Ok(())
}

#[distributed_lock(key = "pair:{pair.0}-{pair.1}")]
async fn tuple_fields(pair: (u32, &str)) -> Result<(), AppError> {
    let _ = pair;
    Ok(())
}

#[distributed_lock(key = "{{literal}}:{id}:}}{{")]
async fn escapes(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(key = "a<b and x < 3 and <> and <1>")]
async fn literal_angles() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "nightly-report")]
async fn fixed() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "counter:{n}")]
async fn mutable_parameter(mut n: u32) -> Result<u32, AppError> {
    n += 1;
    Ok(n)
}

#[distributed_lock(key = "unicode:clé:{nom}")]
async fn unicode(nom: &str) -> Result<(), AppError> {
    let _ = nom;
    Ok(())
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    let order = Order {
        owner: Owner {
            region: Region {
                name: "eu".to_owned(),
            },
            id: 7,
        },
        number: 3,
    };
    assert_send(brace("abc"));
    assert_send(fields(&order));
    assert_send(angle("abc".to_owned()));
    assert_send(angle_fields(order, 1));
    assert_send(tuple_fields((1, "x")));
    assert_send(escapes(1));
    assert_send(literal_angles());
    assert_send(fixed());
    assert_send(mutable_parameter(1));
    assert_send(unicode("x"));
}
