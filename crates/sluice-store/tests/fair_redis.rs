//! Fair valves at their edges (issue 45, B) on a real Redis, the scripts
//! told the time by a hand-set clock: the scenarios of `arrivals/edges.rs`,
//! the gates' arithmetic in Lua.

use sluice_testkit::RedisServer;

mod arrivals;
use arrivals::{Run, Sender, edges, run_redis};

fn on(server: &RedisServer) -> impl Fn(&str, &[Sender], u64, u64) -> Run + '_ {
    move |yaml, senders, run_ms, from_ms| run_redis(&server.url(), yaml, senders, run_ms, from_ms)
}

#[test]
fn a_tenant_admitted_while_the_valve_was_nearly_empty_is_not_shut_out() {
    let server = RedisServer::start();
    edges::a_tenant_admitted_while_the_valve_was_nearly_empty_is_not_shut_out(&on(&server));
}

#[test]
fn a_herd_in_step_leaves_a_polite_tenant_alone() {
    let server = RedisServer::start();
    edges::a_herd_in_step_leaves_a_polite_tenant_alone(&on(&server), 80);
}

#[test]
fn a_window_valve_keeps_its_whole_capacity() {
    let server = RedisServer::start();
    edges::a_window_valve_keeps_its_whole_capacity(&on(&server));
}

#[test]
fn weights_are_scale_free() {
    let server = RedisServer::start();
    edges::weights_are_scale_free(&on(&server));
}

#[test]
fn weights_at_both_ends_in_one_valve() {
    let server = RedisServer::start();
    edges::weights_at_both_ends_in_one_valve(&on(&server));
}

#[test]
fn a_polite_tenant_below_its_share_is_not_starved() {
    let server = RedisServer::start();
    edges::a_polite_tenant_below_its_share_is_not_starved(&on(&server));
}

#[test]
fn a_reserve_holds_its_part_for_its_plan_while_others_saturate_the_valve() {
    let server = RedisServer::start();
    edges::a_reserve_holds_its_part_for_its_plan_while_others_saturate_the_valve(&on(&server));
}
