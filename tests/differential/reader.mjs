#!/usr/bin/env node
// An MCP server that reads JSON with JavaScript's JSON.parse and logs what it read (the
// differential test, run.py): every message as one JSON line {method, id, name, arguments} in
// the log file (argv[2]), non-finite numbers written as strings. It answers initialize,
// tools/list and tools/call, and {} to any other request; a batch with a batch.
import fs from 'node:fs';

const log = fs.openSync(process.argv[2], 'a');
const plain = (v) => {
  if (typeof v === 'number' && !Number.isFinite(v)) return v > 0 ? 'inf' : v < 0 ? '-inf' : 'nan';
  if (Array.isArray(v)) return v.map(plain);
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)]));
  return v;
};

function answer(message) {
  if (!message || typeof message !== 'object' || Array.isArray(message)) return null;
  const params = message.params && typeof message.params === 'object' && !Array.isArray(message.params) ? message.params : {};
  fs.writeSync(log, JSON.stringify(plain({
    method: message.method ?? null,
    id: 'id' in message ? message.id : '(none)',
    name: params.name ?? null,
    arguments: params.arguments ?? null,
  })) + '\n');
  if (!('method' in message) || !('id' in message)) return null;
  let result = {};
  if (message.method === 'initialize') {
    result = { protocolVersion: '2025-11-25', capabilities: { tools: {} }, serverInfo: { name: 'reader-node', version: '1' } };
  } else if (message.method === 'tools/list') {
    result = { tools: [{ name: 't', inputSchema: { type: 'object' } }] };
  } else if (message.method === 'tools/call') {
    result = { content: [{ type: 'text', text: 'ok' }] };
  }
  return { jsonrpc: '2.0', id: message.id, result };
}

// Lines end at \n only (as the SDKs' stdio reads them; readline would also split at \r).
let pending = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  pending += chunk;
  let end;
  while ((end = pending.indexOf('\n')) >= 0) {
    const line = pending.slice(0, end);
    pending = pending.slice(end + 1);
    onLine(line);
  }
});

function onLine(line) {
  let message;
  try {
    message = JSON.parse(line);
  } catch {
    fs.writeSync(log, JSON.stringify({ unreadable: true }) + '\n');
    return;
  }
  const reply = Array.isArray(message) ? message.map(answer).filter((a) => a) : answer(message);
  if (reply && (!Array.isArray(reply) || reply.length)) process.stdout.write(JSON.stringify(reply) + '\n');
}
