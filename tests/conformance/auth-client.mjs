#!/usr/bin/env node
// MCP conformance client for mcp-budget's OAuth 2.1 client role (auth.sh).
//
// `conformance client --scenario auth/<name> --command "node auth-client.mjs"`
// starts a scenario's mock MCP server and authorization server(s), then runs
// this script with the MCP server's URL as its last argument. The script is an
// MCP client on the official TypeScript SDK v2 (@modelcontextprotocol/client)
// that reaches that server only through mcp-budget over stdio:
//
//   mcp-budget --upstream <URL> [--upstream-client-metadata-url CIMD_URL |
//              --upstream-client-id ID --upstream-client-secret-env VAR] --policy none
//
// so it is mcp-budget that meets the 401, discovers the metadata, registers,
// opens the authorization URL with $BROWSER (auth-browser.mjs, which follows
// the authorization server's auto-approving redirect to mcp-budget's loopback
// callback), exchanges the code and retries. The script connects, lists the
// tools, calls each one (arguments built from its input schema as the rmcp
// conformance client does: required properties only, 1.0 / 1 / "test" / true /
// null by type; mcp-budget's own tools, mcp_budget_*, are not called), and
// closes. Any error exits 1: the scenarios where the client
// is expected to give up (scope-retry-limit, resource-mismatch, iss-*, ...)
// allow a failing client; the others do not.
//
// The era is the suite's: MCP_CONFORMANCE_PROTOCOL_VERSION is the wire the
// scenario's mock server speaks. 2025-11-25: a plain legacy client (initialize).
// 2026-07-28 (any stateless version): the SDK's version negotiation pinned to
// it, probing in place on the one mcp-budget process (a subclass of
// StdioClientTransport, because the SDK's own class would run the
// server/discover probe on a second, throwaway mcp-budget, which would start an
// authorization of its own).
//
// Client registration, from the scenario's MCP_CONFORMANCE_CONTEXT (JSON):
// with a client_id (auth/pre-registration), the pre-registered client, its
// secret handed over in MCP_BUDGET_TEST_CLIENT_SECRET; otherwise the client ID
// metadata document URL the suite knows
// (https://conformance-test.local/client-metadata.json), which mcp-budget uses
// when the authorization server advertises client_id_metadata_document_supported
// and else falls back to dynamic registration (the everything-client's choice).
//
// mcp-budget's environment: this one, without MCP_CONFORMANCE_CONTEXT, plus a
// fresh XDG_STATE_HOME (a new directory, so no token or registration survives
// from another run), BROWSER, RUST_LOG. Its stderr is ours.
//
// Environment knobs (auth.sh sets the first):
//   MCP_BUDGET_BIN                  the proxy binary (default: mcp-budget on PATH)
//   MCP_BUDGET_AUTH_STATE_DIR       parent of the fresh state directories (default: the temp dir)
//   MCP_BUDGET_AUTH_SERVER_ERA      auto (default: no --server-era, mcp-budget learns it), match
//                                   (--server-era modern for a stateless wire, legacy otherwise),
//                                   or modern / legacy as given
//   MCP_BUDGET_AUTH_CIMD=0          never pass --upstream-client-metadata-url
//   MCP_BUDGET_AUTH_PROXY_ARGS      more mcp-budget arguments (split at whitespace; with a
//                                   --policy of its own, no --policy none)
//   MCP_BUDGET_AUTH_BROWSER         the BROWSER command (default: auth-browser.mjs next to this file)
//   MCP_BUDGET_AUTH_RUST_LOG        RUST_LOG for mcp-budget (default: info)
//   MCP_BUDGET_AUTH_TIMEOUT_MS      give up (exit 3) after this long (default 25000, under the
//                                   suite's 30 s per scenario, so that the suite never kills us)

