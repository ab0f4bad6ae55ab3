#!/usr/bin/env bash
# Replicas behind HAProxy: three `mcp-budget --listen` replicas (one shared cursor key) behind
# HAProxy with deploy/haproxy.cfg, on loopback; 30 concurrent sessions through it. See
# scenario.py for what is checked. Installs haproxy with apt-get when it is missing.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

if ! command -v haproxy >/dev/null; then
  echo "haproxy: installing it with apt-get"
  if ! (apt-get install -y -q haproxy >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q haproxy >/dev/null 2>&1)); then
    echo "haproxy: cannot install it (apt-get install haproxy failed; is the package mirror reachable, and are we root?)" >&2
    exit 1
  fi
fi
command -v python3 >/dev/null || { echo "haproxy: python3 is needed for the scenario" >&2; exit 1; }

proxy="${MCP_BUDGET_BIN:-$root/target/debug/mcp-budget}"
server="$root/target/debug/examples/quirky_server"
if [ ! -x "$proxy" ] || [ ! -x "$server" ]; then
  (cd "$root" && cargo build --quiet --bin mcp-budget --example quirky_server)
fi

exec python3 "$here/scenario.py" --proxy "$proxy" --server "$server" --config "$root/deploy/haproxy.cfg"
