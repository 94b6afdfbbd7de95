#!/usr/bin/env bash
# Instructions the service executes per decision, counted rather than
# timed (the count moves a few percent between runs; CPU time on a shared
# machine moves more): `sluice serve` (memory store, one gcra rule per
# tenant) under valgrind's callgrind, loaded by `sluice bench --scenario
# steady --start-rate 200` for 1 s and for 5 s; the difference of the two
# totals over the 800 requests between them is one request's cost, start-up
# and first requests cancelled out. The clock's calibration at start-up
# (quanta's, a loop bounded in time, so of a varying length under
# callgrind: 10-16 million instructions, several thousand a request) is
# left out of both totals.
#   scripts/service_instructions.sh [API] [RUNS]   (API http, grpc or
#   limitador; default grpc 3)
# API limitador counts LIMITADOR_BIN (a limitador-server binary, as
# scripts/service_cpu.sh takes it) in memory under the same gRPC load:
# one limit per tenant, every request admitted.
# SLUICE_BIN counts another build of the service (the load still comes
# from this tree's); SERVICE_INSTRUCTIONS_TRACES=1 counts it with tracing
# on and every request sampled (OTEL_TRACES_SAMPLER=always_on), its spans
# exported over OTLP/HTTP to a sink on loopback that accepts every batch
# (the export's work is counted with the rest);
# SERVICE_INSTRUCTIONS_DUMPS=DIR keeps callgrind's dumps
# there (API-SECONDS-RUN.out, for callgrind_annotate). Needs valgrind
# (apt-get install valgrind, which brings callgrind_annotate).
set -euo pipefail
cd "$(dirname "$0")/.."
api=${1:-grpc}; runs=${2:-3}
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
cargo build --release -q -p sluice-server
bench=target/release/sluice
bin=${SLUICE_BIN:-$bench}
. scripts/lib.sh
config=$(mktemp --suffix=.yaml)
export SERVICE_INSTRUCTIONS_PEPPER=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
bench_config "$config" "" SERVICE_INSTRUCTIONS_PEPPER memory
limits=$(mktemp --suffix=.yaml)
if [ "$api" = limitador ]; then
  [ -x "${LIMITADOR_BIN:-}" ] || { echo "API limitador needs LIMITADOR_BIN, a limitador-server binary" >&2; exit 1; }
  limitador_limits "$limits"
fi

# With SERVICE_INSTRUCTIONS_TRACES=1: an OTLP/HTTP sink answering every
# export with an empty ExportTraceServiceResponse, and sluice pointed at it.
if [ "${SERVICE_INSTRUCTIONS_TRACES:-}" = 1 ]; then
  [ "$api" = limitador ] && { echo "traces are sluice's: not with API limitador" >&2; exit 1; }
  sink=$(free_port 1)
  python3 - "$sink" <<'PY' &
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
  sink_pid=$!
  trap 'kill $sink_pid 2>/dev/null || true' EXIT
  export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$sink OTEL_TRACES_SAMPLER=always_on
fi

# Instructions callgrind counted for a service that served `seconds` of load.
count() {
  local seconds=$1 run=$2 http grpc pid target log dump
  read -r http grpc <<< "$(free_port 2)"; log=$(mktemp)
  dump=$dumps/$api-$seconds-$run.out
  if [ "$api" = limitador ]; then
    RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$dump" \
      "$LIMITADOR_BIN" --rls-ip 127.0.0.1 --rls-port $grpc --http-ip 127.0.0.1 \
      --http-port $http "$limits" memory 2>"$log" >/dev/null &
  else
    SLUICE_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$dump" \
      "$bin" serve --config "$config" --http 127.0.0.1:$http --grpc 127.0.0.1:$grpc 2>"$log" &
  fi
  pid=$!
  for _ in $(seq 120); do
    python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' $grpc 2>/dev/null && break
    sleep 0.5
  done
  target=http://127.0.0.1:$http kind=$api
  [ "$api" != http ] && target=http://127.0.0.1:$grpc kind=grpc
  "$bench" bench --scenario steady --api $kind --target $target --tenants 10000 \
    --start-rate 200 --seconds "$seconds" >/dev/null 2>&1
  kill -INT $pid; wait $pid || true
  rm -f "$log"
  # The total, less the clock's calibration.
  callgrind_annotate --inclusive=yes "$dump" 2>/dev/null \
    | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
           /quanta::Clock::new \[/ { gsub(",", "", $1); calibration += $1 }
           END { print total - calibration }'
}

dumps=${SERVICE_INSTRUCTIONS_DUMPS:-$(mktemp -d)}
mkdir -p "$dumps"
for run in $(seq "$runs"); do
  small=$(count 1 "$run"); large=$(count 5 "$run")
  echo "$api run $run: $(( (large - small) / 800 )) instructions per request"
done
rm -f "$config" "$limits"
[ -n "${SERVICE_INSTRUCTIONS_DUMPS:-}" ] || rm -rf "$dumps"