import { accessSync, constants, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const CIMD_CLIENT_METADATA_URL = 'https://conformance-test.local/client-metadata.json';
const SECRET_VAR = 'MCP_BUDGET_TEST_CLIENT_SECRET';
// The versions with the initialize handshake; every other one is stateless (SEP-2575).
const STATEFUL_VERSIONS = new Set(['2024-11-05', '2025-03-26', '2025-06-18', '2025-11-25']);

const here = path.dirname(fileURLToPath(import.meta.url));
const scenario = process.env.MCP_CONFORMANCE_SCENARIO ?? '(no scenario)';
const log = (line) => process.stderr.write(`auth-client [${scenario}]: ${line}\n`);

function fail(message, code = 1) {
  log(message);
  process.exit(code);
}

const serverUrl = process.argv.length > 2 ? process.argv[process.argv.length - 1] : undefined;
if (!serverUrl || !/^https?:\/\//.test(serverUrl)) {
  fail('usage: auth-client.mjs [...] SERVER_URL (the MCP server URL is the last argument)', 2);
}

const protocolVersion = process.env.MCP_CONFORMANCE_PROTOCOL_VERSION || '2025-11-25';
const modern = !STATEFUL_VERSIONS.has(protocolVersion);

let context = {};
if (process.env.MCP_CONFORMANCE_CONTEXT) {
  try {
    context = JSON.parse(process.env.MCP_CONFORMANCE_CONTEXT) ?? {};
  } catch (error) {
    fail(`MCP_CONFORMANCE_CONTEXT is not JSON: ${error.message}`, 2);
  }
}

const timeoutMs = Number(process.env.MCP_BUDGET_AUTH_TIMEOUT_MS ?? 25000);
if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) fail('MCP_BUDGET_AUTH_TIMEOUT_MS must be a positive number', 2);

// mcp-budget's command line.
const proxy = process.env.MCP_BUDGET_BIN || 'mcp-budget';
const args = ['--upstream', serverUrl];
const clientEnv = {};
if (typeof context.client_id === 'string' && context.client_id !== '') {
  args.push('--upstream-client-id', context.client_id);
  if (typeof context.client_secret === 'string' && context.client_secret !== '') {
    args.push('--upstream-client-secret-env', SECRET_VAR);
    clientEnv[SECRET_VAR] = context.client_secret;
  }
} else if (process.env.MCP_BUDGET_AUTH_CIMD !== '0') {
  args.push('--upstream-client-metadata-url', CIMD_CLIENT_METADATA_URL);
}
const serverEra = process.env.MCP_BUDGET_AUTH_SERVER_ERA || 'auto';
switch (serverEra) {
  case 'auto':
    break;
  case 'match':
    args.push('--server-era', modern ? 'modern' : 'legacy');
    break;
  case 'modern':
  case 'legacy':
    args.push('--server-era', serverEra);
    break;
  default:
    fail(`MCP_BUDGET_AUTH_SERVER_ERA must be auto, match, modern or legacy, not '${serverEra}'`, 2);
}
const extra = (process.env.MCP_BUDGET_AUTH_PROXY_ARGS ?? '').split(/\s+/).filter(Boolean);
// No budget policy, as run.sh runs it: the relay alone is under test.
if (!extra.some((arg) => arg === '--policy' || arg.startsWith('--policy='))) args.push('--policy', 'none');
args.push(...extra);

// The browser: an executable taking the URL as its one argument.
const browser = process.env.MCP_BUDGET_AUTH_BROWSER || path.join(here, 'auth-browser.mjs');
if (!process.env.MCP_BUDGET_AUTH_BROWSER) {
  try {
    accessSync(browser, constants.X_OK);
  } catch {
    fail(`${browser} is not executable (chmod +x it, or set MCP_BUDGET_AUTH_BROWSER)`, 2);
  }
}

