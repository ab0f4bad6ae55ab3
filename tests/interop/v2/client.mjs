#!/usr/bin/env node
// Interop: the official TypeScript SDK v2 client (@modelcontextprotocol/client, pinned in
// package.json) against real servers, directly and through mcp-budget, in the three ways a v2
// client connects; with `--sdk 1`, the TypeScript SDK 1.x client (@modelcontextprotocol/sdk,
// pinned beside it), which speaks only the legacy era, through the same checks:
//
//   legacy   the 2025-11-25 initialize handshake (the SDK's default);
//   auto     probe with server/discover, fall back to initialize (a 2025-only server answers
//            the probe with an error);
//   pinned   2026-07-28 only: the probe must offer it, every request then carries the
//            per-request _meta (protocol version, client info, client capabilities).
//
// Servers: @modelcontextprotocol/server-everything and server-filesystem (2025-only), and the
// project's dual-era conformance target (tests/conformance/target.mjs, the official v2 server
// SDK; its test_input_required_result_* tools answer input_required in 2026-07-28 and send
// real elicitation requests in 2025-11-25).
//
// Transports: direct (stdio, and HTTP where the server speaks it), and through the proxy as a
// stdio child (stdio), `mcp-budget --listen -- SERVER` (http) and `mcp-budget --listen
// --upstream URL` (http-upstream).
//
// Checks, each for every mode and transport where it means something:
//   1. automatic paging: a result over the budget comes back paged; the cursors reassemble
//      exactly the direct result;
//   2. client profiles: codex-mcp-client pages stay under 10 KiB, claude-code's under 50,000
//      bytes;
//   3. the built-in server-filesystem policy: read_text_file pages of at most 20,000 bytes;
//   4. refusals (forged cursor, out-of-range limit, a line no page can hold) are tool errors
//      the client parses, with resultType on the wire in 2026-07-28;
//   5. MRTR: an input_required tool's retry reaches the final result (elicitation, and two
//      rounds with requestState);
//   6. a resource subscription with server-everything: resources/subscribe in the legacy era,
//      subscriptions/listen in 2026-07-28 (served by the proxy), an update delivered;
//   7. a sampling round trip with server-everything (input_required through the bridge).
//
// Prints one line per check ("ok CLIENT/MODE/TRANSPORT: CHECK" or "FAIL ...: CHECK: DETAIL",
// the detail with the last request sent and the last response received) and closes with
// "N passed, M failed". Exit status 1 on any failure.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport, getDefaultEnvironment } from '@modelcontextprotocol/client/stdio';

const MODERN = '2026-07-28';

// ---------------------------------------------------------------------------------------------
// Options

function options() {
  const out = { only: process.env.INTEROP_ONLY ? new RegExp(process.env.INTEROP_ONLY) : null };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!['proxy', 'everything', 'filesystem', 'target', 'sdk'].includes(key) || argv[i + 1] === undefined) {
      console.error('usage: node client.mjs --proxy BIN --everything JS --filesystem JS --target MJS [--sdk 1|2]');
      process.exit(2);
    }
    out[key] = argv[i + 1];
  }
  for (const key of ['proxy', 'everything', 'filesystem', 'target']) {
    if (!out[key]) {
      console.error(`client.mjs: --${key} is required`);
      process.exit(2);
    }
  }
  return out;
}

const opts = options();
// The TypeScript SDK 1.x (`--sdk 1`): a legacy-only client, in the one mode it has.
const sdk1 = opts.sdk === '1' ? await loadSdk1() : null;
const CLIENT = sdk1 ? 'ts-v1' : 'ts-v2';
const MODES = sdk1 ? { legacy: 'legacy' } : { legacy: 'legacy', auto: 'auto', pinned: { pin: MODERN } };

async function loadSdk1() {
  const [{ Client }, { StdioClientTransport }, { StreamableHTTPClientTransport }, types] = await Promise.all([
    import('@modelcontextprotocol/sdk/client/index.js'),
    import('@modelcontextprotocol/sdk/client/stdio.js'),
    import('@modelcontextprotocol/sdk/client/streamableHttp.js'),
    import('@modelcontextprotocol/sdk/types.js'),
  ]);
  const schemas = {
    'sampling/createMessage': types.CreateMessageRequestSchema,
    'elicitation/create': types.ElicitRequestSchema,
    'notifications/resources/updated': types.ResourceUpdatedNotificationSchema,
  };
  // A 1.x Client with the v2 calls the checks make: handlers by method name, and callTool's
  // options second (1.x takes a result schema there).
  const client = (info, capabilities) => {
    const c = new Client(info, { capabilities });
    const [onRequest, onNotification, callTool] = [c.setRequestHandler.bind(c), c.setNotificationHandler.bind(c), c.callTool.bind(c)];
    c.setRequestHandler = (method, fn) => onRequest(schemas[method], fn);
    c.setNotificationHandler = (method, fn) => onNotification(schemas[method], fn);
    c.callTool = (params, options) => callTool(params, undefined, options);
    c.getProtocolEra = () => 'legacy';
    c.getNegotiatedProtocolVersion = () => undefined;
    return c;
  };
  return { client, StdioClientTransport, StreamableHTTPClientTransport };
}
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'mcp-budget-interop-v2-'));

// ---------------------------------------------------------------------------------------------
// Results

let passed = 0;
let failed = 0;
let skipped = 0;

function check(label, ok, detail = '') {
  if (ok) {
    passed += 1;
    console.log(`ok ${label}`);
  } else {
    failed += 1;
    console.log(`FAIL ${label}: ${detail}`);
  }
}

function skip(label, why) {
  skipped += 1;
  console.log(`skip ${label}: ${why}`);
}

const clip = (value, n = 400) => {
  const s = JSON.stringify(value); // strings quoted too: one line
  return s === undefined ? String(value) : s.length > n ? `${s.slice(0, n)}…(${s.length} chars)` : s;
};

function describe(error) {
  const parts = [`${error?.constructor?.name ?? 'Error'}: ${String(error?.message ?? error).replace(/\s+/g, ' ')}`];
  if (error?.code !== undefined) parts.push(`code ${error.code}`);
  if (error?.data !== undefined) parts.push(`data ${clip(error.data, 200)}`);
  return parts.join(', ');
}

// ---------------------------------------------------------------------------------------------
// Processes

