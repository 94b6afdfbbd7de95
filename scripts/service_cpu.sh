#!/usr/bin/env bash
# Service CPU per decision over HTTP and gRPC, side by side: starts
# `sluice serve` (memory store, one gcra rule per tenant, every request
# admitted) on free loopback ports, sends the same steady open-loop load
# over each API with `sluice bench --scenario steady`, and reads the
# service's CPU time (utime + stime, /proc) around each run, and of it
# the time in user space (utime).
#   scripts/service_cpu.sh [RATE] [SECONDS] [RUNS]   (default 5000 10 3)
# With JSON=1 each run is one JSON line (for scripts/bench.sh). SLUICE_BIN
# runs another build of the service (the load still comes from this tree's);
# REDIS_URL puts the service on that Redis instead of the memory store,
# REDIS_CLUSTER_NODES (comma-separated node URLs) on that Redis Cluster.
# LIMITADOR_BIN (a limitador-server binary; it is not on crates.io, build
# it from its repository) also measures limitador's gRPC RLS, in memory,
# under the same load: one limit per tenant, every request admitted.
# APIS (default "http grpc") lists what is measured: http, grpc, and
# reserve (each request a reservation on /v1/check, then its settle).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-5000}; seconds=${2:-10}; runs=${3:-3}
cargo build --release -q -p sluice-server
bench=target/release/sluice
bin=${SLUICE_BIN:-$bench}
. scripts/lib.sh
config=$(mktemp --suffix=.yaml)
store=memory; url=${REDIS_URL:-}
[ -n "$url" ] && store=redis
if [ -n "${REDIS_CLUSTER_NODES:-}" ]; then store=redis-cluster; url=$REDIS_CLUSTER_NODES; fi
export SERVICE_CPU_PEPPER=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
bench_config "$config" "$url" SERVICE_CPU_PEPPER "$store"
read -r http grpc peer_grpc peer_http <<< "$(free_port 4)"
SLUICE_LOG=warn "$bin" serve --config "$config" --http 127.0.0.1:$http --grpc 127.0.0.1:$grpc &
pid=$!
peer=""; limits=$(mktemp --suffix=.yaml)
if [ -n "${LIMITADOR_BIN:-}" ] && [ $store != memory ]; then
  echo "LIMITADOR_BIN: limitador is measured in memory only; left out with $store" >&2
elif [ -n "${LIMITADOR_BIN:-}" ]; then
  limitador_limits "$limits"
  RUST_LOG=warn "$LIMITADOR_BIN" --rls-ip 127.0.0.1 --rls-port "$peer_grpc" \
    --http-ip 127.0.0.1 --http-port "$peer_http" "$limits" memory >/dev/null 2>&1 &
  peer=$!
fi
trap 'kill $pid $peer 2>/dev/null; rm -f "$config" "$limits"' EXIT
sleep 1
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' /proc/${1:-$pid}/stat; }
ucpu() { awk '{print $14}' /proc/${1:-$pid}/stat; }
for run in $(seq "$runs"); do
  apis=${APIS:-http grpc}; [ -n "$peer" ] && apis="$apis limitador"
  for api in $apis; do
    target=http://127.0.0.1:$http; [ $api = grpc ] && target=http://127.0.0.1:$grpc
    server=$pid; kind=$api
    if [ $api = limitador ]; then target=http://127.0.0.1:$peer_grpc; server=$peer; kind=grpc; fi
    before=$(cpu $server); ubefore=$(ucpu $server)
    sent=$("$bench" bench --scenario steady --api $kind --target "$target" --tenants 10000 \
      --start-rate "$rate" --seconds "$seconds" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["phases"][0]["classes"][0]["allowed"])')
    after=$(cpu $server); uafter=$(ucpu $server)
    if [ "${JSON:-}" = 1 ]; then
      python3 -c "import json; print(json.dumps({'suite': 'service_cpu', 'store': '$store', 'api': '$api', 'run': $run, 'rate': $rate, 'decisions': $sent, 'service_us_per_decision': round(($after-$before)/$ticks*1e6/$sent, 2), 'service_user_us_per_decision': round(($uafter-$ubefore)/$ticks*1e6/$sent, 2)}))"
    else
      python3 -c "print(f'run $run $api: {($after-$before)/$ticks*1e6/$sent:.1f} µs service CPU per decision, {($uafter-$ubefore)/$ticks*1e6/$sent:.1f} of it in user space ({$sent} decisions at $rate/s)')"
    fi
  done
done
