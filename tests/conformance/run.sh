#!/usr/bin/env bash
# The official MCP conformance suite (@modelcontextprotocol/conformance, server scenarios) in
# both protocol eras, each run with its revision's requirement set at its own wire:
#   2026-07-28  stateless, per-request _meta envelope  (--requirements 2026-07-28)
#   2025-11-25  initialize handshake and sessions      (--requirements 2025-11-25)
# against the project's dual-era conformance target (target.mjs, the official TypeScript SDK
# v2, both eras on one endpoint):
#   1. directly (the target over Streamable HTTP);
#   2. through `mcp-budget --listen`, the target a stdio child            (mode "stdio");
#   3. through `mcp-budget --listen --upstream`, the target over HTTP     (mode "http");
#   5. both eras on ONE proxy instance (`--listen --upstream`, the dual-era target over HTTP),
#      in both orders (2026-07-28 then 2025-11-25, and the reverse), mode "shared": each client
#      gets its own era whatever order clients arrive in, and each run equals the direct one;
#   4. through the era bridge: `--listen` in front of the target serving the OTHER era only
#      (--modern-only for the 2025-11-25 suite, --legacy-only for 2026-07-28) (mode "bridge"):
#      everything the direct run passes, but the scenarios bridge_cannot names (and says why).
# Every scenario the suite runs is counted, the scored (required) ones and those it runs
# without scoring (extensions, pending). The target must pass every required scenario
# directly, and the proxy must pass, in each era and mode, every scenario the direct run
# passes; in the 2025-11-25 era also server-sse-polling (SSE resumability) with no warning.
# A scenario that fails is run again alone, up to twice (some are timing-sensitive).
# Pinned versions are installed into a cache folder later runs reuse.
#
# Knobs (environment):
#   CONFORMANCE_ERAS="2026-07-28 2025-11-25"  eras to run, in order
#   CONFORMANCE_MODES="stdio http"            proxy modes; "none" runs the direct leg only
#   CONFORMANCE_TIMEOUT_MS=10000              the suite's per-scenario timeout
#   CONFORMANCE_REPORT=FILE                   also copy the failure report (markdown) there
#   MCP_BUDGET_BIN=PATH                       the proxy binary (default target/debug/mcp-budget)
#   MCP_BUDGET_CONFORMANCE_CACHE=DIR          the install cache
# e.g. CONFORMANCE_ERAS=2026-07-28 CONFORMANCE_MODES=stdio bash tests/conformance/run.sh
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${MCP_BUDGET_CONFORMANCE_CACHE:-$HOME/.cache/mcp-budget-conformance}"
eras="${CONFORMANCE_ERAS:-2026-07-28 2025-11-25}"
modes="${CONFORMANCE_MODES-stdio http bridge shared}"
timeout_ms="${CONFORMANCE_TIMEOUT_MS:-10000}"

fail() { echo "conformance: $*" >&2; exit 1; }
command -v node >/dev/null || fail "node is not installed"
command -v npm >/dev/null || fail "npm is not installed"
for era in $eras; do
  case "$era" in 2026-07-28 | 2025-11-25) ;; *) fail "unknown era '$era' in CONFORMANCE_ERAS (2026-07-28, 2025-11-25)" ;; esac
done
[ "$modes" = none ] && modes=""
for mode in $modes; do
  case "$mode" in stdio | http | bridge | shared) ;; *) fail "unknown mode '$mode' in CONFORMANCE_MODES (stdio, http, bridge, shared, none)" ;; esac
done
[[ "$timeout_ms" =~ ^[0-9]+$ ]] || fail "CONFORMANCE_TIMEOUT_MS must be a number of milliseconds"

source "$here/install.sh"
install_suite "conformance"
# ES modules resolve packages next to the file: the target runs from the cache folder.
cp "$here/target.mjs" "$cache/target/target.mjs"
target="$cache/target/target.mjs"

proxy="${MCP_BUDGET_BIN:-$root/target/debug/mcp-budget}"
if [ -n "$modes" ] && [ ! -x "$proxy" ]; then
  (cd "$root" && cargo build --quiet --bin mcp-budget) || fail "cannot build mcp-budget"
fi

work="$(mktemp -d)"
report="$work/report.md"
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

strip_colors() { sed -E 's/\x1b\[[0-9;]*m//g'; }

