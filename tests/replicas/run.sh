#!/usr/bin/env bash
# Stateless replicas on a shared Redis cache (issue #27), on loopback: redis-server, the
# counting server (server.mjs), three `mcp-budget --listen --upstream` replicas with one cursor
# key and `--cache redis://…`, HAProxy with deploy/haproxy.cfg in front (2026-07-28 traffic on
# its round-robin backend), then clients.mjs: 30 TypeScript SDK v2 clients pinned to 2026-07-28
# page through large results while a replica is killed, then while Redis is stopped (see
# clients.mjs for what is checked). Installs redis-server and haproxy with apt-get when missing,
# and the SDK from package-lock.json (npm ci) when it is not installed yet.
#
# Environment: MCP_BUDGET_BIN (the proxy; default target/debug/mcp-budget, built when missing),
# REPLICAS_BYTES (each result's size, default 10000000: the issue's 10 MB; with debug replicas
# on 2 cores the scenario takes ~3 minutes), REPLICAS_CLIENTS (phase a's clients, default 30),
# REPLICAS_PROXY_ARGS (more arguments for every replica).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bytes="${REPLICAS_BYTES:-10000000}"
clients="${REPLICAS_CLIENTS:-30}"

fail() { echo "replicas: $*" >&2; exit 1; }

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null || ! command -v haproxy >/dev/null; then
  echo "replicas: installing redis-server and haproxy with apt-get"
  if ! (apt-get install -y -q redis-server haproxy >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q redis-server haproxy >/dev/null 2>&1)); then
    fail "cannot install redis-server and haproxy (apt-get install failed; is the package mirror reachable, and are we root?)"
  fi
fi
command -v node >/dev/null || fail "node is not installed (the server and clients run on it)"
command -v npm >/dev/null || fail "npm is not installed (needed to install the TypeScript SDK)"
command -v curl >/dev/null || fail "curl is not installed (needed to wait for the processes)"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
  || fail "node $(node --version) is too old for the TypeScript SDK v2 (it needs node >= 20)"

# The SDK, as package-lock.json pins it: installed once, then reused offline (a stamp names the
# lock it was installed from).
stamp="$here/node_modules/.installed-$(sha256sum "$here/package-lock.json" | cut -c1-16)"
if [ ! -f "$stamp" ] || [ ! -f "$here/node_modules/@modelcontextprotocol/client/package.json" ] \
  || [ ! -f "$here/node_modules/@modelcontextprotocol/server/package.json" ]; then
  echo "replicas: installing the TypeScript SDK v2 (package-lock.json) into $here/node_modules"
  (cd "$here" && npm ci --silent --no-audit --no-fund --prefer-offline) \
    || fail "cannot install the TypeScript SDK v2 (npm ci in $here; is the npm registry reachable?)"
  touch "$stamp"
fi

proxy="${MCP_BUDGET_BIN:-$root/target/debug/mcp-budget}"
if [ ! -x "$proxy" ]; then
  (cd "$root" && cargo build --quiet --bin mcp-budget) || fail "cannot build mcp-budget"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/mcp-budget-replicas-XXXXXX")"