const children = [];

function startProcess(command, args, { env = childEnv(), urlFrom = null } = {}) {
  const child = spawn(command, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  const log = fs.createWriteStream(path.join(work, `${path.basename(command)}-${child.pid}.log`));
  child.stderr.pipe(log);
  if (!urlFrom) {
    child.stdout.resume();
    return { child, url: Promise.resolve(null) };
  }
  const stream = urlFrom === 'stdout' ? child.stdout : child.stderr;
  if (urlFrom === 'stdout') child.stderr.resume();
  const url = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${command} printed no "listening on" line in 20 s`)), 20_000);
    const lines = readline.createInterface({ input: stream });
    lines.on('line', (line) => {
      const found = /listening on (http:\/\/\S+)/.exec(line);
      if (found) {
        clearTimeout(timer);
        resolve(found[1]);
      }
    });
    child.on('exit', (code) => reject(new Error(`${command} exited (${code}) before listening`)));
  });
  if (urlFrom !== 'stdout') child.stdout.resume();
  return { child, url };
}

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on('error', reject);
  });
}

async function waitPort(port, ms = 20_000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const ok = await new Promise((resolve) => {
      const socket = net.connect(port, '127.0.0.1', () => {
        socket.end();
        resolve(true);
      });
      socket.on('error', () => resolve(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`nothing listens on 127.0.0.1:${port}`);
}

function stopAll() {
  for (const child of children) {
    if (child.exitCode === null) child.kill('SIGTERM');
  }
}

// ---------------------------------------------------------------------------------------------
// Sessions: a v2 Client on a transport whose traffic is tapped (the last request sent and the
// last response received, raw, for the checks and for the evidence of a failure).

// tap.call is the response to the last tools/call (a client may send tools/list around a call).
function tapTransport(transport) {
  const tap = { sent: null, received: null, callId: undefined, call: null, receivedBytes: 0 };
  const send = transport.send.bind(transport);
  transport.send = (message, options) => {
    if (message && 'id' in message && 'method' in message) {
      tap.sent = message;
      if (message.method === 'tools/call') {
        tap.callId = message.id;
        tap.call = null;
      }
    }
    return send(message, options);
  };
  let handler;
  const wrapped = (message, extra) => {
    tap.receivedBytes += Buffer.byteLength(JSON.stringify(message) ?? '');
    if (message && 'id' in message && ('result' in message || 'error' in message)) {
      tap.received = message;
      if (message.id === tap.callId) tap.call = message;
    }
    return handler?.(message, extra);
  };
  Object.defineProperty(transport, 'onmessage', {
    configurable: true,
    get: () => (handler ? wrapped : undefined),
    set: (h) => {
      handler = h;
    },
  });
  return tap;
}

function evidence(tap) {
  if (!tap) return '';
  return ` | request: ${clip(tap.sent, 300)} | response: ${clip(tap.call ?? tap.received, 500)}`;
}

async function openSession(spec) {
  const { target, mode, name = 'mcp-budget-interop' } = spec;
  const capabilities = { elicitation: { form: {} }, ...(spec.sampling ? { sampling: {} } : {}) };
  const client = sdk1
    ? sdk1.client({ name, version: '1.0.0' }, capabilities)
    : new Client({ name, version: '1.0.0' }, { capabilities, versionNegotiation: { mode: MODES[mode] } });
  const session = { client, elicitations: [], samplings: [], answerName: 'octocat', tap: null, note: spec.note ?? '' };
  if (spec.sampling) {
    client.setRequestHandler('sampling/createMessage', async (request) => {
      session.samplings.push(request.params?.messages?.[0]?.content?.text);
      return { role: 'assistant', content: { type: 'text', text: 'sampled by the interop client' }, model: 'interop-model', stopReason: 'endTurn' };
    });
  }
  client.setRequestHandler('elicitation/create', async (request) => {
    const schema = request.params?.requestedSchema?.properties ?? {};
    session.elicitations.push(request.params?.message);
    if ('color' in schema) return { action: 'accept', content: { color: 'teal' } };
    if ('ok' in schema) return { action: 'accept', content: { ok: true } };
    return { action: 'accept', content: { name: session.answerName } };
  });
  let transport;
  const Http = sdk1?.StreamableHTTPClientTransport ?? StreamableHTTPClientTransport;
  const Stdio = sdk1?.StdioClientTransport ?? StdioClientTransport;
  if (target.url) {
    transport = new Http(new URL(target.url));
  } else {
    transport = new Stdio({ command: target.command, args: target.args, env: childEnv(), stderr: 'ignore' });
  }
  session.tap = tapTransport(transport);
  try {
    await client.connect(transport, { timeout: 30_000 });
  } catch (error) {
    await client.close().catch(() => {});
    error.tap = session.tap;
    throw error;
  }
  session.era = client.getProtocolEra();
  session.close = () => client.close().catch(() => {});
  return session;
}

// ---------------------------------------------------------------------------------------------
// Paging helpers (as tests/interop/client.py)

const textsOf = (result) => (result.content ?? []).filter((b) => b.type === 'text').map((b) => b.text);
const lastNotice = (result) => textsOf(result).at(-1) ?? '';
const cursorIn = (notice) => /after:"([^"]*)"/.exec(notice)?.[1] ?? null;
const wireSize = (raw) => Buffer.byteLength(JSON.stringify(raw?.result ?? raw ?? null));

function resolve(doc, jsonPath) {
  const re = /\.([A-Za-z0-9_]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]/g;
  let m;
  while ((m = re.exec(jsonPath.slice(1)))) {
    doc = m[1] !== undefined ? doc[m[1]] : m[2] !== undefined ? doc[Number(m[2])] : doc[JSON.parse(m[3])];
  }
  return doc;
}

// The whole result from the pages: their texts concatenated, or (a list paged out of a JSON
// text) the first page's document with every page's items.
function reassemble(pages, texts) {
  const found = /(?:items|members) \d+-\d+ of \d+ in (\$\S*?)(?:;|\.(?:\s|$)| \()/.exec(lastNotice(pages[0]));
  if (!found) return texts.join('');
  const whole = JSON.parse(texts[0]);
  const items = resolve(whole, found[1]);
  // A list's items, or (a document with no list) an object's members.
  for (const text of texts.slice(1)) {
    const more = resolve(JSON.parse(text), found[1]);
    if (Array.isArray(items)) items.push(...more);
    else Object.assign(items, more);
  }
  return whole;
}

// Where a reassembled result differs from the direct one (for the failure's detail).
function firstDifference(expected, rebuilt) {
  if (typeof expected === 'string' || typeof rebuilt === 'string') {
    const a = String(expected);
    const b = String(rebuilt);
    let i = 0;
    while (i < a.length && a[i] === b[i]) i += 1;
    return `false (lengths ${a.length} and ${b.length}; first difference at ${i}: direct ${clip(a.slice(i, i + 80))}, reassembled ${clip(b.slice(i, i + 80))})`;
  }
  const keys = new Set([...Object.keys(expected), ...Object.keys(rebuilt)]);
  const differ = [...keys].filter((k) => JSON.stringify(expected[k]) !== JSON.stringify(rebuilt[k]));
  return `false (${differ.length} members differ: ${differ.slice(0, 5).map((k) => `${k}: direct ${clip(expected[k], 80)}, reassembled ${clip(rebuilt[k], 80)}`).join('; ')})`;
}

// Follows the cursors of a paged call; every page's raw response is kept.
async function chain(session, tool, args, maxPages = 1000) {
  const pages = [];
  let call = { ...args };
  for (let i = 0; i < maxPages; i += 1) {
    const result = await session.client.callTool({ name: tool, arguments: call }, { timeout: 60_000 });
    if (result.isError) throw Object.assign(new Error(`page ${pages.length + 1} is an error: ${clip(textsOf(result)[0], 300)}`), { tap: session.tap });
    pages.push({ result, raw: session.tap.call });
    const cursor = cursorIn(lastNotice(result));
    if (!cursor) return pages;
    call = { ...args, after: cursor };
  }
  throw new Error('the chain does not end');
}

// The chain's texts without the notices the proxy appends (the last text block of each page).
const pageTexts = (pages) => pages.map(({ result }) => textsOf(result).slice(0, -1).join(''));

// ---------------------------------------------------------------------------------------------
// The servers and the routes to them

const policyFile = path.join(work, 'target-policy.toml');
fs.writeFileSync(
  policyFile,
  [
    '# A rule with a limit on one conformance-target tool: its range is checked before any call.',
    '[[tool]]',
    'name = "test_simple_text"',
    'items = "$.items"',
    'noun = "items"',
    '[tool.limit]',
    'default = 5',
    'max = 10',
    '',
  ].join('\n'),
);

// server-everything's get-env returns the environment: 3,000 variables make it ~370 KB.
for (let i = 0; i < 3000; i += 1) process.env[`MCP_BUDGET_AUTO_${String(i).padStart(4, '0')}`] = `value-${i}-${'y'.repeat(80)}`;

// Every process gets the environment in the order the SDK's stdio transport gives it (its
// inherited defaults first): get-env lists it in order, and direct and proxied legs compare.
const childEnv = () => ({ ...getDefaultEnvironment(), ...process.env });

const fsRoot = fs.realpathSync(fs.mkdtempSync(path.join(work, 'fs-')));
const bigLog = path.join(fsRoot, 'big.log');
{
  const lines = [];
  for (let i = 0; i < 4000; i += 1) {
    lines.push(`2026-11-20T12:00:${String(i % 60).padStart(2, '0')}Z worker-${i % 7} stream st-${String(i % 240).padStart(4, '0')} état ok — line ${i}\n`);
  }
  fs.writeFileSync(bigLog, lines.join(''));
}

// A 300 KB text with what a copy could get wrong (unicode, tabs, quotes, backslashes, CRLF).
const copySource = path.join(fsRoot, 'copy-source.txt');
{
  const lines = [];
  for (let i = 0, length = 0; length < 300_000; i += 1) {
    length += lines.at(-1)?.length ?? 0;
    lines.push(`${i}\tcafé 日本 🦀 "quoted" back\\slash \\n not a newline ${'·'.repeat(i % 13)}${i % 5 === 0 ? '\r\n' : '\n'}`);
  }
  fs.writeFileSync(copySource, lines.join(''));
}

// A name of ~300 KB in lines: the target greets with it, so the final result of an
// input_required round is over the 200,000-byte budget.
const bigName = Array.from({ length: 3000 }, (_, i) => `name line ${String(i).padStart(4, '0')} ${'z'.repeat(88)}`).join('\n');
const oneLineName = 'q'.repeat(300_000);

const everything = { command: 'node', args: [opts.everything] };
const filesystem = { command: 'node', args: [opts.filesystem, fsRoot] };
const target = { command: 'node', args: [opts.target, '--stdio'] };
const modernOnly = { command: 'node', args: [opts.target, '--stdio', '--modern-only'] };
const viaProxy = (server, policy) => ({ command: opts.proxy, args: [...policy, '--', server.command, ...server.args] });

async function startRoutes() {
  const everythingPort = await freePort();
  startProcess('node', [opts.everything, 'streamableHttp'], { env: { ...childEnv(), PORT: String(everythingPort) } });
  const targetHttp = startProcess('node', [opts.target, '--port', '0'], { urlFrom: 'stderr' });
  const modernHttp = startProcess('node', [opts.target, '--port', '0', '--modern-only'], { urlFrom: 'stderr' });
  const listen = ['--listen', 'http://127.0.0.1:0/mcp'];
  const everythingUrl = `http://127.0.0.1:${everythingPort}/mcp`;
  const targetUrl = await targetHttp.url;
  const modernUrl = await modernHttp.url;
  await waitPort(everythingPort);
  const listeners = {
    everythingHttp: startProcess(opts.proxy, ['--policy', 'none', ...listen, '--', ...[everything.command, ...everything.args]], { urlFrom: 'stdout' }),
    everythingUp: startProcess(opts.proxy, ['--policy', 'none', ...listen, '--upstream', everythingUrl], { urlFrom: 'stdout' }),
    filesystemHttp: startProcess(opts.proxy, [...listen, '--', filesystem.command, ...filesystem.args], { urlFrom: 'stdout' }),
    targetHttp: startProcess(opts.proxy, ['--policy', policyFile, ...listen, '--', target.command, ...target.args], { urlFrom: 'stdout' }),
    targetUp: startProcess(opts.proxy, ['--policy', policyFile, ...listen, '--upstream', targetUrl], { urlFrom: 'stdout' }),
    modernHttp: startProcess(opts.proxy, ['--policy', 'none', ...listen, '--', modernOnly.command, ...modernOnly.args], { urlFrom: 'stdout' }),
    modernUp: startProcess(opts.proxy, ['--policy', 'none', ...listen, '--upstream', modernUrl], { urlFrom: 'stdout' }),
  };
  const url = async (name) => ({ url: await listeners[name].url });
  return {
    everything: {
      direct: everything,
      'direct-http': { url: everythingUrl },
      stdio: viaProxy(everything, ['--policy', 'none']),
      http: await url('everythingHttp'),
      'http-upstream': await url('everythingUp'),
    },
    filesystem: {
      direct: filesystem,
      stdio: viaProxy(filesystem, []), // no --policy: the built-in one, picked by server name
      http: await url('filesystemHttp'),
    },
    target: {
      direct: target,
      'direct-http': { url: targetUrl },
      stdio: viaProxy(target, ['--policy', policyFile]),
      http: await url('targetHttp'),
      'http-upstream': await url('targetUp'),
    },
    modernOnly: {
      direct: modernOnly,
      'direct-http': { url: modernUrl },
      stdio: viaProxy(modernOnly, ['--policy', 'none']),
      http: await url('modernHttp'),
      'http-upstream': await url('modernUp'),
    },
  };
}

// The target serving 2026-07-28 only: a legacy client cannot reach it directly (the spec's
// matrix says so, and it fails here), and reaches it through the proxy's era bridge, which
// answers its initialize from the server's discover and gives every request the modern _meta.
async function modernOnlyChecks(routes, mode, transport, prefix) {
  const route = routes.modernOnly[transport];
  if (!route) return;
  if (mode !== 'legacy') {
    // Modern and auto clients speak its era: the dual-era target's checks, against it.
    await targetChecks(routes, mode, transport, prefix, 'modernOnly');
    return;
  }
  if (!isProxy(transport)) {
    const label = `${prefix}: a legacy client cannot reach the modern-only target directly`;
    try {
      const session = await openSession({ target: route, mode, transport });
      await session.close();
      check(label, false, 'it connected');
    } catch (error) {
      check(label, true);
    }
    return;
  }
  const labels = {
    era: `${prefix}: through the era bridge: a legacy client initializes with the modern-only target`,
    list: `${prefix}: through the era bridge: tools/list and a call, in the legacy era`,
    elicit: `${prefix}: through the era bridge: the target's input_required reaches the legacy client as an elicitation request`,
    rounds: `${prefix}: through the era bridge: two rounds of input, the target's requestState echoed`,
    paging: `${prefix}: through the era bridge: the final result after input is paged automatically`,
    subscribe: `${prefix}: through the era bridge: resources/subscribe served from a listen the proxy holds at the modern-only target, an update delivered`,
  };
  await withSession(Object.values(labels), { target: route, mode, transport }, async (session) => {
    const info = session.client.getServerVersion();
    check(labels.era, session.era === 'legacy' && info?.name === 'mcp-budget-conformance-target', `era ${session.era}, server ${clip(info)}`);
    await attempt(labels.list, session, async () => {
      const { tools } = await session.client.listTools();
      const result = await session.client.callTool({ name: 'test_simple_text', arguments: {} });
      const raw = session.tap.call?.result;
      const text = textsOf(result).join('');
      const ok = tools.some((t) => t.name === 'test_simple_text') && text === 'This is a simple text response for testing.' && raw?.resultType === undefined;
      return [ok, `${tools.length} tools, text ${clip(text, 100)}, resultType on the wire ${raw?.resultType}`];
    });
    await attempt(labels.elicit, session, async () => {
      session.elicitations = [];
      session.answerName = 'octocat';
      const result = await session.client.callTool({ name: 'test_input_required_result_elicitation', arguments: {} });
      const text = textsOf(result).join('');
      return [text === 'Hello, octocat!' && session.elicitations.length === 1 && session.tap.call?.result?.resultType === undefined, `text ${clip(text, 200)}, elicitations ${session.elicitations.length}`];
    });
    await attempt(labels.rounds, session, async () => {
      session.elicitations = [];
      const result = await session.client.callTool({ name: 'test_input_required_result_multi_round', arguments: {} });
      const text = textsOf(result).join('');
      return [text === 'Multi-round complete: octocat likes teal' && session.elicitations.length === 2, `text ${clip(text, 200)}, elicitations ${session.elicitations.length}`];
    });
    await attempt(labels.paging, session, async () => {
      session.answerName = bigName;
      session.elicitations = [];
      const pages = await chain(session, 'test_input_required_result_elicitation', {});
      const sizes = pages.map((p) => wireSize(p.raw));
      const whole = `Hello, ${bigName}!`;
      const equal = pageTexts(pages).join('') === whole;
      const ok = pages.length > 1 && Math.max(...sizes) < 200_000 && equal && session.elicitations.length === 1;
      return [ok, `${pages.length} pages, sizes ${sizes.slice(0, 4)}, reassembled equal: ${equal}, elicitations ${session.elicitations.length}`];
    });
    await attempt(labels.subscribe, session, async () => {
      const uri = 'test://watched-resource';
      let update = null;
      session.client.setNotificationHandler('notifications/resources/updated', (notification) => {
        if (notification.params?.uri === uri) update = notification;
      });
      await session.client.subscribeResource({ uri });
      // The proxy answers at once and replaces its listen upstream: over HTTP the trigger may
      // overtake the new listen, so it is asked again until an update arrives (bounded).
      for (let i = 0; i < 40 && update === null; i += 1) {
        await session.client.callTool({ name: 'test_trigger_resource_update', arguments: {} });
        if (update === null) await new Promise((resolve) => setTimeout(resolve, 250));
      }
      await session.client.unsubscribeResource({ uri });
      return [update !== null, `update ${clip(update, 200)}`];
    });
  });
}

// The direct leg each proxy leg is compared with.
const referenceOf = (transport) => (transport === 'http-upstream' ? 'direct-http' : 'direct');
const isProxy = (transport) => !transport.startsWith('direct');

// ---------------------------------------------------------------------------------------------
// Checks

// Runs fn(session) in a session; a session that cannot be opened fails every check it was for.
async function withSession(labels, spec, fn) {
  let session;
  try {
    session = await openSession(spec);
  } catch (error) {
    for (const label of labels) check(label, false, `${spec.note ?? ''}connect: ${describe(error)}${evidence(error.tap)}`);
    return;
  }
  try {
    await fn(session);
  } finally {
    await session.close();
  }
}

async function attempt(label, session, fn) {
  try {
    const [ok, detail] = await fn();
    check(label, ok, ok ? '' : `${session.note}${detail}${evidence(session.tap)}`);
  } catch (error) {
    check(label, false, `${session.note}${describe(error)}${evidence(error.tap ?? session.tap)}`);
  }
}

const references = {};

// The whole result of a tool called directly (the reference a chain must reassemble).
async function reference(key, spec, tool, args, prepare = () => {}) {
  if (key in references) return references[key];
  references[key] = null;
  try {
    const session = await openSession(spec);
    try {
      prepare(session);
      const result = await session.client.callTool({ name: tool, arguments: args }, { timeout: 60_000 });
      references[key] = { result, raw: session.tap.call, era: session.era };
    } finally {
      await session.close();
    }
  } catch (error) {
    references[key] = { error };
  }
  return references[key];
}

// The era a client ends up in: the target is dual-era; the reference servers speak only
// 2025-11-25, so directly an auto client falls back to it, while through the proxy (which
// bridges the eras, and so serves 2026-07-28 in front of any server) it stays modern.
function expectedEra(server, mode, transport = 'direct') {
  if (mode === 'legacy') return 'legacy';
  return server === 'target' || isProxy(transport) ? 'modern' : 'legacy';
}

const session_era_label = (mode, transport) =>
  expectedEra('everything', mode, transport) === 'modern' ? 'input_required through the era bridge' : 'a server-to-client request';

// 1 and 2: everything get-env (2025 only: legacy and auto modes).
async function everythingChecks(routes, mode, transport, prefix) {
  const spec = { target: routes.everything[transport], mode, transport };
  const ref = await reference(`everything ${referenceOf(transport)}`, { target: routes.everything[referenceOf(transport)], mode: 'legacy' }, 'get-env', {});
  const whole = ref.result ? textsOf(ref.result).join('') : null;
  if (!isProxy(transport)) {
    check(`${prefix}: everything get-env answers ${whole ? Buffer.byteLength(whole) : '?'} bytes in one result (the reference)`, Boolean(whole) && Buffer.byteLength(whole) > 200_000, ref.error ? describe(ref.error) : 'too small');
    return;
  }
  const rebuild = (pages) => {
    const rebuilt = reassemble(pages.map((p) => p.result), pageTexts(pages));
    const expected = typeof rebuilt === 'string' ? whole : JSON.parse(whole);
    return JSON.stringify(rebuilt) === JSON.stringify(expected) || firstDifference(expected, rebuilt);
  };
  const label1 = `${prefix}: automatic paging of everything get-env`;
  await withSession([label1], spec, async (session) => {
    await attempt(label1, session, async () => {
      if (!whole) return [false, `no direct reference: ${describe(ref.error)}`];
      if (session.era !== expectedEra('everything', mode, transport)) return [false, `era ${session.era}, expected ${expectedEra('everything', mode, transport)}`];
      await session.client.listTools();
      const pages = await chain(session, 'get-env', {});
      const sizes = pages.map((p) => wireSize(p.raw));
      const equal = rebuild(pages);
      const ok = pages.length > 1 && Math.max(...sizes) < 200_000 && equal === true && /after:"/.test(lastNotice(pages[0].result));
      console.log(`     ${pages.length} pages of at most ${Math.max(...sizes)} bytes for ${Buffer.byteLength(whole)} bytes direct`);
      return [ok, `${pages.length} pages, sizes ${sizes.slice(0, 4)}, reassembled equal: ${equal}`];
    });
  });
  // An elicitation round trip: server-everything asks its client mid-call (a server-to-client
  // request). A modern client gets it through the proxy as input_required, and retries.
  const label2 = `${prefix}: everything trigger-elicitation-request round trip (${session_era_label(mode, transport)})`;
  await withSession([label2], spec, async (session) => {
    await attempt(label2, session, async () => {
      session.elicitations = [];
      const result = await session.client.callTool({ name: 'trigger-elicitation-request', arguments: {} }, { timeout: 30_000 });
      const text = textsOf(result).join(' ');
      const raw = session.tap.call?.result;
      const modern = session.era === 'modern';
      const ok = !result.isError && session.elicitations.length === 1 && /octocat/.test(text) && (!modern || raw?.resultType === 'complete');
      return [ok, `isError ${result.isError}, elicitations ${session.elicitations.length}, era ${session.era}, final resultType ${raw?.resultType}, text ${clip(text, 200)}`];
    });
  });
  // A sampling round trip: server-everything offers trigger-sampling-request to a client that
  // declared sampling, and asks it mid-call (input_required through the bridge for a modern
  // client).
  const label4 = `${prefix}: everything trigger-sampling-request round trip (${session_era_label(mode, transport)})`;
  await withSession([label4], { ...spec, sampling: true }, async (session) => {
    await attempt(label4, session, async () => {
      const result = await session.client.callTool({ name: 'trigger-sampling-request', arguments: { prompt: 'budgets' } }, { timeout: 30_000 });
      const text = textsOf(result).join(' ');
      const raw = session.tap.call?.result;
      const modern = session.era === 'modern';
      const ok = !result.isError && session.samplings.length === 1 && /sampled by the interop client/.test(text) && (!modern || raw?.resultType === 'complete');
      return [ok, `isError ${result.isError}, samplings ${session.samplings.length}, era ${session.era}, final resultType ${raw?.resultType}, text ${clip(text, 200)}`];
    });
  });
  // A resource subscription: a legacy client subscribes (resources/subscribe), a modern one
  // listens (subscriptions/listen, which the proxy serves in front of this 2025-only server);
  // server-everything's toggle-subscriber-updates then sends an update of every subscribed
  // URI at once (and every 5 s), which must reach the client's notification handler.
  const label3 = `${prefix}: everything resource subscription (${expectedEra('everything', mode, transport) === 'modern' ? 'subscriptions/listen, served by the proxy' : 'resources/subscribe'})`;
  await withSession([label3], spec, async (session) => {
    await attempt(label3, session, async () => {
      const uri = 'demo://resource/static/document/architecture.md';
      let arrived;
      const updated = new Promise((resolve) => {
        arrived = resolve;
      });
      session.client.setNotificationHandler('notifications/resources/updated', (notification) => {
        if (notification.params?.uri === uri) arrived(notification);
      });
      let subscription = null;
      if (session.era === 'modern') subscription = await session.client.listen({ resourceSubscriptions: [uri] });
      else await session.client.subscribeResource({ uri });
      await session.client.callTool({ name: 'toggle-subscriber-updates', arguments: {} });
      const update = await Promise.race([updated, new Promise((resolve) => setTimeout(() => resolve(null), 15_000))]);
      await session.client.callTool({ name: 'toggle-subscriber-updates', arguments: {} });
      const honored = subscription?.honoredFilter?.resourceSubscriptions ?? null;
      if (subscription) await subscription.close();
      const ok = update !== null && session.era === expectedEra('everything', mode, transport) && (session.era !== 'modern' || Boolean(honored?.includes(uri)));
      return [ok, `era ${session.era}, honored ${clip(honored)}, update ${clip(update, 200)}`];
    });
  });
  for (const [name, limit, unit] of [['codex-mcp-client', 10 * 1024, '10 KiB'], ['claude-code', 50_000, '50,000 bytes']]) {
    const label = `${prefix}: profile ${name}: everything get-env pages under ${unit}`;
    await withSession([label], { ...spec, name }, async (session) => {
      await attempt(label, session, async () => {
        if (!whole) return [false, `no direct reference: ${describe(ref.error)}`];
        const pages = await chain(session, 'get-env', {});
        const sizes = pages.map((p) => wireSize(p.raw));
        const equal = rebuild(pages);
        const ok = pages.length >= Math.ceil(Buffer.byteLength(whole) / limit) && Math.max(...sizes) <= limit && equal === true;
        console.log(`     ${pages.length} pages of at most ${Math.max(...sizes)} bytes`);
        return [ok, `${pages.length} pages, largest ${Math.max(...sizes)} bytes (limit ${limit}), reassembled equal: ${equal}`];
      });
    });
  }
}

// 3: server-filesystem's built-in policy (no --policy): read_text_file in 20,000-byte pages.
async function filesystemChecks(routes, mode, transport, prefix) {
  const label = `${prefix}: filesystem built-in policy: read_text_file in pages of at most 20,000 bytes`;
  const whole = fs.readFileSync(bigLog, 'utf8');
  if (!routes.filesystem[transport]) return;
  if (!isProxy(transport)) {
    if (mode === 'pinned') {
      // The spec's matrix: a modern-only client with a legacy server fails. It does here.
      const label = `${prefix}: a client pinned to 2026-07-28 cannot reach server-filesystem (2025-11-25 only) directly`;
      try {
        const session = await openSession({ target: routes.filesystem[transport], mode, transport });
        await session.close();
        check(label, false, 'it connected');
      } catch (error) {
        check(label, true);
      }
      return;
    }
    await withSession([`${prefix}: filesystem read_text_file (the reference)`], { target: routes.filesystem[transport], mode, transport }, async (session) => {
      await attempt(`${prefix}: filesystem read_text_file answers the whole file in one result (the reference)`, session, async () => {
        const result = await session.client.callTool({ name: 'read_text_file', arguments: { path: bigLog } });
        return [textsOf(result)[0] === whole, `text of ${Buffer.byteLength(textsOf(result)[0] ?? '')} bytes, file ${Buffer.byteLength(whole)}`];
      });
    });
    return;
  }
  // server-filesystem speaks only 2025-11-25: a pinned client gets its pages through the
  // proxy's era bridge (directly, it cannot reach the server at all: checked above).
  const bridge = mode === 'pinned' ? 'through the era bridge: ' : '';
  await withSession([label], { target: routes.filesystem[transport], mode, transport, note: bridge }, async (session) => {
    await attempt(label, session, async () => {
      const { tools } = await session.client.listTools();
      const described = tools.some((t) => t.name === 'read_text_file' && (t.description ?? '').includes('Budgeted by mcp-budget'));
      const pages = [];
      let args = { path: bigLog };
      for (let i = 0; i < 500; i += 1) {
        const result = await session.client.callTool({ name: 'read_text_file', arguments: args });
        if (result.isError) throw new Error(`page ${pages.length + 1} is an error: ${clip(textsOf(result)[0], 300)}`);
        pages.push(result);
        const notice = textsOf(result)[1] ?? '';
        const cursor = cursorIn(notice);
        if (!cursor) break;
        args = { path: bigLog, after: cursor };
      }
      const sizes = pages.map((p) => Buffer.byteLength(textsOf(p)[0] ?? ''));
      const equal = pages.map((p) => textsOf(p)[0]).join('') === whole;
      const ok = described && pages.length > 1 && Math.max(...sizes) <= 20_000 && equal;
      console.log(`     ${pages.length} pages of at most ${Math.max(...sizes)} bytes for ${Buffer.byteLength(whole)} bytes`);
      return [ok, `${pages.length} pages, text sizes ${sizes.slice(0, 4)}, reassembled equal: ${equal}, descriptor says "Budgeted by mcp-budget": ${described}`];
    });
  });
}

// 3b: a result passed on by its reference: as claude-code, read a 300 KB file (pages of the
// built-in policy) and write its copy with write_file, whose content is the first page's
// result_ref. The copy equals the file byte for byte; the client received under 64 KB in all.
async function copyByReference(routes, mode, transport, prefix) {
  if (!routes.filesystem[transport] || !isProxy(transport)) return;
  const label = `${prefix}: filesystem: a 300 KB file copied by its result_ref, the client reading under 64 KB`;
  const bridge = mode === 'pinned' ? 'through the era bridge: ' : '';
  await withSession([label], { target: routes.filesystem[transport], mode, transport, note: bridge, name: 'claude-code' }, async (session) => {
    await attempt(label, session, async () => {
      const copy = path.join(fsRoot, `copy-${mode}-${transport}.txt`);
      const before = session.tap.receivedBytes;
      const page = await session.client.callTool({ name: 'read_text_file', arguments: { path: copySource } });
      const notice = textsOf(page).slice(1).join(' ');
      const ref = /result_ref:"([^"]+)"/.exec(notice)?.[1];
      if (!ref) return [false, `no result_ref in the page's notice: ${clip(notice, 300)}`];
      const written = await session.client.callTool({ name: 'write_file', arguments: { path: copy, content: ref } });
      if (written.isError) return [false, `write_file: ${clip(textsOf(written)[0], 300)}`];
      const received = session.tap.receivedBytes - before;
      const same = fs.existsSync(copy) && Buffer.compare(fs.readFileSync(copy), fs.readFileSync(copySource)) === 0;
      console.log(`     ${fs.statSync(copySource).size} bytes copied; the client received ${received} bytes`);
      return [same && received < 64 * 1024, `copy equal: ${same}, received ${received} bytes`];
    });
  });
}

