//! Redis CPU per decision: the decision against a floor, a minimal
//! function that issues the same Redis commands (TIME, then GET and SET PX
//! per key; the three tenant rules here share one) and nothing else,
//! measured side by side in one run.
//!
//! Starts its own `redis-server` on a free loopback port. For 1, 2 and 3
//! gcra rules, the calls go out `CALLS` times (64 in flight, 10,000 random
//! tenants of each rule count's own, every request admitted): the decision
//! exactly as sluice sends it (`FCALL`, its keys and packed arguments made
//! by the store's own code), the floor (`FCALL`, on keys of the same length
//! that are not the decision's), and both as scripts (`EVALSHA`, sluice's
//! fallback where functions are unavailable). Each of `RUNS` rounds
//! measures every rule count, so that a decision is compared with its
//! floor, and a rule count with the one before it, within one round.
//! Redis CPU per call is `usec_per_call` in `INFO commandstats`. Prints the
//! medians, and the medians of each round's ratio to the floor and of what
//! each further rule added in each round.
//!
//! With `--instructions` the cost is counted in thousands of instructions
//! Redis executes in the command instead (the server runs under valgrind's
//! callgrind; the same code counts the same to about 1%, where µs are
//! noisy on a shared machine).
//!
//! Run: `cargo run --release -p sluice-store --example redis_cost [-- --json]
//! [--instructions]` (`REDIS_COST_CALLS`, `REDIS_COST_RUNS` change the
//! defaults of 100,000 calls and 5 rounds, 5,000 and 1 when counting;
//! `REDIS_COST_RULES` the most rules, 3; `--json` prints one line per rule
//! count with every sample, for `scripts/bench.sh`). When counting,
//! `REDIS_COST_DUMPS=DIR` keeps each measurement's callgrind dump there for
//! `callgrind_annotate` (`N.out`, in the order measured: per rule count the
//! decision and the floor as functions, then as scripts); on a
//! `redis-server` built with symbols first on `PATH` it shows where a
//! call's instructions go.

use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy};
use sluice_store::redis::{DECIDE_LUA, Decide, DecideCall, Selection};
use sluice_store::{Batch, KeySet, TimeSource, Valve};
use sluice_testkit::{RedisServer, command_usec, replay};

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, not {v:?}"))
    })
}

/// The same commands as a gcra decision, no arithmetic: per key, not per
/// rule (rules of one scope share a key).
const FLOOR_BODY: &str = "local function floor(KEYS)
  local t = redis.call('TIME')
  for i = 1, #KEYS do
    redis.call('GET', KEYS[i])
    redis.call('SET', KEYS[i], t[1], 'PX', 61000)
  end
  return 1
end
";

/// Three gcra rules on the tenant (different limits, so different keys),
/// every request admitted.
const YAML: &str = r#"
default_plan: p
plans:
  p:
    tenant:
      - { algorithm: gcra, limit: 1000000, per: 1s, burst: 1000000 }
      - { algorithm: gcra, limit: 1000001, per: 1s, burst: 1000000 }
      - { algorithm: gcra, limit: 1000002, per: 1s, burst: 1000000 }
"#;

const TENANTS: u64 = 10_000;

