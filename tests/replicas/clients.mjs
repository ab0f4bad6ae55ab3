#!/usr/bin/env node
// The replicas scenario's clients (run.sh starts everything else): official TypeScript SDK v2
// clients (@modelcontextprotocol/client), pinned to 2026-07-28, page through the counting
// server's results (server.mjs, rows.mjs) behind mcp-budget replicas that share a Redis cache,
// behind HAProxy round-robin.
//
//   node clients.mjs --url http://127.0.0.1:FRONT/mcp --count-url http://127.0.0.1:S/count
//       [--bytes B] [--clients 30] [--chains-b 10]
//       [--replica-pids P1,P2,P3] [--replica-metrics http://127.0.0.1:M1/metrics,...]
//       [--redis-cli "redis-cli -p PORT"] [--timeout-secs 30] [--first-timeout-secs 120]
//
// --bytes is the server's --bytes (--direct-bytes is the same option). --replica-pids and
// --replica-metrics name the replicas in the same order; the first pid is the one killed.
//
// Phase a, one replica killed mid-chain: --clients clients each call export_rows (not
// read-only) with a seed of their own and follow next_after to the end. Once every chain has
// done about a third of its pages (a barrier: no request in flight), the first replica is
// killed (SIGKILL); the chains go on. Checks: every page answered (no tool error, no JSON-RPC or
// transport error); every chain reassembles exactly to the run that answered its first call
// (each page is checked, when it arrives, against that run's bytes as rows.mjs generates them:
// a chain stitched from two runs names both); export_rows ran once per seed (GET /count); the
// pages crossed replicas (mcp_budget_remote_cache_hits_total > 0 on at least two replicas).
//
// Phase b, Redis stopped mid-chain (with --redis-cli): --chains-b clients each page an
// export_rows chain and a read_rows chain (new seeds); after two pages of each, Redis is shut
// down; the chains go on. Checks: every call answered within --timeout-secs (a read_rows
// page, which may now run the tool again, within --first-timeout-secs) (a result or a
// tool error, never a JSON-RPC or transport error); an export_rows page that cannot be read is
// the documented cache-miss tool error ("no longer in mcp-budget's cache"; its chain ends
// there), at least once; read_rows chains complete and reassemble exactly (the proxy calls a
// read-only tool again on a miss); a new chain's first page is still answered; export_rows ran
// once per chain; mcp_budget_remote_cache_errors_total moved on the surviving replicas.
//
// A result without a notice is a one-page chain, so --url may point at server.mjs itself, or
// at one replica without --cache (the kill, the metrics and phase b are then skipped unless
// their options are given).
//
// Prints one line per check ("ok LABEL" or "FAIL LABEL: DETAIL"), timings, and closes with
// "N passed, M failed". Exit status 1 on any failure.

import { execFile } from 'node:child_process';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { parseHeader, runsNamed, slice } from './rows.mjs';

const MODERN = '2026-07-28';
const CLIENT_NAME = 'mcp-budget-replicas';
const MISS_TEXT = "no longer in mcp-budget's cache";

// ---------------------------------------------------------------------------------------------
// Options

function usage(why) {
  console.error(`clients.mjs: ${why}`);
  console.error('usage: node clients.mjs --url URL --count-url URL [--bytes B] [--clients N] [--chains-b N] [--replica-pids P,...] [--replica-metrics URL,...] [--redis-cli CMD] [--timeout-secs S] [--first-timeout-secs S]');
  process.exit(2);
}

