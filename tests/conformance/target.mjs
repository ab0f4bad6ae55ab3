#!/usr/bin/env node
// MCP conformance target server for mcp-budget.
//
// A small MCP server, built on the official TypeScript SDK, that implements
// every tool, resource, prompt and completion the official conformance suite
// (@modelcontextprotocol/conformance, `conformance server`) asks for. The suite
// is pointed either at this server directly or at the mcp-budget proxy sitting
// in front of it, so the proxy can be checked for protocol transparency.
//
//   node target.mjs --stdio     stdio transport (spawned as a child by the proxy);
//                               stdout carries only JSON-RPC, logs go to stderr
//   node target.mjs --port N    Streamable HTTP on http://127.0.0.1:N/mcp with
//                               stateful sessions, an in-memory event store
//                               (SSE priming events, Last-Event-ID replay) and
//                               Host/Origin checks against DNS rebinding.
//                               `--port 0` picks a free port. Once listening it
//                               prints `listening on http://127.0.0.1:N/mcp` to
//                               stderr.
//
// Both modes build their servers with the same createServer() factory.
// Dependencies: @modelcontextprotocol/sdk (pinned in package.json) and Node
// built-ins. ES modules ignore NODE_PATH, so this file must sit next to (or
// below) the node_modules folder holding the SDK.

import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import {
  CallToolRequestSchema,
  CompleteRequestSchema,
  CreateMessageResultSchema,
  ElicitResultSchema,
  GetPromptRequestSchema,
  ListPromptsRequestSchema,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ErrorCode,
  ReadResourceRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
  isInitializeRequest,
} from '@modelcontextprotocol/sdk/types.js';

const SERVER_INFO = { name: 'mcp-budget-conformance-target', version: '1.0.0' };
const RESOURCE_NOT_FOUND = -32002; // MCP "resource not found" error code

const log = (...args) => console.error('[conformance-target]', ...args);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------
// Static test data
// ---------------------------------------------------------------------------

// 1x1 red pixel PNG.
const PNG_BASE64 =
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC';

// 0.1 s of 8 kHz, 8-bit mono silence as a RIFF/WAVE file.
const WAV_BASE64 = (() => {
  const samples = 800;
  const buf = Buffer.alloc(44 + samples, 128);
  buf.write('RIFF', 0, 'ascii');
  buf.writeUInt32LE(36 + samples, 4);
  buf.write('WAVE', 8, 'ascii');
  buf.write('fmt ', 12, 'ascii');
  buf.writeUInt32LE(16, 16); // fmt chunk size
  buf.writeUInt16LE(1, 20); // PCM
  buf.writeUInt16LE(1, 22); // channels
  buf.writeUInt32LE(8000, 24); // sample rate
  buf.writeUInt32LE(8000, 28); // byte rate
  buf.writeUInt16LE(1, 32); // block align
  buf.writeUInt16LE(8, 34); // bits per sample
  buf.write('data', 36, 'ascii');
  buf.writeUInt32LE(samples, 40);
  return buf.toString('base64');
})();

const noArgs = { type: 'object', properties: {} };

const TOOLS = [
  { name: 'test_simple_text', description: 'Returns a simple text response', inputSchema: noArgs },
  { name: 'test_image_content', description: 'Returns a PNG image', inputSchema: noArgs },
  { name: 'test_audio_content', description: 'Returns a WAV audio clip', inputSchema: noArgs },
  { name: 'test_embedded_resource', description: 'Returns an embedded text resource', inputSchema: noArgs },
  {
    name: 'test_multiple_content_types',
    description: 'Returns text, image and embedded resource content',
    inputSchema: noArgs,
  },
  {
    name: 'test_tool_with_logging',
    description: 'Sends three info log notifications while running',
    inputSchema: noArgs,
  },
  { name: 'test_error_handling', description: 'Always returns a tool error (isError: true)', inputSchema: noArgs },
  {
    name: 'test_tool_with_progress',
    description: 'Reports progress 0/100, 50/100, 100/100 when given a progress token',
    inputSchema: noArgs,
  },
  {
    name: 'test_sampling',
    description: 'Asks the client for an LLM completion (sampling/createMessage)',
    inputSchema: {
      type: 'object',
      properties: { prompt: { type: 'string', description: 'Prompt sent to the LLM' } },
      required: ['prompt'],
    },
  },
  {
    name: 'test_elicitation',
    description: 'Asks the client for user input (elicitation/create)',
    inputSchema: {
      type: 'object',
      properties: { message: { type: 'string', description: 'Message shown to the user' } },
      required: ['message'],
    },
  },
  {
    name: 'test_elicitation_sep1034_defaults',
    description: 'Elicitation whose schema carries default values for every primitive type (SEP-1034)',
    inputSchema: noArgs,
  },
  {
    name: 'test_elicitation_sep1330_enums',
    description: 'Elicitation whose schema uses all five enum variants (SEP-1330)',
    inputSchema: noArgs,
  },
  {
    name: 'json_schema_2020_12_tool',
    description: 'Tool with JSON Schema 2020-12 features',
    inputSchema: {
      $schema: 'https://json-schema.org/draft/2020-12/schema',
      type: 'object',
      $defs: {
        address: {
          type: 'object',
          properties: { street: { type: 'string' }, city: { type: 'string' } },
        },
      },
      properties: {
        name: { type: 'string' },
        address: { $ref: '#/$defs/address' },
      },
      additionalProperties: false,
    },
  },
  {
    name: 'test_reconnection',
    description: 'Closes its SSE stream mid-call (SEP-1699 polling) and answers after the client reconnects',
    inputSchema: noArgs,
  },
];

