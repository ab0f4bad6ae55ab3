#!/usr/bin/env bash
# Interop with real MCP peers: the official Python SDK (client) and the reference servers
# @modelcontextprotocol/server-everything and server-filesystem, directly and through mcp-budget
# in every transport combination (client.py, the 1.x SDK); then the v2 clients, each in the
# legacy, auto and pinned-2026-07-28 modes, against those servers and the dual-era conformance
# target (tests/conformance/target.mjs): the official TypeScript SDK v2 client (v2/client.mjs,
# pinned with v2/package-lock.json) and the Python SDK 2.x (client2.py, a venv of its own);
# last, the TypeScript SDK 1.x client (the same client.mjs with --sdk 1, pinned beside v2): the
# legacy client of the era bridge's matrix, in its one mode.
# Pinned versions are installed into a cache folder that later runs reuse. A setup failure fails
# this script with a clear message: it never reports success without having run. The last line
# is the total, "N passed, M failed"; the exit status is non-zero on any failure.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${MCP_BUDGET_INTEROP_CACHE:-$HOME/.cache/mcp-budget-interop}"
python_mcp="mcp==1.30.0"
npm_everything="@modelcontextprotocol/server-everything@2026.8.31"
npm_filesystem="@modelcontextprotocol/server-filesystem@2026.8.31"
python_git="mcp-server-git==2026.10.19"  # in a venv of its own: it needs a newer mcp than the client
python_mcp2="mcp==2.3.0"                 # the 2.x client, in a venv of its own too (client2.py)

fail() { echo "interop: $*" >&2; exit 1; }

command -v node >/dev/null || fail "node is not installed (needed for the reference servers)"
command -v npm >/dev/null || fail "npm is not installed (needed to install the reference servers)"
command -v python3 >/dev/null || fail "python3 is not installed (needed for the Python SDK client)"

mkdir -p "$cache"
stamp="$cache/installed-$(echo "$python_mcp $npm_everything $npm_filesystem $python_git" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "interop: installing $python_mcp, $npm_everything, $npm_filesystem, $python_git into $cache"
  rm -rf "$cache/venv" "$cache/git-venv" "$cache/npm"
  python3 -m venv "$cache/venv" || fail "cannot create a Python virtual environment in $cache/venv"
  "$cache/venv/bin/pip" install --quiet --disable-pip-version-check "$python_mcp" \
    || fail "cannot install $python_mcp from PyPI (is the package registry reachable?)"
  python3 -m venv "$cache/git-venv" || fail "cannot create a Python virtual environment in $cache/git-venv"
  "$cache/git-venv/bin/pip" install --quiet --disable-pip-version-check "$python_git" \
    || fail "cannot install $python_git from PyPI (is the package registry reachable?)"
  mkdir -p "$cache/npm"
  (cd "$cache/npm" && npm install --silent --no-audit --no-fund --no-save "$npm_everything" "$npm_filesystem") \
    || fail "cannot install $npm_everything and $npm_filesystem from the npm registry (is it reachable?)"
  touch "$stamp"
fi

# The v2 clients: the TypeScript SDK (and the server SDK the conformance target runs on) from
# v2/package-lock.json, the Python SDK 2.x in venv2. A stamp of their own: a change here does
# not reinstall the rest.
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
  || fail "node $(node --version) is too old for the TypeScript SDK v2 (it needs node >= 20)"
stamp2="$cache/installed-v2-$(cat "$here/v2/package-lock.json" <(echo "$python_mcp2") | sha256sum | cut -c1-16)"
if [ ! -f "$stamp2" ]; then
  echo "interop: installing the v2 clients (v2/package-lock.json: @modelcontextprotocol/client, @modelcontextprotocol/server, @modelcontextprotocol/sdk 1.x; $python_mcp2) into $cache"
  rm -rf "$cache/v2" "$cache/venv2"
  mkdir -p "$cache/v2"
  cp "$here/v2/package.json" "$here/v2/package-lock.json" "$cache/v2/"
  (cd "$cache/v2" && npm ci --silent --no-audit --no-fund) \
    || fail "cannot install the TypeScript SDK v2 (npm ci in $cache/v2; is the npm registry reachable?)"
  python3 -m venv "$cache/venv2" || fail "cannot create a Python virtual environment in $cache/venv2"
  "$cache/venv2/bin/pip" install --quiet --disable-pip-version-check "$python_mcp2" \
    || fail "cannot install $python_mcp2 from PyPI (is the package registry reachable?)"
  touch "$stamp2"
fi