// A resource subscription with the target: a legacy client subscribes (resources/subscribe),
// a modern one listens (subscriptions/listen); test_trigger_resource_update's update of the
// watched resource must then reach the client's notification handler.
async function targetSubscription(session) {
  const uri = 'test://watched-resource';
  let update = null;
  session.client.setNotificationHandler('notifications/resources/updated', (notification) => {
    if (notification.params?.uri === uri) update = notification;
  });
  let subscription = null;
  if (session.era === 'modern') subscription = await session.client.listen({ resourceSubscriptions: [uri] });
  else await session.client.subscribeResource({ uri });
  // Over HTTP the trigger may overtake the subscription upstream: asked again until an
  // update arrives (bounded).
  for (let i = 0; i < 40 && update === null; i += 1) {
    await session.client.callTool({ name: 'test_trigger_resource_update', arguments: {} });
    if (update === null) await new Promise((resolve) => setTimeout(resolve, 250));
  }
  const honored = subscription?.honoredFilter?.resourceSubscriptions ?? null;
  if (subscription) await subscription.close();
  else await session.client.unsubscribeResource({ uri });
  const ok = update !== null && (session.era !== 'modern' || Boolean(honored?.includes(uri)));
  return [ok, `era ${session.era}, honored ${clip(honored)}, update ${clip(update, 200)}`];
}

