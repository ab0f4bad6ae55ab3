# Sourced by run.sh and auth.sh: the pinned conformance suite with Node 22 in $cache/suite, and
# the SDK of package-lock.json in $cache/target, installed once and reused while the pins and
# the lock file stay the same. Needs $here, $cache and fail(); sets $suite, $suite_node and
# $suite_bin. `install_suite LABEL` installs (LABEL starts its message).
suite="@modelcontextprotocol/conformance@0.2.0-alpha.12"
node22="node@22"  # the suite needs Node >= 22; the target and the clients run on any node >= 20
suite_node="$cache/suite/node_modules/.bin/node"
suite_bin="$cache/suite/node_modules/@modelcontextprotocol/conformance/dist/index.js"

install_suite() {
  local label="$1" stamp
  mkdir -p "$cache"
  stamp="$cache/installed-$(cat "$here/package-lock.json" <(echo "$suite $node22") | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    echo "$label: installing $suite, $node22 and the SDK (package-lock.json) into $cache"
    rm -rf "$cache/suite" "$cache/target"
    mkdir -p "$cache/suite" "$cache/target"
    (cd "$cache/suite" && npm install --silent --no-audit --no-fund --no-save "$suite" "$node22") \
      || fail "cannot install $suite and $node22 from the npm registry (is it reachable?)"
    cp "$here/package.json" "$here/package-lock.json" "$cache/target/"
    (cd "$cache/target" && npm ci --silent --no-audit --no-fund) \
      || fail "cannot install the SDK (npm ci in $cache/target)"
    touch "$stamp"
  fi
  [ -x "$suite_node" ] || fail "Node 22 is missing from $cache/suite (delete $stamp to reinstall)"
  [ -f "$suite_bin" ] || fail "the suite is missing from $cache/suite (delete $stamp to reinstall)"
  [ -d "$cache/target/node_modules/@modelcontextprotocol/client" ] \
    || fail "the SDK is missing from $cache/target (delete $stamp to reinstall)"
}
