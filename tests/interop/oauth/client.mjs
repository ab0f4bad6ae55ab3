#!/usr/bin/env node
// Interop: the official TypeScript SDK v2 client (@modelcontextprotocol/client, pinned by
// ../v2/package-lock.json) over stdio through `mcp-budget --upstream URL`, against an
// OAuth-protected MCP server on the SDK v2 (server.mjs). mcp-budget signs in by itself: the
// 401, the metadata, dynamic registration, the browser ($BROWSER, auth-browser.mjs, which
// follows the auto-approving /authorize to the proxy's loopback callback), the code exchange,
// the kept tokens, their refresh.
//
// Steps, each asserted (the server's /stats says what happened on its side):
//   1. connect and list: the tools are there; one registration, one browser authorization,
//      one code exchange, with the resource indicator;
//   2. echo answers;
//   3. past the access token's lifetime: echo answers again, after a refresh (refresh_token
//      grant) made before the expired token was sent (none reached the server), and no new
//      authorization;
//   4. a token the server revoked: the 401 is met with a refresh (no new authorization) and
//      echo answers;
//   5. big (3,000,000 bytes): a first page with a cursor; the pages (the same tool called
//      with `after`) each within the budget, reassembled equal to the text, byte for byte;
//   6. the proxy exits by itself once its client closes;
//   7. a second proxy on the same state directory: connect, list, echo, with no new
//      registration or authorization (the kept sign-in);
//   8. the sign-in file is mode 0600, and no rotated refresh token was spent twice.
//
// Prints "ok ..." per assertion; at the first failure "FAIL ...: detail" (with the tail of
// the proxy's stderr), "N passed, 1 failed", exit 1. On success a one-line summary, then
// "N passed, 0 failed".
//
//   node client.mjs --proxy BIN --url http://127.0.0.1:PORT/mcp --browser CMD
//                   [--mode legacy|auto|pinned] [--server-era auto|legacy|modern] [--work DIR]
// --browser: the BROWSER command (words split at whitespace by mcp-budget). --mode: the
// client's protocol negotiation (legacy: the initialize handshake; auto: server/discover,
// then initialize; pinned: 2026-07-28 only). --server-era: the proxy's (default auto, not
// passed: it learns the server's, which serves both). --work: where state and logs go
// (default: a new temporary directory).
// Environment: OAUTH_RUST_LOG (the proxy's RUST_LOG, default info), OAUTH_BUDGET_BYTES
// (the page limit asserted, default 200000: the proxy's cap for a client without a profile),
// OAUTH_TIMEOUT_MS (the whole run's deadline, default 120000).

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { bigText } from './content.mjs';

const MODERN = '2026-07-28';
const started = Date.now();

// ---------------------------------------------------------------------------------------------
// Options

function usage(why) {
  if (why) console.error(`client.mjs: ${why}`);
  console.error('usage: node client.mjs --proxy BIN --url URL --browser CMD [--mode legacy|auto|pinned] [--server-era auto|legacy|modern] [--work DIR]');
  process.exit(2);
}
const opts = { mode: 'legacy', 'server-era': 'auto' };
{
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!['proxy', 'url', 'browser', 'mode', 'server-era', 'work'].includes(key) || argv[i + 1] === undefined) usage(`bad argument ${argv[i]}`);
    opts[key] = argv[i + 1];
  }
  for (const key of ['proxy', 'url', 'browser']) if (!opts[key]) usage(`--${key} is required`);
  if (!['legacy', 'auto', 'pinned'].includes(opts.mode)) usage(`--mode must be legacy, auto or pinned`);
  if (!['auto', 'legacy', 'modern'].includes(opts['server-era'])) usage(`--server-era must be auto, legacy or modern`);
}
const ERA = opts['server-era'];
const RUN = ERA === 'auto' ? opts.mode : `${opts.mode}-${ERA}`; // names the run's files
const MODE = opts.mode === 'pinned' ? { pin: MODERN } : opts.mode;
const BUDGET = Number(process.env.OAUTH_BUDGET_BYTES ?? 200_000);
const TIMEOUT_MS = Number(process.env.OAUTH_TIMEOUT_MS ?? 120_000);
const work = opts.work ?? fs.mkdtempSync(path.join(os.tmpdir(), 'mcp-budget-oauth-interop-'));
fs.mkdirSync(work, { recursive: true });
const stateHome = fs.mkdtempSync(path.join(work, `state-${RUN}-`));
const base = new URL(opts.url).origin;
const label = `ts-v2/${opts.mode}/oauth${ERA === 'auto' ? '' : `/server-era-${ERA}`}`;

