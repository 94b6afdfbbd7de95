//! Fair valves at their edges (issue 45, B) on the memory store with a
//! hand-set clock: the scenarios of `arrivals/edges.rs`.

mod arrivals;
use arrivals::{edges, run};

#[test]
fn a_tenant_admitted_while_the_valve_was_nearly_empty_is_not_shut_out() {
    edges::a_tenant_admitted_while_the_valve_was_nearly_empty_is_not_shut_out(&run);
}

#[test]
fn a_herd_in_step_leaves_a_polite_tenant_alone() {
    for n in [60, 80] {
        edges::a_herd_in_step_leaves_a_polite_tenant_alone(&run, n);
    }
}

#[test]
fn a_window_valve_keeps_its_whole_capacity() {
    edges::a_window_valve_keeps_its_whole_capacity(&run);
}

#[test]
fn weights_are_scale_free() {
    edges::weights_are_scale_free(&run);
}

#[test]
fn weights_at_both_ends_in_one_valve() {
    edges::weights_at_both_ends_in_one_valve(&run);
}

#[test]
fn many_light_ids_outweigh_a_heavy_one_unless_it_reserves() {
    edges::many_light_ids_outweigh_a_heavy_one_unless_it_reserves(&run);
}
