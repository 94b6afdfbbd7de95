//! Redis CPU per decision: the decision against a floor, a minimal
//! function that issues the same Redis commands (TIME, then GET and SET PX
//! per rule) and nothing else, measured side by side in one run.
//!
//! Starts its own `redis-server` on a free loopback port. For 1, 2 and 3
//! gcra rules, `redis-benchmark` sends each `CALLS` times (64 connections,
//! 10,000 random tenants, every request admitted), `RUNS` rounds
//! alternating: the decision as sluice sends it (`FCALL`), the floor
//! (`FCALL`), and both as scripts (`EVALSHA`, sluice's fallback where
//! functions are unavailable). Redis CPU per call is `usec_per_call` in
//! `INFO commandstats`. Prints the medians, the ratios to the floor and what
//! each further rule adds.
//!
//! Run: `cargo run --release -p sluice-store --example redis_cost [-- --json]`
//! (`REDIS_COST_CALLS`, `REDIS_COST_RUNS` change the defaults of 100,000
//! calls and 5 rounds; `--json` prints one line per rule count with every
//! sample, for `scripts/bench.sh`).

use sluice_store::script::{DECIDE_LUA, Decide};
use sluice_testkit::{RedisServer, command_usec};

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, not {v:?}"))
    })
}

/// The same commands as a gcra decision, no arithmetic.
const FLOOR_BODY: &str = "local function floor(KEYS)
  local t = redis.call('TIME')
  for i = 1, #KEYS do
    redis.call('GET', KEYS[i])
    redis.call('SET', KEYS[i], t[1], 'PX', 61000)
  end
  return 1
end
";

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let calls = setting("REDIS_COST_CALLS", 100_000);
    let runs = setting("REDIS_COST_RUNS", 5);
    let server = RedisServer::start();
    let mut conn = server.connection();
    let decide = Decide::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut connection = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .expect("connects");
        decide.load(&mut connection).await.expect("FUNCTION LOAD");
    });
    let _: () = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(format!(
            "#!lua name=floor\n{FLOOR_BODY}redis.register_function('floor', floor)\n"
        ))
        .query(&mut conn)
        .expect("floor loads");
    let load = |source: &str| -> String {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(source)
            .query(&mut server.connection())
            .expect("script loads")
    };
    let decide_sha = load(DECIDE_LUA);
    let floor_sha = load(&format!("{FLOOR_BODY}return floor(KEYS)\n"));
    if !json {
        println!(
            "{:<6} {:>8} {:>8} {:>6} {:>9}   {:>8} {:>8} {:>6} {:>9}",
            "rules", "FCALL", "floor", "ratio", "per rule", "EVALSHA", "floor", "ratio", "per rule"
        );
    }
    let mut previous: Option<(f64, f64)> = None;
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
        let mut samples: [Vec<f64>; 4] = Default::default();
        for _ in 0..runs {
            let commands = [
                ("fcall", decide.function_name(), &args[..]),
                ("fcall", "floor", &[][..]),
                ("evalsha", decide_sha.as_str(), &args[..]),
                ("evalsha", floor_sha.as_str(), &[][..]),
            ];
            for (sample, (command, name, args)) in samples.iter_mut().zip(commands) {
                sample.push(cost(&server, &mut conn, calls, command, name, &keys, args));
            }
        }
        if json {
            let [a, b, c, d] = &samples;
            println!(
                "{{\"suite\":\"redis_cost\",\"rules\":{rules},\"fcall\":{a:?},\"fcall_floor\":{b:?},\"evalsha\":{c:?},\"evalsha_floor\":{d:?}}}"
            );
            continue;
        }
        let [fcall, fcall_floor, evalsha, evalsha_floor] = samples.map(median);
        let added = |now: f64, before: Option<f64>| {
            before.map_or(String::new(), |p| format!("+{:.1}", now - p))
        };
        println!(
            "{rules:<6} {fcall:>8.1} {fcall_floor:>8.1} {:>6.2} {:>9}   {evalsha:>8.1} {evalsha_floor:>8.1} {:>6.2} {:>9}",
            fcall / fcall_floor,
            added(fcall, previous.map(|p| p.0)),
            evalsha / evalsha_floor,
            added(evalsha, previous.map(|p| p.1)),
        );
        previous = Some((fcall, evalsha));
    }
}

/// Redis CPU µs per call of `command` (`fcall` or `evalsha`) of `name`
/// over `keys` with `args`.
fn cost(
    server: &RedisServer,
    conn: &mut redis::Connection,
    calls: usize,
    command: &str,
    name: &str,
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
        .args(["-n", &calls.to_string()])
        .args([command, name, &keys.len().to_string()])
        .args(keys)
        .args(args)
        .output()
        .expect("redis-benchmark runs (install redis-tools)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ran, usec) = command_usec(conn, command).expect("command stats");
    assert!(ran >= calls as u64, "every call ran: {ran}");
    usec as f64 / ran as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
