//! An adaptive valve's law as `adapt.lua` steps it on a real redis-server
//! and as its Rust twin (`sluice_core::adaptive::law::Law::step`) does, on
//! the same hand-driven clock: identical states, bit for bit, after every
//! step; and the script's key is opaque.

use std::sync::Arc;

use proptest::prelude::*;
use sluice_core::adaptive::Adaptive;
use sluice_core::adaptive::law::{Law, Seen};
use sluice_core::config::NamedRule;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{BoundRule, Rule, Scope};
use sluice_store::redis::adapt::{adapt_call, law_key, law_of};
use sluice_store::{Clock, ManualClock, TimeSource};
use sluice_testkit::RedisServer;

fn valve(limit: i128) -> BoundRule {
    let named = NamedRule {
        name: "search-db".into(),
        rule: Rule::concurrency(limit, 30_000).unwrap(),
        shadow: false,
        count_if: None,
        tolerance: sluice_core::tolerance::Tolerance::EXACT,
        regions: None,
    };
    BoundRule::new(Scope::Global, "POST /v1/search", &named, 0.8)
}

/// One step: ms since the last (below 0: the clock stepped back; past ten
/// minutes: the law forgotten), then what was seen.
fn steps() -> impl Strategy<Value = Vec<(i64, Seen)>> {
    let seen = (
        prop_oneof![Just(0u64), 1u64..=50, 1_000u64..=5_000],
        0.0f64..=2_000.0,
        0u64..=60,
        any::<bool>(),
    )
        .prop_map(|(requests, mean, failed, full)| Seen {
            requests,
            latency_ms: mean * requests as f64,
            failed: failed.min(requests),
            full,
        });
    let dt = prop_oneof![
        6 => 0i64..=150,
        3 => 150i64..=3_000,
        1 => -5_000i64..=-1,
        1 => 600_000i64..=700_000,
    ];
    proptest::collection::vec((dt, seen), 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_law_script_and_its_twin_step_alike(
        limit in prop_oneof![1i128..=10, 10i128..=5_000],
        min in 1u64..=20,
        target in prop_oneof![1u64..=20, 20u64..=2_000],
        changed_limit in prop_oneof![Just(None), (1i128..=5_000).prop_map(Some)],
        steps in steps(),
    ) {
        let server = RedisServer::start();
        let mut connection = server.connection();
        let keyer = Keyer::new("sl", &Pepper::parse(&[3u8; 32]).unwrap());
        let clock = Arc::new(ManualClock::new(1_764_460_800_000));
        let time = TimeSource::Client(clock.clone());
        let mut rule = valve(limit);
        let terms = Adaptive { latency_target_ms: target, min: min.min(limit as u64) };
        let mut twin = Law::default();
        for (i, (dt, seen)) in steps.into_iter().enumerate() {
            // Halfway, a reload changes the valve's limit.
            if i == 10 && let Some(to) = changed_limit {
                rule = valve(to);
            }
            clock.set(clock.now_ms().saturating_add_signed(dt));
            let terms = Adaptive { min: terms.min.min(rule.rule().limit()), ..terms };
            let reply: Vec<u8> = adapt_call(&keyer, &rule, terms, seen, &time)
                .invoke(&mut connection)
                .unwrap();
            twin = twin.step(clock.now_ms(), seen, rule.rule().limit(), terms);
            let lua = law_of(&reply).unwrap();
            prop_assert_eq!(lua.limit.to_bits(), twin.limit.to_bits(), "step {}: {:?} vs {:?}", i, lua, twin);
            prop_assert_eq!(lua.latency_ms.to_bits(), twin.latency_ms.to_bits(), "step {}: {:?} vs {:?}", i, lua, twin);
            prop_assert_eq!((lua.cut_at_ms, lua.at_ms), (twin.cut_at_ms, twin.at_ms), "step {}", i);
            let effective = lua.effective(rule.rule().limit(), terms);
            prop_assert!((terms.min..=rule.rule().limit()).contains(&effective));
        }
        // Opaque: the key names neither the route nor the valve.
        let key = law_key(&keyer, &rule);
        prop_assert!(!key.contains("search") && !key.contains("POST"), "{}", key);
    }
}
