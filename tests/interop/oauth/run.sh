#!/usr/bin/env bash
# Interop of mcp-budget's OAuth sign-in (`--upstream URL` to a server that requires a token):
# the official TypeScript SDK v2 client over stdio through the proxy (client.mjs), against a
# local OAuth-protected MCP server built on the TypeScript SDK v2's resource-server auth
# support, with a tiny authorization server in the same process (server.mjs). The proxy signs
# in (discovery, dynamic registration, the browser step with ../../conformance/auth-browser.mjs
# as $BROWSER, PKCE, the resource indicator), lists, calls, refreshes after expiry and after a
# revoked token's 401, pages a 3 MB result, and a second proxy uses the kept sign-in; see
# client.mjs for every assertion.
#
# The client runs once per entry of OAUTH_MODES, each with a fresh state directory, against
# one server. An entry is the client's mode (legacy: the initialize handshake; auto: probe,
# then fall back; pinned: 2026-07-28 only), optionally /ERA, the proxy's --server-era (legacy,
# modern; without it the proxy learns the era, and the server, which serves both, answers it
# as 2026-07-28). Default "legacy pinned legacy/legacy": the two client eras, and the
# 2025-11-25 upstream (initialize, sessions) signed in too.
# The SDK is the one ../v2/package-lock.json pins, installed into a cache folder of its own
# ($MCP_BUDGET_INTEROP_CACHE/oauth, default ~/.cache/mcp-budget-interop/oauth) that later runs
# reuse. The last line is the total, "N passed, M failed"; the exit status is the clients'
# (non-zero on any failure). No process it started outlives it, whatever way it ends.
#
# Knobs (environment): OAUTH_MODES (above), OAUTH_TOKEN_TTL_SECS (the access tokens' lifetime,
# default 3), OAUTH_RUST_LOG (the proxy's RUST_LOG, default info; its stderr is kept in the work
# folder and its tail shown on a failure), OAUTH_BUDGET_BYTES and OAUTH_TIMEOUT_MS (client.mjs),
# MCP_BUDGET_BIN (the proxy, default target/debug/mcp-budget).
# e.g. OAUTH_MODES=pinned OAUTH_RUST_LOG=debug bash tests/interop/oauth/run.sh
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
cache="${MCP_BUDGET_INTEROP_CACHE:-$HOME/.cache/mcp-budget-interop}/oauth"
modes="${OAUTH_MODES:-legacy pinned legacy/legacy}"
ttl="${OAUTH_TOKEN_TTL_SECS:-3}"

fail() { echo "oauth interop: $*" >&2; exit 1; }

command -v node >/dev/null || fail "node is not installed"
command -v npm >/dev/null || fail "npm is not installed"
command -v setsid >/dev/null || fail "setsid is not installed (util-linux)"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
  || fail "node $(node --version) is too old for the TypeScript SDK v2 (it needs node >= 20)"
for entry in $modes; do
  case "$entry" in
    legacy | auto | pinned | legacy/legacy | auto/legacy | pinned/legacy | legacy/modern | auto/modern | pinned/modern) ;;
    *) fail "unknown entry '$entry' in OAUTH_MODES (legacy, auto or pinned, each optionally /legacy or /modern)" ;;
  esac
done
[[ "$ttl" =~ ^[0-9]+$ ]] && [ "$ttl" -ge 2 ] || fail "OAUTH_TOKEN_TTL_SECS must be a number of seconds, at least 2"
browser_script="$root/tests/conformance/auth-browser.mjs"
[ -f "$browser_script" ] || fail "$browser_script is missing"
node_bin="$(command -v node)"
# mcp-budget splits $BROWSER at whitespace.
[[ "$node_bin $browser_script" != *" "*" "* ]] || fail "node's path or the repository's has a space: \$BROWSER cannot hold it"

mkdir -p "$cache"
stamp="$cache/installed-$(cat "$root/tests/interop/v2/package-lock.json" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "oauth interop: installing the TypeScript SDK v2 (../v2/package-lock.json) into $cache"
  find "$cache" -mindepth 1 -delete
  cp "$root/tests/interop/v2/package.json" "$root/tests/interop/v2/package-lock.json" "$cache/"
  (cd "$cache" && npm ci --silent --no-audit --no-fund) \
    || fail "cannot install the TypeScript SDK v2 (npm ci in $cache; is the npm registry reachable?)"
  touch "$stamp"
fi
for package in client server; do
  [ -f "$cache/node_modules/@modelcontextprotocol/$package/package.json" ] \
    || fail "@modelcontextprotocol/$package is missing from $cache (delete $stamp to reinstall)"
done
# ES modules resolve packages next to the file: the scripts run from the cache.
cp "$here/server.mjs" "$here/client.mjs" "$here/content.mjs" "$cache/"

