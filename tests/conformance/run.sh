#!/usr/bin/env bash
# The official MCP conformance suite (@modelcontextprotocol/conformance, server scenarios)
# against the project's conformance target (target.mjs, the official TypeScript SDK):
#   1. directly (the target over Streamable HTTP);
#   2. through `mcp-budget --listen`, the target a stdio child;
#   3. through `mcp-budget --listen --upstream`, the target over Streamable HTTP.
# The proxy must pass every scenario the direct run passes, and server-sse-polling (SSE
# resumability, from the pending suite) with no warning. A scenario that fails is run again
# alone, up to twice (some elicitation scenarios are timing-flaky even directly).
# Pinned versions are installed into a cache folder later runs reuse.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${MCP_BUDGET_CONFORMANCE_CACHE:-$HOME/.cache/mcp-budget-conformance}"
suite="@modelcontextprotocol/conformance@0.1.16"
node22="node@22"  # the suite needs Node >= 22 (fs.globSync); the target runs on any node >= 20

fail() { echo "conformance: $*" >&2; exit 1; }
command -v node >/dev/null || fail "node is not installed"
command -v npm >/dev/null || fail "npm is not installed"

mkdir -p "$cache"
stamp="$cache/installed-$(cat "$here/package-lock.json" <(echo "$suite $node22") | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "conformance: installing $suite, $node22 and the target's SDK into $cache"
  rm -rf "$cache/suite" "$cache/target"
  mkdir -p "$cache/suite" "$cache/target"
  (cd "$cache/suite" && npm install --silent --no-audit --no-fund --no-save "$suite" "$node22") \
    || fail "cannot install $suite and $node22 from the npm registry (is it reachable?)"
  cp "$here/package.json" "$here/package-lock.json" "$cache/target/"
  (cd "$cache/target" && npm ci --silent --no-audit --no-fund) \
    || fail "cannot install the target's dependencies (npm ci in $cache/target)"
  touch "$stamp"
fi
# ES modules resolve packages next to the file: the target runs from the cache folder.
cp "$here/target.mjs" "$cache/target/target.mjs"
target="$cache/target/target.mjs"
suite_node="$cache/suite/node_modules/.bin/node"
suite_bin="$cache/suite/node_modules/@modelcontextprotocol/conformance/dist/index.js"
[ -x "$suite_node" ] || fail "Node 22 is missing from $cache/suite (delete $stamp to reinstall)"
[ -f "$suite_bin" ] || fail "the suite is missing from $cache/suite (delete $stamp to reinstall)"

proxy="${MCP_BUDGET_BIN:-$root/target/debug/mcp-budget}"
if [ ! -x "$proxy" ]; then
  (cd "$root" && cargo build --quiet --bin mcp-budget) || fail "cannot build mcp-budget"
fi

work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# Waits for a line "listening on URL" in a file; prints the URL.
wait_url() {
  local file="$1" url=""
  for _ in $(seq 1 100); do
    url="$(grep -o 'listening on http://[^ ]*' "$file" 2>/dev/null | head -1 | cut -d' ' -f3 || true)"
    [ -n "$url" ] && { echo "$url"; return 0; }
    sleep 0.1
  done
  fail "nothing listened (see $file)"
}

# Each starter runs in this shell (not in a command substitution, which would wait for the
# background process's stdout) and sets $url.
start_target() {
  local log="$work/target-$1.log"
  node "$target" --port 0 >/dev/null 2>"$log" &
  pids+=($!)
  url="$(wait_url "$log")"
}

start_proxy() {  # $1: name, then the proxy's upstream arguments
  local name="$1"; shift
  local out="$work/proxy-$name.out"
  "$proxy" --policy none --listen http://127.0.0.1:0/mcp "$@" >"$out" 2>"$work/proxy-$name.log" </dev/null &
  pids+=($!)
  url="$(wait_url "$out")"
}

