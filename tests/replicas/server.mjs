#!/usr/bin/env node
// The counting server of the replicas scenario (run.sh): an MCP server on the official
// TypeScript SDK v2 (@modelcontextprotocol/server) over Streamable HTTP, that counts what it
// runs, so the scenario can tell how often a tool ran behind three proxy replicas.
//
//   node server.mjs --port N [--bytes B]
//
// Serves http://127.0.0.1:N/mcp (`--port 0` picks a port) and prints
// `listening on http://127.0.0.1:N/mcp` on stderr once it listens. Both eras, statelessly:
// the SDK's createMcpHandler answers 2026-07-28 requests with one server per request, and
// 2025-11-25 ones with its stateless legacy fallback (no sessions; GET and DELETE get 405).
//
// Tools (results built by rows.mjs, about B bytes, default 10,000,000, in lines of 100 bytes):
//   export_rows {seed}  not read-only (readOnlyHint false, destructiveHint false): every call
//                       is a new run (the process's call counter, from 1), which its every line
//                       names, so two calls of one seed answer differently;
//   read_rows {seed}    read-only (readOnlyHint true): the same text for a seed on every call.
//
// GET /count on the same port answers what ran, per tool and seed:
//   {"export_rows": {"<seed>": n, ...}, "read_rows": {...}, "runs": <export_rows calls>}

import http from 'node:http';
import { McpServer, createMcpHandler, fromJsonSchema } from '@modelcontextprotocol/server';
import { rows } from './rows.mjs';

const log = (...args) => console.error('[replicas-server]', ...args);

function options() {
  const out = { port: null, bytes: 10_000_000 };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    const value = argv[i + 1];
    if (!['port', 'bytes'].includes(key) || !/^\d+$/.test(value ?? '')) {
      console.error('usage: node server.mjs --port N [--bytes B]');
      process.exit(2);
    }
    out[key] = Number(value);
  }
  if (out.port === null || out.port > 65535) {
    console.error('usage: node server.mjs --port N [--bytes B]');
    process.exit(2);
  }
  return out;
}

const opts = options();
const counts = { export_rows: {}, read_rows: {} };
let runs = 0;

const seedSchema = fromJsonSchema({
  type: 'object',
  properties: { seed: { type: 'integer', description: 'Which rows' } },
  required: ['seed'],
});

function createServer() {
  const mcp = new McpServer({ name: 'mcp-budget-replicas-server', version: '1.0.0' }, { capabilities: { tools: {} } });
  mcp.registerTool(
    'export_rows',
    {
      description: `Exports about ${opts.bytes} bytes of rows; each call is a new run (not read-only)`,
      inputSchema: seedSchema,
      annotations: { readOnlyHint: false, destructiveHint: false },
    },
    async ({ seed }) => {
      runs += 1;
      const run = runs;
      counts.export_rows[seed] = (counts.export_rows[seed] ?? 0) + 1;
      return { content: [{ type: 'text', text: rows('export_rows', seed, run, opts.bytes) }] };
    },
  );
  mcp.registerTool(
    'read_rows',
    {
      description: `Reads about ${opts.bytes} bytes of rows; the same for a seed on every call (read-only)`,
      inputSchema: seedSchema,
      annotations: { readOnlyHint: true },
    },
    async ({ seed }) => {
      counts.read_rows[seed] = (counts.read_rows[seed] ?? 0) + 1;
      return { content: [{ type: 'text', text: rows('read_rows', seed, 0, opts.bytes) }] };
    },
  );
  return mcp;
}

// Both eras on one endpoint: modern requests get a server each; legacy ones the SDK's
// stateless fallback, from the same factory.
const handler = createMcpHandler(() => createServer(), { onerror: (err) => log('mcp:', err?.message ?? err) });

// node:http request -> web-standard Request (the body read here); aborted when the client goes.
async function toWebRequest(req, res) {
  const chunks = [];
  if (req.method === 'POST') for await (const chunk of req) chunks.push(chunk);
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) {
    if (Array.isArray(value)) for (const v of value) headers.append(name, v);
    else if (value !== undefined) headers.set(name, value);
  }
  const controller = new AbortController();
  res.on('close', () => controller.abort());
  const body = Buffer.concat(chunks);
  return new Request(new URL(req.url ?? '/', 'http://127.0.0.1'), {
    method: req.method,
    headers,
    body: body.length > 0 ? body : undefined,
    signal: controller.signal,
  });
}

// Web-standard Response -> node:http response, streaming (SSE) bodies as they come.
async function writeWebResponse(res, response) {
  const headers = {};
  response.headers.forEach((value, name) => {
    headers[name] = value;
  });
  res.writeHead(response.status, headers);
  if (!response.body) {
    res.end();
    return;
  }
  const reader = response.body.getReader();
  res.on('close', () => reader.cancel().catch(() => {}));
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (!res.write(value)) await new Promise((resolve) => res.once('drain', resolve));
    }
  } catch {
    // the client went away or the stream failed: nothing more to write
  }
  res.end();
}

async function handle(req, res) {
  const path = new URL(req.url ?? '/', 'http://127.0.0.1').pathname;
  if (path === '/count' && req.method === 'GET') {
    res.writeHead(200, { 'Content-Type': 'application/json' }).end(JSON.stringify({ ...counts, runs }));
    return;
  }
  if (path !== '/mcp') {
    res.writeHead(404, { 'Content-Type': 'text/plain' }).end('Not Found');
    return;
  }
  await writeWebResponse(res, await handler.fetch(await toWebRequest(req, res)));
}

// The proxies keep their connections for the whole scenario, and results are large: no
// header or request timeout. Node checks those every 30 s on every connection and, on a
// kept-alive one, counts from before its current request (nodejs/node#58140): a connection
// older than the 60 s default was reset mid-call, for every such call at once (seen in a CI
// rehearsal: "could not reach the upstream server … connection error" on 6 calls, 16 ms apart).
// The idle limit outlasts the scenario: with 60 s, the connections left idle after phase a's
// first pages timed out just as phase b began, while this server's loop was busy building 10 MB
// results, so it read the timer before the requests already sent on them and reset 6 of them
// (CI, stop 39). The proxy now reuses a connection only a second short of the announced
// `Keep-Alive: timeout`, but a loop busy for longer than that second still loses the race.
const server = http.createServer({ requestTimeout: 0, headersTimeout: 0, keepAliveTimeout: 600_000 }, (req, res) => {
  handle(req, res).catch((err) => {
    log('request error:', err?.stack ?? err);
    if (!res.headersSent) {
      res.writeHead(500, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32603, message: 'Internal server error' }, id: null }));
    } else {
      res.end();
    }
  });
});

await new Promise((resolve, reject) => {
  server.once('error', reject);
  server.listen(opts.port, '127.0.0.1', resolve);
});
// Exact line: harnesses wait for it to learn the port.
console.error(`listening on http://127.0.0.1:${server.address().port}/mcp`);

const shutdown = async () => {
  await handler.close().catch(() => {});
  server.close();
  server.closeAllConnections?.();
  process.exit(0);
};
process.on('SIGINT', shutdown);
process.on('SIGTERM', shutdown);
