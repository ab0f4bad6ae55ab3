#!/usr/bin/env bash
# Interop with real MCP peers: the official Python SDK (client) and the reference servers
# @modelcontextprotocol/server-everything and server-filesystem, directly and through mcp-budget
# in every transport combination. Pinned versions are installed into a cache folder that later
# runs reuse. A setup failure fails this script with a clear message: it never reports success
# without having run.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${MCP_BUDGET_INTEROP_CACHE:-$HOME/.cache/mcp-budget-interop}"
python_mcp="mcp==1.30.0"
npm_everything="@modelcontextprotocol/server-everything@2026.8.31"
npm_filesystem="@modelcontextprotocol/server-filesystem@2026.8.31"
python_git="mcp-server-git==2026.10.19"  # in a venv of its own: it needs a newer mcp than the client

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

everything="$cache/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
filesystem="$cache/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
[ -f "$everything" ] || fail "server-everything is missing from $cache/npm (delete $stamp to reinstall)"
[ -f "$filesystem" ] || fail "server-filesystem is missing from $cache/npm (delete $stamp to reinstall)"

proxy="${MCP_BUDGET_BIN:-$root/target/debug/mcp-budget}"
if [ ! -x "$proxy" ]; then
  (cd "$root" && cargo build --quiet --bin mcp-budget) || fail "cannot build mcp-budget"
fi

command -v git >/dev/null || fail "git is not installed (needed by mcp-server-git)"
export MCP_BUDGET_GIT_SERVER="$cache/git-venv/bin/mcp-server-git"
[ -x "$MCP_BUDGET_GIT_SERVER" ] || fail "mcp-server-git is missing from $cache/git-venv (delete $stamp to reinstall)"

cd "$(mktemp -d)"
exec "$cache/venv/bin/python" "$here/client.py" --proxy "$proxy" --everything "$everything" --filesystem "$filesystem"