const SEP1034_SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', description: 'User name', default: 'John Doe' },
    age: { type: 'integer', description: 'User age', default: 30 },
    score: { type: 'number', description: 'User score', default: 95.5 },
    status: {
      type: 'string',
      description: 'User status',
      enum: ['active', 'inactive', 'pending'],
      default: 'active',
    },
    verified: { type: 'boolean', description: 'Verification status', default: true },
  },
  required: [],
};

const SEP1330_SCHEMA = {
  type: 'object',
  properties: {
    untitledSingle: {
      type: 'string',
      description: 'Untitled single-select',
      enum: ['option1', 'option2', 'option3'],
    },
    titledSingle: {
      type: 'string',
      description: 'Titled single-select',
      oneOf: [
        { const: 'value1', title: 'First Option' },
        { const: 'value2', title: 'Second Option' },
        { const: 'value3', title: 'Third Option' },
      ],
    },
    legacyEnum: {
      type: 'string',
      description: 'Legacy titled enum (enumNames, deprecated)',
      enum: ['opt1', 'opt2', 'opt3'],
      enumNames: ['Option One', 'Option Two', 'Option Three'],
    },
    untitledMulti: {
      type: 'array',
      description: 'Untitled multi-select',
      items: { type: 'string', enum: ['option1', 'option2', 'option3'] },
    },
    titledMulti: {
      type: 'array',
      description: 'Titled multi-select',
      items: {
        anyOf: [
          { const: 'value1', title: 'First Choice' },
          { const: 'value2', title: 'Second Choice' },
          { const: 'value3', title: 'Third Choice' },
        ],
      },
    },
  },
  required: [],
};

const RESOURCES = [
  {
    uri: 'test://static-text',
    name: 'static-text',
    description: 'A static text resource',
    mimeType: 'text/plain',
  },
  {
    uri: 'test://static-binary',
    name: 'static-binary',
    description: 'A static binary resource (PNG image)',
    mimeType: 'image/png',
  },
  {
    uri: 'test://watched-resource',
    name: 'watched-resource',
    description: 'A resource that can be subscribed to',
    mimeType: 'text/plain',
  },
];

const RESOURCE_TEMPLATES = [
  {
    uriTemplate: 'test://template/{id}/data',
    name: 'template-data',
    description: 'Templated resource; {id} is substituted into the content',
    mimeType: 'application/json',
  },
];
const TEMPLATE_RE = /^test:\/\/template\/([^/]+)\/data$/;

const PROMPTS = [
  { name: 'test_simple_prompt', description: 'A prompt without arguments' },
  {
    name: 'test_prompt_with_arguments',
    description: 'A prompt with two required arguments',
    arguments: [
      { name: 'arg1', description: 'First test argument', required: true },
      { name: 'arg2', description: 'Second test argument', required: true },
    ],
  },
  {
    name: 'test_prompt_with_embedded_resource',
    description: 'A prompt that embeds a resource',
    arguments: [{ name: 'resourceUri', description: 'URI of the resource to embed', required: true }],
  },
  { name: 'test_prompt_with_image', description: 'A prompt that contains an image' },
];

