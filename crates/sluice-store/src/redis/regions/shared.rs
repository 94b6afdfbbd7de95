//! What a region's store knows of the regions, and of the shared rules
//! its decisions touched (see the module's documentation).

use std::collections::HashMap;
use std::sync::Mutex;

use sluice_core::algorithm::{State, fixed_window, sliding_window, token_bucket};
use sluice_core::keys::Record;
use sluice_core::regions::bucket::{Bucket, Standing, Terms};
use sluice_core::regions::sliding::Slide;
use sluice_core::regions::stored::{self, SharedRecord, Stored, window_of};
use sluice_core::regions::{pool, share};
use sluice_core::{Algorithm, BoundRule, Rule};

/// A shared rule's kind: how its record moves with the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// An aligned `fixed_window` (`shared_window` in shared.lua).
    Window,
    /// A `sliding_window` (`shared_sliding`).
    Sliding,
    /// A `gcra` or `token_bucket` (`shared_bucket`) of `burst` units
    /// whose pool is `pool` per period: its rate moves.
    Bucket {
        /// Its burst.
        burst: u64,
        /// Its pool.
        pool: u64,
    },
}

impl Kind {
    /// The kind of shared `rule`.
    pub fn of(rule: &BoundRule) -> Kind {
        match rule.rule().algorithm() {
            Algorithm::SlidingWindow => Kind::Sliding,
            Algorithm::Gcra | Algorithm::TokenBucket => Kind::Bucket {
                burst: rule.rule().burst(),
                pool: Regions::pool(rule),
            },
            _ => Kind::Window,
        }
    }

    /// A bucket's terms (`None` for a window).
    pub fn terms(self, per: u64, max_debt: u64) -> Option<Terms> {
        match self {
            Kind::Bucket { burst, pool } => Some(Terms::new(burst, per, pool, max_debt)),
            Kind::Window | Kind::Sliding => None,
        }
    }

    /// The span a ledger counts in for a rule of `per` ms (a window; a
    /// bucket's epoch).
    pub fn span(self, per: u64) -> u64 {
        match self {
            Kind::Bucket { .. } => Bucket::period(per),
            Kind::Window | Kind::Sliding => per,
        }
    }
}

/// One shared rule of one key, as the link names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shared {
    /// The rule's group key.
    pub key: String,
    /// Its record's name.
    pub record: Record,
    /// Its period (ms).
    pub per_ms: u64,
    /// Its kind.
    pub kind: Kind,
    /// Its `max_debt`: a count more than that past the cap reads as spent
    /// when its window
    /// moves on.
    pub max_debt: u64,
    /// While rotating the pepper, its group key and record's name under
    /// the previous one (see ledger.lua).
    pub previous: Option<(String, Record)>,
}

/// The regions as a store sees them.
#[derive(Debug)]
pub struct Regions {
    /// Every region's name, in the order shares are computed (every
    /// region configured the same).
    pub names: Vec<String>,
    /// Their weights, in that order.
    pub weights: Vec<u32>,
    /// This region's place.
    pub index: usize,
    /// How often the link moves budget (ms).
    pub sync_every_ms: u64,
    /// The shared rules decided here since the link last took them, with
    /// the window, the pool and the units asked.
    noted: Mutex<HashMap<Shared, Noted>>,
}

/// One region's part of a shared rule's window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionPart {
    /// The region.
    pub region: String,
    /// Its share of the pool when the window began.
    pub share: u64,
    /// What it may admit in the window, in all (`None`: not heard).
    pub cap: Option<u64>,
    /// What it admitted (`None`: not heard).
    pub used: Option<u64>,
    /// When a peer's part was heard (ms since the epoch, by this region's
    /// Redis clock); `None` for this region's own.
    pub heard_at_ms: Option<u64>,
}

/// What decisions noted of one shared rule since the link last ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Noted {
    /// The window (by this instance's clock).
    pub window: u64,
    /// The rule's pool.
    pub pool: u64,
    /// Units asked.
    pub wanted: u64,
}

