#!/usr/bin/env node
// MCP conformance target server for mcp-budget.
//
// A small MCP server, built on the official TypeScript SDK v2
// (@modelcontextprotocol/server), that implements every tool, resource, prompt
// and completion the official conformance suite (@modelcontextprotocol/
// conformance, `conformance server`) asks for, in both protocol eras:
//
//   2025-11-25  the stateful lifecycle: initialize handshake, Mcp-Session-Id
//               sessions, server-to-client requests (sampling, elicitation),
//               logging/setLevel, resource subscriptions, resumable SSE;
//   2026-07-28  the stateless lifecycle: every request carries its own _meta
//               envelope (protocol version, client info and capabilities),
//               server/discover, subscriptions/listen, input-required results
//               (multi-round-trip, SEP-2322), caching hints (SEP-2549).
//
// The suite is pointed either at this server directly or at the mcp-budget
// proxy sitting in front of it, so the proxy can be checked for protocol
// transparency in each era.
//
//   node target.mjs --stdio     stdio transport (spawned as a child by the proxy);
//                               the opening message picks the era for the
//                               connection (the SDK's serveStdio). stdout
//                               carries only JSON-RPC, logs go to stderr.
//   node target.mjs --port N    Streamable HTTP on http://127.0.0.1:N/mcp, both
//                               eras on the same endpoint: requests claiming
//                               the 2026-07-28 envelope go to the SDK's
//                               createMcpHandler (one server per request); the
//                               rest (2025-11-25) to stateful sessions with an
//                               in-memory event store (SSE priming events,
//                               Last-Event-ID replay). Host/Origin are checked
//                               against DNS rebinding. `--port 0` picks a free
//                               port; once listening it prints
//                               `listening on http://127.0.0.1:N/mcp` to stderr.
//
//   --modern-only               with either: serve 2026-07-28 alone (a legacy
//                               opening gets the SDK's unsupported-version
//                               error), as a modern-only server does.
//   --legacy-only               with either: serve 2025-11-25 alone (initialize
//                               and sessions; server/discover unknown), as a
//                               server not yet updated does.
//
// All modes build their servers with the same createServer() factory.
// Dependencies: @modelcontextprotocol/server (pinned in package.json) and Node
// built-ins (Node >= 20). ES modules ignore NODE_PATH, so this file must sit
// next to (or below) the node_modules folder holding the SDK.

import http from 'node:http';
import { randomUUID } from 'node:crypto';
import {
  CLIENT_CAPABILITIES_META_KEY,
  McpServer,
  ProtocolError,
  ProtocolErrorCode,
  ResourceTemplate,
  WebStandardStreamableHTTPServerTransport,
  acceptedContent,
  createMcpHandler,
  createRequestStateCodec,
  fromJsonSchema,
  inputRequired,
  isInitializeRequest,
  isLegacyRequest,
  localhostAllowedHostnames,
  localhostAllowedOrigins,
  validateHostHeader,
  validateOriginHeader,
} from '@modelcontextprotocol/server';
import { StdioServerTransport, serveStdio } from '@modelcontextprotocol/server/stdio';

const SERVER_INFO = { name: 'mcp-budget-conformance-target', version: '2.0.0' };

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