function options() {
  const out = {
    url: null,
    'count-url': null,
    bytes: 10_000_000,
    clients: 30,
    'chains-b': 10,
    'replica-pids': [],
    'replica-metrics': [],
    'redis-cli': null,
    'timeout-secs': 30,
    'first-timeout-secs': 120,
  };
  const numbers = ['bytes', 'clients', 'chains-b', 'timeout-secs', 'first-timeout-secs'];
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    let key = argv[i].replace(/^--/, '');
    if (key === 'direct-bytes') key = 'bytes';
    const value = argv[i + 1];
    if (!(key in out) || value === undefined) usage(`unknown option or missing value: ${argv[i]}`);
    if (numbers.includes(key)) {
      if (!/^\d+$/.test(value)) usage(`--${key} takes a number`);
      out[key] = Number(value);
    } else if (key === 'replica-pids') {
      out[key] = value.split(',').filter(Boolean).map(Number);
    } else if (key === 'replica-metrics') {
      out[key] = value.split(',').filter(Boolean);
    } else {
      out[key] = value;
    }
  }
  if (!out.url) usage('--url is required');
  if (!out['count-url']) usage('--count-url is required');
  if (out['replica-pids'].length && out['replica-metrics'].length && out['replica-pids'].length !== out['replica-metrics'].length) {
    usage('--replica-pids and --replica-metrics name the same replicas, in the same order');
  }
  return out;
}

const opts = options();

// ---------------------------------------------------------------------------------------------
// Results

let passed = 0;
let failed = 0;

function check(label, ok, detail = '') {
  if (ok) {
    passed += 1;
    console.log(`ok ${label}`);
  } else {
    failed += 1;
    console.log(`FAIL ${label}: ${detail}`);
  }
}

const skip = (label, why) => console.log(`skip ${label}: ${why}`);
const note = (text) => console.log(`     ${text}`);
const seconds = (ms) => `${(ms / 1000).toFixed(1)} s`;
const clip = (value, n = 300) => {
  const s = typeof value === 'string' ? JSON.stringify(value) : JSON.stringify(value) ?? String(value);
  return s.length > n ? `${s.slice(0, n)}…(${s.length} chars)` : s;
};
const sample = (items, n = 5) => items.slice(0, n).join('; ') + (items.length > n ? `; … (${items.length} in all)` : '');

function describe(error) {
  const parts = [`${error?.constructor?.name ?? 'Error'}: ${String(error?.message ?? error).replace(/\s+/g, ' ').slice(0, 300)}`];
  if (error?.code !== undefined) parts.push(`code ${error.code}`);
  return parts.join(', ');
}

// ---------------------------------------------------------------------------------------------
// Clients and chains

async function connect(i) {
  const client = new Client({ name: CLIENT_NAME, version: '1.0.0' }, { capabilities: {}, versionNegotiation: { mode: { pin: MODERN } } });
  await client.connect(new StreamableHTTPClientTransport(new URL(opts.url)), { timeout: opts['timeout-secs'] * 1000 });
  if (client.getNegotiatedProtocolVersion() !== MODERN) throw new Error(`client ${i} negotiated ${client.getNegotiatedProtocolVersion()}`);
  // As clients do: the tools first. (A replica learns a tool's readOnlyHint from a tools/list it
  // relays; round-robin spreads the clients' lists over the replicas.)
  const { tools } = await client.listTools(undefined, { timeout: opts['timeout-secs'] * 1000 });
  for (const name of ['export_rows', 'read_rows']) {
    if (!tools.some((t) => t.name === name)) throw new Error(`client ${i}: tools/list has no ${name}`);
  }
  return client;
}

const textsOf = (result) => (result.content ?? []).filter((b) => b.type === 'text').map((b) => b.text);
const isNotice = (text) => typeof text === 'string' && text.startsWith('mcp-budget paged this result');

// One page chain: each page is checked against the run its first page names, when it arrives.
class Chain {
  constructor(client, tool, seed, label) {
    Object.assign(this, { client, tool, seed, label });
    this.pages = 0;
    this.offset = 0; // bytes of the result checked so far
    this.shape = null; // what the first page's header declares
    this.cursor = null;
    this.done = false;
    this.complete = false; // the last page came, and the whole result was reassembled
    this.mismatch = null; // where the pages left the expected bytes
    this.toolError = null; // the text of a page that is a tool error
    this.failure = null; // a JSON-RPC, transport or timeout error
    this.slowest = 0;
    this.firstMs = null;
    this.estimate = 1; // pages, as the first one lets guess
    this.rerun = false; // any page may run the tool again (a read-only chain, the cache gone)
  }