// 1, 2, 4, 5 and 6 against the dual-era target (`server` 'target'), or against the target
// serving 2026-07-28 only ('modernOnly', for the clients that speak it).
async function targetChecks(routes, mode, transport, prefix, server = 'target') {
  const route = routes[server][transport];
  const spec = { target: route, mode, transport };
  const modern = expectedEra('target', mode) === 'modern';
  const who = server === 'target' ? '' : 'modern-only target: ';
  const refSpec = { target: routes[server][referenceOf(transport)], mode };
  const ref = await reference(`${server} ${referenceOf(transport)} ${mode}`, refSpec, 'test_input_required_result_elicitation', {}, (s) => {
    s.answerName = bigName;
  });
  const whole = ref.result ? textsOf(ref.result).join('') : null;

  // 5: MRTR (legacy: the same tools fulfilled with real elicitation requests).
  const how = modern ? 'input_required, retried' : 'legacy: a server-to-client elicitation request';
  const labels = {
    era: `${prefix}: ${who || 'target '}connects in the ${modern ? '2026-07-28' : '2025-11-25'} era`,
    elicit: `${prefix}: ${who}MRTR elicitation round trip (${how})`,
    rounds: `${prefix}: ${who}MRTR two rounds with requestState (${how})`,
    subscribe: `${prefix}: ${who}resource subscription (${modern ? 'subscriptions/listen' : 'resources/subscribe'}), an update delivered`,
    forged: `${prefix}: ${who}refusal: a forged after cursor is a tool error the client parses`,
    limit: `${prefix}: ${who}refusal: limit out of range is a tool error the client parses`,
    line: `${prefix}: ${who}refusal: a line no page can hold is a tool error the client parses`,
    paging: `${prefix}: ${who}automatic paging of a result reached through ${modern ? 'input_required' : 'elicitation'}`,
    search: `${prefix}: ${who}mcp_budget_search over that chain finds the lines a RegExp finds in the direct text`,
  };
  const proxied = isProxy(transport);
  // (The limit refusal needs the policy with a rule for test_simple_text: the dual-era
  // target's routes have it.)
  const asked = Object.values(labels).filter((l) => (proxied || !/refusal|paging|search/.test(l)) && (server === 'target' || l !== labels.limit));
  await withSession(asked, spec, async (session) => {
    check(labels.era, session.era === (modern ? 'modern' : 'legacy') && (!modern || session.client.getNegotiatedProtocolVersion() === MODERN), `era ${session.era}, version ${session.client.getNegotiatedProtocolVersion()}`);
    await attempt(labels.elicit, session, async () => {
      session.elicitations = [];
      session.answerName = 'octocat';
      const result = await session.client.callTool({ name: 'test_input_required_result_elicitation', arguments: {} });
      const text = textsOf(result).join('');
      const raw = session.tap.call?.result;
      const typed = !modern || raw?.resultType === 'complete';
      return [text === 'Hello, octocat!' && session.elicitations.length === 1 && !result.isError && typed, `text ${clip(text, 200)}, elicitations ${session.elicitations.length}, final resultType ${raw?.resultType}`];
    });
    await attempt(labels.rounds, session, async () => {
      session.elicitations = [];
      const result = await session.client.callTool({ name: 'test_input_required_result_multi_round', arguments: {} });
      const text = textsOf(result).join('');
      const expected = modern ? 'Multi-round complete: octocat likes teal' : null;
      // In 2025-11-25 the target's shim runs the rounds as requests; its requestState is its own.
      const ok = modern ? text === expected && session.elicitations.length === 2 : !result.isError && session.elicitations.length >= 1;
      return [ok, `text ${clip(text, 200)}, elicitations ${session.elicitations.length}`];
    });
    await attempt(labels.subscribe, session, () => targetSubscription(session));
    if (!proxied) return;

    // 4: refusals.
    const refusal = async (tool, args, pattern) => {
      const result = await session.client.callTool({ name: tool, arguments: args });
      const raw = session.tap.call?.result;
      const text = textsOf(result).join(' ');
      const typed = !modern || raw?.resultType === 'complete';
      return [result.isError === true && pattern.test(text) && typed, `isError ${result.isError}, resultType on the wire ${raw?.resultType}, text ${clip(text, 250)}`];
    };
    await attempt(labels.forged, session, () => refusal('test_input_required_result_elicitation', { after: 'bm90LWEtY3Vyc29y' }, /after/));
    if (asked.includes(labels.limit)) {
      await attempt(labels.limit, session, () => refusal('test_simple_text', { limit: 500 }, /limit must be an integer between 1 and 10/));
    }
    await attempt(labels.line, session, async () => {
      session.answerName = oneLineName;
      return refusal('test_input_required_result_elicitation', {}, /result-too-large|cannot be paged/);
    });

    // 1: automatic paging of the (big) final result.
    await attempt(labels.paging, session, async () => {
      if (!whole) return [false, `no direct reference: ${ref.error ? describe(ref.error) : 'none'}`];
      session.answerName = bigName;
      session.elicitations = [];
      const pages = await chain(session, 'test_input_required_result_elicitation', {});
      const sizes = pages.map((p) => wireSize(p.raw));
      const equal = pageTexts(pages).join('') === whole;
      const typed = !modern || pages.every((p) => p.raw?.result?.resultType === 'complete');
      const ok = pages.length > 1 && Math.max(...sizes) < 200_000 && equal && typed && session.elicitations.length === 1;
      console.log(`     ${pages.length} pages of at most ${Math.max(...sizes)} bytes for ${Buffer.byteLength(whole)} bytes direct`);
      return [ok, `${pages.length} pages, sizes ${sizes.slice(0, 4)}, reassembled equal: ${equal}, resultType on every page: ${typed}, elicitations ${session.elicitations.length} (1 expected: later pages come from the proxy)`];
    });

    // 5: search inside the paged result, from its first page's cursor (the tool is not re-run).
    await attempt(labels.search, session, async () => {
      if (!whole) return [false, 'no direct reference'];
      session.answerName = bigName;
      session.elicitations = [];
      const first = await session.client.callTool({ name: 'test_input_required_result_elicitation', arguments: {} });
      const cursor = cursorIn(lastNotice(first));
      const pattern = 'name line (0[0-4]|29)[0-9]{2} ';
      const expected = whole.split('\n').flatMap((text, i) => (new RegExp(pattern).test(text) ? [[i + 1, text]] : []));
      const found = [];
      let args = { cursor, pattern };
      let body = {};
      for (let page = 0; page < 50; page += 1) {
        const answer = await session.client.callTool({ name: 'mcp_budget_search', arguments: args });
        if (answer.isError) return [false, `search refused: ${clip(textsOf(answer).join(' '), 300)}`];
        body = answer.structuredContent ?? {};
        found.push(...(body.matches ?? []).map((m) => [m.line, m.text]));
        if (!body.next_after) break;
        args = { ...args, after: body.next_after };
      }
      const typed = !modern || session.tap.call?.result?.resultType === 'complete';
      const ok = expected.length > 100 && JSON.stringify(found) === JSON.stringify(expected) && body.total_matches === expected.length && typed;
      return [ok, `found ${found.length}, expected ${expected.length}, total_matches ${body.total_matches}, resultType ${session.tap.call?.result?.resultType}`];
    });
  });
  if (!proxied) {
    check(`${prefix}: ${who || "target's "}greeting with a ~300 KB name is ${whole ? Buffer.byteLength(whole) : '?'} bytes in one result (the reference)`, Boolean(whole) && Buffer.byteLength(whole) > 200_000, ref.error ? describe(ref.error) : 'too small');
    return;
  }

  // 2: profiles, fitted per request in 2026-07-28 (clientInfo in _meta), per session before.
  for (const [name, limit, unit] of [['codex-mcp-client', 10 * 1024, '10 KiB'], ['claude-code', 50_000, '50,000 bytes']]) {
    const label = `${prefix}: ${who}profile ${name}: target pages under ${unit}`;
    await withSession([label], { ...spec, name }, async (session) => {
      await attempt(label, session, async () => {
        if (!whole) return [false, 'no direct reference'];
        session.answerName = bigName;
        const pages = await chain(session, 'test_input_required_result_elicitation', {});
        const sizes = pages.map((p) => wireSize(p.raw));
        const equal = pageTexts(pages).join('') === whole;
        const ok = pages.length >= Math.ceil(Buffer.byteLength(whole) / limit) && Math.max(...sizes) <= limit && equal;
        console.log(`     ${pages.length} pages of at most ${Math.max(...sizes)} bytes`);
        return [ok, `${pages.length} pages, largest ${Math.max(...sizes)} bytes (limit ${limit}), reassembled equal: ${equal}`];
      });
    });
  }
}

