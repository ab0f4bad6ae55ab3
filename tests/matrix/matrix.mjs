#!/usr/bin/env node
// The default path, for every client: each client profile × each server with a built-in policy
// (server-filesystem, mcp-server-git, server-everything), under its built-in policy and under
// `--policy none`, in both eras (the TypeScript SDK v2 client, legacy and pinned to
// 2026-07-28), over stdio; and one row over `--listen`.
//
// Each cell calls one tool, follows the chain to its end and checks:
//   - no page is refused (no isError);
//   - every page is within the client's budget, measured on what that client's model reads
//     (the profile table of src/client.rs: structuredContent, content, or both);
//   - the continuation is in what the client reads (next_after in structuredContent, or
//     after:"…" in the text);
//   - the chain reassembles to the direct result exactly, and every page of a JSON document
//     parses.
//
// Prints one line per cell ("ok …" or "FAIL …: DETAIL"), a table of chain lengths, and closes
// with "N passed, M failed". Exit status 1 on any failure.
//
// usage: node matrix.mjs --proxy BIN --everything JS --filesystem JS --git BIN --work DIR

import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport, getDefaultEnvironment } from '@modelcontextprotocol/client/stdio';

const MODERN = '2026-07-28';
const opts = {};
for (let i = 2; i < process.argv.length; i += 2) opts[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
for (const key of ['proxy', 'everything', 'filesystem', 'git', 'work']) {
  if (!opts[key]) {
    console.error(`matrix.mjs: --${key} is required`);
    process.exit(2);
  }
}
const only = process.env.MATRIX_ONLY ? new RegExp(process.env.MATRIX_ONLY) : null;

// The client profiles (src/client.rs): the clientInfo.name each sends, its byte budget, its
// line budget, and what its model reads of a result with both content and structuredContent.
// Cursor and an unknown client have no profile: the policy's 200000 bytes, both halves.
const CLIENTS = [
  { profile: 'codex', name: 'codex-mcp-client', bytes: 10_000, lines: 256, reads: 'structured' },
  { profile: 'vscode', name: 'Visual Studio Code', bytes: 8 * 1024, reads: 'structured' },
  { profile: 'copilot-cli', name: 'github-copilot-developer', bytes: 10 * 1024, reads: 'both' },
  { profile: 'gemini-cli', name: 'gemini-cli-mcp-client', bytes: 40_000, reads: 'content' },
  { profile: 'opencode', name: 'opencode', bytes: 50 * 1024, lines: 2_000, reads: 'content' },
  // Claude Code honours _meta["anthropic/maxResultSizeChars"] (up to 500000) on the tools the
  // proxy declares it on; elsewhere 50000. (Its 25000-token budget is the proxy's to count; a
  // 4-byte-a-token bound is checked here: bytes / 4.)
  { profile: 'claude-code', name: 'claude-code', bytes: 50_000, allowance: true, reads: 'structured' },
  { profile: 'cursor', name: 'cursor-vscode', bytes: 200_000, reads: 'both' },
  { profile: 'unknown', name: 'some-other-client', bytes: 200_000, reads: 'both' },
];

const work = opts.work;
const files = path.join(work, 'files');
const repo = path.join(work, 'repo');

// ---------------------------------------------------------------------------------------------
// Fixtures: a 7 KB and a 300 KB text file (unicode, tabs, quotes, backslashes), a directory of
// 3,000 entries, a tree of 20 directories of 40 files, a repository of 600 commits.

function fixtures() {
  fs.rmSync(work, { recursive: true, force: true });
  fs.mkdirSync(path.join(files, 'many'), { recursive: true });
  let seed = 7;
  const random = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
  const words = ['alpha', 'beta', 'δέλτα', 'naïve', '"quoted"', 'back\\slash', 'tab\there', 'emoji😀', 'x'.repeat(30)];
  const text = (bytes) => {
    const lines = [];
    let size = 0;
    for (let i = 0; size < bytes; i += 1) {
      const n = 3 + Math.floor(random() * 12);
      const line = `${String(i).padStart(6, '0')} ${Array.from({ length: n }, () => words[Math.floor(random() * words.length)]).join(' ')}\n`;
      lines.push(line);
      size += Buffer.byteLength(line);
    }
    return lines.join('');
  };
  fs.writeFileSync(path.join(files, 'small.txt'), text(7 * 1024));
  fs.writeFileSync(path.join(files, 'big.txt'), text(300 * 1024));
  for (let i = 0; i < 3000; i += 1) fs.writeFileSync(path.join(files, 'many', `entry-${String(i).padStart(4, '0')}.txt`), 'x');
  for (let d = 0; d < 20; d += 1) {
    const dir = path.join(files, 'tree', `dir${String(d).padStart(2, '0')}`);
    fs.mkdirSync(dir, { recursive: true });
    for (let f = 0; f < 40; f += 1) fs.writeFileSync(path.join(dir, `file-${String(f).padStart(3, '0')}.txt`), 'y');
  }
  // 600 commits in one fast-import stream.
  fs.mkdirSync(repo);
  const git = (args, input) => execFileSync('git', args, { cwd: repo, input, stdio: ['pipe', 'ignore', 'inherit'] });
  git(['init', '-q', '-b', 'main']);
  let stream = '';
  for (let i = 0; i < 600; i += 1) {
    const message = `change ${i}: ${'a careful description of what changed and why '.repeat(1 + (i % 3))}\n`;
    const data = `line ${i}\n`;
    stream += `commit refs/heads/main\nmark :${i + 1}\ncommitter Matrix <matrix@example.com> ${1700000000 + i * 60} +0000\n`;
    stream += `data ${Buffer.byteLength(message)}\n${message}`;
    if (i > 0) stream += `from :${i}\n`;
    stream += `M 644 inline file.txt\ndata ${Buffer.byteLength(data)}\n${data}\n`;
  }
  git(['fast-import', '--quiet'], stream);
  git(['checkout', '-q', 'main']);
}

// ---------------------------------------------------------------------------------------------
// Servers and the results asked of them.

const SERVERS = {
  filesystem: {
    command: 'node',
    args: [opts.filesystem, files],
    calls: [
      { label: '7 KB file', tool: 'read_text_file', arguments: { path: path.join(files, 'small.txt') } },
      { label: '300 KB file', tool: 'read_text_file', arguments: { path: path.join(files, 'big.txt') } },
      { label: '3,000-entry listing', tool: 'list_directory', arguments: { path: path.join(files, 'many') } },
      { label: 'directory_tree (JSON)', tool: 'directory_tree', arguments: { path: path.join(files, 'tree') }, json: true },
    ],
  },
  git: {
    command: opts.git,
    args: ['--repository', repo],
    calls: [{ label: '600-commit git_log', tool: 'git_log', arguments: { repo_path: repo, max_count: 600 } }],
  },
  everything: {
    command: 'node',
    args: [opts.everything],
    calls: [{ label: '300 KB echo', tool: 'echo', arguments: { message: Array.from({ length: 10_000 }, (_, i) => `${i} ünïcode "q" \\ tab\t end`).join('\n') } }],
  },
};

// ---------------------------------------------------------------------------------------------
// Sessions

const children = [];
process.on('exit', () => children.forEach((c) => c.kill('SIGKILL')));

function env() {
  return { ...getDefaultEnvironment(), PATH: process.env.PATH, HOME: process.env.HOME, RUST_LOG: 'warn' };
}

async function open(target, { name, mode }) {
  const client = new Client({ name, version: '1.0.0' }, { capabilities: {}, versionNegotiation: { mode: mode === 'pinned' ? { pin: MODERN } : 'legacy' } });
  const transport = target.url
    ? new StreamableHTTPClientTransport(new URL(target.url))
    : new StdioClientTransport({ command: target.command, args: target.args, env: env(), stderr: 'ignore' });
  await client.connect(transport, { timeout: 30_000 });
  return client;
}

function listen(policy, server) {
  const child = spawn(opts.proxy, [...policy, '--listen', 'http://127.0.0.1:0/mcp', '--', server.command, ...server.args], { env: env(), stdio: ['ignore', 'pipe', 'ignore'] });
  children.push(child);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no "listening on" line in 20 s')), 20_000);
    readline.createInterface({ input: child.stdout }).on('line', (line) => {
      const found = /listening on (http:\/\/\S+)/.exec(line);
      if (found) {
        clearTimeout(timer);
        resolve({ url: found[1], child });
      }
    });
    child.on('exit', (code) => reject(new Error(`mcp-budget --listen exited (${code})`)));
  });
}

