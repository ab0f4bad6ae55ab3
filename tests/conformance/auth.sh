#!/usr/bin/env bash
# mcp-budget as an OAuth 2.1 client of its HTTP upstream (`--upstream URL`, the MCP
# authorization spec), checked with the official MCP conformance suite's client auth
# scenarios (@modelcontextprotocol/conformance, `conformance client`), in both protocol eras,
# each with its revision's requirement set at its own wire:
#   2026-07-28  the scenarios `conformance list --client --requirements 2026-07-28` names
#               under auth/, their mock MCP servers stateless (no initialize; every request
#               carries MCP-Protocol-Version and the _meta envelope);
#   2025-11-25  the same for 2025-11-25, mock servers with the initialize handshake.
# Each scenario runs alone (`conformance client --scenario auth/NAME --spec-version ERA`: a
# requirement set cannot be combined with --scenario, and --spec-version is what gives the
# scenario its era's wire), one after the other. The client is auth-client.mjs (the official
# TypeScript SDK v2 over stdio) in front of `mcp-budget --upstream <the scenario's server>`;
# mcp-budget opens the authorization URL with $BROWSER, auth-browser.mjs, which follows the
# suite's auto-approving redirect to mcp-budget's loopback callback.
# A scenario passes when the suite's run exits 0 (no client timeout, no client error where
# the scenario does not allow one) with at least one check passed and none failed, none
# WARNING, and it was not SKIPPED. One that does not is run again, AUTH_RETRIES times. The
# scenarios expected_failure names (with the reason) may fail without failing the run; one
# of them that passes is reported, so that the list stays true.
# The suite and the client's SDK are the ones run.sh pins (package-lock.json), installed
# into the same cache folder, which later runs (of either script) reuse.
#
# Knobs (environment):
#   AUTH_ERAS="2026-07-28 2025-11-25"  eras to run, in order
#   AUTH_SCENARIOS="..."               only these (names with or without auth/, spaces or commas),
#                                      each run in every era whose requirement set has it
#   AUTH_EXTENSIONS=1                  also the era's auth scenarios run but never scored
#                                      (extensions: client credentials, DPoP, ...; with --force, as
#                                      the requirement set runs them): reported only, run once
#   AUTH_RETRIES=1                     runs again of a scenario that does not pass
#   AUTH_TIMEOUT_MS=30000              the suite's per-scenario timeout (the client gives up 5 s
#                                      before it, so that the suite never has to kill it)
#   AUTH_SERVER_ERA=auto               mcp-budget's --server-era: auto (not passed), match (modern
#                                      for the 2026-07-28 run, legacy for 2025-11-25), modern, legacy
#   AUTH_PROXY_ARGS="..."              more mcp-budget arguments
#   AUTH_RUST_LOG=info                 mcp-budget's RUST_LOG (its stderr lands in the report)
#   AUTH_REPORT=FILE                   also copy the failure report (markdown) there
#   MCP_BUDGET_BIN=PATH                the proxy binary (default target/debug/mcp-budget)
#   MCP_BUDGET_CONFORMANCE_CACHE=DIR   the install cache (shared with run.sh)
# The client's own knobs (auth-client.mjs's header) pass through, e.g. MCP_BUDGET_AUTH_CIMD=0.
# e.g. AUTH_ERAS=2026-07-28 AUTH_SCENARIOS="metadata-default scope-step-up" bash tests/conformance/auth.sh
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${MCP_BUDGET_CONFORMANCE_CACHE:-$HOME/.cache/mcp-budget-conformance}"
eras="${AUTH_ERAS:-2026-07-28 2025-11-25}"
subset="${AUTH_SCENARIOS:-}"
extensions="${AUTH_EXTENSIONS:-0}"
retries="${AUTH_RETRIES:-1}"
timeout_ms="${AUTH_TIMEOUT_MS:-30000}"
server_era="${AUTH_SERVER_ERA:-auto}"