const text = (t) => ({ type: 'text', text: t });
const noArgs = () => fromJsonSchema({ type: 'object', properties: {} });
const objectSchema = (properties, required = Object.keys(properties)) => ({
  type: 'object',
  properties,
  required,
});

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
      minItems: 1,
      maxItems: 3,
      items: { type: 'string', enum: ['option1', 'option2', 'option3'] },
    },
    titledMulti: {
      type: 'array',
      description: 'Titled multi-select',
      minItems: 1,
      maxItems: 3,
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

// JSON Schema 2020-12 keywords that must survive tools/list verbatim
// (SEP-1613, SEP-2106).
const JSON_SCHEMA_2020_12 = {
  $schema: 'https://json-schema.org/draft/2020-12/schema',
  type: 'object',
  $defs: {
    address: {
      $anchor: 'addressDef',
      type: 'object',
      properties: { street: { type: 'string' }, city: { type: 'string' } },
    },
  },
  properties: {
    name: { type: 'string' },
    address: { $ref: '#/$defs/address' },
    contactMethod: { type: 'string', enum: ['phone', 'email'] },
    phone: { type: 'string' },
    email: { type: 'string' },
  },
  allOf: [{ anyOf: [{ required: ['phone'] }, { required: ['email'] }] }],
  if: { properties: { contactMethod: { const: 'phone' } }, required: ['contactMethod'] },
  then: { required: ['phone'] },
  else: { required: ['email'] },
  additionalProperties: false,
};

// Completion candidates, keyed by "<ref>:<argument>".
const COMPLETIONS = {
  'prompt:test_prompt_with_arguments:arg1': ['paris', 'park', 'party', 'test', 'testValue1'],
  'prompt:test_prompt_with_arguments:arg2': ['world', 'wonder', 'test', 'testValue2'],
  'prompt:test_prompt_with_embedded_resource:resourceUri': ['test://static-text', 'test://example-resource'],
  'resource:test://template/{id}/data:id': ['1', '2', '3', '123'],
};

// requestState round-trips through the client (2026-07-28 input-required
// results), so it is HMAC-sealed when minted and verified by the SDK before a
// handler runs (tampered state: -32602). The key is per process: on the
// stateless path every round is served by a fresh server instance.
const requestStateCodec = createRequestStateCodec({ key: crypto.getRandomValues(new Uint8Array(32)) });

const nameRequest = (message = 'What is your name?') =>
  inputRequired.elicit({ message, requestedSchema: objectSchema({ name: { type: 'string' } }) });
const confirmRequest = () =>
  inputRequired.elicit({ message: 'Please confirm', requestedSchema: objectSchema({ ok: { type: 'boolean' } }) });

// ---------------------------------------------------------------------------
// Server factory: one McpServer per session (2025-11-25 over HTTP), per request
// (2026-07-28 over HTTP) or per connection (stdio).
//   era:     'legacy' (2025-11-25) or 'modern' (2026-07-28)
//   changed: publishes a list_changed event ('tools' | 'prompts'); over HTTP the
//            modern era publishes onto the handler's subscriptions/listen bus
// ---------------------------------------------------------------------------

// The resource test_trigger_resource_update says was updated.
const WATCHED = 'test://watched-resource';

function createServer({ era, changed }) {
  const mcp = new McpServer(SERVER_INFO, {
    capabilities: {
      tools: { listChanged: true },
      resources: { subscribe: true, listChanged: true },
      prompts: { listChanged: true },
      // Deprecated in 2026-07-28 (SEP-2577), kept for 2025-11-25 logging/setLevel.
      logging: {},
      completions: {},
    },
    instructions: 'Conformance target for the mcp-budget proxy.',
    requestState: { verify: requestStateCodec.verify },
  });
  const publish = (kind) => {
    if (changed) changed(kind);
    else if (kind === 'tools') mcp.sendToolListChanged();
    else if (kind === 'resource') mcp.server.sendResourceUpdated({ uri: WATCHED });
    else mcp.sendPromptListChanged();
  };

  const tool = (name, description, handler, inputSchema = noArgs()) =>
    mcp.registerTool(name, { description, inputSchema }, handler);

  // ----- content tools ------------------------------------------------------

  tool('test_simple_text', 'Returns a simple text response', async () => ({
    content: [text('This is a simple text response for testing.')],
  }));

  tool('test_image_content', 'Returns a PNG image', async () => ({
    content: [{ type: 'image', data: PNG_BASE64, mimeType: 'image/png' }],
  }));

  tool('test_audio_content', 'Returns a WAV audio clip', async () => ({
    content: [{ type: 'audio', data: WAV_BASE64, mimeType: 'audio/wav' }],
  }));

  tool('test_embedded_resource', 'Returns an embedded text resource', async () => ({
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
  }));

  tool('test_multiple_content_types', 'Returns text, image and embedded resource content', async () => ({
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
  }));

  tool('test_error_handling', 'Always returns a tool error (isError: true)', async () => ({
    isError: true,
    content: [text('This tool intentionally returns an error for testing')],
  }));

  tool('json_schema_2020_12_tool', 'Tool with JSON Schema 2020-12 features', async (args) => ({
    content: [text(`Received: ${JSON.stringify(args)}`)],
  }), fromJsonSchema(JSON_SCHEMA_2020_12));

  // SEP-2243: an argument mirrored into the Mcp-Param-Region header.
  tool(
    'test_x_mcp_header',
    'Argument region is mirrored into the Mcp-Param-Region header (SEP-2243)',
    async (args) => ({ content: [text(`region=${args.region ?? '<none>'}`)] }),
    fromJsonSchema({
      type: 'object',
      properties: {
        region: { type: 'string', description: 'mirrored into Mcp-Param-Region', 'x-mcp-header': 'Region' },
        level: { type: 'integer', description: 'not mirrored' },
      },
    }),
  );

  // ----- notifications during a call ----------------------------------------

  tool('test_tool_with_logging', 'Sends three info log notifications while running', async (_args, ctx) => {
    for (const [i, message] of ['Tool execution started', 'Tool processing data', 'Tool execution completed'].entries()) {
      if (i > 0) await sleep(50);
      await ctx.mcpReq.notify({
        method: 'notifications/message',
        params: { level: 'info', logger: 'conformance-target', data: message },
      });
    }
    return { content: [text('Tool with logging executed successfully')] };
  });

  tool('test_tool_with_progress', 'Reports progress 0/100, 50/100, 100/100 when given a progress token', async (_args, ctx) => {
    const progressToken = ctx.mcpReq._meta?.progressToken;
    if (progressToken !== undefined) {
      for (const progress of [0, 50, 100]) {
        await ctx.mcpReq.notify({
          method: 'notifications/progress',
          params: { progressToken, progress, total: 100, message: `progress ${progress}/100` },
        });
        if (progress < 100) await sleep(50);
      }
    }
    return { content: [text(String(progressToken ?? 'no-progress-token'))] };
  });

  // 2026-07-28: logs only when the request's _meta carries a logLevel.
  tool('test_logging_tool', 'Logs through the request-scoped, logLevel-gated channel', async (_args, ctx) => {
    await ctx.mcpReq.log('info', 'test_logging_tool ran');
    return { content: [text('logged through the request-scoped channel')] };
  });

  // SEP-1699: close the POST SSE stream mid-call; the result goes to the event
  // store and reaches the client when it resumes with Last-Event-ID. The SDK
  // only offers closeSSE with an event store and a 2025-11-25 client (one that
  // got a priming event); otherwise the call completes on the open stream.
  tool('test_reconnection', 'Closes its SSE stream mid-call (SEP-1699 polling) and answers after the client reconnects', async (_args, ctx) => {
    await sleep(100);
    if (ctx.http?.closeSSE) {
      ctx.http.closeSSE();
      await sleep(200);
    }
    return { content: [text('Reconnection test completed successfully')] };
  });

  // ----- server-to-client requests (2025-11-25) ------------------------------

  tool(
    'test_sampling',
    'Asks the client for an LLM completion (sampling/createMessage)',
    async (args, ctx) => {
      try {
        const result = await ctx.mcpReq.send({
          method: 'sampling/createMessage',
          params: { messages: [{ role: 'user', content: text(String(args.prompt ?? '')) }], maxTokens: 100 },
        });
        const reply = result.content?.type === 'text' ? result.content.text : JSON.stringify(result.content);
        return { content: [text(`LLM response: ${reply}`)] };
      } catch (err) {
        return { isError: true, content: [text(`Sampling failed: ${err?.message ?? err}`)] };
      }
    },
    fromJsonSchema(objectSchema({ prompt: { type: 'string', description: 'Prompt sent to the LLM' } })),
  );

  const elicit = async (ctx, params, prefix) => {
    try {
      const result = await ctx.mcpReq.send({ method: 'elicitation/create', params });
      return { content: [text(`${prefix}: action=${result.action}, content=${JSON.stringify(result.content ?? {})}`)] };
    } catch (err) {
      return { isError: true, content: [text(`Elicitation failed: ${err?.message ?? err}`)] };
    }
  };

  tool(
    'test_elicitation',
    'Asks the client for user input (elicitation/create)',
    (args, ctx) =>
      elicit(
        ctx,
        {
          message: String(args.message ?? ''),
          requestedSchema: objectSchema({
            username: { type: 'string', description: "User's response" },
            email: { type: 'string', description: "User's email address" },
          }),
        },
        'User response',
      ),
    fromJsonSchema(objectSchema({ message: { type: 'string', description: 'Message shown to the user' } })),
  );

  tool('test_elicitation_sep1034_defaults', 'Elicitation whose schema carries default values for every primitive type (SEP-1034)', (_args, ctx) =>
    elicit(ctx, { message: 'Please review and update the form fields with defaults', requestedSchema: SEP1034_SCHEMA }, 'Elicitation completed'),
  );

  tool('test_elicitation_sep1330_enums', 'Elicitation whose schema uses all five enum variants (SEP-1330)', (_args, ctx) =>
    elicit(ctx, { message: 'Please select options from the enum fields', requestedSchema: SEP1330_SCHEMA }, 'Elicitation completed'),
  );

  // ----- 2026-07-28 stateless diagnostics (server-stateless, SEP-2575) -------

  tool('test_missing_capability', 'Requires the sampling client capability (input-required createMessage)', async (_args, ctx) => {
    if (ctx.mcpReq.inputResponses?.llm_answer === undefined) {
      return inputRequired({
        inputRequests: {
          llm_answer: inputRequired.createMessage({
            messages: [{ role: 'user', content: text('Reply with the single word: pong') }],
            maxTokens: 16,
          }),
        },
      });
    }
    return { content: [text('sampling round-trip complete')] };
  });

  tool('test_streaming_elicitation', 'Answers on a stream that carries no top-level JSON-RPC request', async () => ({
    content: [text('stream observed: result frames only')],
  }));

  tool('test_trigger_tool_change', 'Publishes a tools/list_changed event', async () => {
    publish('tools');
    return { content: [text('tools_list_changed published')] };
  });

  tool('test_trigger_resource_update', `Publishes notifications/resources/updated for ${WATCHED}`, async () => {
    publish('resource');
    return { content: [text('resource update published')] };
  });

  tool('test_trigger_prompt_change', 'Publishes a prompts/list_changed event', async () => {
    publish('prompts');
    return { content: [text('prompts_list_changed published')] };
  });

  // ----- 2026-07-28 input-required results (multi-round-trip, SEP-2322) ------
  // Each returns inputRequired(...) until the retried request carries the
  // responses it needs. On a 2025-11-25 session the SDK's legacy shim fulfils
  // them with real server-to-client requests instead.

  tool('test_input_required_result_elicitation', 'Asks for the caller name via an in-band elicitation request', async (_args, ctx) => {
    const name = acceptedContent(ctx.mcpReq.inputResponses, 'user_name')?.name;
    if (typeof name !== 'string') return inputRequired({ inputRequests: { user_name: nameRequest() } });
    return { content: [text(`Hello, ${name}!`)] };
  });

  tool('test_input_required_result_sampling', 'Asks for an LLM completion via an in-band sampling request', async (_args, ctx) => {
    const response = ctx.mcpReq.inputResponses?.capital_question;
    if (response === undefined) {
      return inputRequired({
        inputRequests: {
          capital_question: inputRequired.createMessage({
            messages: [{ role: 'user', content: text('What is the capital of France?') }],
            maxTokens: 100,
          }),
        },
      });
    }
    const answer = typeof response.content?.text === 'string' ? response.content.text : JSON.stringify(response);
    return { content: [text(`Sampling response: ${answer}`)] };
  });

  tool('test_input_required_result_list_roots', 'Asks for the client roots via an in-band roots/list request', async (_args, ctx) => {
    const roots = ctx.mcpReq.inputResponses?.client_roots?.roots;
    if (!Array.isArray(roots)) return inputRequired({ inputRequests: { client_roots: inputRequired.listRoots() } });
    return { content: [text(`Client exposed ${roots.length} root(s): ${roots.map((r) => r.uri).join(', ')}`)] };
  });

  tool('test_input_required_result_request_state', 'Round-trips integrity-protected requestState alongside an elicitation request', async (_args, ctx) => {
    if (acceptedContent(ctx.mcpReq.inputResponses, 'confirm') === undefined) {
      return inputRequired({
        inputRequests: { confirm: confirmRequest() },
        requestState: await requestStateCodec.mint({ tool: 'request_state', nonce: randomUUID() }),
      });
    }
    if (ctx.mcpReq.requestState() === undefined) {
      throw new ProtocolError(ProtocolErrorCode.InvalidParams, 'Invalid requestState: missing or failed verification');
    }
    return { content: [text('state-ok: requestState verified and confirmation received')] };
  });

  tool('test_input_required_result_multiple_inputs', 'Asks for elicitation, sampling and roots input in a single round', async (_args, ctx) => {
    const responses = ctx.mcpReq.inputResponses;
    const name = acceptedContent(responses, 'user_name')?.name;
    const greeting = responses?.greeting?.content?.text;
    const roots = responses?.client_roots?.roots;
    if (typeof name !== 'string' || typeof greeting !== 'string' || !Array.isArray(roots)) {
      return inputRequired({
        inputRequests: {
          user_name: nameRequest(),
          greeting: inputRequired.createMessage({
            messages: [{ role: 'user', content: text('Generate a greeting') }],
            maxTokens: 50,
          }),
          client_roots: inputRequired.listRoots(),
        },
        requestState: await requestStateCodec.mint({ tool: 'multiple_inputs', nonce: randomUUID() }),
      });
    }
    return { content: [text(`${greeting} ${name} - ${roots.length} root(s) visible`)] };
  });

  // The round number lives in the sealed requestState (no per-session state).
  tool('test_input_required_result_multi_round', 'Two elicitation rounds with evolving requestState before completing', async (_args, ctx) => {
    const state = ctx.mcpReq.requestState();
    const round = state?.tool === 'multi_round' && typeof state.round === 'number' ? state.round : 0;
    if (round === 0) {
      return inputRequired({
        inputRequests: { step1: nameRequest('Step 1: What is your name?') },
        requestState: await requestStateCodec.mint({ tool: 'multi_round', round: 1, nonce: randomUUID() }),
      });
    }
    if (round === 1) {
      const name = acceptedContent(ctx.mcpReq.inputResponses, 'step1')?.name ?? 'unknown';
      return inputRequired({
        inputRequests: {
          step2: inputRequired.elicit({
            message: 'Step 2: What is your favorite color?',
            requestedSchema: objectSchema({ color: { type: 'string' } }),
          }),
        },
        requestState: await requestStateCodec.mint({ tool: 'multi_round', round: 2, name, nonce: randomUUID() }),
      });
    }
    const color = acceptedContent(ctx.mcpReq.inputResponses, 'step2')?.color ?? 'unknown';
    return { content: [text(`Multi-round complete: ${String(state?.name ?? 'unknown')} likes ${color}`)] };
  });

  // A retry whose requestState fails verification is rejected (-32602) by the
  // SDK before this handler runs.
  tool('test_input_required_result_tampered_state', 'Rejects retries whose requestState fails integrity verification', async (_args, ctx) => {
    if (ctx.mcpReq.requestState() !== undefined && acceptedContent(ctx.mcpReq.inputResponses, 'confirm') !== undefined) {
      return { content: [text('integrity-ok: requestState verified')] };
    }
    return inputRequired({
      inputRequests: { confirm: confirmRequest() },
      requestState: await requestStateCodec.mint({ tool: 'tampered_state', nonce: randomUUID() }),
    });
  });

  // Only asks for input kinds the request's declared client capabilities cover.
  tool('test_input_required_result_capabilities', 'Only requests input kinds the declared client capabilities cover', async (_args, ctx) => {
    if (ctx.mcpReq.inputResponses !== undefined) {
      return { content: [text('Capability-aware input requests fulfilled')] };
    }
    const declared = ctx.mcpReq.envelope?.[CLIENT_CAPABILITIES_META_KEY];
    const inputRequests = {};
    if (declared?.elicitation !== undefined) inputRequests.user_name = nameRequest();
    if (declared?.sampling !== undefined) {
      inputRequests.greeting = inputRequired.createMessage({
        messages: [{ role: 'user', content: text('Generate a short greeting') }],
        maxTokens: 50,
      });
    }
    if (declared?.roots !== undefined) inputRequests.client_roots = inputRequired.listRoots();
    if (Object.keys(inputRequests).length === 0) {
      return { content: [text('No declared client capability supports an in-band input request')] };
    }
    return inputRequired({ inputRequests });
  });

  // ----- resources ----------------------------------------------------------

  mcp.registerResource(
    'static-text',
    'test://static-text',
    { title: 'Static Text Resource', description: 'A static text resource', mimeType: 'text/plain' },
    async (uri) => ({
      contents: [{ uri: uri.toString(), mimeType: 'text/plain', text: 'This is the content of the static text resource.' }],
    }),
  );

  mcp.registerResource(
    'static-binary',
    'test://static-binary',
    { title: 'Static Binary Resource', description: 'A static binary resource (PNG image)', mimeType: 'image/png' },
    async (uri) => ({ contents: [{ uri: uri.toString(), mimeType: 'image/png', blob: PNG_BASE64 }] }),
  );

  mcp.registerResource(
    'watched-resource',
    'test://watched-resource',
    { title: 'Watched Resource', description: 'A resource that can be subscribed to', mimeType: 'text/plain' },
    async (uri) => ({ contents: [{ uri: uri.toString(), mimeType: 'text/plain', text: 'Watched resource content' }] }),
  );

  mcp.registerResource(
    'template-data',
    new ResourceTemplate('test://template/{id}/data', { list: undefined }),
    {
      title: 'Resource Template',
      description: 'Templated resource; {id} is substituted into the content',
      mimeType: 'application/json',
    },
    async (uri, { id }) => ({
      contents: [
        {
          uri: uri.toString(),
          mimeType: 'application/json',
          text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }),
        },
      ],
    }),
  );

  // resources/subscribe is a 2025-11-25 method (2026-07-28 has
  // subscriptions/listen instead, served by the SDK).
  if (era === 'legacy') {
    const subscriptions = new Set();
    mcp.server.setRequestHandler('resources/subscribe', async (request) => {
      subscriptions.add(request.params.uri);
      return {};
    });
    mcp.server.setRequestHandler('resources/unsubscribe', async (request) => {
      subscriptions.delete(request.params.uri);
      return {};
    });
  }

  // ----- prompts ------------------------------------------------------------

  mcp.registerPrompt('test_simple_prompt', { title: 'Simple Test Prompt', description: 'A prompt without arguments' }, async () => ({
    messages: [{ role: 'user', content: text('This is a simple prompt for testing.') }],
  }));

  mcp.registerPrompt(
    'test_prompt_with_arguments',
    {
      title: 'Prompt With Arguments',
      description: 'A prompt with two required arguments',
      argsSchema: fromJsonSchema(
        objectSchema({
          arg1: { type: 'string', description: 'First test argument' },
          arg2: { type: 'string', description: 'Second test argument' },
        }),
      ),
    },
    async (args) => ({
      messages: [{ role: 'user', content: text(`Prompt with arguments: arg1='${args.arg1}', arg2='${args.arg2}'`) }],
    }),
  );

  mcp.registerPrompt(
    'test_prompt_with_embedded_resource',
    {
      title: 'Prompt With Embedded Resource',
      description: 'A prompt that embeds a resource',
      argsSchema: fromJsonSchema(objectSchema({ resourceUri: { type: 'string', description: 'URI of the resource to embed' } })),
    },
    async (args) => ({
      messages: [
        {
          role: 'user',
          content: {
            type: 'resource',
            resource: { uri: args.resourceUri, mimeType: 'text/plain', text: 'Embedded resource content for testing.' },
          },
        },
        { role: 'user', content: text('Please process the embedded resource above.') },
      ],
    }),
  );

  mcp.registerPrompt('test_prompt_with_image', { title: 'Prompt With Image', description: 'A prompt that contains an image' }, async () => ({
    messages: [
      { role: 'user', content: { type: 'image', data: PNG_BASE64, mimeType: 'image/png' } },
      { role: 'user', content: text('Please analyze the image above.') },
    ],
  }));

  // prompts/get may answer input_required too (2026-07-28).
  mcp.registerPrompt(
    'test_input_required_result_prompt',
    { title: 'Input-Required Prompt', description: 'Requires elicitation input before rendering' },
    async (ctx) => {
      const context = acceptedContent(ctx.mcpReq.inputResponses, 'user_context')?.context;
      if (typeof context !== 'string') {
        return inputRequired({
          inputRequests: {
            user_context: inputRequired.elicit({
              message: 'What context should the prompt use?',
              requestedSchema: objectSchema({ context: { type: 'string' } }),
            }),
          },
        });
      }
      return { messages: [{ role: 'user', content: text(`Use the following context: ${context}`) }] };
    },
  );

  // ----- completion ---------------------------------------------------------

  mcp.server.setRequestHandler('completion/complete', async (request) => {
    const { ref, argument } = request.params;
    const key = ref.type === 'ref/prompt' ? `prompt:${ref.name}:${argument.name}` : `resource:${ref.uri}:${argument.name}`;
    const prefix = String(argument.value ?? '').toLowerCase();
    const values = (COMPLETIONS[key] ?? []).filter((v) => v.toLowerCase().startsWith(prefix));
    return { completion: { values, total: values.length, hasMore: false } };
  });

  return mcp;
}