// ---------------------------------------------------------------------------------------------
// Measures

const bytes = (value) => Buffer.byteLength(JSON.stringify(value));

function read(result, reads) {
  const { structuredContent, ...rest } = result;
  if (reads === 'structured' && structuredContent != null) return { bytes: bytes(structuredContent), text: JSON.stringify(structuredContent) };
  if (reads === 'content' && structuredContent != null) return { bytes: bytes(rest), text: texts(result).join('\n') };
  return { bytes: bytes(result), text: texts(result).join('\n') };
}

const texts = (result) => (result.content ?? []).filter((b) => b.type === 'text').map((b) => b.text);

function cursorOf(result, reads) {
  const structured = result.structuredContent;
  if (reads === 'structured' && structured != null) {
    if (typeof structured === 'object' && !Array.isArray(structured)) return structured.next_after ?? null;
    return result._meta?.['mcp-budget/next_after'] ?? null;
  }
  for (const text of texts(result).slice(1).reverse()) {
    const found = /after:"([^"]+)"/.exec(text);
    if (found) return found[1];
  }
  return null;
}

// The page's own data: its first text block (these servers answer with one).
const dataOf = (result) => texts(result)[0] ?? '';

function resolvePath(doc, jsonPath) {
  const re = /\.([A-Za-z0-9_]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]/g;
  let m;
  while ((m = re.exec(jsonPath.slice(1)))) doc = m[1] !== undefined ? doc[m[1]] : m[2] !== undefined ? doc[Number(m[2])] : doc[JSON.parse(m[3])];
  return doc;
}