# The scenarios the era bridge cannot pass, by their nature or not yet (the README's table
# says why): a scenario listed here that passes is reported, so that the list stays true.
bridge_cannot() {
  local era="$1" scenario="$2"
  case "$era:$scenario" in
    # The modern-only target's own tools ask by server-to-client requests, which its SDK
    # refuses on a 2026-07-28 wire: it cannot ask, bridged or not.
    2025-11-25:tools-call-sampling | 2025-11-25:tools-call-elicitation) return 0 ;;
    2025-11-25:elicitation-sep1034-defaults | 2025-11-25:elicitation-sep1330-enums) return 0 ;;
    # A legacy server checks an undeclared capability itself (the SDK 1.x target runs
    # test_missing_capability and answers with a complete error, not -32021): the proxy cannot
    # know a tool needs sampling before the server asks for it.
    2026-07-28:server-stateless) return 0 ;;
    # The scenario expects the server's own input key ("user_name"): a legacy server's
    # requests have no keys, the bridge names them.
    2026-07-28:input-required-result-basic-elicitation) return 0 ;;
  esac
  return 1
}

# Runs the era's requirement set against a URL. Writes "scenario passed failed" lines to
# $name.txt, the names of the scenarios run without being scored to $name.unscored, the
# suite's output to $name.log and its results (checks.json per scenario) under $name.results/.
run_suite() {
  local era="$1" url="$2" name="$3"
  (cd "$work" && "$suite_node" "$suite_bin" server --url "$url" --requirements "$era" \
    --timeout "$timeout_ms" -o "$work/$name.results" >"$work/$name.log" 2>&1 </dev/null) || true
  strip_colors <"$work/$name.log" \
    | grep -E '^[^ ]+ [a-z0-9-]+: [0-9]+ passed, [0-9]+ failed' \
    | sed -E 's/^[^ ]+ ([a-z0-9-]+): ([0-9]+) passed, ([0-9]+) failed.*/\1 \2 \3/' >"$work/$name.txt"
  strip_colors <"$work/$name.log" | sed -n '/^Not scored for/,$p' \
    | grep -E '^ +[^ ]+ [a-z0-9-]+ \(' | sed -E 's/^ +[^ ]+ ([a-z0-9-]+) .*/\1/' >"$work/$name.unscored" || true
  [ -s "$work/$name.txt" ] || {
    tail -30 "$work/$name.log" >&2
    fail "the suite reported no scenarios against $url (log: $work/$name.log)"
  }
}

# Runs one scenario alone at the era's wire; prints "passed failed warnings".
run_one() {
  local era="$1" url="$2" scenario="$3" results="$4" log
  log="$work/one-$scenario-$RANDOM.log"
  (cd "$work" && "$suite_node" "$suite_bin" server --url "$url" --scenario "$scenario" --spec-version "$era" \
    --timeout "$timeout_ms" -o "$results" >"$log" 2>&1 </dev/null) || true
  strip_colors <"$log" \
    | grep -E 'Passed: [0-9]+/[0-9]+, [0-9]+ failed, [0-9]+ warnings' \
    | sed -E 's/.*Passed: ([0-9]+)\/[0-9]+, ([0-9]+) failed, ([0-9]+) warnings.*/\1 \2 \3/' \
    | tail -1
}

# A scenario passes when at least one check passes and none fails, in the full run or when
# run again alone (twice at most).
passes() {
  local era="$1" url="$2" scenario="$3" name="$4" line
  line="$(grep -E "^$scenario " "$work/$name.txt" || true)"
  if [ -n "$line" ] && [ "$(echo "$line" | cut -d' ' -f3)" = "0" ] && [ "$(echo "$line" | cut -d' ' -f2)" != "0" ]; then
    return 0
  fi
  for _ in 1 2; do
    line="$(run_one "$era" "$url" "$scenario" "$work/$name.results")"
    if [ -n "$line" ] && [ "$(echo "$line" | cut -d' ' -f2)" = "0" ] && [ "$(echo "$line" | cut -d' ' -f1)" != "0" ]; then
      return 0
    fi
  done
  return 1
}

