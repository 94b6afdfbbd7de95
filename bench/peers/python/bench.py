"""The Python `limits` package under the load the other peers get: one
fixed-window limit per key over 10,000 keys, every request admitted, in
memory and on the Redis at REDIS_URL, from one thread (the package's
synchronous API, as a WSGI worker calls it). One JSON line per run.

Usage: REDIS_URL=redis://127.0.0.1:PORT python bench.py RUNS SECONDS
"""

import json
import os
import sys
import time

import redis
from limits import RateLimitItemPerSecond, storage, strategies

KEYS = 10_000


def commandstats(admin):
    total = 0
    for name, stats in admin.info("commandstats").items():
        if name not in ("cmdstat_info",) and not name.startswith("cmdstat_config"):
            total += stats["usec"]
    cpu = admin.info("cpu")
    return total, (cpu["used_cpu_user"] + cpu["used_cpu_sys"]) * 1e6


def measure(limiter, item, seconds, admin):
    if admin:
        admin.config_resetstat()
        before = commandstats(admin)
    keys = [f"tenant-{i:05}" for i in range(KEYS)]
    decisions, i = 0, 0
    started = time.perf_counter()
    until = started + seconds
    while time.perf_counter() < until:
        for _ in range(100):
            i = (i + 104_729) % KEYS
            assert limiter.hit(item, keys[i]), "every request is admitted"
        decisions += 100
    elapsed = time.perf_counter() - started
    line = {"suite": "python_peers", "decisions_per_s": round(decisions / elapsed)}
    if admin:
        after = commandstats(admin)
        line["redis_command_us_per_decision"] = round(after[0] / decisions, 2)
        line["redis_process_us_per_decision"] = round((after[1] - before[1]) / decisions, 2)
    return line


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 5
    url = os.environ["REDIS_URL"]
    item = RateLimitItemPerSecond(1_000_000_000)
    admin = redis.Redis.from_url(url)
    backends = [
        ("memory", strategies.FixedWindowRateLimiter(storage.MemoryStorage()), None),
        ("redis", strategies.FixedWindowRateLimiter(storage.RedisStorage(url)), admin),
    ]
    for run in range(1, runs + 1):
        for backend, limiter, stats in backends:
            line = measure(limiter, item, seconds, stats)
            line.update(peer="limits_fixed_window", backend=backend, run=run)
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
