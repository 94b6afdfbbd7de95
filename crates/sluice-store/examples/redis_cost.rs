//! Redis CPU per decision: the decision script against a floor, a minimal
//! script that issues the same Redis commands (TIME, then GET and SET PX
//! per rule) and nothing else, measured side by side in one run.
//!
//! Starts its own `redis-server` on a free loopback port. For 1, 2 and 3
//! gcra rules, `redis-benchmark` sends each script `CALLS` times (64
//! connections, 10,000 random tenants, every request admitted), `RUNS`
//! rounds alternating the two; Redis CPU per call is `usec_per_call` of
//! `EVALSHA` in `INFO commandstats`. Prints the medians, the ratio to the
//! floor and what each further rule adds.
//!
//! Run: `cargo run --release -p sluice-store --example redis_cost`.

use sluice_store::script::DECIDE_LUA;
use sluice_testkit::{RedisServer, command_usec};

const CALLS: u32 = 100_000;
const RUNS: usize = 5;

/// The same commands as a gcra decision, no arithmetic.
const FLOOR_LUA: &str = "local t = redis.call('TIME')
for i = 1, #KEYS do
  redis.call('GET', KEYS[i])
  redis.call('SET', KEYS[i], t[1], 'PX', 61000)
end
return 1";

fn main() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let load = |source: &str| -> String {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(source)
            .query(&mut server.connection())
            .expect("script loads")
    };
    let (decide, floor) = (load(DECIDE_LUA), load(FLOOR_LUA));
    println!(
        "{:<6} {:>12} {:>12} {:>8} {:>14}",
        "rules", "sluice µs", "floor µs", "ratio", "per rule µs"
    );
    let mut previous: Option<f64> = None;
    for rules in 1..=3 {
        let keys: Vec<String> = (0..rules)
            .map(|r| format!("sl:{{t__rand_int__}}:r{r}"))
            .collect();
        // now (server clock), n rules, not rotating, no lease; per rule:
        // gcra, limit, per, burst, aligned, cost, shadow.
        let mut args: Vec<String> =
            vec![String::new(), rules.to_string(), "0".into(), String::new()];
        for _ in 0..rules {
            for v in ["1", "1000000", "1000", "1000000", "0", "1", "0"] {
                args.push(v.to_owned());
            }
        }
        let (mut ours, mut floors) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            ours.push(cost(&server, &mut conn, &decide, &keys, &args));
            floors.push(cost(&server, &mut conn, &floor, &keys, &[]));
        }
        let (ours, floor) = (median(ours), median(floors));
        let added = previous.map_or(String::new(), |p| format!("{:.1}", ours - p));
        println!(
            "{rules:<6} {ours:>12.1} {floor:>12.1} {:>8.2} {added:>14}",
            ours / floor
        );
        previous = Some(ours);
    }
}

/// Redis CPU µs per call of script `sha` over `keys` with `args`.
fn cost(
    server: &RedisServer,
    conn: &mut redis::Connection,
    sha: &str,
    keys: &[String],
    args: &[String],
) -> f64 {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(conn)
        .expect("reset stats");
    let out = std::process::Command::new("redis-benchmark")
        .args([
            "-p",
            &server.port().to_string(),
            "-c",
            "64",
            "-r",
            "10000",
            "-q",
        ])
        .args(["-n", &CALLS.to_string()])
        .args(["EVALSHA", sha, &keys.len().to_string()])
        .args(keys)
        .args(args)
        .output()
        .expect("redis-benchmark runs (install redis-tools)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (calls, usec) = command_usec(conn, "evalsha").expect("evalsha stats");
    assert!(calls >= u64::from(CALLS), "every call ran: {calls}");
    usec as f64 / calls as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