proxy="${MCP_BUDGET_BIN:-$root/target/debug/mcp-budget}"
if [ ! -x "$proxy" ]; then
  (cd "$root" && cargo build --quiet --bin mcp-budget) || fail "cannot build mcp-budget"
fi
proxy="$(cd "$(dirname "$proxy")" && pwd)/$(basename "$proxy")"
[[ "$("$proxy" --help 2>&1 || true)" == *--upstream-client-id* ]] \
  || fail "$proxy has no --upstream-client-id: not an mcp-budget with the OAuth client (rebuild it)"

work="$(mktemp -d)"
# Every process started here leads a process group of its own (setsid), and the groups are
# ended on any exit: the server, each client and what it started (the proxies, the browser).
groups=()
cleanup() {
  local group alive=()
  for group in "${groups[@]}"; do
    kill -TERM -- "-$group" 2>/dev/null && alive+=("$group")
  done
  for _ in $(seq 1 30); do
    [ "${#alive[@]}" -eq 0 ] && break
    local still=()
    for group in "${alive[@]}"; do kill -0 -- "-$group" 2>/dev/null && still+=("$group"); done
    alive=("${still[@]}")
    [ "${#alive[@]}" -eq 0 ] || sleep 0.1
  done
  for group in "${alive[@]}"; do kill -KILL -- "-$group" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

started="$(date +%s)"
setsid node "$cache/server.mjs" --port 0 --token-ttl-secs "$ttl" >/dev/null 2>"$work/server.log" &
groups+=($!)
url=""
for _ in $(seq 1 100); do
  url="$(grep -o 'listening on http://[^ ]*' "$work/server.log" 2>/dev/null | head -1 | cut -d' ' -f3 || true)"
  [ -n "$url" ] && break
  kill -0 "${groups[0]}" 2>/dev/null || { cat "$work/server.log" >&2; fail "the server exited before listening"; }
  sleep 0.1
done
[ -n "$url" ] || fail "the server did not listen within 10 s (see $work/server.log)"
echo "oauth interop: server $url (access tokens live $ttl s), proxy $proxy"

total_passed=0
total_failed=0
summary=()
for entry in $modes; do
  mode="${entry%%/*}"
  era="auto"
  [ "$entry" = "$mode" ] || era="${entry#*/}"
  run="$mode"
  [ "$era" = auto ] || run="$mode-$era"
  began="$(date +%s)"
  status=0
  : >"$work/client-$run.log"
  setsid node "$cache/client.mjs" --proxy "$proxy" --url "$url" --browser "$node_bin $browser_script" \
    --mode "$mode" --server-era "$era" --work "$work" >"$work/client-$run.log" 2>"$work/client-$run.err" &
  client_group=$!
  groups+=("$client_group")
  tail -n +1 -f --pid="$client_group" "$work/client-$run.log" &
  wait "$client_group" || status=$?
  wait $! 2>/dev/null || true
  # A process the client started that is still there 3 s after it ended (a proxy that did not
  # exit, a browser that hangs) fails the run, and is ended.
  for _ in $(seq 1 30); do
    pgrep -g "$client_group" >/dev/null 2>&1 || break
    sleep 0.1
  done
  if stray="$(pgrep -g "$client_group" -a 2>/dev/null)"; then
    echo "FAIL $run: processes left behind after the client ended:"
    echo "$stray" | sed 's/^/  /'
    kill -KILL -- "-$client_group" 2>/dev/null || true
    [ "$status" -ne 0 ] || status=1
    total_failed=$((total_failed + 1))
  fi
  line="$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$work/client-$run.log" | tail -1 || true)"
  if [ -z "$line" ]; then
    echo "FAIL $run: the client ended (status $status) without its closing line; its stderr ends:"
    tail -20 "$work/client-$run.err"
    total_failed=$((total_failed + 1))
    line="no result"
  else
    total_passed=$((total_passed + $(echo "$line" | cut -d' ' -f1)))
    total_failed=$((total_failed + $(echo "$line" | cut -d' ' -f3)))
    if [ "$status" -ne 0 ] && [ "$(echo "$line" | cut -d' ' -f3)" = "0" ]; then
      echo "FAIL $run: the client exited with status $status after reporting no failure; its stderr ends:"
      tail -20 "$work/client-$run.err"
      total_failed=$((total_failed + 1))
    fi
  fi
  summary+=("oauth interop $entry: $line ($(($(date +%s) - began)) s)")
done

if [ "$total_failed" -gt 0 ]; then
  echo "oauth interop: the server's log ($work/server.log) ends:"
  tail -20 "$work/server.log" | sed 's/^/  /'
fi
echo
printf '%s\n' "${summary[@]}"
echo "oauth interop: $(($(date +%s) - started)) s in all (logs in $work: server.log, client-RUN.log, RUN-proxy-N.stderr.log)"
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ] && [ "$total_passed" -gt 0 ]