# Runs the suite against a URL; writes "scenario passed failed" lines to $2.
run_suite() {
  local url="$1" results="$2" log="$3"
  (cd "$work" && "$suite_node" "$suite_bin" server --url "$url" >"$log" 2>&1) || true
  sed -E 's/\x1b\[[0-9;]*m//g' "$log" \
    | grep -E '^[^ ]+ [a-z0-9-]+: [0-9]+ passed, [0-9]+ failed' \
    | sed -E 's/^[^ ]+ ([a-z0-9-]+): ([0-9]+) passed, ([0-9]+) failed.*/\1 \2 \3/' >"$results"
  [ -s "$results" ] || { tail -30 "$log" >&2; fail "the suite reported no scenarios against $url (log: $log)"; }
}

# Runs one scenario alone; prints "passed failed warnings".
run_one() {
  local url="$1" scenario="$2" log
  log="$work/one-$scenario-$RANDOM.log"
  (cd "$work" && "$suite_node" "$suite_bin" server --url "$url" --scenario "$scenario" >"$log" 2>&1) || true
  sed -E 's/\x1b\[[0-9;]*m//g' "$log" \
    | grep -E 'Passed: [0-9]+/[0-9]+, [0-9]+ failed, [0-9]+ warnings' \
    | sed -E 's/.*Passed: ([0-9]+)\/[0-9]+, ([0-9]+) failed, ([0-9]+) warnings.*/\1 \2 \3/' \
    | tail -1
}

# A scenario passes when it has no failed check, here or when run again alone (twice at most).
passes() {
  local url="$1" scenario="$2" results="$3" line
  line="$(grep -E "^$scenario " "$results" || true)"
  [ -n "$line" ] && [ "$(echo "$line" | cut -d' ' -f3)" = "0" ] && return 0
  for _ in 1 2; do
    line="$(run_one "$url" "$scenario")"
    [ -n "$line" ] && [ "$(echo "$line" | cut -d' ' -f2)" = "0" ] && return 0
  done
  return 1
}

echo "conformance: direct"
start_target direct
direct_url="$url"
run_suite "$direct_url" "$work/direct.txt" "$work/direct.log"
expected=()
while read -r scenario _ _; do
  if passes "$direct_url" "$scenario" "$work/direct.txt"; then
    expected+=("$scenario")
  else
    echo "conformance: $scenario fails directly against the target (not required of the proxy)"
  fi
done <"$work/direct.txt"
echo "conformance: ${#expected[@]} of $(wc -l <"$work/direct.txt") scenarios pass directly"
[ "${#expected[@]}" -gt 0 ] || fail "no scenario passes directly: the target is broken"

start_target upstream
upstream_url="$url"
failed=0
for mode in stdio http; do
  if [ "$mode" = stdio ]; then
    start_proxy stdio -- node "$target" --stdio
  else
    start_proxy http --upstream "$upstream_url"
  fi
  echo "conformance: through mcp-budget --listen, upstream over $mode"
  run_suite "$url" "$work/proxy-$mode.txt" "$work/proxy-$mode-suite.log"
  ok=0
  for scenario in "${expected[@]}"; do
    if passes "$url" "$scenario" "$work/proxy-$mode.txt"; then
      ok=$((ok + 1))
    else
      echo "FAIL ($mode): $scenario passes directly but not through the proxy" >&2
      grep -E "^$scenario " "$work/proxy-$mode.txt" >&2 || true
      failed=$((failed + 1))
    fi
  done
  echo "conformance: upstream over $mode: $ok of ${#expected[@]} pass through the proxy"
  # Resumable SSE (priming event, retry, Last-Event-ID): no failure and no warning.
  polling="$(run_one "$url" server-sse-polling)"
  if [ -z "$polling" ] || [ "$(echo "$polling" | cut -d' ' -f2)" != "0" ] || [ "$(echo "$polling" | cut -d' ' -f3)" != "0" ]; then
    echo "FAIL ($mode): server-sse-polling through the proxy: passed/failed/warnings = ${polling:-none}" >&2
    failed=$((failed + 1))
  else
    echo "conformance: upstream over $mode: server-sse-polling passes with no warning"
  fi
done

if [ "$failed" -gt 0 ]; then
  echo "conformance: $failed failure(s); logs in $work" >&2
  exit 1
fi
echo "conformance: the proxy passes everything the direct run passes, in both upstream modes"