# The failed (and warned) checks of a scenario's latest run under a results folder, as
# markdown list items: "- `check-id` (STATUS): message".
failed_checks() {
  local results="$1" scenario="$2" dir
  dir="$(ls -d "$results/server-$scenario-"[0-9][0-9][0-9][0-9]-* 2>/dev/null | sort | tail -1 || true)"
  [ -n "$dir" ] && [ -f "$dir/checks.json" ] || { echo "- (no checks.json recorded)"; return 0; }
  "$suite_node" -e '
    const checks = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const bad = checks.filter((c) => c.status !== "SUCCESS" && c.status !== "INFO" && c.status !== "SKIPPED");
    if (bad.length === 0) console.log("- (no failed check recorded: the scenario reported nothing or timed out)");
    for (const c of bad) {
      const msg = String(c.errorMessage ?? c.description ?? "").split("\n")[0].slice(0, 400);
      console.log("- `" + c.id + "` (" + c.status + "): " + msg);
    }' "$dir/checks.json"
}

is_unscored() { grep -qxF "$2" "$work/$1.unscored"; }

started="$(date +%s)"
start_target direct
direct_url="$url"
if [[ " $modes " == *" http "* ]] || [[ " $modes " == *" shared "* ]]; then
  start_target upstream
  upstream_url="$url"
fi
declare -A expected_by_era

failed=0
summary=()
{
  echo "# Conformance through mcp-budget: failures"
  echo
  echo "Suite $suite; target tests/conformance/target.mjs (@modelcontextprotocol/server, see package-lock.json)."
  echo "Proxy: $proxy"
  echo
} >"$report"

for era in $eras; do
  SECONDS=0
  name="direct-$era"
  echo "conformance $era: direct"
  run_suite "$era" "$direct_url" "$name"
  expected=()
  not_expected=()
  required=0 required_ok=0 unscored=0 unscored_ok=0
  while read -r scenario _ _; do
    if is_unscored "$name" "$scenario"; then unscored=$((unscored + 1)); else required=$((required + 1)); fi
    if passes "$era" "$direct_url" "$scenario" "$name"; then
      expected+=("$scenario")
      if is_unscored "$name" "$scenario"; then unscored_ok=$((unscored_ok + 1)); else required_ok=$((required_ok + 1)); fi
    elif is_unscored "$name" "$scenario"; then
      not_expected+=("$scenario")
    else
      echo "FAIL ($era direct): required scenario $scenario fails directly against the target" >&2
      failed=$((failed + 1))
    fi
  done <"$work/$name.txt"
  if [ "${#not_expected[@]}" -gt 0 ]; then
    echo "conformance $era: not scored, failing or skipped directly, not required of the proxy: ${not_expected[*]}"
  fi
  line="conformance $era direct: $required_ok of $required required pass, $unscored_ok of $unscored not scored pass (${SECONDS}s)"
  echo "$line"; summary+=("$line")
  [ "${#expected[@]}" -gt 0 ] || fail "no scenario passes directly in $era: the target is broken (logs in $work)"
  expected_by_era[$era]="${expected[*]}"

  for mode in $modes; do
    [ "$mode" = shared ] && continue  # after every era's direct run: below
    SECONDS=0
    name="proxy-$mode-$era"
    if [ "$mode" = stdio ]; then
      start_proxy "$mode-$era" -- node "$target" --stdio
      label="through --listen (stdio)"
    elif [ "$mode" = bridge ]; then
      # The era bridge: this era's client in front of a target of the other era only.
      if [ "$era" = 2025-11-25 ]; then
        start_proxy "$mode-$era" -- node "$target" --stdio --modern-only
        label="through the era bridge (--listen, a modern-only stdio target)"
      else
        start_proxy "$mode-$era" -- node "$target" --stdio --legacy-only
        label="through the era bridge (--listen, a legacy-only stdio target)"
      fi
    else
      start_proxy "$mode-$era" --upstream "$upstream_url"
      label="through --listen --upstream"
    fi
    proxy_url="$url"
    echo "conformance $era: $label"
    run_suite "$era" "$proxy_url" "$name"
    ok=0
    bad=()
    known=()
    for scenario in "${expected[@]}"; do
      if passes "$era" "$proxy_url" "$scenario" "$name"; then
        ok=$((ok + 1))
        if [ "$mode" = bridge ] && bridge_cannot "$era" "$scenario"; then
          echo "conformance $era bridge: $scenario now passes: take it out of bridge_cannot in $0"
        fi
      elif [ "$mode" = bridge ] && bridge_cannot "$era" "$scenario"; then
        known+=("$scenario")
      else
        bad+=("$scenario")
        echo "FAIL ($era, $mode): $scenario passes directly but not through the proxy" >&2
        failed=$((failed + 1))
      fi
    done
    polling=""
    if [ "$era" = 2025-11-25 ]; then
      # Resumable SSE (priming event, retry, Last-Event-ID): no failure and no warning.
      polling="$(run_one "$era" "$proxy_url" server-sse-polling "$work/$name.results")"
      if [ -z "$polling" ] || [ "$(echo "$polling" | cut -d' ' -f2)" != "0" ] || [ "$(echo "$polling" | cut -d' ' -f3)" != "0" ]; then
        echo "FAIL ($era, $mode): server-sse-polling through the proxy: passed/failed/warnings = ${polling:-none}" >&2
        failed=$((failed + 1))
      else
        polling=""
      fi
    fi
    line="conformance $era $label: $ok of ${#expected[@]} pass (${SECONDS}s)"
    [ "${#known[@]}" -gt 0 ] && line="$line; not bridged (README, \"Which client works with which server\"): ${known[*]}"
    echo "$line"; summary+=("$line")
    if [ "${#bad[@]}" -gt 0 ] || [ -n "$polling" ]; then
      {
        echo "## $era, $label: $ok of ${#expected[@]} pass"
        echo
        for scenario in "${bad[@]}"; do
          echo "### $scenario$(is_unscored "direct-$era" "$scenario" && echo " (not scored)")"
          echo
          echo "Full run: $(grep -E "^$scenario " "$work/$name.txt" | awk '{print $2 " passed, " $3 " failed"}' || true); last run alone:"
          echo
          failed_checks "$work/$name.results" "$scenario"
          echo
        done
        if [ -n "$polling" ]; then
          echo "### server-sse-polling (warnings count here)"
          echo
          echo "passed/failed/warnings = $polling"
          echo
          failed_checks "$work/$name.results" server-sse-polling
          echo
        fi
      } >>"$report"
    fi
    # The stdio child pins one era per connection: each era gets a proxy of its own.
    kill "${pids[-1]}" 2>/dev/null || true
  done