  async step() {
    const args = this.cursor ? { seed: this.seed, after: this.cursor } : { seed: this.seed };
    // A first page runs the tool; so may any page of a read-only chain once the cache is
    // gone (the proxy calls the tool again on a miss): those get the first page's bound.
    const runs = this.pages === 0 || this.rerun;
    const timeout = (runs ? opts['first-timeout-secs'] : opts['timeout-secs']) * 1000;
    const began = Date.now();
    let result;
    try {
      result = await this.client.callTool({ name: this.tool, arguments: args }, { timeout });
    } catch (error) {
      this.failure = `page ${this.pages + 1}: ${describe(error)} after ${seconds(Date.now() - began)}`;
      this.done = true;
      return;
    }
    const took = Date.now() - began;
    this.slowest = Math.max(this.slowest, took);
    if (this.pages === 0) this.firstMs = took;
    const texts = textsOf(result);
    if (result.isError) {
      this.toolError = `page ${this.pages + 1}: ${texts.join(' ')}`;
      this.done = true;
      return;
    }
    const notice = isNotice(texts.at(-1)) ? texts.at(-1) : null;
    const body = (notice ? texts.slice(0, -1) : texts).join('');
    if (this.pages === 0) {
      this.shape = parseHeader(body);
      if (!this.shape || this.shape.tool !== this.tool || this.shape.seed !== this.seed) {
        this.mismatch = `page 1 does not begin with ${this.tool}'s header for seed ${this.seed}: ${clip(body.slice(0, 120))}`;
        this.done = true;
        return;
      }
      if (this.tool === 'read_rows' && this.shape.run !== 0) this.mismatch = `read_rows answered run ${this.shape.run}`;
      this.estimate = Math.max(1, Math.ceil(this.shape.total / Math.max(1, body.length)));
    }
    const expected = slice(this.shape, this.offset, this.offset + body.length);
    if (body !== expected) {
      let at = 0;
      while (at < body.length && body[at] === expected[at]) at += 1;
      const runs = runsNamed(body);
      this.mismatch =
        `page ${this.pages + 1} (bytes ${this.offset}-${this.offset + body.length} of ${this.shape.total}) differs from run ${this.shape.run} at byte ${this.offset + at}` +
        `${runs.length > 1 || runs[0] !== this.shape.run ? `; its lines name runs ${runs.join(', ')}` : ''}` +
        `: got ${clip(body.slice(at, at + 60))}, expected ${clip(expected.slice(at, at + 60))}`;
      this.done = true;
      return;
    }
    this.offset += body.length;
    this.pages += 1;
    this.cursor = notice ? (/after:"([^"]+)"/.exec(notice)?.[1] ?? null) : null;
    if (this.cursor && body.length === 0) {
      this.mismatch = `page ${this.pages} is empty and names a next page: the chain would not end`;
      this.done = true;
      return;
    }
    if (!this.cursor) {
      this.done = true;
      this.complete = this.offset === this.shape.total && !this.mismatch;
      if (!this.complete && !this.mismatch) this.mismatch = `the chain ended after ${this.offset} of ${this.shape.total} bytes (${this.pages} pages)`;
    }
  }

  // Pages until `pages` are done (or the chain ends).
  async run(pages = Infinity) {
    while (!this.done && this.pages < pages) await this.step();
  }

  get ok() {
    return this.complete && !this.failure && !this.toolError && !this.mismatch;
  }

  why() {
    return `${this.label}: ${this.failure ?? this.toolError ?? this.mismatch ?? `incomplete after ${this.pages} pages`}`;
  }
}

// ---------------------------------------------------------------------------------------------
// The world around: counts, metrics, replicas, Redis

async function getText(url) {
  const response = await fetch(url, { signal: AbortSignal.timeout(10_000) });
  if (!response.ok) throw new Error(`GET ${url}: ${response.status}`);
  return response.text();
}

const counts = async () => JSON.parse(await getText(opts['count-url']));

// The sum of a metric's samples (every label set) in Prometheus text, or null when absent.
function metricSum(text, name) {
  let sum = null;
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const found = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (found && found[1] === name) sum = (sum ?? 0) + Number(found[3]);
  }
  return sum;
}

