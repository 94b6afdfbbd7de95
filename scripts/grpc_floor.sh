#!/usr/bin/env bash
# Instructions per request of a canned gRPC answer (examples/grpc_floor.rs:
# `ShouldRateLimit` answered OK without a decision), through hyper's HTTP/2
# server, straight on h2, and through hyper with its streams run in the
# connection's task (inline), counted the way scripts/service_instructions.sh
# counts the service: under valgrind's callgrind, loaded by `sluice bench
# --scenario steady --api grpc --start-rate 200` for 1 s and for 5 s; the
# difference of the two totals over the 800 requests between them is one
# request's cost. Compare with `scripts/service_instructions.sh grpc` and
# `http`, the same load through the service.
#   scripts/grpc_floor.sh [RUNS]   (default 3)
# Needs valgrind (apt-get install valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
cargo build --release -q -p sluice-server --example grpc_floor
cargo build --release -q -p sluice-server
. scripts/lib.sh

# Instructions callgrind counted for a floor that served `seconds` of load.
count() {
  local mode=$1 seconds=$2 port log pid
  port=$(free_port); log=$(mktemp)
  # It serves for the load's length plus time to start under valgrind.
  valgrind --tool=callgrind --callgrind-out-file=/dev/null \
    target/release/examples/grpc_floor "$mode" "$port" $((seconds + 8)) 2>"$log" &
  pid=$!
  for _ in $(seq 60); do
    python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "$port" 2>/dev/null && break
    sleep 0.25
  done
  target/release/sluice bench --scenario steady --api grpc --target "http://127.0.0.1:$port" \
    --tenants 10000 --start-rate 200 --seconds "$seconds" >/dev/null 2>&1
  wait $pid
  awk '/Collected :/ { print $4 }' "$log"
  rm -f "$log"
}

for run in $(seq "$runs"); do
  for mode in hyper h2 inline; do
    small=$(count "$mode" 1); large=$(count "$mode" 5)
    echo "$mode run $run: $(( (large - small) / 800 )) instructions per request"
  done
done