/// The load: this many connections, each keeping `DEPTH` calls in flight.
const CONNECTIONS: usize = 4;
const DEPTH: usize = 16;

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let counting = std::env::args().any(|a| a == "--instructions");
    let calls = setting("REDIS_COST_CALLS", if counting { 5_000 } else { 100_000 });
    let runs = setting("REDIS_COST_RUNS", if counting { 1 } else { 5 });
    let most_rules = setting("REDIS_COST_RULES", 3).clamp(1, 3);
    let dumps = std::env::temp_dir().join(format!("redis-cost-{}", std::process::id()));
    let server = if counting {
        std::fs::create_dir_all(&dumps).expect("a directory for callgrind's dumps");
        RedisServer::start_under(&[
            "valgrind",
            "--tool=callgrind",
            "--compress-strings=no",
            "--toggle-collect=fcallCommand",
            "--toggle-collect=evalShaCommand",
            &format!("--callgrind-out-file={}", dumps.join("cg.out").display()),
        ])
    } else {
        RedisServer::start()
    };
    let meter = if counting {
        Meter::Instructions(&dumps)
    } else {
        Meter::Time
    };
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
    let policy = Policy::compile(&Config::from_yaml(YAML, "cost.yaml").expect("valid").limits);
    let all = policy.applicable("any", "GET /", false).rules;
    let keyer = Keyer::new("sl", &Pepper::parse(&[b'x'; 32]).expect("valid pepper"));
    // Each rule count decides for tenants of its own, so that a count's
    // values hold its records only (as a plan's would), whichever ran
    // before it.
    let tenants: Vec<Vec<String>> = (1..=most_rules)
        .map(|rules| {
            (0..TENANTS)
                .map(|t| format!("tenant-{rules}-{t:05}"))
                .collect()
        })
        .collect();
    // What sluice sends for a decision of `rules` rules for a tenant: its
    // keys, and the call's arguments after the function or script; or the
    // floor's call on keys of the same length that are not the decision's
    // (the floor writes what a decision could not read).
    let call = |rules: usize, tenant: u64, command: &str, name: &str, floor: bool| {
        let batch = Batch::new(&tenants[rules - 1][tenant as usize], None, 1, &all[..rules]);
        let buckets = KeySet::keys(&keyer, &batch, Valve::WHOLE);
        let mut keys = buckets.keys.into_vec();
        let mut cmd = redis::cmd(command);
        cmd.arg(name);
        if floor {
            // The same commands: one GET and one SET per key, however
            // many rules share it.
            keys.dedup();
            let keys: Vec<String> = keys.iter().map(|k| k.replacen("sl:", "fl:", 1)).collect();
            cmd.arg(keys.len()).arg(keys);
        } else {
            let time = TimeSource::Server;
            DecideCall::new(&batch, Selection::ALL, keys, &buckets.records, None, &time)
                .fill(&mut cmd);
        }
        cmd
    };
    let commands = [
        ("fcall", decide.function_name(), false),
        ("fcall", "floor", true),
        ("evalsha", decide_sha.as_str(), false),
        ("evalsha", floor_sha.as_str(), true),
    ];
    // Per rule count, the four commands' samples, one per round. A round
    // measures every rule count, so that a count is compared with its floor
    // and with the count before it as measured minutes apart at most, not
    // across the whole run (a shared machine drifts more than that).
    let mut samples: Vec<[Vec<f64>; 4]> = vec![Default::default(); most_rules];
    for _ in 0..runs {
        for (rules, of_rules) in (1..=most_rules).zip(samples.iter_mut()) {
            for (sample, (command, name, floor)) in of_rules.iter_mut().zip(commands) {
                sample.push(cost(&server, &mut conn, meter, calls, command, |t| {
                    call(rules, t, command, name, floor)
                }));
            }
        }
    }
    let suite = if counting {
        "redis_instructions"
    } else {
        "redis_cost"
    };
    if !json {
        println!(
            "{:<6} {:>8} {:>8} {:>6} {:>9}   {:>8} {:>8} {:>6} {:>9}",
            "rules", "FCALL", "floor", "ratio", "per rule", "EVALSHA", "floor", "ratio", "per rule"
        );
    }
    for (rules, of_rules) in (1..=most_rules).zip(&samples) {
        let [a, b, c, d] = of_rules;
        if json {
            println!(
                "{{\"suite\":\"{suite}\",\"rules\":{rules},\"fcall\":{a:?},\"fcall_floor\":{b:?},\"evalsha\":{c:?},\"evalsha_floor\":{d:?}}}"
            );
            continue;
        }
        // Ratios and steps of one round each, then their medians.
        let paired = |x: &[f64], y: &[f64], f: fn(f64, f64) -> f64| {
            median(x.iter().zip(y).map(|(x, y)| f(*x, *y)).collect())
        };
        let step = |of: usize| {
            (rules > 1).then(|| {
                let before = &samples[rules - 2][of];
                format!("{:+.1}", paired(&of_rules[of], before, |x, y| x - y))
            })
        };
        println!(
            "{rules:<6} {:>8.1} {:>8.1} {:>6.2} {:>9}   {:>8.1} {:>8.1} {:>6.2} {:>9}",
            median(a.clone()),
            median(b.clone()),
            paired(a, b, |x, y| x / y),
            step(0).unwrap_or_default(),
            median(c.clone()),
            median(d.clone()),
            paired(c, d, |x, y| x / y),
            step(2).unwrap_or_default(),
        );
    }
    // The server writes a last dump as it stops: stop it, then remove them.
    drop(conn);
    drop(server);
    let _ = std::fs::remove_dir_all(&dumps);
}

