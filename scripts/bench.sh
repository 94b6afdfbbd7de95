#!/usr/bin/env bash
# Every figure of docs/BENCHMARKS.md's summary and of
# docs/benchmarks/side-by-side.md's tables in one command, on this machine:
# sluice in process against governor and limitador (criterion), Redis CPU
# per decision against a floor, sluice, limitador, rate-limiter-flexible (Node) and limits (Python) on one Redis
# this script starts on a free loopback port, service CPU over HTTP and
# gRPC (memory store, that Redis, and a 3-master Redis Cluster it starts
# too), and the highest rate with p99 under 5 ms per backend and API.
# The peers are installed from crates.io, npm and PyPI under target/bench
# (never committed). Results go to target/bench/results.jsonl, then
# scripts/bench_report.py rewrites both sections with medians, ratios and
# noise flags.
#
#   scripts/bench.sh [RUNS] [SECONDS]     (default 3 runs of 5 s each)
#   NO_REPORT=1 scripts/bench.sh          (measure, leave the docs alone)
#   LIMITADOR_BIN=PATH scripts/bench.sh   (also limitador-server's gRPC, in
#                                          memory: not on crates.io, so built
#                                          from its repository by hand)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}; seconds=${2:-5}
out=target/bench; mkdir -p "$out"
results=$out/results.jsonl; : > "$results"

