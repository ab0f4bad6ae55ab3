#!/usr/bin/env node
// The npm launcher of mcp-budget: runs the binary of this platform's package
// (@mcp-budget/<os>-<arch>, an optional dependency: npm installs only the one that matches),
// as esbuild and biome ship theirs. Its stdin, stdout and stderr are this process's own (the
// MCP stdio stream passes through untouched); signals are passed on; its exit status is ours.
"use strict";

const { spawn } = require("node:child_process");
const fs = require("node:fs");

function isMusl() {
  if (process.platform !== "linux") return false;
  try {
    return !process.report.getReport().header.glibcVersionRuntime;
  } catch {
    return false;
  }
}

function binary() {
  if (process.env.MCP_BUDGET_BINARY) return process.env.MCP_BUDGET_BINARY;
  const name = `@mcp-budget/${process.platform}-${process.arch}${isMusl() ? "-musl" : ""}`;
  const exe = process.platform === "win32" ? "mcp-budget.exe" : "mcp-budget";
  let path;
  try {
    path = require.resolve(`${name}/bin/${exe}`);
  } catch {
    process.stderr.write(
      `mcp-budget: no binary for ${process.platform}-${process.arch}: the package ${name} is not installed ` +
        `(npm skips optional dependencies with --no-optional or --omit=optional; reinstall without it), ` +
        `or none is published for this platform (install from PyPI: uvx --from mcp-budget-proxy mcp-budget, or build it: cargo install --path .)\n`,
    );
    process.exit(2);
  }
  try {
    fs.accessSync(path, fs.constants.X_OK);
  } catch {
    try {
      fs.chmodSync(path, 0o755);
    } catch {
      // Run it anyway: spawn says why it cannot.
    }
  }
  return path;
}

const path = binary();
const child = spawn(path, process.argv.slice(2), { stdio: "inherit" });
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(signal, () => child.kill(signal));
}
child.on("error", (err) => {
  process.stderr.write(`mcp-budget: cannot run ${path}: ${err.message}\n`);
  process.exit(2);
});
child.on("exit", (code, signal) => {
  if (signal) {
    process.removeAllListeners(signal);
    process.kill(process.pid, signal);
  } else {
    process.exit(code === null ? 1 : code);
  }
});