impl Regions {
    /// `(name, weight)` of every region in the order shares are computed,
    /// `this` among them, the link moving budget every `sync_every_ms`.
    pub fn new(in_order: &[(&str, u32)], this: &str, sync_every_ms: u64) -> Option<Regions> {
        let index = in_order.iter().position(|(name, _)| *name == this)?;
        Some(Regions {
            names: in_order.iter().map(|(n, _)| n.to_string()).collect(),
            weights: in_order.iter().map(|&(_, w)| w).collect(),
            index,
            sync_every_ms,
            noted: Mutex::new(HashMap::new()),
        })
    }

    /// How many regions.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none (never: this one is among them).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// A shared rule's pool per window.
    pub fn pool(rule: &BoundRule) -> u64 {
        pool(rule.rule().limit(), rule.tolerance())
    }

    /// Region `index`'s share of `pool`.
    pub fn share_of(&self, pool: u64, index: usize) -> u64 {
        share(pool, &self.weights, index)
    }

    /// This region's share of `pool`.
    pub fn share(&self, pool: u64) -> u64 {
        self.share_of(pool, self.index)
    }

    /// What a read-only check at `now` finds of shared `rule` whose record
    /// holds `numbers` (when it goes idle, then its three numbers; `None`:
    /// no record): the state, and the rule to read it with when it is not
    /// the rule itself. A window reads as the rule of its limit `L` reads
    /// a window of now that counts `L − left + owed` (at most `L +
    /// max_debt`), so that what is left is what this region may still
    /// admit (at most `L`), and a region past what it may admit owes. A
    /// bucket reads as this region's own: a `token_bucket` of its rate and
    /// capacity now (so that its reset and retry are at its rate, not the
    /// fleet's).
    pub fn standing(
        &self,
        rule: &BoundRule,
        numbers: Option<[f64; 4]>,
        now: u64,
    ) -> (State, Option<Rule>) {
        let per = rule.rule().period_ms();
        let share = self.share(Regions::pool(rule));
        let max_debt = rule.rule().max_debt();
        let kind = Kind::of(rule);
        let (left, owed) = match kind {
            Kind::Sliding => standing_of::<Slide>(numbers, now, (share, per), max_debt),
            Kind::Window => standing_of::<stored::Record>(numbers, now, (share, per), max_debt),
            Kind::Bucket { burst, pool } => {
                let terms = Terms::new(burst, per, pool, max_debt);
                let record = numbers.map(Bucket::stored);
                let standing = Bucket::standing(record, now, (share, per), terms);
                return region_bucket(rule, standing, now);
            }
        };
        // Owing more than the rule may owe reads as owing all it may (a
        // rule of its own reads such a count as spent under another rule).
        let limit = rule.rule().limit();
        let count = limit
            .saturating_sub(left)
            .saturating_add(owed)
            .min(limit.saturating_add(rule.rule().max_debt()));
        let start_ms = window_of(now, per);
        let state = if kind == Kind::Sliding {
            State::SlidingWindow(sliding_window::Windows {
                start_ms,
                prev: 0,
                cur: count,
            })
        } else {
            State::FixedWindow(fixed_window::Window { start_ms, count })
        };
        (state, None)
    }

    /// A decision asked `cost` units of shared `rule` kept in `key` and
    /// `record` (and `previous`, while rotating), at `now` (this
    /// instance's clock).
    pub(crate) fn note(
        &self,
        rule: &BoundRule,
        (key, record, previous): (&str, Record, Option<(&str, Record)>),
        cost: u64,
        now: u64,
    ) {
        let per = rule.rule().period_ms();
        let kind = Kind::of(rule);
        let window = window_of(now, kind.span(per));
        let pool = Regions::pool(rule);
        let mut noted = self.noted.lock().unwrap_or_else(|e| e.into_inner());
        let shared = Shared {
            key: key.to_owned(),
            record,
            per_ms: per,
            kind,
            max_debt: rule.rule().max_debt(),
            previous: previous.map(|(k, r)| (k.to_owned(), r)),
        };
        let entry = noted.entry(shared).or_insert(Noted {
            window,
            pool,
            wanted: 0,
        });
        if entry.window != window {
            *entry = Noted {
                window,
                pool,
                wanted: 0,
            };
        }
        entry.pool = pool;
        entry.wanted = entry.wanted.saturating_add(cost);
    }