# Scenarios mcp-budget cannot pass by their nature: "ERA:auth/NAME" and why. A listed scenario
# that fails does not fail the run; one that passes is reported, so that the list stays true.
expected_failure() {
  local era="$1" scenario="$2"
  case "$era:$scenario" in
    # (none yet) e.g.
    # 2026-07-28:auth/some-scenario) echo "why it cannot pass"; return 0 ;;
    *) return 1 ;;
  esac
}

fail() { echo "auth conformance: $*" >&2; exit 1; }
command -v node >/dev/null || fail "node is not installed"
command -v npm >/dev/null || fail "npm is not installed"
for era in $eras; do
  case "$era" in 2026-07-28 | 2025-11-25) ;; *) fail "unknown era '$era' in AUTH_ERAS (2026-07-28, 2025-11-25)" ;; esac
done
case "$server_era" in auto | match | modern | legacy) ;; *) fail "AUTH_SERVER_ERA must be auto, match, modern or legacy" ;; esac
[[ "$timeout_ms" =~ ^[0-9]+$ ]] && [ "$timeout_ms" -ge 10000 ] || fail "AUTH_TIMEOUT_MS must be a number of milliseconds, at least 10000"
[[ "$retries" =~ ^[0-9]+$ ]] || fail "AUTH_RETRIES must be a number"
# The suite splits --command at spaces.
[[ "$cache" != *" "* ]] || fail "the cache folder's path has a space ($cache): set MCP_BUDGET_CONFORMANCE_CACHE"

source "$here/install.sh"
install_suite "auth conformance"
# ES modules resolve packages next to the file: the client runs from the cache folder.
cp "$here/auth-client.mjs" "$here/auth-browser.mjs" "$cache/target/"
chmod +x "$cache/target/auth-browser.mjs"
client="$cache/target/auth-client.mjs"
client_node="$(command -v node)"
[[ "$client_node" != *" "* ]] || fail "node's path has a space ($client_node)"

proxy="${MCP_BUDGET_BIN:-$root/target/debug/mcp-budget}"
if [ ! -x "$proxy" ]; then
  (cd "$root" && cargo build --quiet --bin mcp-budget) || fail "cannot build mcp-budget"
fi
proxy="$(cd "$(dirname "$proxy")" && pwd)/$(basename "$proxy")"
proxy_help="$("$proxy" --help 2>&1 || true)"
[[ "$proxy_help" == *--upstream-client-metadata-url* ]] \
  || fail "$proxy has no --upstream-client-metadata-url: not an mcp-budget with the OAuth client (rebuild it)"

work="$(mktemp -d)"
report="$work/report.md"
mkdir -p "$work/state"
strip_colors() { sed -E 's/\x1b\[[0-9;]*m//g'; }

# The era's auth scenarios: the scored ones (required), and with AUTH_EXTENSIONS=1 also the
# not scored ones, as "NAME scored|unscored" lines.
list_scenarios() {
  local era="$1" out
  out="$("$suite_node" "$suite_bin" list --client --requirements "$era" 2>&1 | strip_colors)" \
    || { echo "$out" >&2; fail "conformance list --client --requirements $era failed"; }
  echo "$out" | awk '
    /^Client scenarios/ { section = "required"; next }
    /^Run and reported, but never scored/ { section = "unscored"; next }
    /^[A-Z]/ { section = "" }
    section == "required" && /^  - auth\// { print $2 " scored" }
    section == "unscored" && /^    - auth\/.*\[client\]/ { print $2 " unscored" }'
}