// Completion candidates, keyed by "<ref>:<argument>".
const COMPLETIONS = {
  'prompt:test_prompt_with_arguments:arg1': ['paris', 'park', 'party', 'test', 'testValue1'],
  'prompt:test_prompt_with_arguments:arg2': ['world', 'wonder', 'test', 'testValue2'],
  'prompt:test_prompt_with_embedded_resource:resourceUri': ['test://static-text', 'test://example-resource'],
  'resource:test://template/{id}/data:id': ['1', '2', '3', '123'],
};

const text = (t) => ({ type: 'text', text: t });

// ---------------------------------------------------------------------------
// Server factory: one Server per session (HTTP) or per process (stdio).
// ---------------------------------------------------------------------------

function createServer() {
  const server = new Server(SERVER_INFO, {
    capabilities: {
      tools: { listChanged: false },
      resources: { subscribe: true, listChanged: false },
      prompts: { listChanged: false },
      logging: {},
      completions: {},
    },
    instructions: 'Conformance target for the mcp-budget proxy.',
  });
  const subscriptions = new Set();

  // Log notification tied to the calling request, so it travels on that
  // request's SSE stream; honours the level set with logging/setLevel.
  async function logToClient(extra, level, data) {
    if (server.isMessageIgnored(level, extra.sessionId)) return;
    await extra.sendNotification({
      method: 'notifications/message',
      params: { level, logger: 'conformance-target', data },
    });
  }

  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS }));

  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const args = request.params.arguments ?? {};
    switch (request.params.name) {
      case 'test_simple_text':
        return { content: [text('This is a simple text response for testing.')] };

      case 'test_image_content':
        return { content: [{ type: 'image', data: PNG_BASE64, mimeType: 'image/png' }] };

      case 'test_audio_content':
        return { content: [{ type: 'audio', data: WAV_BASE64, mimeType: 'audio/wav' }] };

      case 'test_embedded_resource':
        return {
          content: [
            {
              type: 'resource',
              resource: {
                uri: 'test://embedded-resource',
                mimeType: 'text/plain',
                text: 'This is an embedded resource content.',
              },
            },
          ],
        };

      case 'test_multiple_content_types':
        return {
          content: [
            text('Multiple content types test:'),
            { type: 'image', data: PNG_BASE64, mimeType: 'image/png' },
            {
              type: 'resource',
              resource: {
                uri: 'test://mixed-content-resource',
                mimeType: 'application/json',
                text: JSON.stringify({ test: 'data', value: 123 }),
              },
            },
          ],
        };

      case 'test_tool_with_logging':
        await logToClient(extra, 'info', 'Tool execution started');
        await sleep(50);
        await logToClient(extra, 'info', 'Tool processing data');
        await sleep(50);
        await logToClient(extra, 'info', 'Tool execution completed');
        return { content: [text('Tool with logging executed successfully')] };

      case 'test_error_handling':
        return {
          isError: true,
          content: [text('This tool intentionally returns an error for testing')],
        };

      case 'test_tool_with_progress': {
        const progressToken = extra._meta?.progressToken;
        for (const progress of [0, 50, 100]) {
          if (progressToken !== undefined) {
            await extra.sendNotification({
              method: 'notifications/progress',
              params: { progressToken, progress, total: 100, message: `progress ${progress}/100` },
            });
          }
          if (progress < 100) await sleep(50);
        }
        return { content: [text('Tool with progress executed successfully')] };
      }

      case 'test_sampling': {
        if (!server.getClientCapabilities()?.sampling) {
          return { isError: true, content: [text('Client does not support sampling')] };
        }
        const result = await extra.sendRequest(
          {
            method: 'sampling/createMessage',
            params: {
              messages: [{ role: 'user', content: text(String(args.prompt ?? '')) }],
              maxTokens: 100,
            },
          },
          CreateMessageResultSchema,
        );
        const reply = result.content?.type === 'text' ? result.content.text : JSON.stringify(result.content);
        return { content: [text(`LLM response: ${reply}`)] };
      }

      case 'test_elicitation': {
        if (!server.getClientCapabilities()?.elicitation) {
          return { isError: true, content: [text('Client does not support elicitation')] };
        }
        const result = await extra.sendRequest(
          {
            method: 'elicitation/create',
            params: {
              message: String(args.message ?? ''),
              requestedSchema: {
                type: 'object',
                properties: {
                  username: { type: 'string', description: "User's response" },
                  email: { type: 'string', description: "User's email address" },
                },
                required: ['username', 'email'],
              },
            },
          },
          ElicitResultSchema,
        );
        return {
          content: [text(`User response: action=${result.action}, content=${JSON.stringify(result.content ?? {})}`)],
        };
      }

      case 'test_elicitation_sep1034_defaults':
      case 'test_elicitation_sep1330_enums': {
        if (!server.getClientCapabilities()?.elicitation) {
          return { isError: true, content: [text('Client does not support elicitation')] };
        }
        const sep1034 = request.params.name === 'test_elicitation_sep1034_defaults';
        const result = await extra.sendRequest(
          {
            method: 'elicitation/create',
            params: sep1034
              ? { message: 'Please review and update the form fields with defaults', requestedSchema: SEP1034_SCHEMA }
              : { message: 'Please select options from the enum fields', requestedSchema: SEP1330_SCHEMA },
          },
          ElicitResultSchema,
        );
        return {
          content: [
            text(`Elicitation completed: action=${result.action}, content=${JSON.stringify(result.content ?? {})}`),
          ],
        };
      }

      case 'json_schema_2020_12_tool':
        return { content: [text(`Received: ${JSON.stringify(args)}`)] };

      case 'test_reconnection':
        // SEP-1699: close the POST SSE stream mid-call; the result is stored in
        // the event store and delivered when the client resumes with
        // Last-Event-ID. The SDK only offers closeSSEStream when resumability
        // is on and the client speaks 2025-11-25 or later (it got a priming
        // event); otherwise the call simply completes on the open stream.
        await sleep(100);
        if (extra.closeSSEStream) {
          extra.closeSSEStream();
          await sleep(200);
        }
        return { content: [text('Reconnection test completed successfully')] };

      default:
        throw new McpError(ErrorCode.InvalidParams, `Unknown tool: ${request.params.name}`);
    }
  });

  server.setRequestHandler(ListResourcesRequestSchema, async () => ({ resources: RESOURCES }));

  server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({
    resourceTemplates: RESOURCE_TEMPLATES,
  }));

  server.setRequestHandler(ReadResourceRequestSchema, async (request) => {
    const { uri } = request.params;
    if (uri === 'test://static-text') {
      return {
        contents: [{ uri, mimeType: 'text/plain', text: 'This is the content of the static text resource.' }],
      };
    }
    if (uri === 'test://static-binary') {
      return { contents: [{ uri, mimeType: 'image/png', blob: PNG_BASE64 }] };
    }
    if (uri === 'test://watched-resource') {
      return {
        contents: [{ uri, mimeType: 'text/plain', text: `Watched resource content at ${new Date().toISOString()}` }],
      };
    }
    const match = TEMPLATE_RE.exec(uri);
    if (match) {
      const id = decodeURIComponent(match[1]);
      return {
        contents: [
          {
            uri,
            mimeType: 'application/json',
            text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }),
          },
        ],
      };
    }
    throw new McpError(RESOURCE_NOT_FOUND, `Resource not found: ${uri}`, { uri });
  });

  server.setRequestHandler(SubscribeRequestSchema, async (request) => {
    const { uri } = request.params;
    subscriptions.add(uri);
    // Announce one update shortly after subscribing. It is not tied to a
    // request, so over HTTP it goes to the standalone GET stream (or the
    // event store when no GET stream is open); over stdio it is a plain line.
    setTimeout(() => {
      if (!subscriptions.has(uri)) return;
      server.sendResourceUpdated({ uri }).catch(() => {
        /* session may already be gone */
      });
    }, 50);
    return {};
  });

  server.setRequestHandler(UnsubscribeRequestSchema, async (request) => {
    subscriptions.delete(request.params.uri);
    return {};
  });

  server.setRequestHandler(ListPromptsRequestSchema, async () => ({ prompts: PROMPTS }));

  server.setRequestHandler(GetPromptRequestSchema, async (request) => {
    const args = request.params.arguments ?? {};
    switch (request.params.name) {
      case 'test_simple_prompt':
        return { messages: [{ role: 'user', content: text('This is a simple prompt for testing.') }] };

      case 'test_prompt_with_arguments':
        requireArgs(args, ['arg1', 'arg2']);
        return {
          messages: [
            { role: 'user', content: text(`Prompt with arguments: arg1='${args.arg1}', arg2='${args.arg2}'`) },
          ],
        };

      case 'test_prompt_with_embedded_resource':
        requireArgs(args, ['resourceUri']);
        return {
          messages: [
            {
              role: 'user',
              content: {
                type: 'resource',
                resource: {
                  uri: args.resourceUri,
                  mimeType: 'text/plain',
                  text: 'Embedded resource content for testing.',
                },
              },
            },
            { role: 'user', content: text('Please process the embedded resource above.') },
          ],
        };

      case 'test_prompt_with_image':
        return {
          messages: [
            { role: 'user', content: { type: 'image', data: PNG_BASE64, mimeType: 'image/png' } },
            { role: 'user', content: text('Please analyze the image above.') },
          ],
        };

      default:
        throw new McpError(ErrorCode.InvalidParams, `Unknown prompt: ${request.params.name}`);
    }
  });

  server.setRequestHandler(CompleteRequestSchema, async (request) => {
    const { ref, argument } = request.params;
    const key =
      ref.type === 'ref/prompt' ? `prompt:${ref.name}:${argument.name}` : `resource:${ref.uri}:${argument.name}`;
    const prefix = String(argument.value ?? '').toLowerCase();
    const values = (COMPLETIONS[key] ?? []).filter((v) => v.toLowerCase().startsWith(prefix));
    return { completion: { values, total: values.length, hasMore: false } };
  });

  return server;
}