pids=()
status=1
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$status" -ne 0 ]; then
    for log in "$work"/*.log; do
      [ -f "$log" ] || continue
      echo "--- $(basename "$log") (end)"
      tail -n 25 "$log"
    done
    echo "replicas: logs in $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A port free now, and not one this script handed out before (a closed port is often the next
# one the kernel picks; a CI rehearsal of the HAProxy scenario saw 'Address already in use').
# Sets $port: a command substitution would run it in a subshell, which forgets $given.
given=" "
free_port() {
  for _ in $(seq 1 20); do
    port="$(node -e 'const s = require("net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });')"
    case "$given" in *" $port "*) continue ;; esac
    given+="$port "
    return 0
  done
  fail "no free port found in 20 tries"
}

# Waits until a URL answers 200 (the process of pid $2 still running).
wait_http() {
  local url="$1" pid="$2" what="$3"
  for _ in $(seq 1 200); do
    curl -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || fail "$what exited before answering $url"
    sleep 0.1
  done
  fail "$what did not answer 200 on $url within 20 s"
}

started="$(date +%s)"

free_port; redis_port="$port"
redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work" --save '' --appendonly no \
  --maxmemory 1gb --maxmemory-policy allkeys-lru >"$work/redis.log" 2>&1 &
pids+=($!)
redis_pid=$!
for _ in $(seq 1 100); do
  [ "$(redis-cli -p "$redis_port" ping 2>/dev/null || true)" = PONG ] && break
  kill -0 "$redis_pid" 2>/dev/null || fail "redis-server exited at start"
  sleep 0.1
done
[ "$(redis-cli -p "$redis_port" ping 2>/dev/null || true)" = PONG ] || fail "redis-server does not answer PING on port $redis_port"

free_port; server_port="$port"
node "$here/server.mjs" --port "$server_port" --bytes "$bytes" 2>"$work/server.log" >/dev/null &
pids+=($!)
wait_http "http://127.0.0.1:$server_port/count" "$!" "the counting server"

# 32 random bytes as hex: raw bytes could begin or end with a byte the key reader trims as
# white space, leaving fewer than 32.
od -An -N32 -tx1 /dev/urandom | tr -d " \n" >"$work/cursor.key"
chmod 600 "$work/cursor.key"

# Every request reaches the replicas from HAProxy's address: one principal, so one rate limit
# (off here) and one shared-cache quota (raised above the scenario's ~400 MB).
replica_ports=() replica_pids=() replica_metrics=()
start_replica() { # $1: its index (0-2)
  local metrics
  free_port; metrics="$port"
  free_port
  # shellcheck disable=SC2086
  "$proxy" --listen "http://127.0.0.1:$port/mcp" --policy none --rate-limit 0 --metrics "127.0.0.1:$metrics" \
    --cursor-key-file "$work/cursor.key" --cache "redis://127.0.0.1:$redis_port/0" --cache-quota-bytes 1073741824 --cache-timeout-ms 5000 \
    ${REPLICAS_PROXY_ARGS:-} --upstream "http://127.0.0.1:$server_port/mcp" >"$work/replica-$(($1 + 1)).log" 2>&1 </dev/null &
  pids+=($!)
  # clients.mjs kills one: out of the job table, so that bash does not report it "Killed".
  disown $!
  replica_pids[$1]=$!
  replica_ports[$1]="$port"
  replica_metrics[$1]="http://127.0.0.1:$metrics/metrics"
}
for n in 0 1 2; do start_replica "$n"; done
# A replica that exits at start with 'Address already in use' lost a port to another process
# between free_port and its bind: it is started again on new ports, up to 5 times.
for n in 0 1 2; do
  for attempt in 1 2 3 4 5; do
    log="$work/replica-$((n + 1)).log"
    for _ in $(seq 1 200); do
      curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:${replica_ports[$n]}/healthz" 2>/dev/null && break 2
      kill -0 "${replica_pids[$n]}" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "${replica_pids[$n]}" 2>/dev/null; then
      fail "replica r$((n + 1)) did not answer 200 on /healthz within 20 s"
    fi
    if [ "$attempt" = 5 ] || ! grep -q "Address already in use" "$log"; then
      fail "replica r$((n + 1)) exited at start: $(tail -n 3 "$log")"
    fi
    echo "replicas: r$((n + 1)) exited at start ($(tail -n 1 "$log")); started again on new ports"
    start_replica "$n"
  done
done

free_port; front="$port"
FRONT_PORT="$front" REPLICA_1="${replica_ports[0]}" REPLICA_2="${replica_ports[1]}" REPLICA_3="${replica_ports[2]}" \
  haproxy -db -f "$root/deploy/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$front/healthz" "$!" "haproxy"
echo "replicas: redis-server, the counting server, 3 replicas and haproxy up in $(($(date +%s) - started)) s ($bytes bytes a result)"

join() { local IFS=,; echo "$*"; }
clients_status=0
node "$here/clients.mjs" --url "http://127.0.0.1:$front/mcp" --count-url "http://127.0.0.1:$server_port/count" \
  --bytes "$bytes" --clients "$clients" --replica-pids "$(join "${replica_pids[@]}")" \
  --replica-metrics "$(join "${replica_metrics[@]}")" --redis-cli "redis-cli -p $redis_port" || clients_status=$?
echo "replicas: $(($(date +%s) - started)) s in all"
status="$clients_status"
exit "$status"