const METRICS = ['mcp_budget_remote_cache_hits_total', 'mcp_budget_remote_cache_misses_total', 'mcp_budget_remote_cache_errors_total'];
const short = (name) => name.replace('mcp_budget_remote_cache_', '').replace('_total', '');

// Each replica's remote-cache metrics ({} for one that does not answer: a killed one).
async function scrape(urls) {
  return Promise.all(
    urls.map(async (url) => {
      try {
        const text = await getText(url);
        return Object.fromEntries(METRICS.map((m) => [m, metricSum(text, m)]));
      } catch (error) {
        return { error: describe(error) };
      }
    }),
  );
}

const showMetrics = (samples) =>
  samples.map((s, i) => `r${i + 1} ${s.error ? 'unreachable' : METRICS.map((m) => `${short(m)} ${s[m] ?? 'absent'}`).join(', ')}`).join('; ');

function sh(commandLine, args) {
  const [command, ...rest] = commandLine.split(/\s+/).filter(Boolean);
  return new Promise((resolve) => {
    execFile(command, [...rest, ...args], { timeout: 10_000 }, (error, stdout, stderr) => resolve({ error, out: `${stdout}${stderr}`.trim() }));
  });
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

// A barrier: resolves once every chain has reached it or ended; then `release` lets them go.
function barrier(n) {
  let arrived = 0;
  let allIn;
  const all = new Promise((resolve) => {
    allIn = resolve;
  });
  let open;
  const gate = new Promise((resolve) => {
    open = resolve;
  });
  if (n === 0) allIn();
  return {
    all,
    release: () => open(),
    async arrive() {
      arrived += 1;
      if (arrived === n) allIn();
      await gate;
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Phase a

async function phaseA() {
  const n = opts.clients;
  const began = Date.now();
  const clients = await Promise.all(Array.from({ length: n }, (_, i) => connect(i)));
  const connected = Date.now();
  const chains = clients.map((client, i) => new Chain(client, 'export_rows', i + 1, `export_rows seed ${i + 1}`));
  const gate = barrier(n);
  const runs = chains.map(async (chain) => {
    try {
      await chain.run(1);
      // About a third of the chain before the kill.
      await chain.run(Math.max(1, Math.floor(chain.estimate / 3)));
    } finally {
      await gate.arrive();
    }
    await chain.run();
  });

  await gate.all;
  const atBarrier = Date.now();
  const firstPages = chains.filter((c) => c.firstMs !== null).map((c) => c.firstMs);
  note(`phase a: ${n} clients connected in ${seconds(connected - began)}; first pages in ${seconds(Math.min(...firstPages))} to ${seconds(Math.max(...firstPages))}; every chain at its barrier after ${seconds(atBarrier - began)}`);
  const pagesBefore = chains.map((c) => c.pages);
  const metricsUrls = opts['replica-metrics'];
  const beforeKill = metricsUrls.length ? await scrape(metricsUrls) : [];
  if (metricsUrls.length) note(`before the kill: ${showMetrics(beforeKill)}`);
  let killed = null;
  if (opts['replica-pids'].length) {
    killed = opts['replica-pids'][0];
    let error = null;
    try {
      process.kill(killed, 'SIGKILL');
    } catch (e) {
      error = e;
    }
    const deadline = Date.now() + 5000;
    while (alive(killed) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    const midChain = chains.filter((c) => !c.done).length;
    check(
      `replica r1 (pid ${killed}) killed mid-chain, no request in flight: ${midChain} of ${n} chains had more pages to go (pages done ${Math.min(...pagesBefore)} to ${Math.max(...pagesBefore)})`,
      !error && !alive(killed) && midChain === n,
      error
        ? describe(error)
        : alive(killed)
          ? 'still alive 5 s after SIGKILL'
          : `${n - midChain} chains had ended before the kill (${chains.filter((c) => c.done && !c.ok).length} on an error, reported below)`,
    );
  } else {
    skip('a replica killed mid-chain', 'no --replica-pids');
  }
  gate.release();
  await Promise.all(runs);
  const ended = Date.now();
  const pages = chains.reduce((sum, c) => sum + c.pages, 0);
  note(`phase a: ${seconds(ended - began)} wall (${pages} pages, ${(pages / ((ended - began) / 1000)).toFixed(0)} pages/s; after the kill ${seconds(ended - atBarrier)}); pages per chain ${Math.min(...chains.map((c) => c.pages))} to ${Math.max(...chains.map((c) => c.pages))}; slowest page ${seconds(Math.max(...chains.map((c) => c.slowest)))}`);

  const refused = chains.filter((c) => c.failure || c.toolError);
  check(`phase a: ${n} concurrent clients (${MODERN}), every page answered: no tool error, no JSON-RPC or transport error`, refused.length === 0, sample(refused.map((c) => c.why())));
  const wrong = chains.filter((c) => !c.ok && !c.failure && !c.toolError);
  check(`phase a: every chain reassembles exactly to the one run of its first page (${opts.bytes} bytes each)`, chains.every((c) => c.ok), sample([...wrong, ...refused].map((c) => c.why())));

  try {
    const ran = (await counts()).export_rows ?? {};
    const off = chains.filter((c) => ran[c.seed] !== 1).map((c) => `seed ${c.seed} ran ${ran[c.seed] ?? 0} times`);
    check('phase a: export_rows (not read-only) ran once per chain (the server\'s count)', off.length === 0, sample(off));
  } catch (error) {
    check("phase a: export_rows (not read-only) ran once per chain (the server's count)", false, describe(error));
  }

  if (metricsUrls.length) {
    const after = await scrape(metricsUrls);
    // The killed replica's last figures are those read before the kill.
    const latest = after.map((s, i) => (s.error ? beforeKill[i] : s));
    note(`after phase a: ${showMetrics(after)}`);
    const hits = latest.map((s) => s?.mcp_budget_remote_cache_hits_total ?? 0);
    const sum = hits.reduce((a, b) => a + b, 0);
    note(`mcp_budget_remote_cache_hits_total: ${sum} in all (${hits.join(', ')})`);
    check(
      `phase a: pages crossed replicas: mcp_budget_remote_cache_hits_total > 0 on at least two replicas (${hits.join(', ')})`,
      hits.filter((h) => h > 0).length >= 2,
      `hits per replica ${hits.join(', ')}; ${showMetrics(after)}`,
    );
  } else {
    skip('phase a: pages crossed replicas (remote cache hits)', 'no --replica-metrics');
  }
  await Promise.all(clients.map((c) => c.close().catch(() => {})));
  return { killed };
}

// ---------------------------------------------------------------------------------------------
// Phase b

async function phaseB({ killed }) {
  const n = opts['chains-b'];
  const began = Date.now();
  const clients = await Promise.all(Array.from({ length: n }, (_, i) => connect(i)));
  const exports = clients.map((client, i) => new Chain(client, 'export_rows', 1001 + i, `export_rows seed ${1001 + i}`));
  const reads = clients.map((client, i) => new Chain(client, 'read_rows', 2001 + i, `read_rows seed ${2001 + i}`));
  const chains = [...exports, ...reads];
  const gate = barrier(chains.length);
  const runs = chains.map(async (chain) => {
    try {
      await chain.run(2);
    } finally {
      await gate.arrive();
    }
    await chain.run();
  });
  await gate.all;
  const atBarrier = Date.now();
  const early = chains.filter((c) => !c.ok && c.done);
  check(`phase b: ${n} clients, an export_rows and a read_rows chain each: the first two pages of each, with Redis up`, early.length === 0, sample(early.map((c) => c.why())));

  const survivors = opts['replica-metrics'].filter((_, i) => opts['replica-pids'][i] !== killed);
  const before = survivors.length ? await scrape(survivors) : [];
  const down = await sh(opts['redis-cli'], ['shutdown', 'nosave']);
  const ping = await sh(opts['redis-cli'], ['ping']);
  check('phase b: Redis shut down mid-chain (redis-cli shutdown nosave; ping then fails)', ping.error && !/PONG/.test(ping.out), `shutdown: ${down.out || 'no output'}; ping: ${ping.out}`);
  const stopped = Date.now();
  for (const chain of reads) chain.rerun = true;
  gate.release();
  // A new chain once Redis is down: its first page needs no cache.
  const fresh = new Chain(clients[0], 'export_rows', 3001, 'export_rows seed 3001 (begun with Redis down)');
  await Promise.all([...runs, fresh.run(1)]);
  const ended = Date.now();

  const failures = [...chains, fresh].filter((c) => c.failure);
  const slowest = Math.max(...[...chains, fresh].map((c) => c.slowest));
  note(`phase b: ${seconds(ended - began)} wall (${seconds(ended - stopped)} with Redis down); slowest answer ${seconds(slowest)}`);
  check(
    `phase b: with Redis down every call is answered within ${opts['timeout-secs']} s, or ${opts['first-timeout-secs']} s where it may run the tool again (a read_rows page, as a first page) (a result or a tool error; no JSON-RPC or transport error)`,
    failures.length === 0,
    sample(failures.map((c) => c.why())),
  );
  check(
    'phase b: a new chain begun with Redis down gets its first page (the first page needs no cache)',
    !fresh.failure && !fresh.toolError && !fresh.mismatch && fresh.pages === 1,
    fresh.why(),
  );

  const missed = exports.filter((c) => c.toolError && c.toolError.includes(MISS_TEXT));
  const otherwise = exports.filter((c) => !c.ok && !missed.includes(c));
  note(`export_rows chains: ${missed.length} ended on the cache-miss error, ${exports.filter((c) => c.ok).length} completed (pages from their replica's memory)`);
  if (missed[0]) note(`e.g. ${clip(missed[0].toolError, 400)}`);
  check(
    `phase b: export_rows pages that need the cache get the documented cache-miss tool error ("${MISS_TEXT}"): ${missed.length} of ${n} chains, the others complete and exact`,
    missed.length >= 1 && otherwise.length === 0,
    missed.length === 0 ? `no chain got it; ${sample(exports.map((c) => `${c.label}: ${c.ok ? 'complete' : c.why()}`))}` : sample(otherwise.map((c) => c.why())),
  );
  const badReads = reads.filter((c) => !c.ok);
  check('phase b: read_rows (read-only) chains complete and reassemble exactly with Redis down (called again on a miss)', badReads.length === 0, sample(badReads.map((c) => c.why())));

  try {
    const ran = await counts();
    const off = [...exports, fresh].filter((c) => ran.export_rows?.[c.seed] !== 1).map((c) => `seed ${c.seed} ran ${ran.export_rows?.[c.seed] ?? 0} times`);
    check("phase b: export_rows ran once per chain (the server's count)", off.length === 0, sample(off));
    note(`read_rows runs per chain: ${reads.map((c) => ran.read_rows?.[c.seed] ?? 0).join(', ')} (1 + the re-runs of misses)`);
  } catch (error) {
    check("phase b: export_rows ran once per chain (the server's count)", false, describe(error));
  }

  if (survivors.length) {
    const after = await scrape(survivors);
    const sum = (samples) => samples.reduce((a, s) => a + (s.mcp_budget_remote_cache_errors_total ?? 0), 0);
    note(`surviving replicas after phase b: ${showMetrics(after)}`);
    check(
      `phase b: mcp_budget_remote_cache_errors_total moved on the surviving replicas (${sum(before)} before Redis stopped, ${sum(after)} after)`,
      after.every((s) => !s.error) && sum(after) > sum(before),
      showMetrics(after),
    );
  } else {
    skip('phase b: the remote-cache error metric moves', 'no --replica-metrics');
  }
  note(`phase b: barrier after ${seconds(atBarrier - began)}`);
  await Promise.all(clients.map((c) => c.close().catch(() => {})));
}

// ---------------------------------------------------------------------------------------------

let code = 1;
const started = Date.now();
try {
  const a = await phaseA();
  if (opts['redis-cli']) await phaseB(a);
  else skip('phase b: Redis stopped mid-chain', 'no --redis-cli');
  code = failed || !passed ? 1 : 0;
} catch (error) {
  console.log(`FAIL setup: ${describe(error)}`);
  failed += 1;
}
console.log(`clients: ${seconds(Date.now() - started)} in all`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(code);