# Whether AUTH_SCENARIOS (if set) names a scenario.
wanted() {
  local scenario="$1" name
  [ -z "$subset" ] && return 0
  for name in ${subset//,/ }; do
    [ "auth/${name#auth/}" = "$scenario" ] && return 0
  done
  return 1
}

# Runs one scenario once (with --force when $4 is "force": the extensions are off the spec
# timeline, so --spec-version alone skips them, as a requirement-set run does not); sets
# $outcome (PASS, FAIL, WARNING, SKIPPED, TIMEOUT, ERROR), $counts ("passed/denominator,
# failed, warnings") and $results (the suite's result folder).
run_one() {
  local era="$1" scenario="$2" attempt="$3" force="${4:-}" log rc line passed failed warnings
  results="$work/results/$era/${scenario#auth/}/$attempt"
  log="$results.log"
  mkdir -p "$results"
  set +e
  (cd "$work" && MCP_BUDGET_BIN="$proxy" \
    MCP_BUDGET_AUTH_STATE_DIR="$work/state" \
    MCP_BUDGET_AUTH_SERVER_ERA="$server_era" \
    MCP_BUDGET_AUTH_PROXY_ARGS="${AUTH_PROXY_ARGS:-}" \
    MCP_BUDGET_AUTH_RUST_LOG="${AUTH_RUST_LOG:-info}" \
    MCP_BUDGET_AUTH_TIMEOUT_MS="$((timeout_ms - 5000))" \
    "$suite_node" "$suite_bin" client --command "$client_node $client" --scenario "$scenario" \
    --spec-version "$era" ${force:+--force} --timeout "$timeout_ms" -o "$results" >"$log" 2>&1 </dev/null)
  rc=$?
  set -e
  line="$(strip_colors <"$log" | grep -E 'Passed: [0-9]+/[0-9]+, [0-9]+ failed, [0-9]+ warnings' | tail -1 || true)"
  counts="$(echo "$line" | sed -E 's/.*Passed: ([0-9]+\/[0-9]+, [0-9]+ failed, [0-9]+ warnings).*/\1/')"
  passed="$(echo "$line" | sed -nE 's/.*Passed: ([0-9]+)\/.*/\1/p')"
  failed="$(echo "$line" | sed -nE 's/.*, ([0-9]+) failed,.*/\1/p')"
  warnings="$(echo "$line" | sed -nE 's/.*, ([0-9]+) warnings.*/\1/p')"
  if grep -q '^SKIPPED:' "$log"; then
    outcome=SKIPPED counts="skipped"
  elif [ -z "$line" ]; then
    outcome=ERROR counts="no result (exit $rc)"
  elif [ "$failed" != 0 ]; then
    outcome=FAIL
  elif [ "$warnings" != 0 ]; then
    outcome=WARNING
  elif grep -q 'CLIENT TIMED OUT' "$log"; then
    outcome=TIMEOUT
  elif [ "$rc" != 0 ]; then
    outcome=ERROR counts="$counts; the client exited with an error"
  elif [ "$passed" = 0 ]; then
    outcome=ERROR counts="$counts; no check passed"
  else
    outcome=PASS
  fi
}

# The failed and warned checks of a result folder (markdown list items), and the tail of the
# client's stderr (mcp-budget's and the browser's too).
describe_failure() {
  local results="$1" checks stderr
  checks="$(find "$results" -name checks.json 2>/dev/null | head -1)"
  stderr="$(find "$results" -name stderr.txt 2>/dev/null | head -1)"
  if [ -n "$checks" ]; then
    "$suite_node" -e '
      const checks = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
      const bad = checks.filter((c) => c.status === "FAILURE" || c.status === "WARNING");
      if (bad.length === 0) console.log("- (no failed or warned check recorded)");
      for (const c of bad) {
        const msg = String(c.errorMessage ?? c.description ?? "").split("\n")[0].slice(0, 400);
        const details = c.details ? " " + JSON.stringify(c.details).slice(0, 300) : "";
        console.log("- `" + c.id + "` (" + c.status + "): " + msg + details);
      }' "$checks"
  else
    echo "- (no checks.json recorded; see $results.log)"
  fi
  echo
  if [ -n "$stderr" ] && [ -s "$stderr" ]; then
    echo "Client stderr (last 40 lines; mcp-budget's included):"
    echo
    echo '```'
    tail -40 "$stderr" | strip_colors
    echo '```'
  else
    echo "Suite output (last 30 lines):"
    echo
    echo '```'
    tail -30 "$results.log" | strip_colors
    echo '```'
  fi
  echo
}

{
  echo "# OAuth client conformance of mcp-budget --upstream: failures"
  echo
  echo "Suite $suite (conformance client, auth scenarios); client tests/conformance/auth-client.mjs"
  echo "(@modelcontextprotocol/client, see package-lock.json); --server-era: $server_era."
  echo "Proxy: $proxy"
  echo
} >"$report"

started="$(date +%s)"
failures=0
expected_count=0
summary=()
ran_any=0
for era in $eras; do
  SECONDS=0
  scenarios="$(list_scenarios "$era")"
  [ -n "$scenarios" ] || fail "the suite lists no auth scenario for $era"
  total=0 ok=0
  bad=() known=() unscored_lines=()
  while read -r scenario kind; do
    [ "$kind" = unscored ] && [ "$extensions" != 1 ] && continue
    wanted "$scenario" || continue
    ran_any=1
    if [ "$kind" = unscored ]; then
      run_one "$era" "$scenario" 1 force
      echo "auth $era: $scenario (not scored): $outcome ($counts)"
      unscored_lines+=("$scenario: $outcome")
      continue
    fi
    attempt=1
    run_one "$era" "$scenario" "$attempt"
    while [ "$outcome" != PASS ] && [ "$attempt" -le "$retries" ]; do
      attempt=$((attempt + 1))
      echo "auth $era: $scenario: $outcome ($counts), again ($attempt)"
      run_one "$era" "$scenario" "$attempt"
    done
    total=$((total + 1))
    if [ "$outcome" = PASS ]; then
      ok=$((ok + 1))
      echo "auth $era: $scenario: PASS ($counts)"
      if reason="$(expected_failure "$era" "$scenario")"; then
        echo "auth $era: $scenario now passes: take it out of expected_failure in $0"
      fi
    elif reason="$(expected_failure "$era" "$scenario")"; then
      known+=("$scenario")
      expected_count=$((expected_count + 1))
      echo "auth $era: $scenario: $outcome ($counts), expected: $reason"
    else
      bad+=("$scenario")
      failures=$((failures + 1))
      echo "FAIL (auth $era): $scenario: $outcome ($counts)" >&2
      {
        echo "## $era: $scenario ($outcome: $counts)"
        echo
        echo "Suite log: $results.log"
        echo
        describe_failure "$results"
      } >>"$report"
    fi
  done <<<"$scenarios"
  [ "$total" -gt 0 ] || [ "${#unscored_lines[@]}" -gt 0 ] || continue
  line="auth $era: $ok of $total pass (${SECONDS}s)"
  [ "${#known[@]}" -gt 0 ] && line="$line; expected failures: ${known[*]}"
  [ "${#bad[@]}" -gt 0 ] && line="$line; failing: ${bad[*]}"
  [ "${#unscored_lines[@]}" -gt 0 ] && line="$line; not scored: $(printf '%s, ' "${unscored_lines[@]}" | sed 's/, $//')"
  summary+=("$line")
done
[ "$ran_any" = 1 ] || fail "AUTH_SCENARIOS ($subset) names no auth scenario of the eras run ($eras)"

echo
printf '%s\n' "${summary[@]}"
echo "auth conformance: $(($(date +%s) - started))s in all (eras: $eras; logs and results in $work)"
{
  echo "## Summary"
  echo
  printf -- '- %s\n' "${summary[@]}"
  [ "$failures" -gt 0 ] || { echo; echo "No failure."; }
} >>"$report"
if [ -n "${AUTH_REPORT:-}" ]; then cp "$report" "$AUTH_REPORT"; fi
if [ "$failures" -gt 0 ]; then
  echo "auth conformance: $failures scenario(s) fail; report $report${AUTH_REPORT:+ (copied to $AUTH_REPORT)}" >&2
  exit 1
fi
echo "auth conformance: every required auth scenario run passes in each era ($eras)$(
  [ "$expected_count" -gt 0 ] && echo ", but $expected_count that expected_failure names")"