/// What a call's cost is measured in.
#[derive(Clone, Copy)]
enum Meter<'a> {
    /// Redis CPU µs (`usec_per_call`): what sizing needs, but noisy on a
    /// shared machine.
    Time,
    /// Thousands of instructions the server executes in the command
    /// (callgrind, dumps in this directory): the same code counts the same
    /// to about 1%, so a change worth a few percent shows.
    Instructions(&'a std::path::Path),
}

/// The cost per call of `command` (`fcall` or `evalsha`), each call made by
/// `call` for a tenant.
fn cost(
    server: &RedisServer,
    conn: &mut redis::Connection,
    meter: Meter<'_>,
    calls: usize,
    command: &str,
    call: impl Fn(u64) -> redis::Cmd + Sync,
) -> f64 {
    let Meter::Instructions(dumps) = meter else {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(conn)
            .expect("reset stats");
        replay(server.port(), CONNECTIONS, DEPTH, calls, TENANTS, call);
        let (ran, usec) = command_usec(conn, command).expect("command stats");
        assert!(ran >= calls as u64, "every call ran: {ran}");
        return usec as f64 / ran as f64;
    };
    // Every tenant's keys exist first (a fresh key is a cheaper call), then
    // only the measured calls are counted.
    replay(
        server.port(),
        CONNECTIONS,
        DEPTH,
        2 * TENANTS as usize,
        TENANTS,
        &call,
    );
    callgrind(server, "--zero");
    replay(server.port(), CONNECTIONS, DEPTH, calls, TENANTS, &call);
    callgrind(server, "--dump");
    // The dump just asked for; the files are removed so that the next
    // measurement finds only its own.
    let mut total = None;
    for entry in std::fs::read_dir(dumps).expect("callgrind's dumps") {
        let path = entry.expect("a dump").path();
        let text = std::fs::read_to_string(&path).expect("a readable dump");
        if text.contains("desc: Trigger: dump") {
            if let Ok(keep) = std::env::var("REDIS_COST_DUMPS") {
                let kept = std::fs::read_dir(&keep).map_or(0, Iterator::count);
                std::fs::write(format!("{keep}/{kept}.out"), &text).expect("a dump kept");
            }
            total = text
                .lines()
                .find_map(|l| l.strip_prefix("summary: "))
                .and_then(|v| v.trim().parse::<u64>().ok());
        }
        std::fs::remove_file(&path).expect("remove a dump");
    }
    let total = total.expect("callgrind wrote a dump with a summary");
    // replay sends the same number on each of its connections.
    let sent = calls.div_ceil(CONNECTIONS) * CONNECTIONS;
    total as f64 / sent as f64 / 1000.0
}

/// Runs `callgrind_control OPTION` on the server (zero or dump its counts).
fn callgrind(server: &RedisServer, option: &str) {
    let out = std::process::Command::new("callgrind_control")
        .arg(option)
        .arg(server.pid().to_string())
        .output()
        .expect("callgrind_control runs (install valgrind)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
