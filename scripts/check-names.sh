#!/usr/bin/env bash
# The names the README tells users to type resolve to this project on the registries, or to
# nothing yet: the PyPI distribution (mcp-budget-proxy: `mcp-budget` on PyPI is an unrelated
# project), the npm launcher (mcp-budget) and its platform packages (@mcp-budget/*). A name
# that resolves to a package whose description is not ours fails, and so does a README line
# that installs the unrelated PyPI `mcp-budget`. Prints one line per name and exits non-zero on
# any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

ours="A proxy that puts a response budget in front of any MCP server"
failed=0
say() { echo "names: $*"; }

# PyPI: `pip download` of the name; nothing found is fine (not published yet).
pypi() {
  local name="$1" dir summary
  dir="$(mktemp -d)"
  if ! pip download --quiet --no-deps --no-binary :none: -d "$dir" "$name" >/dev/null 2>"$dir/err"; then
    if grep -qiE "no matching distribution|could not find a version" "$dir/err"; then
      say "PyPI $name: not published (resolves to nothing)"
    else
      say "PyPI $name: cannot ask the registry: $(tail -1 "$dir/err")"; failed=1
    fi
  else
    summary="$(python3 - "$dir" <<'PY'
import sys, zipfile, tarfile, pathlib, email
for f in pathlib.Path(sys.argv[1]).iterdir():
    if f.suffix == ".whl":
        with zipfile.ZipFile(f) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            print(email.message_from_bytes(z.read(meta)).get("Summary", "")); break
    if f.name.endswith(".tar.gz"):
        with tarfile.open(f) as t:
            meta = next(m for m in t.getmembers() if m.name.endswith("PKG-INFO"))
            print(email.message_from_bytes(t.extractfile(meta).read()).get("Summary", "")); break
PY
)"
    if [ "$summary" = "$ours" ]; then say "PyPI $name: this project"; else say "PyPI $name: ANOTHER project (\"$summary\")"; failed=1; fi
  fi
  rm -rf "$dir"
}

# npm: `npm view`; E404 is fine (not published yet).
npm_name() {
  local name="$1" out
  if out="$(npm view "$name" description 2>&1)"; then
    if [ "$out" = "$ours" ] || [[ "$out" == "The mcp-budget binary for "* ]]; then say "npm $name: this project"; else say "npm $name: ANOTHER project (\"$out\")"; failed=1; fi
  elif printf '%s' "$out" | grep -q "E404"; then
    say "npm $name: not published (resolves to nothing)"
  else
    say "npm $name: cannot ask the registry: $(printf '%s' "$out" | tail -1)"; failed=1
  fi
}

name="$(sed -n 's/^name = "\(.*\)"$/\1/p' pyproject.toml | head -1)"
[ "$name" = "mcp-budget-proxy" ] || { say "pyproject.toml names the distribution \"$name\", not mcp-budget-proxy"; failed=1; }
pypi mcp-budget-proxy
npm_name mcp-budget
npm_name @mcp-budget/linux-x64
# What users are told to type: never the unrelated PyPI `mcp-budget`.
docs=(README.md npm/mcp-budget/README.md)
for f in docs/*.md; do [ -f "$f" ] && docs+=("$f"); done
if grep -nE '(uvx|pipx run|pip install) mcp-budget([^-]|$)' "${docs[@]}"; then
  say "the lines above install PyPI's mcp-budget, another project: use mcp-budget-proxy"; failed=1
fi
[ "$failed" -eq 0 ] && say "every name resolves to this project or to nothing"
exit "$failed"