function requireArgs(args, names) {
  const missing = names.filter((n) => typeof args[n] !== 'string');
  if (missing.length > 0) {
    throw new McpError(ErrorCode.InvalidParams, `Missing required argument(s): ${missing.join(', ')}`);
  }
}

// ---------------------------------------------------------------------------
// Event store for resumability (Last-Event-ID replay, SSE polling).
// ---------------------------------------------------------------------------

class MemoryEventStore {
  constructor(maxEvents = 10_000) {
    this.maxEvents = maxEvents;
    this.events = new Map(); // eventId -> { streamId, message }, in insertion order
    this.seq = 0;
  }

  async storeEvent(streamId, message) {
    const eventId = `${++this.seq}:${streamId}`;
    this.events.set(eventId, { streamId, message });
    if (this.events.size > this.maxEvents) {
      this.events.delete(this.events.keys().next().value);
    }
    return eventId;
  }

  async getStreamIdForEventId(eventId) {
    return this.events.get(eventId)?.streamId;
  }

  async replayEventsAfter(lastEventId, { send }) {
    const last = this.events.get(lastEventId);
    if (!last) return '';
    let found = false;
    for (const [eventId, { streamId, message }] of this.events) {
      if (eventId === lastEventId) {
        found = true;
        continue;
      }
      // Skip other streams and priming events (stored as an empty message).
      if (!found || streamId !== last.streamId || !('jsonrpc' in message)) continue;
      await send(eventId, message);
    }
    return last.streamId;
  }
}

