#!/usr/bin/env bash
# Builds the packages a user runs without a Rust toolchain, for one target triple, at the
# crate's version:
#   - the Python wheel (maturin, bindings = "bin"): `uvx --from mcp-budget-proxy mcp-budget`, `pipx run --spec mcp-budget-proxy mcp-budget`;
#   - the npm tarballs: @mcp-budget/<os>-<arch> (the binary) and mcp-budget (the launcher, with
#     every platform package as an optional dependency): `npx -y mcp-budget`.
#
# Usage: scripts/dist.sh [--profile dist|release|dev] [--out DIR] [TRIPLE]
#   TRIPLE    default: this machine's (rustc -vV); another needs its Rust target installed
#             (rustup target add TRIPLE) and a linker for it, or run this script on that OS.
#   --profile default: dist (stripped, LTO, one codegen unit; slow: see the README); CI passes
#             dev, reusing the debug build `cargo test` made.
#   --out     default: target/packages
# Needs maturin (pip install maturin) and npm. Publishing is a manual step: see the README.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=dist
out=target/packages
triple=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "dist: unknown option $1" >&2; exit 2 ;;
    *) triple="$1"; shift ;;
  esac
done

fail() { echo "dist: $*" >&2; exit 1; }
command -v "${MATURIN:-maturin}" >/dev/null || fail "maturin is not installed (pip install maturin)"
command -v npm >/dev/null || fail "npm is not installed"

host="$(rustc -vV | sed -n 's/^host: //p')"
triple="${triple:-$host}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
[ -n "$version" ] || fail "no version in Cargo.toml"

# The npm platform package of a triple (Node's process.platform-process.arch, -musl for musl).
case "$triple" in
  x86_64-unknown-linux-gnu) platform=linux-x64 os=linux cpu=x64 libc=glibc ;;
  aarch64-unknown-linux-gnu) platform=linux-arm64 os=linux cpu=arm64 libc=glibc ;;
  x86_64-unknown-linux-musl) platform=linux-x64-musl os=linux cpu=x64 libc=musl ;;
  aarch64-unknown-linux-musl) platform=linux-arm64-musl os=linux cpu=arm64 libc=musl ;;
  x86_64-apple-darwin) platform=darwin-x64 os=darwin cpu=x64 libc="" ;;
  aarch64-apple-darwin) platform=darwin-arm64 os=darwin cpu=arm64 libc="" ;;
  x86_64-pc-windows-msvc) platform=win32-x64 os=win32 cpu=x64 libc="" ;;
  aarch64-pc-windows-msvc) platform=win32-arm64 os=win32 cpu=arm64 libc="" ;;
  *) fail "no npm platform package for $triple (known: x86_64/aarch64 linux gnu and musl, apple-darwin, pc-windows-msvc)" ;;
esac
all_platforms="linux-x64 linux-arm64 linux-x64-musl linux-arm64-musl darwin-x64 darwin-arm64 win32-x64 win32-arm64"

# Where cargo puts the binary: target/[TRIPLE/]PROFILE-DIR (a host build keeps target/PROFILE-DIR,
# so that CI's `--profile dev` finds the debug build `cargo test` made).
target_args=()
target_dir=target
if [ "$triple" != "$host" ]; then
  target_args=(--target "$triple")
  target_dir="target/$triple"
fi
case "$profile" in
  dev) profile_dir=debug ;;
  *) profile_dir="$profile" ;;
esac
exe=mcp-budget
case "$triple" in *windows*) exe=mcp-budget.exe ;; esac

mkdir -p "$out"
out="$(cd "$out" && pwd)"
started="$(date +%s)"

echo "dist: mcp-budget $version for $triple, profile $profile"
# maturin runs cargo (one build, reused below for npm).
"${MATURIN:-maturin}" build --quiet --profile "$profile" "${target_args[@]}" --out "$out" \
  || fail "maturin build failed"
cargo build --quiet --profile "$profile" "${target_args[@]}" --bin mcp-budget
binary="$target_dir/$profile_dir/$exe"
[ -x "$binary" ] || fail "no binary at $binary"
wheel="$(ls -t "$out"/mcp_budget_proxy-"$version"-*.whl | head -1)"

# npm: the platform package, then the launcher naming every platform package.
stage="$out/npm"
rm -rf "$stage"
mkdir -p "$stage/$platform/bin" "$stage/mcp-budget"
cp "$binary" "$stage/$platform/bin/$exe"
chmod 755 "$stage/$platform/bin/$exe"
PLATFORM="$platform" OS="$os" CPU="$cpu" LIBC="$libc" VERSION="$version" TRIPLE="$triple" node -e '
  const e = process.env;
  const pkg = {
    name: `@mcp-budget/${e.PLATFORM}`,
    version: e.VERSION,
    description: `The mcp-budget binary for ${e.TRIPLE} (run it through the mcp-budget package)`,
    license: "Apache-2.0",
    os: [e.OS],
    cpu: [e.CPU],
    ...(e.LIBC ? { libc: [e.LIBC] } : {}),
    files: ["bin/"],
    preferUnplugged: true,
  };
  require("fs").writeFileSync(`${process.argv[1]}/package.json`, JSON.stringify(pkg, null, 2) + "\n");
' "$stage/$platform"
cp npm/mcp-budget/package.json npm/mcp-budget/README.md "$stage/mcp-budget/"
mkdir -p "$stage/mcp-budget/bin"
cp npm/mcp-budget/bin/mcp-budget.js "$stage/mcp-budget/bin/"
VERSION="$version" PLATFORMS="$all_platforms" node -e '
  const fs = require("fs");
  const path = `${process.argv[1]}/package.json`;
  const pkg = JSON.parse(fs.readFileSync(path, "utf8"));
  pkg.version = process.env.VERSION;
  pkg.optionalDependencies = Object.fromEntries(
    process.env.PLATFORMS.split(" ").map((p) => [`@mcp-budget/${p}`, process.env.VERSION]));
  fs.writeFileSync(path, JSON.stringify(pkg, null, 2) + "\n");
' "$stage/mcp-budget"
(cd "$stage/$platform" && npm pack --silent --pack-destination "$out" >/dev/null)
(cd "$stage/mcp-budget" && npm pack --silent --pack-destination "$out" >/dev/null)

size() { stat -c %s "$1" 2>/dev/null || stat -f %z "$1"; }
echo "dist: built in $(($(date +%s) - started)) s:"
echo "  binary   $binary ($(size "$binary") bytes)"
echo "  wheel    $wheel ($(size "$wheel") bytes)"
echo "  npm      $out/mcp-budget-$platform-$version.tgz ($(size "$out/mcp-budget-$platform-$version.tgz") bytes)"
echo "  npm      $out/mcp-budget-$version.tgz"