// ---------------------------------------------------------------------------
// Event store for resumability (2025-11-25: Last-Event-ID replay, SSE polling).
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
// stdio mode: the SDK pins the era on the connection's opening message.
// ---------------------------------------------------------------------------

function runStdio() {
  if (legacyOnly) {
    // Hand-wired, as a 2025 server is: initialize only; server/discover is unknown.
    const server = createServer({ era: 'legacy' });
    server.server.onerror = (err) => log('stdio error:', err?.message ?? err);
    server.connect(new StdioServerTransport());
    log('ready on stdio (legacy only)');
    return;
  }
  const handle = serveStdio(({ era }) => createServer({ era }), {
    legacy: modernOnly ? 'reject' : 'serve',
    onerror: (err) => log('stdio error:', err?.message ?? err),
  });
  log('ready on stdio');
  const shutdown = () => handle.close().finally(() => process.exit(0));
  process.on('SIGINT', shutdown);
  process.on('SIGTERM', shutdown);
}

// ---------------------------------------------------------------------------
// Streamable HTTP mode
// ---------------------------------------------------------------------------

const MAX_BODY_BYTES = 4 * 1024 * 1024;

function jsonRpcError(status, code, message, headers = {}) {
  return Response.json({ jsonrpc: '2.0', error: { code, message }, id: null }, { status, headers });
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
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

// node:http request -> web-standard Request; aborted when the client goes away.
function toWebRequest(req, res, body) {
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) {
    if (Array.isArray(value)) for (const v of value) headers.append(name, v);
    else if (value !== undefined) headers.set(name, value);
  }
  const controller = new AbortController();
  res.on('close', () => controller.abort());
  return new Request(new URL(req.url ?? '/', 'http://127.0.0.1'), {
    method: req.method,
    headers,
    body: body && body.length > 0 ? body : undefined,
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
  res.flushHeaders();
  const reader = response.body.getReader();
  res.on('close', () => reader.cancel().catch(() => {}));
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      res.write(value);
    }
  } catch {
    // client gone or stream errored: nothing more to write
  }
  res.end();
}

