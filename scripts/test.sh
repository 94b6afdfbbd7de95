#!/usr/bin/env bash
# The README's test command: installs what the test suite starts and is
# missing (Debian's packages, with apt-get; through sudo when not root),
# then runs the whole suite. Arguments go to `cargo test --workspace`
# (e.g. `scripts/test.sh --test readme`). `.ci/run` runs this script.
set -euo pipefail
cd "$(dirname "$0")/.."

# The programs the tests start, each with the Debian package that has it
# (crates/sluice-server/tests/setup.rs checks this list against the tests).
needs=(
  redis-server:redis-server     # every Redis and Redis Cluster test
  redis-cli:redis-tools         # cluster creation and resharding
  prometheus:prometheus         # the dashboard and alerts, on a real Prometheus
  promtool:prometheus
  nginx:nginx                   # the gateway recipes, with the real gateways
  caddy:caddy
  haproxy:haproxy
  systemd-analyze:systemd       # the systemd unit is verified
  curl:curl                     # the README's and OPERATIONS' commands
  openssl:openssl
  python3:python3               # scripts/bench_report.py
  kill:procps                   # signals to the servers the tests start
)

# nginx and haproxy install to /usr/sbin, which a user's PATH may lack.
sbin=${SLUICE_TEST_SBIN-/usr/local/sbin:/usr/sbin:/sbin}
[ -n "$sbin" ] && export PATH="$PATH:$sbin"

missing=()
for need in "${needs[@]}"; do
  program=${need%%:*} package=${need#*:}
  if ! type -P "$program" >/dev/null; then
    case " ${missing[*]-} " in *" $package "*) ;; *) missing+=("$package") ;; esac
  fi
done

if ((${#missing[@]})); then
  echo "scripts/test.sh: installing ${missing[*]} (Debian packages the tests need)" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if ! type -P sudo >/dev/null; then
      echo "scripts/test.sh: not root and no sudo: install ${missing[*]} as root (apt-get install ${missing[*]}), then run again" >&2
      exit 1
    fi
    sudo="sudo"
  fi
  if ! type -P apt-get >/dev/null; then
    echo "scripts/test.sh: no apt-get here: install the programs of these Debian packages with your system's package manager, then run again: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; }; then
    echo "scripts/test.sh: apt-get could not install ${missing[*]}: install them by hand, then run again" >&2
    exit 1
  fi
fi

exec cargo test --workspace "$@"