const stateDir = mkdtempSync(path.join(process.env.MCP_BUDGET_AUTH_STATE_DIR || tmpdir(), 'state-'));
const env = { ...process.env, ...clientEnv };
delete env.MCP_CONFORMANCE_CONTEXT; // the secret reaches mcp-budget by the variable it is told of, only
env.XDG_STATE_HOME = stateDir;
env.BROWSER = browser;
env.RUST_LOG = process.env.MCP_BUDGET_AUTH_RUST_LOG || 'info';

// Probes in place: see the header. (The SDK runs the probe on a disposable sibling
// process only for its own StdioClientTransport class exactly, not a subclass.)
class InPlaceStdioClientTransport extends StdioClientTransport {}

/** Arguments from an input schema, as the rmcp conformance client builds them. */
function buildArguments(inputSchema) {
  const properties = inputSchema?.properties;
  const required = Array.isArray(inputSchema?.required) ? inputSchema.required : [];
  const args = {};
  if (!properties || typeof properties !== 'object') return args;
  for (const [name, schema] of Object.entries(properties)) {
    if (!required.includes(name)) continue;
    switch (schema?.type) {
      case 'number':
        args[name] = 1.0;
        break;
      case 'integer':
        args[name] = 1;
        break;
      case 'string':
        args[name] = 'test';
        break;
      case 'boolean':
        args[name] = true;
        break;
      default:
        args[name] = null;
    }
  }
  return args;
}

const shortJson = (value) => {
  const text = JSON.stringify(value) ?? String(value);
  return text.length > 300 ? `${text.slice(0, 300)}…` : text;
};

const transport = new InPlaceStdioClientTransport({ command: proxy, args, env, stderr: 'inherit' });
const client = new Client(
  { name: 'mcp-budget-auth-conformance-client', version: '1.0.0' },
  { capabilities: {}, ...(modern && { versionNegotiation: { mode: { pin: protocolVersion } } }) }
);

const watchdog = setTimeout(() => {
  log(`no end after ${timeoutMs} ms: giving up`);
  transport.close().finally(() => process.exit(3));
  setTimeout(() => process.exit(3), 2000).unref();
}, timeoutMs);
watchdog.unref();

async function main() {
  log(`${modern ? `${protocolVersion} (stateless)` : `${protocolVersion} (initialize)`} through ${proxy} ${args.join(' ')}`);
  log(`state in ${stateDir}`);
  const options = { timeout: timeoutMs };
  await client.connect(transport, options);
  log(`connected: protocol ${client.getNegotiatedProtocolVersion() ?? '?'}, server ${shortJson(client.getServerVersion())}`);

  const tools = [];
  let cursor;
  for (let page = 0; page < 20; page++) {
    const result = await client.listTools(cursor ? { cursor } : undefined, { ...options, cacheMode: 'bypass' });
    tools.push(...result.tools);
    cursor = result.nextCursor;
    if (!cursor) break;
  }
  log(`tools: ${tools.map((t) => t.name).join(', ') || '(none)'}`);

  let errors = 0;
  for (const tool of tools) {
    if (tool.name.startsWith('mcp_budget_')) {
      log(`tools/call ${tool.name}: skipped (mcp-budget's own tool, not the server's)`);
      continue;
    }
    const toolArgs = buildArguments(tool.inputSchema);
    const result = await client.callTool({ name: tool.name, arguments: toolArgs }, options);
    if (result.isError) {
      errors++;
      log(`tools/call ${tool.name} ${shortJson(toolArgs)}: error result ${shortJson(result.content)}`);
    } else {
      log(`tools/call ${tool.name} ${shortJson(toolArgs)}: ${shortJson(result.content)}`);
    }
  }
  await client.close();
  return errors === 0 ? 0 : 1;
}

main().then(
  (code) => {
    clearTimeout(watchdog);
    log(code === 0 ? 'done' : 'done, with error results');
    process.exit(code);
  },
  async (error) => {
    clearTimeout(watchdog);
    log(`failed: ${error?.message ?? error}${error?.code !== undefined ? ` (code ${error.code})` : ''}`);
    await transport.close().catch(() => {});
    process.exit(1);
  }
);