async function runHttp(port) {
  // 2026-07-28: one server per request, from the same factory.
  const modern = createMcpHandler(
    ({ era }) =>
      createServer({
        era,
        changed: (kind) =>
          kind === 'tools' ? modern.notify.toolsChanged() : kind === 'resource' ? modern.notify.resourceUpdated(WATCHED) : modern.notify.promptsChanged(),
      }),
    { legacy: 'reject', onerror: (err) => log('modern:', err?.message ?? err) },
  );

  // 2025-11-25: stateful sessions.
  const sessions = new Map(); // session id -> { transport, server }

  async function serveLegacy(request, parsedBody) {
    const sessionId = request.headers.get('mcp-session-id');
    const session = sessionId ? sessions.get(sessionId) : undefined;
    if (session) return session.transport.handleRequest(request, { parsedBody });
    if (sessionId) return jsonRpcError(404, -32001, 'Session not found');
    if (request.method !== 'POST') return jsonRpcError(400, -32000, 'Bad Request: missing Mcp-Session-Id header');
    if (parsedBody === undefined) return jsonRpcError(400, -32700, 'Parse error');
    const isInit = Array.isArray(parsedBody) ? parsedBody.some(isInitializeRequest) : isInitializeRequest(parsedBody);
    if (!isInit) return jsonRpcError(400, -32000, 'Bad Request: no valid session ID and not an initialize request');

    const server = createServer({ era: 'legacy' });
    const transport = new WebStandardStreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      eventStore: new MemoryEventStore(),
      retryInterval: 500,
      onsessioninitialized: (id) => {
        sessions.set(id, { transport, server });
        log(`session ${id} opened`);
      },
    });
    transport.onclose = () => {
      const id = transport.sessionId;
      if (id && sessions.delete(id)) {
        log(`session ${id} closed`);
        server.close().catch(() => {});
      }
    };
    server.server.onerror = (err) => log('legacy:', err?.message ?? err);
    await server.connect(transport);
    return transport.handleRequest(request, { parsedBody });
  }

  async function handle(req, res) {
    const path = new URL(req.url ?? '/', 'http://127.0.0.1').pathname;
    if (path !== '/mcp') {
      res.writeHead(404, { 'Content-Type': 'text/plain' }).end('Not Found');
      return;
    }
    // DNS-rebinding protection: Host must name a loopback host; Origin, when
    // present, must too.
    const host = validateHostHeader(req.headers.host, localhostAllowedHostnames());
    const origin = validateOriginHeader(req.headers.origin, localhostAllowedOrigins());
    if (!host.ok || !origin.ok) {
      await writeWebResponse(res, jsonRpcError(403, -32000, (host.ok ? origin : host).message));
      return;
    }
    if (!['GET', 'POST', 'DELETE'].includes(req.method)) {
      await writeWebResponse(res, jsonRpcError(405, -32000, 'Method not allowed', { Allow: 'GET, POST, DELETE' }));
      return;
    }

    let body;
    let parsedBody;
    if (req.method === 'POST') {
      try {
        body = await readBody(req);
      } catch (err) {
        await writeWebResponse(res, jsonRpcError(err?.status === 413 ? 413 : 400, -32000, err.message));
        return;
      }
      try {
        parsedBody = body.length > 0 ? JSON.parse(body.toString('utf8')) : undefined;
      } catch {
        parsedBody = undefined;
      }
    }
    const request = toWebRequest(req, res, body);
    const legacy = legacyOnly || (!modernOnly && (await isLegacyRequest(request, parsedBody)));
    const response = legacy ? await serveLegacy(request, parsedBody) : await modern.fetch(request, { parsedBody });
    await writeWebResponse(res, response);
  }

  const httpServer = http.createServer((req, res) => {
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
    httpServer.once('error', reject);
    httpServer.listen(port, '127.0.0.1', resolve);
  });
  const actualPort = httpServer.address().port;
  // Exact line, unprefixed: harnesses wait for it to learn the port.
  console.error(`listening on http://127.0.0.1:${actualPort}/mcp`);

  const shutdown = async () => {
    for (const { transport } of sessions.values()) await transport.close().catch(() => {});
    await modern.close().catch(() => {});
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
  console.error('usage: node target.mjs --stdio | --port <N>  [--modern-only | --legacy-only]');
  process.exit(2);
}

// --modern-only: 2026-07-28 alone (the SDK refuses a legacy opening with the
// unsupported-version error naming the modern revision), as a modern-only server is.
const modernOnly = process.argv.includes('--modern-only');
// --legacy-only: 2025-11-25 alone (sessions, initialize), as a server not yet updated is.
const legacyOnly = process.argv.includes('--legacy-only');
const argv = process.argv.slice(2).filter((a) => a !== '--modern-only' && a !== '--legacy-only');
if (argv[0] === '--stdio' && argv.length === 1) {
  runStdio();
} else if (argv[0] === '--port' && argv.length === 2 && /^\d+$/.test(argv[1]) && Number(argv[1]) < 65536) {
  await runHttp(Number(argv[1]));
} else {
  usage();
}
