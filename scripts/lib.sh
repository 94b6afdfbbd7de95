# Shared by the scripts beside it (sourced).

# A free loopback TCP port; with N, N distinct ones on one line (the
# probes are held open until all are found, so none is handed out twice).
free_port() {
  python3 -c '
import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))
' "${1:-1}"
}

# A free loopback TCP port for a Redis Cluster node: below 55000, with its
# cluster bus port (+10000) free too.
cluster_port() {
  python3 -c '
import socket
for _ in range(200):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    if port >= 55000:
        continue
    bus = socket.socket()
    try:
        bus.bind(("127.0.0.1", port + 10000))
    except OSError:
        continue
    print(port); break
else:
    raise SystemExit("no free port for a cluster node")
'
}

# Starts a Redis Cluster of $2 masters (no replicas) on loopback, node
# directories under $1; appends the nodes' pids to the array pids and sets
# cluster_nodes to their URLs, comma-separated.
start_cluster() {
  local dir=$1 masters=$2 addresses="" port i
  cluster_nodes=""
  for i in $(seq "$masters"); do
    port=$(cluster_port)
    mkdir -p "$dir/$i"; rm -f "$dir/$i/nodes.conf"
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$i" --cluster-enabled yes \
      --cluster-config-file nodes.conf --save '' --appendonly no --daemonize no >/dev/null &
    pids+=($!)
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    addresses+=" 127.0.0.1:$port"
    cluster_nodes+="${cluster_nodes:+,}redis://127.0.0.1:$port"
  done
  # shellcheck disable=SC2086
  redis-cli --cluster create $addresses --cluster-yes >/dev/null
  for _ in $(seq 100); do
    redis-cli -p "$port" cluster info | grep -q 'cluster_state:ok' && return 0
    sleep 0.1
  done
  echo "the Redis Cluster under $dir did not come up" >&2
  return 1
}

# Writes to $1 the configuration both load against: one gcra rule per
# tenant that admits everything, on the memory store, or on the Redis at
# $2 when given (its pepper read from the environment variable $3), or on
# the Redis Cluster whose comma-separated node URLs $2 is when $4 is
# redis-cluster.
bench_config() {
  local storage=""
  if [ "${4:-redis}" = redis-cluster ]; then
    storage="storage: { backend: redis-cluster, nodes: [${2//,/, }] }
keys: { pepper_env: $3 }"
  elif [ -n "${2:-}" ]; then
    storage="storage: { backend: redis, url: \"$2\" }
keys: { pepper_env: $3 }"
  fi
  cat > "$1" <<YAML
$storage
default_plan: p
plans:
  p:
    routes:
      "*": [{ name: r, algorithm: gcra, limit: 1000000000, per: 1s }]
YAML
}

# Writes to $1 limitador-server's limits for the same load as bench_config's
# (the native domain `sluice`, one limit per tenant, every request
# admitted).
limitador_limits() {
  cat > "$1" <<YAML
- namespace: sluice
  max_value: 1000000000
  seconds: 1
  conditions: []
  variables: ["descriptors[0]['tenant']"]
YAML
}