// ---------------------------------------------------------------------------------------------
// Results

let passed = 0;
const proxies = []; // { name, log, transport }
const clip = (value, n = 300) => {
  const s = typeof value === 'string' ? value : JSON.stringify(value);
  return s === undefined ? String(value) : s.length > n ? `${s.slice(0, n)}…(${s.length} chars)` : s;
};

function proxyTails() {
  return proxies
    .map(({ name, log }) => {
      let text = '';
      try {
        text = fs.readFileSync(log, 'utf8');
      } catch {
        return `  (${name}: no stderr log at ${log})`;
      }
      const lines = text.trimEnd().split('\n');
      return `  ${name}'s stderr (${log}), last ${Math.min(lines.length, 30)} of ${lines.length} lines:\n${lines.slice(-30).map((l) => `    ${l}`).join('\n')}`;
    })
    .join('\n');
}

let finishing = false;
async function die(what, detail) {
  if (finishing) return;
  finishing = true;
  console.log(`FAIL ${label}: ${what}: ${detail}`);
  const tails = proxyTails();
  if (tails) console.log(tails);
  for (const { transport } of proxies) await transport.close().catch(() => {});
  console.log(`${passed} passed, 1 failed`);
  process.exit(1);
}

function check(what, ok, detail = '') {
  if (!ok) return die(what, detail);
  passed += 1;
  console.log(`ok ${label}: ${what}${detail ? ` (${detail})` : ''}`);
  return Promise.resolve();
}

const watchdog = setTimeout(() => die('deadline', `no end after ${TIMEOUT_MS} ms`), TIMEOUT_MS);
watchdog.unref();

// ---------------------------------------------------------------------------------------------
// The server's side

async function stats() {
  const response = await fetch(`${base}/stats`);
  if (!response.ok) throw new Error(`GET /stats: HTTP ${response.status}`);
  return response.json();
}

async function revokeAccess() {
  const response = await fetch(`${base}/admin/revoke-access`, { method: 'POST' });
  if (!response.ok) throw new Error(`POST /admin/revoke-access: HTTP ${response.status}`);
  return (await response.json()).revoked;
}

// Differences of the counts that matter, since `from`.
function delta(from, to) {
  return {
    registrations: to.registrations - from.registrations,
    authorizations: to.authorizations - from.authorizations,
    codeExchanges: to.codeExchanges - from.codeExchanges,
    refreshes: to.refreshes - from.refreshes,
    refreshReuses: to.refreshReuses - from.refreshReuses,
    expired: to.rejected.expired - from.rejected.expired,
    revoked: to.rejected.revoked - from.rejected.revoked,
    missing: to.rejected.missing - from.rejected.missing,
    unknown: to.rejected.unknown - from.rejected.unknown,
    other: to.rejected.other - from.rejected.other,
    big: to.toolCalls.big - from.toolCalls.big,
  };
}
const show = (d) =>
  Object.entries(d)
    .filter(([, v]) => v !== 0)
    .map(([k, v]) => `${k} ${v > 0 ? '+' : ''}${v}`)
    .join(', ') || 'no change';

// ---------------------------------------------------------------------------------------------
// The proxy and the client

// The probe of `auto` and pinned negotiation runs in place, on this one mcp-budget (the SDK's
// own StdioClientTransport class would run it on a throwaway sibling process, which would
// sign in on its own); the child is kept to see how it ends.
class InPlaceStdioClientTransport extends StdioClientTransport {
  async start() {
    await super.start();
    this.child = this._process;
  }
}

async function openProxy(name) {
  const log = path.join(work, `${RUN}-${name}.stderr.log`);
  const transport = new InPlaceStdioClientTransport({
    command: opts.proxy,
    args: ['--upstream', opts.url, ...(ERA === 'auto' ? [] : ['--server-era', ERA])],
    env: {
      XDG_STATE_HOME: stateHome,
      BROWSER: opts.browser,
      RUST_LOG: process.env.OAUTH_RUST_LOG || 'info',
      MCP_BUDGET_AUTH_BROWSER_TIMEOUT_MS: '20000',
    },
    stderr: 'pipe',
  });
  const out = fs.createWriteStream(log);
  transport.stderr.pipe(out);
  proxies.push({ name, log, transport });
  const client = new Client({ name: 'mcp-budget-oauth-interop', version: '1.0.0' }, { capabilities: {}, versionNegotiation: { mode: MODE } });
  const raw = tap(transport);
  await client.connect(transport, { timeout: 60_000 });
  return { client, transport, raw };
}