// ---------------------------------------------------------------------------
// stdio mode
// ---------------------------------------------------------------------------

async function runStdio() {
  const server = createServer();
  server.onerror = (err) => log('server error:', err?.message ?? err);
  await server.connect(new StdioServerTransport());
  log('ready on stdio');
  const shutdown = () => server.close().finally(() => process.exit(0));
  process.on('SIGINT', shutdown);
  process.on('SIGTERM', shutdown);
}

// ---------------------------------------------------------------------------
// Streamable HTTP mode
// ---------------------------------------------------------------------------

const LOCAL_HOSTNAMES = new Set(['localhost', '127.0.0.1', '[::1]']);
const MAX_BODY_BYTES = 4 * 1024 * 1024;

// DNS-rebinding protection: Host must name a loopback host; Origin, when
// present, must too.
function isLocalRequest(req) {
  const hostOk = (value) => {
    try {
      return LOCAL_HOSTNAMES.has(new URL(`http://${value}`).hostname.toLowerCase());
    } catch {
      return false;
    }
  };
  const host = req.headers.host;
  if (!host || !hostOk(host)) return false;
  const origin = req.headers.origin;
  if (origin !== undefined) {
    try {
      const url = new URL(origin);
      if (!['http:', 'https:'].includes(url.protocol) || !LOCAL_HOSTNAMES.has(url.hostname.toLowerCase())) {
        return false;
      }
    } catch {
      return false;
    }
  }
  return true;
}

