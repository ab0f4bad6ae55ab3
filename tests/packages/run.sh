#!/usr/bin/env bash
# The packages a user installs (#29): builds the wheel and the npm tarballs with
# scripts/dist.sh, installs each the way a user would — the wheel into a fresh venv, through
# `uv tool run --from` (uv from PyPI) and through `pipx run --spec`; the npm tarballs into an
# empty project with `npm install --offline`, run with npx — and through each install runs
# `mcp-budget --version` and one real session in front of server-filesystem that pages a 3 MB
# file (the server command given without `--`, as launchers that eat one pass it, and with it).
#
# The profile: MCP_BUDGET_PACKAGES_PROFILE, default dev (the debug build `cargo test` made, so
# CI builds nothing more; scripts/dist.sh alone defaults to dist). maturin, uv and pipx are
# installed into a cache folder (~/.cache/mcp-budget-packages) that later runs reuse;
# server-filesystem and the Python SDK come from the interop cache (tests/interop/run.sh
# installs them). The last line is "N passed, M failed"; the exit status is non-zero on any
# failure.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${MCP_BUDGET_PACKAGES_CACHE:-$HOME/.cache/mcp-budget-packages}"
interop="${MCP_BUDGET_INTEROP_CACHE:-$HOME/.cache/mcp-budget-interop}"
profile="${MCP_BUDGET_PACKAGES_PROFILE:-dev}"
tools="maturin==1.16.0 uv==0.13.9 pipx==1.18.4"

fail() { echo "packages: $*" >&2; exit 1; }

command -v node >/dev/null || fail "node is not installed"
command -v npm >/dev/null || fail "npm is not installed"
command -v python3 >/dev/null || fail "python3 is not installed"
filesystem="$interop/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
[ -f "$filesystem" ] || fail "server-filesystem is missing from $interop (run tests/interop/run.sh first)"
[ -x "$interop/venv/bin/python" ] || fail "the Python SDK venv is missing from $interop (run tests/interop/run.sh first)"

mkdir -p "$cache"
stamp="$cache/installed-$(echo "$tools" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "packages: installing $tools into $cache/tools"
  rm -rf "$cache/tools"
  python3 -m venv "$cache/tools" || fail "cannot create a virtual environment in $cache/tools"
  # shellcheck disable=SC2086
  "$cache/tools/bin/pip" install --quiet --disable-pip-version-check $tools \
    || fail "cannot install $tools from PyPI (is the package registry reachable?)"
  touch "$stamp"
fi
export PATH="$cache/tools/bin:$PATH"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -1)"

echo "packages: scripts/dist.sh --profile $profile"
(cd "$root" && scripts/dist.sh --profile "$profile" --out "$work/dist") || fail "scripts/dist.sh failed"
wheel="$(ls "$work"/dist/mcp_budget_proxy-"$version"-*.whl)"
launcher_tgz="$work/dist/mcp-budget-$version.tgz"
platform_tgz="$(ls "$work"/dist/mcp-budget-linux-*-"$version".tgz)"

passed=0
failed=0
check() {
  local label="$1" ok="$2" detail="$3"
  if [ "$ok" = yes ]; then
    passed=$((passed + 1))
    echo "PASS $label: $detail"
  else
    failed=$((failed + 1))
    echo "FAIL $label: $detail"
  fi
}
# The --version of an install: the crate's version.
version_check() {
  local label="$1" out
  shift
  out="$("$@" --version 2>"$work/version.err" || true)"
  if [ "$out" = "mcp-budget $version" ]; then
    check "$label --version" yes "$out"
  else
    check "$label --version" no "expected 'mcp-budget $version', got: $out; stderr: $(tail -3 "$work/version.err" | tr '\n' ' ')"
  fi
}
# One session in front of server-filesystem: the launcher words, then the proxy's arguments.
session_check() {
  local label="$1" out
  shift
  mkdir -p "$work/root-$passed-$failed"
  local served
  served="$(cd "$work/root-$passed-$failed" && pwd -P)"
  out="$("$interop/venv/bin/python" "$here/session.py" "$served" -- "$@" "$served" 2>"$work/session.err" | tail -1 || true)"
  if [[ "$out" == ok:* ]]; then
    check "$label" yes "${out#ok: }"
  else
    check "$label" no "${out:-no result}; stderr: $(tail -5 "$work/session.err" | tr '\n' ' ')"
  fi
}

# 1. The wheel in a fresh venv (pip, offline: the wheel has no dependencies).
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check --no-index "$wheel" \
  || fail "pip cannot install $wheel"
version_check "venv (pip install the wheel)" "$work/venv/bin/mcp-budget"
session_check "venv: a session paging a 3 MB file (no --)" \
  "$work/venv/bin/mcp-budget" --policy none node "$filesystem"

# 2. uv tool run --from the wheel (what `uvx --from mcp-budget-proxy mcp-budget` does once it is on PyPI).
export UV_CACHE_DIR="$work/uv-cache" UV_TOOL_DIR="$work/uv-tools"
version_check "uv tool run --from the wheel" uv tool run --offline --from "$wheel" mcp-budget
session_check "uv tool run: a session paging a 3 MB file (no --)" \
  uv tool run --offline --from "$wheel" mcp-budget --policy none node "$filesystem"
session_check "uvx: a session paging a 3 MB file (with --)" \
  uvx --offline --from "$wheel" mcp-budget --policy none -- node "$filesystem"

# 3. pipx run --spec the wheel (what `pipx run --spec mcp-budget-proxy mcp-budget` does once it is on PyPI).
export PIPX_HOME="$work/pipx" PIPX_BIN_DIR="$work/pipx-bin"
version_check "pipx run --spec the wheel" pipx run --spec "$wheel" mcp-budget
session_check "pipx run: a session paging a 3 MB file (no --)" \
  pipx run --spec "$wheel" mcp-budget --policy none node "$filesystem"

# 4. npm: both tarballs into an empty project, offline; run through npx as a client would.
mkdir -p "$work/npm-project"
(
  cd "$work/npm-project"
  npm init -y >/dev/null
  npm install --offline --silent --no-audit --no-fund "$launcher_tgz" "$platform_tgz"
) || fail "npm install --offline of the tarballs failed"
cd "$work/npm-project"
version_check "npm install (node_modules/.bin)" node_modules/.bin/mcp-budget
version_check "npx --no-install" npx --no-install mcp-budget
session_check "npx: a session paging a 3 MB file (no --)" \
  npx --no-install mcp-budget --policy none node "$filesystem"
session_check "npx: a session paging a 3 MB file (with --)" \
  npx --no-install mcp-budget --policy none -- node "$filesystem"
cd "$root"

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