// The raw response to the last tools/call, for the pages' sizes on the wire.
function tap(transport) {
  const raw = { callId: undefined, call: null };
  const send = transport.send.bind(transport);
  transport.send = (message, options) => {
    if (message?.method === 'tools/call') {
      raw.callId = message.id;
      raw.call = null;
    }
    return send(message, options);
  };
  let handler;
  Object.defineProperty(transport, 'onmessage', {
    configurable: true,
    get: () =>
      handler &&
      ((message, extra) => {
        if (message && message.id === raw.callId && ('result' in message || 'error' in message)) raw.call = message;
        return handler(message, extra);
      }),
    set: (h) => {
      handler = h;
    },
  });
  return raw;
}

const textsOf = (result) => (result?.content ?? []).filter((b) => b.type === 'text').map((b) => b.text);
const cursorIn = (notice) => /after:"([^"]*)"/.exec(notice ?? '')?.[1] ?? null;
const wireSize = (message) => Buffer.byteLength(JSON.stringify(message?.result ?? message ?? null));

async function listTools(client) {
  const tools = [];
  let cursor;
  for (let i = 0; i < 20; i += 1) {
    const result = await client.listTools(cursor ? { cursor } : undefined, { timeout: 60_000 });
    tools.push(...result.tools);
    cursor = result.nextCursor;
    if (!cursor) break;
  }
  return tools.map((t) => t.name);
}

async function echo(client, text) {
  const result = await client.callTool({ name: 'echo', arguments: { text } }, { timeout: 60_000 });
  return { ok: !result.isError && textsOf(result).join('') === `echo: ${text}`, got: textsOf(result).join(' | ') };
}

// ---------------------------------------------------------------------------------------------
// The run

