//! Fair valves on a real Redis Cluster, the scripts told the time by a
//! hand-set clock: appendix E's core promises and the scenarios of
//! `arrivals/edges.rs`, each valve split over its keys as
//! `storage.global_shards` splits it by default (a valve of 100/s: four
//! keys of 25/s). Each test starts its own cluster.

use sluice_testkit::RedisCluster;

mod arrivals;
use arrivals::{Run, Sender, edges, run_cluster};

/// A runner on `cluster`.
fn on(cluster: &RedisCluster) -> impl Fn(&str, &[Sender], u64, u64) -> Run {
    let urls = cluster.urls();
    move |yaml, senders, run_ms, from_ms| run_cluster(&urls, yaml, senders, run_ms, from_ms)
}

#[test]
fn a_polite_tenant_below_its_share_is_not_starved() {
    let cluster = RedisCluster::start(3, 0);
    edges::a_polite_tenant_below_its_share_is_not_starved(&on(&cluster));
}

#[test]
fn a_reserve_holds_its_part_for_its_plan_while_others_saturate_the_valve() {
    let cluster = RedisCluster::start(3, 0);
    edges::a_reserve_holds_its_part_for_its_plan_while_others_saturate_the_valve(&on(&cluster));
}

#[test]
fn a_tenant_admitted_while_the_valve_was_nearly_empty_is_not_shut_out() {
    let cluster = RedisCluster::start(3, 0);
    edges::a_tenant_admitted_while_the_valve_was_nearly_empty_is_not_shut_out(&on(&cluster));
}

#[test]
fn a_herd_in_step_leaves_a_polite_tenant_alone() {
    let cluster = RedisCluster::start(3, 0);
    edges::a_herd_in_step_leaves_a_polite_tenant_alone(&on(&cluster), 80);
}

#[test]
fn weights_are_scale_free() {
    let cluster = RedisCluster::start(3, 0);
    edges::weights_are_scale_free(&on(&cluster));
}