done

# Both eras on one proxy instance, in both orders: a client of either era gets its own era
# whichever came first (a dual-era upstream's legacy clients are not bridged once a modern
# client has come through).
if [[ " $modes " == *" shared "* ]] && [ "$(echo $eras | wc -w)" -eq 2 ]; then
  for order in "$eras" "$(echo $eras | awk '{print $2 " " $1}')"; do
    start_proxy "shared-${order// /-}" --upstream "$upstream_url"
    proxy_url="$url"
    for era in $order; do
      SECONDS=0
      name="shared-${order// /-}-$era"
      label="one proxy for both eras ($order), $era"
      echo "conformance: $label"
      run_suite "$era" "$proxy_url" "$name"
      ok=0
      total=0
      bad=()
      for scenario in ${expected_by_era[$era]}; do
        total=$((total + 1))
        if passes "$era" "$proxy_url" "$scenario" "$name"; then
          ok=$((ok + 1))
        else
          bad+=("$scenario")
          echo "FAIL (shared, $order, $era): $scenario passes directly but not through the shared proxy" >&2
          failed=$((failed + 1))
        fi
      done
      line="conformance $label: $ok of $total pass (${SECONDS}s)"
      echo "$line"; summary+=("$line")
      if [ "${#bad[@]}" -gt 0 ]; then
        {
          echo "## $label: $ok of $total pass"
          echo
          for scenario in "${bad[@]}"; do
            echo "### $scenario"
            echo
            failed_checks "$work/$name.results" "$scenario"
            echo
          done
        } >>"$report"
      fi
    done
    kill "${pids[-1]}" 2>/dev/null || true
  done
fi

echo
printf '%s\n' "${summary[@]}"
echo "conformance: $(($(date +%s) - started))s in all (eras: $eras; modes: ${modes:-none})"
{
  echo "## Summary"
  echo
  printf -- '- %s\n' "${summary[@]}"
  [ "$failed" -gt 0 ] || { echo; echo "No failure."; }
} >>"$report"
if [ -n "${CONFORMANCE_REPORT:-}" ]; then cp "$report" "$CONFORMANCE_REPORT"; fi
if [ "$failed" -gt 0 ]; then
  echo "conformance: $failed failure(s); report $report${CONFORMANCE_REPORT:+ (copied to $CONFORMANCE_REPORT)}; logs in $work" >&2
  exit 1
fi
if [ -n "$modes" ]; then
  echo "conformance: the proxy passes everything the direct run passes, in each era ($eras) and mode ($modes); through the era bridge, all but what bridge_cannot names"
else
  echo "conformance: direct runs pass (no proxy mode asked for)"
fi