async function main() {
  console.log(`${label}: ${opts.proxy} --upstream ${opts.url}${ERA === 'auto' ? '' : ` --server-era ${ERA}`} (state in ${stateHome})`);
  const s0 = await stats();
  const ttl = s0.tokenTtlSecs;

  // 1. Connect and list: the proxy signs in.
  let t = Date.now();
  const first = await openProxy('proxy-1');
  const tools = await listTools(first.client);
  const s1 = await stats();
  const d1 = delta(s0, s1);
  await check('connect and tools/list through the sign-in', tools.includes('echo') && tools.includes('big'), `tools ${tools.join(', ')}; ${Date.now() - t} ms`);
  await check(
    'one registration, one browser authorization, one code exchange',
    d1.registrations === 1 && d1.authorizations === 1 && d1.codeExchanges === 1,
    `server: ${show(d1)}`,
  );
  const resource = new URL(opts.url).href;
  await check(
    'the resource indicator is the server URL',
    s1.resourceIndicators.length > 0 && s1.resourceIndicators.every((r) => r.replace(/\/+$/, '') === resource.replace(/\/+$/, '')),
    `seen: ${s1.resourceIndicators.join(' ')}`,
  );

  // 2. A call.
  let e = await echo(first.client, 'hello');
  await check('echo', e.ok, `got ${clip(e.got)}`);

  // 3. Past the token's lifetime: a refresh, before the expired token is sent.
  const s2 = await stats();
  const wait = ttl * 1000 + 1200;
  await new Promise((r) => setTimeout(r, wait));
  t = Date.now();
  e = await echo(first.client, 'after expiry');
  const s3 = await stats();
  const d3 = delta(s2, s3);
  await check(`echo after the access token expired (waited ${wait} ms)`, e.ok, `got ${clip(e.got)}; ${Date.now() - t} ms`);
  await check('it was refreshed (refresh_token grant), with no new authorization', d3.refreshes >= 1 && d3.authorizations === 0 && d3.codeExchanges === 0, `server: ${show(d3)}`);
  await check('the refresh came before expiry: no expired token reached the server', d3.expired === 0, `server: ${show(d3)}`);

  // 4. A token the server revoked: the 401 is met with a refresh.
  const revoked = await revokeAccess();
  const s4 = await stats();
  e = await echo(first.client, 'after revocation');
  const s5 = await stats();
  const d5 = delta(s4, s5);
  await check('echo after the server revoked the access token', e.ok, `got ${clip(e.got)}; ${revoked} token(s) revoked`);
  await check(
    'the 401 with a kept token was met with a refresh, not a new authorization',
    d5.revoked >= 1 && d5.refreshes >= 1 && d5.authorizations === 0 && d5.codeExchanges === 0,
    `server: ${show(d5)}`,
  );

  // 5. big: paged by the proxy.
  t = Date.now();
  const whole = bigText();
  const pages = [];
  let args = {};
  for (let i = 0; i < 1000; i += 1) {
    const result = await first.client.callTool({ name: 'big', arguments: args }, { timeout: 60_000 });
    if (result.isError) return die('big', `page ${pages.length + 1} is an error: ${clip(textsOf(result).join(' | '))}`);
    pages.push({ result, size: wireSize(first.raw.call) });
    const cursor = cursorIn(textsOf(result).at(-1));
    if (!cursor) break;
    args = { after: cursor };
  }
  const bigMs = Date.now() - t;
  const s6 = await stats();
  const sizes = pages.map((p) => p.size);
  await check('big comes back paged, with a cursor on the first page', pages.length > 1, `${pages.length} page(s); first page ends ${clip(textsOf(pages[0].result).at(-1), 200)}`);
  await check(`every page within the budget (${BUDGET} bytes on the wire)`, Math.max(...sizes) <= BUDGET, `sizes ${sizes.join(', ')}`);
  // Each page: its text, then the proxy's notice (the last text block).
  const rebuilt = pages.map(({ result }) => textsOf(result).slice(0, -1).join('')).join('');
  let at = 0;
  while (at < whole.length && whole[at] === rebuilt[at]) at += 1;
  await check(
    'the pages reassemble the 3,000,000 bytes exactly',
    rebuilt === whole,
    rebuilt === whole
      ? `${pages.length} pages of at most ${Math.max(...sizes)} bytes, in ${bigMs} ms`
      : `lengths ${whole.length} and ${rebuilt.length}; first difference at ${at}: expected ${clip(whole.slice(at, at + 80))}, got ${clip(rebuilt.slice(at, at + 80))}`,
  );
  await check('the server ran big once (the later pages come from the proxy)', delta(s5, s6).big === 1, `server: ${show(delta(s5, s6))}`);

  // 6. Close: the proxy ends by itself.
  t = Date.now();
  const child = first.transport.child;
  await first.client.close();
  await check(
    'the first proxy exits by itself once its client closes',
    child && child.exitCode === 0 && child.signalCode === null,
    `exit code ${child?.exitCode}, signal ${child?.signalCode}, ${Date.now() - t} ms`,
  );

  // 7. A second proxy on the kept sign-in.
  const s7 = await stats();
  t = Date.now();
  const second = await openProxy('proxy-2');
  const tools2 = await listTools(second.client);
  e = await echo(second.client, 'second proxy');
  const s8 = await stats();
  const d8 = delta(s7, s8);
  await check('a second proxy on the same state: connect, tools/list, echo', tools2.includes('echo') && e.ok, `tools ${tools2.join(', ')}; got ${clip(e.got)}; ${Date.now() - t} ms`);
  await check('it used the kept sign-in: no new registration or authorization', d8.registrations === 0 && d8.authorizations === 0 && d8.codeExchanges === 0, `server: ${show(d8)}`);
  const child2 = second.transport.child;
  await second.client.close();
  await check('the second proxy exits by itself once its client closes', child2 && child2.exitCode === 0 && child2.signalCode === null, `exit code ${child2?.exitCode}, signal ${child2?.signalCode}`);

  // 8. The kept file, and the refresh tokens.
  const dir = path.join(stateHome, 'mcp-budget', 'oauth');
  const files = fs.existsSync(dir) ? fs.readdirSync(dir).filter((f) => f.endsWith('.json')) : [];
  const modes = files.map((f) => (fs.statSync(path.join(dir, f)).mode & 0o777).toString(8));
  await check('one sign-in file, mode 0600', files.length === 1 && modes[0] === '600', `${dir}: ${files.map((f, i) => `${f} ${modes[i]}`).join(', ') || '(none)'}`);
  const s9 = await stats();
  const all = delta(s0, s9);
  await check('no rotated refresh token was presented twice, no token refused for scope or audience', all.refreshReuses === 0 && all.other === 0, `server: ${show(all)}`);

  console.log(
    `${label}: signed in once (${all.registrations} registration, ${all.authorizations} authorization), ${all.refreshes} refreshes, ` +
      `${all.expired + all.revoked + all.missing + all.unknown} rejected requests (${all.missing} without a token, ${all.revoked} revoked, ${all.expired} expired), ` +
      `big in ${pages.length} pages of <= ${Math.max(...sizes)} bytes reassembled exactly, second proxy without sign-in, token file 0600; ${Date.now() - started} ms`,
  );
  console.log(`${passed} passed, 0 failed`);
}

main().then(
  () => {
    clearTimeout(watchdog);
    process.exit(0);
  },
  (error) => die('unexpected error', `${error?.constructor?.name ?? 'Error'}: ${error?.message ?? error}${error?.code !== undefined ? ` (code ${error.code})` : ''}`),
);
