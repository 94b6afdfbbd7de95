//! The merge of the entries kept alike in every region (the admin API's
//! overrides, `replica.lua`) and its twin,
//! `sluice_core::regions::replica::Replica`, give identical answers: random
//! merges (late, repeated, tied, tombstones) through a real Redis and
//! through the twin.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use sluice_core::regions::replica::{Entry, Replica};
use sluice_store::redis::regions::{Replicated, identity_key, replica_script};
use sluice_testkit::RedisServer;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn entries() -> impl Strategy<Value = Vec<Entry>> {
    let value = prop_oneof![
        1 => Just(None),
        3 => prop::sample::select(vec!["0a", "0b", "ff", "0a0b"]).prop_map(|v| Some(v.to_owned())),
    ];
    let entry = (prop::sample::select(vec!["a", "b", "c"]), 1u64..=6, value).prop_map(
        |(field, version, value)| Entry {
            field: field.to_owned(),
            version: 1_764_460_800_000_000 + version,
            value,
        },
    );
    proptest::collection::vec(entry, 1..6)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    /// The merge of replicated entries (overrides) and its twin: what each
    /// merge applied, and what the store holds after it (values, versions
    /// with tombstones, the change counter); a store whose identity
    /// changed merges nothing.
    #[test]
    fn the_replica_merge_and_its_twin_answer_alike(
        merges in proptest::collection::vec((entries(), prop::bool::weighted(0.1)), 1..12),
    ) {
        let server = RedisServer::start();
        let runtime = runtime();
        let mut connection = runtime.block_on(server.client().get_multiplexed_async_connection()).unwrap();
        let replicated = Replicated {
            values: "sl:{admin}:overrides".into(),
            versions: "sl:{admin}:versions".into(),
            counter: "sl:{admin}:version".into(),
        };
        let identity = identity_key("sl");
        runtime
            .block_on(redis::cmd("SET").arg(&identity).arg("its identity").query_async::<()>(&mut connection))
            .unwrap();
        let mut twin = Replica::default();
        for (i, (merge, foreign)) in merges.into_iter().enumerate() {
            let seen = if foreign { "another" } else { "its identity" };
            let mut pipe = redis::pipe();
            pipe.load_script(replica_script()).ignore();
            for call in replicated.merge_calls(&merge, (&identity, seen)) {
                pipe.invoke_script(&call);
            }
            let lua: Vec<i64> = runtime.block_on(pipe.query_async(&mut connection)).unwrap();
            let rust = if foreign { -2 } else { twin.merge(&merge) as i64 };
            prop_assert_eq!(lua, vec![rust], "merge {} of {:?}", i, merge);
            let (counter, stored) = runtime.block_on(replicated.read(&mut connection)).unwrap();
            prop_assert_eq!(counter, twin.counter, "after merge {}", i);
            prop_assert_eq!(stored, twin.shipped(), "after merge {}", i);
        }
    }

}
