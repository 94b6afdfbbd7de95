// rate-limiter-flexible under the load the other peers get: one limit per
// key over 10,000 keys, every request admitted, 64 concurrent callers in
// one process, in memory and on the Redis at REDIS_URL. One JSON line per
// run. Usage: REDIS_URL=redis://127.0.0.1:PORT node bench.mjs RUNS SECONDS
import Redis from 'ioredis';
import { RateLimiterMemory, RateLimiterRedis } from 'rate-limiter-flexible';

const [runs, seconds] = [Number(process.argv[2] ?? 3), Number(process.argv[3] ?? 5)];
const url = process.env.REDIS_URL;
const KEYS = 10000, CALLERS = 64;
const keys = Array.from({ length: KEYS }, (_, i) => `tenant-${String(i).padStart(5, '0')}`);

const admin = new Redis(url);
const store = new Redis(url, { enableOfflineQueue: true });

async function stats() {
  const commands = await admin.info('commandstats');
  let us = 0;
  for (const line of commands.split('\n')) {
    const m = line.match(/^cmdstat_([^:]+):.*?usec=(\d+)/);
    if (m && m[1] !== 'info' && !m[1].startsWith('config')) us += Number(m[2]);
  }
  const cpu = await admin.info('cpu');
  const get = (k) => Number((cpu.match(new RegExp(`${k}:([0-9.]+)`)) ?? [0, 0])[1]);
  return { us, cpu: (get('used_cpu_user') + get('used_cpu_sys')) * 1e6 };
}

async function measure(limiter, redis) {
  if (redis) await admin.config('RESETSTAT');
  const before = redis ? await stats() : null;
  let decisions = 0;
  const started = performance.now();
  const until = started + seconds * 1000;
  await Promise.all(Array.from({ length: CALLERS }, async (_, c) => {
    let i = c * 7919;
    while (performance.now() < until) {
      i = (i + 104729) % KEYS;
      await limiter.consume(keys[i], 1); // rejects when limited: never here
      decisions++;
    }
  }));
  const elapsed = (performance.now() - started) / 1000;
  const line = { suite: 'node_peers', decisions_per_s: Math.round(decisions / elapsed) };
  if (redis) {
    const after = await stats();
    line.redis_command_us_per_decision = Number((after.us / decisions).toFixed(2));
    line.redis_process_us_per_decision = Number(((after.cpu - before.cpu) / decisions).toFixed(2));
  }
  return line;
}

const memory = new RateLimiterMemory({ points: 1e9, duration: 1 });
const onRedis = new RateLimiterRedis({ storeClient: store, points: 1e9, duration: 1, keyPrefix: 'rlf' });
for (let run = 1; run <= runs; run++) {
  for (const [backend, limiter] of [['memory', memory], ['redis', onRedis]]) {
    const line = await measure(limiter, backend === 'redis');
    console.log(JSON.stringify({ ...line, peer: 'rate_limiter_flexible', backend, run }));
  }
}
admin.disconnect();
store.disconnect();
