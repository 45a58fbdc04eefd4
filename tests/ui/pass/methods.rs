// Methods with every receiver, `{self.field}` placeholders, and trait-impl methods.
use distlock::{distributed_lock, LockError};

struct Account {
    id: u64,
    balance: u64,
}

impl Account {
    #[distributed_lock(key = "account:{self.id}")]
    async fn balance(&self) -> Result<u64, LockError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:{self.id}", guard = lock)]
    pub async fn withdraw(&mut self, amount: u64) -> Result<u64, LockError> {
        let _ = lock.key();
        self.balance -= amount;
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.id>:close")]
    pub(crate) async fn close(self) -> Result<u64, LockError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:{self.id}:boxed")]
    async fn boxed(self: Box<Self>) -> Result<u64, LockError> {
        Ok(self.id)
    }

    #[distributed_lock(key = "account:{id}")]
    async fn associated(id: u64) -> Result<Self, LockError> {
        Ok(Self { id, balance: 0 })
    }

    #[distributed_lock(key = "account:{self.id}:to:{other.id}")]
    async fn transfer(&mut self, other: &mut Account, amount: u64) -> Result<(), LockError> {
        self.balance -= amount;
        other.balance += amount;
        Ok(())
    }
}

trait Store {
    async fn save(&self, id: u64) -> Result<(), LockError>;
}

struct Redisish {
    name: String,
}

impl Store for Redisish {
    #[distributed_lock(key = "store:{self.name}:{id}")]
    async fn save(&self, id: u64) -> Result<(), LockError> {
        let _ = (&self.name, id);
        Ok(())
    }
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    let mut account = Account { id: 1, balance: 10 };
    let mut other = Account { id: 2, balance: 0 };
    assert_send(account.balance());
    assert_send(account.withdraw(1));
    assert_send(account.transfer(&mut other, 1));
    assert_send(Box::new(Account { id: 3, balance: 0 }).boxed());
    assert_send(Account::associated(4));
    assert_send(account.close());
    let store = Redisish {
        name: "s".to_owned(),
    };
    assert_send(store.save(1));
}
