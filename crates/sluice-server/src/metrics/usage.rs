//! Usage known after the fact: settles, debits, debt and expired
//! reservations (no tenant labels).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::ResultLabel;

/// The counters of reservations, settles and debits.
#[derive(Debug, Clone)]
pub struct UsageMetrics {
    /// Settles by result: applied, repeated (an identical retry), refused.
    settles: [Counter; 3],
    settled_cost: Counter,
    debited: Counter,
    debts: Counter,
    forgiven: Counter,
    expired: Counter,
    /// Attempts concluded, by result: counted, given back, expired.
    attempts: [Counter; 3],
}

/// How an attempt (a check on rules that count by outcome) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptResult {
    /// Its status matched a rule's `count_if`: counted there.
    Counted,
    /// Its status matched none: given back.
    GivenBack,
    /// Never concluded within `attempt_ttl`: given back.
    Expired,
}

/// What a settle found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleResult {
    /// It applied.
    Applied,
    /// The same settle had applied before: nothing changed.
    Repeated,
    /// Unknown, expired, forged or settled otherwise: nothing changed.
    Refused,
}

impl UsageMetrics {
    pub(super) fn register(registry: &mut Registry) -> UsageMetrics {
        let settles = Family::<ResultLabel, Counter>::default();
        registry.register(
            "settles",
            "Settles of reservations, by result (applied, repeated: an identical retry, refused)",
            settles.clone(),
        );
        let settles = ["applied", "repeated", "refused"]
            .map(|result| settles.get_or_create(&ResultLabel { result }).clone());
        let counter = |registry: &mut Registry, name: &str, help: &str| {
            let counter = Counter::default();
            registry.register(name, help, counter.clone());
            counter
        };
        let attempts = Family::<ResultLabel, Counter>::default();
        registry.register(
            "attempts",
            "Attempts on rules that count by outcome, by how they ended (counted: a status they count; given_back: a status they do not; expired: never concluded within attempt_ttl, given back)",
            attempts.clone(),
        );
        let attempts = ["counted", "given_back", "expired"]
            .map(|result| attempts.get_or_create(&ResultLabel { result }).clone());
        UsageMetrics {
            settles,
            attempts,
            settled_cost: counter(
                registry,
                "settled_cost",
                "Units reservations were settled at (their actual cost)",
            ),
            debited: counter(
                registry,
                "debited_units",
                "Units charged after the fact (reports, settles above their estimate), debt included",
            ),
            debts: counter(
                registry,
                "debts",
                "Debits that left a rule owing (a request of one unit denied until repaid)",
            ),
            forgiven: counter(
                registry,
                "forgiven_debt_units",
                "Units a debit would have owed beyond a rule's max_debt, forgiven",
            ),
            expired: counter(
                registry,
                "reservations_expired",
                "Reservations not settled within reservation_ttl: charged their estimate",
            ),
        }
    }

    /// A settle, and the actual cost when it applied.
    pub fn settle(&self, result: SettleResult, actual: u64) {
        let index = match result {
            SettleResult::Applied => 0,
            SettleResult::Repeated => 1,
            SettleResult::Refused => 2,
        };
        self.settles[index].inc();
        if result == SettleResult::Applied {
            self.settled_cost.inc_by(actual);
        }
    }

    /// A debit of `units`, whether it left a rule owing, and the units
    /// forgiven.
    pub fn debit(&self, units: u64, owing: bool, forgiven: u64) {
        self.debited.inc_by(units);
        if owing {
            self.debts.inc();
        }
        self.forgiven.inc_by(forgiven);
    }

    /// A reservation expired unsettled.
    pub fn expired(&self) {
        self.expired.inc();
    }

    /// An attempt concluded (or expired).
    pub fn attempt(&self, result: AttemptResult) {
        let index = match result {
            AttemptResult::Counted => 0,
            AttemptResult::GivenBack => 1,
            AttemptResult::Expired => 2,
        };
        self.attempts[index].inc();
    }
}
