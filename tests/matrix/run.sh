#!/usr/bin/env bash
# The default path, for every client (tests/matrix/matrix.mjs): every client profile in front of
# server-filesystem, mcp-server-git and server-everything, each under its built-in policy and
# under --policy none, in both eras over stdio, and one row over --listen. The peers are the
# interop's pinned ones (tests/interop/run.sh --install puts them in its cache). The last line
# is "N passed, M failed"; the exit status is non-zero on any failure.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${MCP_BUDGET_INTEROP_CACHE:-$HOME/.cache/mcp-budget-interop}"

bash "$root/tests/interop/run.sh" --install
proxy="${MCP_BUDGET_BIN:-$root/target/debug/mcp-budget}"
if [ ! -x "$proxy" ]; then
  (cd "$root" && cargo build --quiet --bin mcp-budget) || { echo "matrix: cannot build mcp-budget" >&2; exit 1; }
fi
# ES modules resolve packages next to the file: the script runs from the v2 client's folder.
cp "$here/matrix.mjs" "$cache/v2/matrix.mjs"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
node "$cache/v2/matrix.mjs" --proxy "$proxy" \
  --everything "$cache/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js" \
  --filesystem "$cache/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js" \
  --git "$cache/git-venv/bin/mcp-server-git" \
  --work "$work/fixtures"