# What the peers and the load need, from Debian's archive when missing
# (libclang-dev: limitador's Redis storage builds RocksDB, through bindgen).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v callgrind_control >/dev/null 2>&1 || missing+=(valgrind)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
# (libclang itself: libclang-cpp, which other packages bring, is not what bindgen loads)
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || missing+=(libclang-dev)
if ((${#missing[@]})); then
  echo "installing ${missing[*]}" >&2
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
step() { echo "== $* ($(date +%T))" >&2; }
. scripts/lib.sh

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

step "building (release)"
cargo build --release -q -p sluice-server -p sluice-store --examples --bins
cargo build --release -q --manifest-path bench/peers/Cargo.toml --target-dir target/peers --bins --benches

step "in process: sluice, governor, limitador (criterion)"
# criterion writes under the package's own target/ (bench/peers/target for the peers).
rm -rf target/criterion/embedded_decision bench/peers/target/criterion/one_limit_per_key
cargo bench -q -p sluice-store --bench decision -- --noplot >&2
cargo bench -q --manifest-path bench/peers/Cargo.toml --target-dir target/peers --bench embedded -- --noplot >&2
python3 - "$results" <<'PY'
import glob, json, os, sys
with open(sys.argv[1], "a") as out:
    for root in ("target/criterion/embedded_decision", "bench/peers/target/criterion/one_limit_per_key"):
      for path in glob.glob(f"{root}/**/new/estimates.json", recursive=True):
        est = json.load(open(path))
        group = os.path.basename(root)
        case = os.path.relpath(os.path.dirname(os.path.dirname(path)), root)
        out.write(json.dumps({"suite": "criterion", "group": group, "case": case,
                              "median_ns": est["median"]["point_estimate"],
                              "mad_ns": est["median_abs_dev"]["point_estimate"]}) + "\n")
PY

step "Redis CPU per decision against the floor"
REDIS_COST_CALLS=50000 REDIS_COST_RUNS=$runs target/release/examples/redis_cost --json >> "$results"
step "instructions per call against the floor (callgrind)"
target/release/examples/redis_cost --instructions --json >> "$results"

step "sluice and limitador on one Redis"
target/peers/release/redis_peers "$runs" "$seconds" >> "$results"

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
export REDIS_URL=redis://127.0.0.1:$redis_port

step "rate-limiter-flexible (npm)"
mkdir -p "$out/node"; cp bench/peers/node/package.json bench/peers/node/bench.mjs "$out/node/"
(cd "$out/node" && npm install --silent --no-audit --no-fund >&2)
node "$out/node/bench.mjs" "$runs" "$seconds" >> "$results"

step "limits (PyPI)"
[ -x "$out/venv/bin/python" ] || python3 -m venv "$out/venv"
"$out/venv/bin/pip" install -q -r bench/peers/python/requirements.txt >&2
"$out/venv/bin/python" bench/peers/python/bench.py "$runs" "$seconds" >> "$results"

step "service CPU per decision, HTTP and gRPC, memory store, Redis and Redis Cluster"
env -u REDIS_URL JSON=1 scripts/service_cpu.sh 4000 "$seconds" "$runs" >> "$results"
JSON=1 scripts/service_cpu.sh 4000 "$seconds" "$runs" >> "$results"
start_cluster "$out/cluster" 3
REDIS_CLUSTER_NODES=$cluster_nodes env -u REDIS_URL JSON=1 scripts/service_cpu.sh 4000 "$seconds" "$runs" >> "$results"

step "throughput with p99 under 5 ms, per backend and API"
config=$out/throughput.yaml
pepper=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
for backend in memory redis; do
  url=""; [ $backend = redis ] && url=$REDIS_URL
  bench_config "$config" "$url" BENCH_PEPPER
  read -r http grpc <<< "$(free_port 2)"
  BENCH_PEPPER=$pepper SLUICE_LOG=warn target/release/sluice serve --config "$config" \
    --http 127.0.0.1:$http --grpc 127.0.0.1:$grpc &
  serve=$!; pids+=($serve)
  for _ in $(seq 50); do curl -fs http://127.0.0.1:$http/healthz >/dev/null 2>&1 && break; sleep 0.1; done
  for run in $(seq "$runs"); do for api in http grpc; do
    target=http://127.0.0.1:$http; [ $api = grpc ] && target=http://127.0.0.1:$grpc
    # (exit status 1 when no rate kept p99 under 5 ms: recorded as 0/s, not fatal)
    { target/release/sluice bench --scenario throughput --api $api --target "$target" --tenants 10000 \
      --start-rate 2000 --seconds 2 --json || [ $? = 1 ]; } \
      | python3 -c "import json,sys; o=json.load(sys.stdin); print(json.dumps({'suite':'throughput','backend':'$backend','api':'$api','run':$run,'phases':[{'rate':p['offered_per_second'],'p50_us':p['classes'][0]['p50_us'],'p99_us':p['classes'][0]['p99_us'],'errors':p['classes'][0]['errors']} for p in o['phases']]}))" >> "$results"
  done; done
  kill $serve; wait $serve 2>/dev/null || true
done

{
  echo "{\"suite\":\"machine\",\"date\":\"$(date -u +%F)\",\"cpu\":\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)\",\"cores\":$(nproc),\"kernel\":\"$(uname -r)\",\"redis\":\"$(redis-server --version | grep -o 'v=[0-9.]*' | cut -d= -f2)\",\"rustc\":\"$(rustc --version | cut -d' ' -f2)\",\"node\":\"$(node --version)\",\"python\":\"$(python3 --version | cut -d' ' -f2)\",\"runs\":$runs,\"seconds\":$seconds,\"load\":$(cut -d' ' -f1 /proc/loadavg)}"
  for p in governor limitador; do
    v=$(grep -A1 "^name = \"$p\"" bench/peers/Cargo.lock | grep -o '"[0-9.]*"' | tr -d '"')
    echo "{\"suite\":\"version\",\"package\":\"$p\",\"version\":\"$v\"}"
  done
  echo "{\"suite\":\"version\",\"package\":\"rate-limiter-flexible\",\"version\":\"$(node -p "require('./$out/node/node_modules/rate-limiter-flexible/package.json').version")\"}"
  echo "{\"suite\":\"version\",\"package\":\"limits\",\"version\":\"$("$out/venv/bin/python" -c 'import limits; print(limits.__version__)')\"}"
} >> "$results"

if [ "${NO_REPORT:-}" != 1 ]; then
  python3 scripts/bench_report.py "$results" docs/BENCHMARKS.md
  step "docs/BENCHMARKS.md and docs/benchmarks/side-by-side.md rewritten from $results"
fi
