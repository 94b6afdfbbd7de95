//! Load against a server: many threads at once, many pipelined commands.

/// Runs `work` on `threads` new threads at once and calls `meanwhile` once
/// every thread has returned from it but before any ends, while what
/// `work` keeps (its second value: a runtime, say) still stands. Returns
/// whether `work` said true on every thread, and what `meanwhile` returned.
pub fn while_threads_stand<K, T>(
    threads: usize,
    work: impl Fn() -> (bool, K) + Send + Sync + 'static,
    meanwhile: impl FnOnce() -> T,
) -> (bool, T) {
    use std::sync::{Arc, Barrier};
    let work = Arc::new(work);
    let (worked, seen) = (
        Arc::new(Barrier::new(threads + 1)),
        Arc::new(Barrier::new(threads + 1)),
    );
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (work, worked, seen) = (work.clone(), worked.clone(), seen.clone());
            std::thread::spawn(move || {
                let (ok, kept) = work();
                worked.wait();
                seen.wait();
                drop(kept);
                ok
            })
        })
        .collect();
    worked.wait();
    let result = meanwhile();
    seen.wait();
    let oks: Vec<bool> = handles
        .into_iter()
        .map(|h| h.join().expect("a working thread"))
        .collect();
    (oks.into_iter().all(|ok| ok), result)
}

/// A load like `redis-benchmark -c 64 -r TENANTS` for commands it cannot
/// send (binary arguments): `calls` commands to the server on `port`,
/// `command(tenant)` making each for a tenant drawn at random below
/// `tenants`, over `connections` connections that each keep `depth`
/// commands in flight (pipelined). Panics on an error reply. Returns calls
/// per second.
pub fn replay(
    port: u16,
    connections: usize,
    depth: usize,
    calls: usize,
    tenants: u64,
    command: impl Fn(u64) -> redis::Cmd + Sync,
) -> f64 {
    let started = std::time::Instant::now();
    let per_connection = calls.div_ceil(connections);
    std::thread::scope(|scope| {
        for c in 0..connections {
            let command = &command;
            scope.spawn(move || {
                let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                    .expect("a loopback URL");
                let mut conn = client.get_connection().expect("connects");
                // splitmix64: a different stream per connection.
                let mut seed = 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(c as u64 + 1);
                let mut next = move || {
                    seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = seed;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    z ^ (z >> 31)
                };
                let mut sent = 0;
                while sent < per_connection {
                    let mut pipe = redis::pipe();
                    for _ in 0..depth.min(per_connection - sent) {
                        pipe.add_command(command(next() % tenants));
                        sent += 1;
                    }
                    let _: Vec<redis::Value> = pipe.query(&mut conn).expect("every call succeeds");
                }
            });
        }
    });
    (per_connection * connections) as f64 / started.elapsed().as_secs_f64()
}