    /// Every region's part of a shared rule's window as `snapshot` (this
    /// region's, read from its store) shows it: this region's exactly, the
    /// peers' as they last said. A bucket's parts are rates, and say
    /// nothing of what was used (`used` is `None`).
    pub fn parts(
        &self,
        snapshot: &sluice_core::regions::stored::Snapshot,
        kind: Kind,
    ) -> Vec<RegionPart> {
        let bucket = matches!(kind, Kind::Bucket { .. });
        self.names
            .iter()
            .enumerate()
            .map(|(r, name)| {
                let share = self.share_of(snapshot.pool, r);
                if r == self.index {
                    let mut part = snapshot.part.clone();
                    part.share = share;
                    return RegionPart {
                        region: name.clone(),
                        share,
                        cap: Some(part.cap()),
                        used: (!bucket).then_some(part.used),
                        heard_at_ms: None,
                    };
                }
                let view = snapshot.views.get(r).copied().flatten();
                RegionPart {
                    region: name.clone(),
                    share,
                    cap: view.map(|v| v.heard.cap),
                    used: view.filter(|_| !bucket).map(|v| v.heard.used),
                    heard_at_ms: view.map(|v| v.at_ms),
                }
            })
            .collect()
    }

    /// What decisions noted since the last call.
    pub(crate) fn take_noted(&self) -> HashMap<Shared, Noted> {
        std::mem::take(&mut *self.noted.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// What remains to admit of a shared record of kind `K` whose stored
/// numbers are `numbers`, and how far past it the region is, at `now`.
fn standing_of<K: SharedRecord>(
    numbers: Option<[f64; 4]>,
    now: u64,
    (share, per): (u64, u64),
    terms: K::Terms,
) -> (u64, u64) {
    let stored = Stored::<K> {
        record: numbers.map(K::stored),
        ..Stored::default()
    };
    stored.standing(now, share, per, terms)
}

/// This region's bucket of shared `rule` as a `token_bucket` of its own:
/// its rate and its capacity in whole units, holding its tokens (owing:
/// refilling from a moment ahead of now, as adjust.lua writes it). A rate
/// a rule of its own cannot have reads as the nearest it can: at least 1
/// (a region of no rate, which validation leaves none, reads as refilling
/// at one unit per `per`), at most what a rule may refill (a pool above it
/// reads slower: its retry later, never sooner).
fn region_bucket(rule: &BoundRule, standing: Standing, now: u64) -> (State, Option<Rule>) {
    let per = rule.rule().period_ms();
    let most = sluice_core::rule::MAX_LIMIT.min(sluice_core::rule::MAX_SCALED / per);
    let rate = standing.rate.clamp(1, most.max(1));
    let burst = (standing.capacity.max(0) as u64 / per).max(1);
    let own = Rule::new(
        Algorithm::TokenBucket,
        i128::from(rate),
        per,
        Some(i128::from(burst)),
        false,
    )
    .and_then(|r| r.with_max_debt(i128::from(rule.rule().max_debt())));
    let Ok(own) = own else {
        // Beyond what a rule of its own may hold: the rule itself.
        return (State::Fresh, None);
    };
    let tokens = i128::from(standing.tokens).min(i128::from(burst) * i128::from(per));
    let state = if tokens >= 0 {
        token_bucket::Bucket {
            scaled_tokens: tokens as u64,
            last_ms: now,
        }
    } else {
        let owed = -tokens;
        let ahead_ms = (owed + i128::from(rate) - 1) / i128::from(rate);
        token_bucket::Bucket {
            scaled_tokens: (ahead_ms * i128::from(rate) - owed) as u64,
            last_ms: now.saturating_add(ahead_ms as u64),
        }
    };
    (State::TokenBucket(state), Some(own))
}