// The whole result from the pages: texts concatenated, or (a list paged out of a JSON text)
// the first page's document with every page's items.
function reassemble(pages) {
  const data = pages.map(dataOf);
  const notice = texts(pages[0]).slice(1).join(' ');
  const found = /(?:items|members) \d+-\d+ of \d+ in (\$\S*?)(?:;|\.(?:\s|$)| \()/.exec(notice);
  if (!found) return data.join('');
  const docs = data.map((text) => JSON.parse(text));
  const whole = docs[0];
  const items = resolvePath(whole, found[1]);
  // A list's items, or (a document with no list) an object's members.
  for (const doc of docs.slice(1)) {
    const more = resolvePath(doc, found[1]);
    if (Array.isArray(items)) items.push(...more);
    else Object.assign(items, more);
  }
  return JSON.stringify(whole);
}

// ---------------------------------------------------------------------------------------------
// One session of one client: every call of the server, each followed to its chain's end.

const results = [];
let passed = 0;
let failed = 0;
const direct = {};

async function directResults(serverName, server) {
  const client = await open(server, { name: 'matrix-direct', mode: 'legacy' });
  try {
    for (const call of server.calls) {
      const result = await client.callTool({ name: call.tool, arguments: call.arguments }, { timeout: 60_000 });
      direct[`${serverName}/${call.tool}/${call.label}`] = result;
    }
  } finally {
    await client.close().catch(() => {});
  }
}

async function cells(serverName, server, policyName, client, mode, transport, target) {
  const prefix = `${client.profile}/${mode}/${transport}: ${serverName} (${policyName})`;
  if (only && !only.test(prefix)) return;
  let session;
  try {
    session = await open(target, { name: client.name, mode });
  } catch (error) {
    for (const call of server.calls) fail(`${prefix}: ${call.label}`, `the session did not open: ${error.message}`);
    return;
  }
  try {
    const tools = (await session.listTools()).tools;
    for (const call of server.calls) {
      const label = `${prefix}: ${call.label}`;
      const descriptor = tools.find((t) => t.name === call.tool);
      const allowance = descriptor?._meta?.['anthropic/maxResultSizeChars'];
      const budget = client.allowance && allowance ? Math.min(allowance, 500_000) : client.bytes;
      const expected = direct[`${serverName}/${call.tool}/${call.label}`];
      try {
        const pages = [];
        let args = { ...call.arguments };
        for (;;) {
          const result = await session.callTool({ name: call.tool, arguments: args }, { timeout: 60_000 });
          pages.push(result);
          if (result.isError) throw new Error(`page ${pages.length} refused: ${texts(result).join(' ').slice(0, 300)}`);
          const seen = read(result, client.reads);
          if (seen.bytes >= budget) throw new Error(`page ${pages.length}: the model reads ${seen.bytes} bytes, over the ${budget}-byte budget`);
          if (client.allowance && seen.bytes / 4 > 25_000) throw new Error(`page ${pages.length}: ${seen.bytes} bytes, over 25000 tokens at 4 bytes a token`);
          if (client.lines && client.reads !== 'structured' && seen.text.split('\n').length > client.lines) {
            throw new Error(`page ${pages.length}: ${seen.text.split('\n').length} lines, over ${client.lines}`);
          }
          if (call.json) JSON.parse(dataOf(result));
          const cursor = cursorOf(result, client.reads);
          if (!cursor) break;
          if (pages.length > 5000) throw new Error('more than 5000 pages');
          args = { ...call.arguments, after: cursor };
        }
        const whole = reassemble(pages);
        const want = dataOf(expected);
        const same = call.json ? JSON.stringify(JSON.parse(want)) === JSON.stringify(JSON.parse(whole)) : want === whole;
        if (!same) throw new Error(`the ${pages.length} pages reassemble to ${whole.length} characters, not the direct ${want.length}`);
        // The structured half, where it mirrors the text, reassembles to the same text.
        if (!call.json && pages.every((p) => typeof p.structuredContent?.content === 'string')) {
          const structured = pages.map((p) => p.structuredContent.content).join('');
          if (structured !== want) throw new Error(`structuredContent.content of the ${pages.length} pages is not the direct text`);
        }
        ok(label, pages.length);
        results.push({ client: client.profile, mode, transport, server: serverName, policy: policyName, label: call.label, pages: pages.length });
      } catch (error) {
        fail(label, error.message);
      }
    }
  } finally {
    await session.close().catch(() => {});
  }
}

function ok(label, pages) {
  passed += 1;
  console.log(`ok ${label} (${pages} page${pages === 1 ? '' : 's'})`);
}

function fail(label, detail) {
  failed += 1;
  console.log(`FAIL ${label}: ${detail}`);
}

// ---------------------------------------------------------------------------------------------

fixtures();
for (const [name, server] of Object.entries(SERVERS)) await directResults(name, server);

const POLICIES = { 'built-in policy': [], 'policy none': ['--policy', 'none'] };
for (const [serverName, server] of Object.entries(SERVERS)) {
  for (const [policyName, policy] of Object.entries(POLICIES)) {
    const target = { command: opts.proxy, args: [...policy, '--', server.command, ...server.args] };
    for (const client of CLIENTS) {
      for (const mode of ['legacy', 'pinned']) await cells(serverName, server, policyName, client, mode, 'stdio', target);
    }
  }
}
// One row over --listen: server-filesystem under its built-in policy, every client, both eras.
{
  const { url, child } = await listen([], SERVERS.filesystem);
  for (const client of CLIENTS) {
    for (const mode of ['legacy', 'pinned']) await cells('filesystem', SERVERS.filesystem, 'built-in policy', client, mode, 'listen', { url });
  }
  child.kill();
}

// Chain lengths, legacy stdio, built-in policy, per client and result.
const labels = [...new Set(results.map((r) => `${r.server}: ${r.label}`))];
console.log(`\nchain lengths (calls), stdio, legacy era, built-in policy / --policy none:`);
console.log(`| client | ${labels.join(' | ')} |`);
for (const client of CLIENTS) {
  const row = labels.map((label) => {
    const find = (policy) => results.find((r) => r.client === client.profile && r.mode === 'legacy' && r.transport === 'stdio' && `${r.server}: ${r.label}` === label && r.policy === policy)?.pages ?? '—';
    return `${find('built-in policy')} / ${find('policy none')}`;
  });
  console.log(`| ${client.profile} | ${row.join(' | ')} |`);
}
console.log(`\n${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