// ---------------------------------------------------------------------------------------------

async function main() {
  const started = Date.now();
  const routes = await startRoutes();
  for (const mode of Object.keys(MODES)) {
    for (const transport of ['direct', 'direct-http', 'stdio', 'http', 'http-upstream']) {
      const prefix = `${CLIENT}/${mode}/${transport}`;
      if (opts.only && !opts.only.test(prefix)) continue;
      const t0 = Date.now();
      if (mode === 'pinned' && !isProxy(transport)) {
        skip(`${prefix}: everything get-env`, 'server-everything speaks only 2025-11-25: a pinned client cannot reach it directly (the filesystem cell checks that it fails)');
      } else if (routes.everything[transport]) {
        await everythingChecks(routes, mode, transport, prefix);
      }
      await filesystemChecks(routes, mode, transport, prefix);
      await copyByReference(routes, mode, transport, prefix);
      await targetChecks(routes, mode, transport, prefix);
      await modernOnlyChecks(routes, mode, transport, prefix);
      console.log(`     (${prefix}: ${((Date.now() - t0) / 1000).toFixed(1)} s)`);
    }
  }
  console.log(`${CLIENT}: ${((Date.now() - started) / 1000).toFixed(1)} s, ${skipped} not applicable`);
  console.log(`${passed} passed, ${failed} failed`);
}

let code = 1;
try {
  await main();
  code = failed || !passed ? 1 : 0;
} catch (error) {
  console.log(`FAIL ${CLIENT}: setup: ${describe(error)}`);
  console.log(`${passed} passed, ${failed + 1} failed`);
} finally {
  stopAll();
  fs.rmSync(work, { recursive: true, force: true });
}
process.exit(code);