function sendJsonRpcError(res, status, code, message, headers = {}) {
  if (res.headersSent) {
    res.end();
    return;
  }
  res.writeHead(status, { 'Content-Type': 'application/json', ...headers });
  res.end(JSON.stringify({ jsonrpc: '2.0', error: { code, message }, id: null }));
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) {
        reject(Object.assign(new Error('request body too large'), { status: 413 }));
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

async function runHttp(port) {
  const sessions = new Map(); // session id -> { transport, server }

  async function newSession() {
    const server = createServer();
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      eventStore: new MemoryEventStore(),
      retryInterval: 500,
      onsessioninitialized: (sessionId) => {
        sessions.set(sessionId, { transport, server });
        log(`session ${sessionId} opened`);
      },
    });
    transport.onclose = () => {
      const sessionId = transport.sessionId;
      if (sessionId && sessions.delete(sessionId)) log(`session ${sessionId} closed`);
    };
    server.onerror = (err) => log('server error:', err?.message ?? err);
    await server.connect(transport);
    return transport;
  }

  async function handle(req, res) {
    const path = new URL(req.url ?? '/', 'http://localhost').pathname;
    if (path !== '/mcp') {
      res.writeHead(404, { 'Content-Type': 'text/plain' }).end('Not Found');
      return;
    }
    if (!isLocalRequest(req)) {
      sendJsonRpcError(res, 403, -32000, 'Forbidden: non-localhost Host or Origin header');
      return;
    }
    if (!['GET', 'POST', 'DELETE'].includes(req.method)) {
      sendJsonRpcError(res, 405, -32000, 'Method not allowed', { Allow: 'GET, POST, DELETE' });
      return;
    }

    const sessionId = req.headers['mcp-session-id'];
    const session = typeof sessionId === 'string' ? sessions.get(sessionId) : undefined;

    if (req.method !== 'POST') {
      if (!sessionId) return sendJsonRpcError(res, 400, -32000, 'Bad Request: missing Mcp-Session-Id header');
      if (!session) return sendJsonRpcError(res, 404, -32001, 'Session not found');
      await session.transport.handleRequest(req, res);
      return;
    }

    let body;
    try {
      body = JSON.parse(await readBody(req));
    } catch (err) {
      if (err?.status === 413) return sendJsonRpcError(res, 413, -32000, 'Request body too large');
      return sendJsonRpcError(res, 400, ErrorCode.ParseError, 'Parse error');
    }

    if (session) {
      await session.transport.handleRequest(req, res, body);
      return;
    }
    if (sessionId) return sendJsonRpcError(res, 404, -32001, 'Session not found');

    const isInit = Array.isArray(body) ? body.some(isInitializeRequest) : isInitializeRequest(body);
    if (!isInit) {
      return sendJsonRpcError(res, 400, -32000, 'Bad Request: no valid session ID and not an initialize request');
    }
    const transport = await newSession();
    await transport.handleRequest(req, res, body);
  }

  const httpServer = http.createServer((req, res) => {
    handle(req, res).catch((err) => {
      log('request error:', err?.stack ?? err);
      sendJsonRpcError(res, 500, ErrorCode.InternalError, 'Internal server error');
    });
  });

  await new Promise((resolve, reject) => {
    httpServer.once('error', reject);
    httpServer.listen(port, '127.0.0.1', resolve);
  });
  const actualPort = httpServer.address().port;
  // Exact line, unprefixed: harnesses wait for it to learn the port.
  console.error(`listening on http://127.0.0.1:${actualPort}/mcp`);

  const shutdown = async () => {
    for (const { transport } of sessions.values()) await transport.close().catch(() => {});
    httpServer.close();
    httpServer.closeAllConnections?.();
    process.exit(0);
  };
  process.on('SIGINT', shutdown);
  process.on('SIGTERM', shutdown);
}

// ---------------------------------------------------------------------------
// Entry point
// ---------------------------------------------------------------------------

function usage() {
  console.error('usage: node target.mjs --stdio | --port <N>');
  process.exit(2);
}

const argv = process.argv.slice(2);
if (argv[0] === '--stdio' && argv.length === 1) {
  await runStdio();
} else if (argv[0] === '--port' && argv.length === 2 && /^\d+$/.test(argv[1]) && Number(argv[1]) < 65536) {
  await runHttp(Number(argv[1]));
} else {
  usage();
}
