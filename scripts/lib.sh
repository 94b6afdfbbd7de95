# Shared by scripts/bench.sh and scripts/service_cpu.sh (sourced).

# A free loopback TCP port.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

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