everything="$cache/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
filesystem="$cache/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
[ -f "$everything" ] || fail "server-everything is missing from $cache/npm (delete $stamp to reinstall)"
[ -f "$filesystem" ] || fail "server-filesystem is missing from $cache/npm (delete $stamp to reinstall)"
[ -f "$cache/v2/node_modules/@modelcontextprotocol/client/package.json" ] \
  || fail "the TypeScript SDK v2 is missing from $cache/v2 (delete $stamp2 to reinstall)"
[ -f "$cache/v2/node_modules/@modelcontextprotocol/sdk/package.json" ] \
  || fail "the TypeScript SDK 1.x is missing from $cache/v2 (delete $stamp2 to reinstall)"
[ -f "$cache/v2/node_modules/@modelcontextprotocol/server/package.json" ] \
  || fail "the server SDK v2 (for the conformance target) is missing from $cache/v2 (delete $stamp2 to reinstall)"
"$cache/venv2/bin/python" -c 'import mcp, mcp_types' 2>/dev/null \
  || fail "$python_mcp2 is missing from $cache/venv2 (delete $stamp2 to reinstall)"
# ES modules resolve packages next to the file: the v2 client and the target run from the cache.
cp "$here/v2/client.mjs" "$cache/v2/client.mjs"
cp "$root/tests/conformance/target.mjs" "$cache/v2/target.mjs"

command -v git >/dev/null || fail "git is not installed (needed by mcp-server-git)"
[ -x "$cache/git-venv/bin/mcp-server-git" ] || fail "mcp-server-git is missing from $cache/git-venv (delete $stamp to reinstall)"
# `--install`: the peers only (tests/matrix/run.sh uses them too).
if [ "${1:-}" = "--install" ]; then
  exit 0
fi

proxy="${MCP_BUDGET_BIN:-$root/target/debug/mcp-budget}"
if [ ! -x "$proxy" ]; then
  (cd "$root" && cargo build --quiet --bin mcp-budget) || fail "cannot build mcp-budget"
fi

export MCP_BUDGET_GIT_SERVER="$cache/git-venv/bin/mcp-server-git"

work="$(mktemp -d)"
cd "$work"
started="$(date +%s)"
total_passed=0
total_failed=0
summary=()
# Runs one client (its output streamed, and kept in $work/NAME.log), then adds its closing
# "N passed, M failed" to the totals; a run that closes without one, or that exits non-zero
# after reporting no failure, counts as a failure.
run_client() {
  local name="$1" began line status=0
  shift
  began="$(date +%s)"
  echo "interop: $name"
  "$@" 2>"$work/$name.err" | tee "$work/$name.log" || status=$?
  line="$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$work/$name.log" | tail -1 || true)"
  if [ -z "$line" ]; then
    echo "FAIL $name: it ended (status $status) without its closing line; its stderr ends:"
    tail -20 "$work/$name.err"
    total_failed=$((total_failed + 1))
    line="no result"
  else
    total_passed=$((total_passed + $(echo "$line" | cut -d' ' -f1)))
    total_failed=$((total_failed + $(echo "$line" | cut -d' ' -f3)))
    if [ "$status" -ne 0 ] && [ "$(echo "$line" | cut -d' ' -f3)" = "0" ]; then
      echo "FAIL $name: it exited with status $status after reporting no failure; its stderr ends:"
      tail -20 "$work/$name.err"
      total_failed=$((total_failed + 1))
    fi
  fi
  summary+=("interop $name: $line ($(($(date +%s) - began)) s)")
}

run_client "python-sdk-1.x" "$cache/venv/bin/python" "$here/client.py" --proxy "$proxy" --everything "$everything" --filesystem "$filesystem" --target "$cache/v2/target.mjs"
run_client "typescript-sdk-v2" node "$cache/v2/client.mjs" --proxy "$proxy" --everything "$everything" --filesystem "$filesystem" --target "$cache/v2/target.mjs"
run_client "python-sdk-2.x" "$cache/venv2/bin/python" "$here/client2.py" --proxy "$proxy" --everything "$everything" --filesystem "$filesystem" --target "$cache/v2/target.mjs"
run_client "typescript-sdk-1.x" node "$cache/v2/client.mjs" --sdk 1 --proxy "$proxy" --everything "$everything" --filesystem "$filesystem" --target "$cache/v2/target.mjs"
# Last, the v2 client through a proxy that signs in to an OAuth-protected server on the SDK v2
# (oauth/run.sh: its own install under $cache/oauth and its own server; its last line, the total).
run_client "typescript-sdk-v2-oauth" env MCP_BUDGET_BIN="$proxy" MCP_BUDGET_INTEROP_CACHE="$cache" bash "$here/oauth/run.sh"

echo
printf '%s\n' "${summary[@]}"
echo "interop: $(($(date +%s) - started)) s in all (logs in $work)"
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ] && [ "$total_passed" -gt 0 ]
