#!/usr/bin/env node
// MCP conformance target for the tasks extension (io.modelcontextprotocol/tasks,
// SEP-2663), for mcp-budget.
//
// The official TypeScript SDK v2 ships no tasks extension, so the SDK-based
// target (target.mjs) cannot pass the conformance suite's `tasks-*` scenarios.
// This one is written by hand, with Node built-ins only (no dependencies), and
// speaks the modern protocol alone (2026-07-28: stateless, every request
// carries its own _meta envelope; no initialize, no sessions).
//
//   node tasks-target.mjs --port N   Streamable HTTP on http://127.0.0.1:N/mcp
//                                    (`--port 0` picks a free port). Once
//                                    listening it prints the exact line
//                                    `listening on http://127.0.0.1:N/mcp` to
//                                    stderr, as target.mjs does.
//   node tasks-target.mjs --stdio    newline-delimited JSON-RPC on stdin/stdout
//                                    (logs go to stderr).
//   --modern-only is accepted and changes nothing (this target is modern only).
//
// What it implements (2026-07-28 plus the tasks extension):
//   server/discover        declares tools and the tasks extension;
//   tools/list, tools/call the fixtures the `tasks-*` scenarios name (below),
//                          plus `big_task`, whose result is large, so that the
//                          proxy's budget can be tested on a task's result;
//   tasks/get, tasks/update, tasks/cancel
//                          gated on the client declaring the extension in the
//                          request's own _meta (-32021 otherwise);
//   subscriptions/listen   an SSE stream (HTTP) that acknowledges the task ids
//                          it will report on, then carries notifications/tasks
//                          on every status change of those tasks;
//   HTTP request checks    Host/Origin (DNS rebinding), MCP-Protocol-Version,
//                          Mcp-Method and Mcp-Name (SEP-2243; Mcp-Name is the
//                          taskId for tasks/*), with 400 + -32020 on mismatch.
//
// Tools (the scenario fixtures; "task" = answered with a CreateTaskResult when
// the request declares the extension):
//   greet               never a task: "Hello, {name}!".
//   slow_compute        task when it can: sleeps `seconds`, then a result;
//                       settles to `cancelled` when cancelled while running.
//   failing_job         task required (-32021 without the extension): after
//                       ~0.5 s completes with a tool error (isError: true).
//   protocol_error_job  task when it can: fails with a JSON-RPC error (-32603),
//                       so the task ends `failed` with an inlined `error`.
//   confirm_delete      task when it can: one elicitation (input_required,
//                       answered by tasks/update); without the extension the
//                       same question is asked by MRTR (InputRequiredResult).
//   multi_input         task when it can: two elicitations pending at once
//                       (partial answers keep the task in input_required).
//   test_tool_with_task task required: asks `user_name` by MRTR first, then,
//                       on the retry carrying the answer, creates a task whose
//                       result greets that name.
//   big_task            task when it can: completes with one text block of
//                       `bytes` bytes (default 600,000) of numbered lines.
//
// Tasks live in memory, for TASK_TTL_MS after creation; task ids are random
// UUIDs. There is no authentication, so anyone holding a task id may use it.

import http from 'node:http';
import readline from 'node:readline';
import { randomUUID } from 'node:crypto';

const PROTOCOL_VERSION = '2026-07-28';
const SUPPORTED_VERSIONS = [PROTOCOL_VERSION];
const TASKS_EXTENSION = 'io.modelcontextprotocol/tasks';
const SERVER_INFO = { name: 'mcp-budget-tasks-conformance-target', version: '1.0.0' };

// _meta keys of the 2026-07-28 envelope.
const META_PROTOCOL_VERSION = 'io.modelcontextprotocol/protocolVersion';
const META_CLIENT_CAPABILITIES = 'io.modelcontextprotocol/clientCapabilities';
const META_SERVER_INFO = 'io.modelcontextprotocol/serverInfo';
const META_SUBSCRIPTION_ID = 'io.modelcontextprotocol/subscriptionId';

// JSON-RPC error codes.
const PARSE_ERROR = -32700;
const INVALID_REQUEST = -32600;
const METHOD_NOT_FOUND = -32601;
const INVALID_PARAMS = -32602;
const INTERNAL_ERROR = -32603;
const HEADER_MISMATCH = -32020;
const MISSING_REQUIRED_CLIENT_CAPABILITY = -32021;
const UNSUPPORTED_PROTOCOL_VERSION = -32022;

const TASK_TTL_MS = 5 * 60 * 1000; // how long a task stays readable after creation
const POLL_INTERVAL_MS = 250; // suggested tasks/get interval
const LIST_TTL_MS = 60 * 1000; // caching hint on server/discover and tools/list
const KEEPALIVE_MS = 15 * 1000; // SSE comment on quiet listen streams
const MAX_BODY_BYTES = 4 * 1024 * 1024;
const BIG_TASK_DEFAULT_BYTES = 600000;
const BIG_TASK_MAX_BYTES = 64 * 1024 * 1024;

const log = (...args) => console.error('[tasks-target]', ...args);
const isObject = (v) => typeof v === 'object' && v !== null && !Array.isArray(v);
const nowIso = () => new Date().toISOString();

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

// A JSON-RPC error to answer with. `httpStatus` is the status on Streamable
// HTTP; when absent, statusFor() derives it from the code.
class RpcError extends Error {
  constructor(code, message, data, httpStatus) {
    super(message);
    this.code = code;
    this.data = data;
    this.httpStatus = httpStatus;
  }

  toJSON() {
    return { code: this.code, message: this.message, ...(this.data !== undefined ? { data: this.data } : {}) };
  }
}

// The HTTP status of an error response (2026-07-28 Streamable HTTP): 400 for
// malformed requests, header mismatches, missing client capabilities and
// unsupported versions; 404 for an unknown method; 200 for errors of a method
// that ran (unknown task, bad tool arguments, a tool's own JSON-RPC error).
function statusFor(err) {
  if (err.httpStatus) return err.httpStatus;
  switch (err.code) {
    case PARSE_ERROR:
    case INVALID_REQUEST:
    case HEADER_MISMATCH:
    case MISSING_REQUIRED_CLIENT_CAPABILITY:
    case UNSUPPORTED_PROTOCOL_VERSION:
      return 400;
    case METHOD_NOT_FOUND:
      return 404;
    default:
      return 200;
  }
}

const invalidParams = (message) => new RpcError(INVALID_PARAMS, message);
const headerMismatch = (message) => new RpcError(HEADER_MISMATCH, `Header mismatch: ${message}`);
const missingCapability = (requiredCapabilities) =>
  new RpcError(MISSING_REQUIRED_CLIENT_CAPABILITY, 'Missing required client capability', { requiredCapabilities });
const missingTasksExtension = () => missingCapability({ extensions: { [TASKS_EXTENSION]: {} } });
const unsupportedVersion = (requested) =>
  new RpcError(UNSUPPORTED_PROTOCOL_VERSION, `Unsupported protocol version: ${requested}`, {
    supported: SUPPORTED_VERSIONS,
    requested: String(requested),
  });

// Thrown into a task's job when the task is cancelled or expires.
class Cancelled extends Error {}

// ---------------------------------------------------------------------------
// Tasks
// ---------------------------------------------------------------------------

const TERMINAL = new Set(['completed', 'failed', 'cancelled']);

class Task {
  constructor() {
    this.taskId = randomUUID(); // unguessable: it is the only handle on the task
    this.status = 'working';
    this.statusMessage = undefined;
    this.createdAt = nowIso();
    this.lastUpdatedAt = this.createdAt;
    this.ttlMs = TASK_TTL_MS;
    this.pollIntervalMs = POLL_INTERVAL_MS;
    this.result = undefined; // CallToolResult, once completed
    this.error = undefined; // JSON-RPC error object, once failed
    this.pending = new Map(); // input key -> { request, resolve, reject }
    this.keyCounter = 0; // input keys are never reused within a task
    this.abort = new AbortController(); // aborted on cancel / expiry
  }

  get terminal() {
    return TERMINAL.has(this.status);
  }

  // The Task fields (CreateTaskResult = Result & Task).
  info() {
    return {
      taskId: this.taskId,
      status: this.status,
      ...(this.statusMessage !== undefined ? { statusMessage: this.statusMessage } : {}),
      createdAt: this.createdAt,
      lastUpdatedAt: this.lastUpdatedAt,
      ttlMs: this.ttlMs,
      pollIntervalMs: this.pollIntervalMs,
    };
  }

  // DetailedTask: the Task plus what its status carries (tasks/get and
  // notifications/tasks).
  detailed() {
    const out = this.info();
    if (this.status === 'input_required') {
      out.inputRequests = Object.fromEntries([...this.pending].map(([key, p]) => [key, p.request]));
    } else if (this.status === 'completed') {
      out.result = this.result;
    } else if (this.status === 'failed') {
      out.error = this.error;
    }
    return out;
  }
}

// All tasks of this process, and who listens for their status changes.
const tasks = new Map(); // taskId -> Task
const subscriptions = new Set(); // { taskIds: Set, send(message), end() }

// Records a status change and reports it to the listen streams watching it.
function setStatus(task, status, fields = {}) {
  task.status = status;
  task.statusMessage = fields.statusMessage;
  if ('result' in fields) task.result = fields.result;
  if ('error' in fields) task.error = fields.error;
  task.lastUpdatedAt = nowIso();
  const params = task.detailed();
  for (const sub of subscriptions) {
    if (!sub.taskIds.has(task.taskId)) continue;
    sub.send({
      jsonrpc: '2.0',
      method: 'notifications/tasks',
      params: { ...params, _meta: { [META_SUBSCRIPTION_ID]: sub.id } },
    });
  }
}

// Ends a task that has not ended yet: its pending questions are dropped and its
// job is told to stop (the job's later outcome is ignored).
function stopTask(task, status, fields) {
  if (task.terminal) return;
  const pending = [...task.pending.values()];
  task.pending.clear();
  setStatus(task, status, fields);
  task.abort.abort();
  for (const p of pending) p.reject(new Cancelled('task ended'));
}

// Creates a task running `job(ctx)` and returns it; the task is in the store
// (so tasks/get resolves it) before the caller answers with it. The job
// returns the CallToolResult (-> completed) or throws an RpcError (-> failed).
function startTask(job) {
  const task = new Task();
  tasks.set(task.taskId, task);

  // TTL: past it, a task still running is stopped, and the task is forgotten.
  const expiry = setTimeout(() => {
    stopTask(task, 'failed', {
      statusMessage: 'The task expired (its ttlMs elapsed).',
      error: { code: INTERNAL_ERROR, message: 'Task expired' },
    });
    tasks.delete(task.taskId);
  }, task.ttlMs);
  expiry.unref();

  const ctx = {
    signal: task.abort.signal,
    sleep: (ms) => sleep(ms, task.abort.signal),
    // Asks the client a question through the task: the task goes to
    // input_required until every pending question has its answer
    // (tasks/update), and the promise resolves with the answer (ElicitResult).
    elicit(keyHint, params) {
      if (task.terminal) return Promise.reject(new Cancelled('task ended'));
      const key = `${keyHint}-${++task.keyCounter}`;
      const answered = new Promise((resolve, reject) => {
        task.pending.set(key, { request: { method: 'elicitation/create', params }, resolve, reject });
      });
      setStatus(task, 'input_required', { statusMessage: 'Waiting for the client to answer inputRequests.' });
      return answered;
    },
  };

  // Started on the next turn, so the CreateTaskResult shows the seed state.
  setImmediate(async () => {
    try {
      const result = await job(ctx);
      if (!task.terminal) setStatus(task, 'completed', { statusMessage: 'The tool call completed.', result });
    } catch (err) {
      if (task.terminal) return; // cancelled or expired meanwhile
      const error = err instanceof RpcError ? err.toJSON() : { code: INTERNAL_ERROR, message: String(err?.message ?? err) };
      setStatus(task, 'failed', { statusMessage: `The tool call failed: ${error.message}`, error });
    }
  });
  return task;
}

// The CreateTaskResult for a new task.
function createTaskResult(task) {
  return { resultType: 'task', ...task.info() };
}

// A sleep that rejects with Cancelled as soon as `signal` aborts.
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(new Cancelled('cancelled'));
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(new Cancelled('cancelled'));
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

// ---------------------------------------------------------------------------
// Tools
// ---------------------------------------------------------------------------

const text = (s) => ({ type: 'text', text: s });
const toolResult = (s, extra = {}) => ({ resultType: 'complete', content: [text(s)], ...extra });

// An elicitation (form mode) asking for the given primitive fields.
function formRequest(message, properties, required = Object.keys(properties)) {
  return { mode: 'form', message, requestedSchema: { type: 'object', properties, required } };
}

// An answer to an elicitation must at least be an ElicitResult.
function isElicitResult(v) {
  return isObject(v) && typeof v.action === 'string';
}

// MRTR (SEP-2322) for the synchronous path: the questions a tool needs
// answered before it can go on. `requests` maps input keys to the requests.
// Answers come in `params.inputResponses`; answers of earlier rounds travel
// in `requestState` (opaque to the client; a real server would sign or
// encrypt it). Returns { answers } once every key has its answer, else
// { inputRequired } (an InputRequiredResult asking for the missing ones).
function gatherInputs(toolName, params, requests) {
  let earlier = {};
  if (params.requestState !== undefined) {
    try {
      const state = JSON.parse(Buffer.from(String(params.requestState), 'base64url').toString('utf8'));
      if (!isObject(state) || state.tool !== toolName || !isObject(state.answers)) throw new Error('foreign state');
      earlier = state.answers;
    } catch {
      throw invalidParams('requestState is not one this server issued for this tool');
    }
  }
  const answers = { ...earlier };
  const responses = isObject(params.inputResponses) ? params.inputResponses : {};
  for (const key of Object.keys(requests)) {
    if (isElicitResult(responses[key])) answers[key] = responses[key];
  }
  const missing = Object.keys(requests).filter((key) => !(key in answers));
  if (missing.length === 0) return { answers };
  return {
    inputRequired: {
      resultType: 'input_required',
      inputRequests: Object.fromEntries(missing.map((key) => [key, requests[key]])),
      requestState: Buffer.from(JSON.stringify({ tool: toolName, answers })).toString('base64url'),
    },
  };
}

// `bytes` bytes of numbered lines, 60 bytes each ("line 000001 ...\n"); the
// last line is cut to make the total exact.
const FILLER = 'abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJK'; // 47 bytes
function numberedLines(bytes) {
  const lines = [];
  for (let i = 1, size = 0; size < bytes; i++) {
    const line = `line ${String(i).padStart(6, '0')} ${FILLER}\n`;
    lines.push(line);
    size += line.length;
  }
  return lines.join('').slice(0, bytes);
}

function stringArg(args, name, fallback) {
  const v = args[name] ?? fallback;
  if (typeof v !== 'string') throw invalidParams(`argument '${name}' must be a string`);
  return v;
}

function numberArg(args, name, fallback, min, max) {
  const v = args[name] ?? fallback;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max) {
    throw invalidParams(`argument '${name}' must be a number from ${min} to ${max}`);
  }
  return v;
}

// Each tool: its tools/list definition, `task` ('never' | 'optional' |
// 'required': whether it answers with a task when the client declares the
// extension, and whether it can do without), `needs` (client capabilities it
// relies on) and call(args, ctx, params), which returns the result. `ctx.tasks`
// says whether the request declared the extension (and the tool takes tasks);
// `ctx.signal` aborts, and `ctx.sleep` rejects, when the client goes away (a
// synchronous call's cancellation). A task's job gets its own ctx (startTask).
const TOOLS = {
  greet: {
    task: 'never',
    definition: {
      name: 'greet',
      description: 'Synchronous only (never a task): returns "Hello, {name}!" (name defaults to "World").',
      // No required argument: the suite's header scenarios call the first
      // listed tool with empty arguments.
      inputSchema: { type: 'object', properties: { name: { type: 'string', description: 'Who to greet' } } },
    },
    call(args) {
      return toolResult(`Hello, ${stringArg(args, 'name', 'World')}!`);
    },
  },

  slow_compute: {
    task: 'optional',
    definition: {
      name: 'slow_compute',
      description:
        'Sleeps `seconds` seconds, then returns a result. A task when the client declares io.modelcontextprotocol/tasks (cancellable: it then ends `cancelled`), synchronous otherwise.',
      inputSchema: {
        type: 'object',
        properties: {
          seconds: { type: 'number', minimum: 0, maximum: 3600, description: 'How long to work (0: at once)' },
          label: { type: 'string', description: 'Echoed in the result' },
        },
      },
    },
    call(args, ctx) {
      const seconds = numberArg(args, 'seconds', 1, 0, 3600);
      const label = stringArg(args, 'label', 'slow_compute');
      const job = async (c) => {
        await c.sleep(seconds * 1000);
        return toolResult(`slow_compute '${label}' finished after ${seconds} s`);
      };
      return ctx.tasks ? createTaskResult(startTask(job)) : job(ctx);
    },
  },

  failing_job: {
    task: 'required',
    definition: {
      name: 'failing_job',
      description:
        'Task required (-32021 when the client does not declare io.modelcontextprotocol/tasks): after about half a second the task completes with a tool error (isError: true).',
      inputSchema: { type: 'object', properties: {} },
    },
    call() {
      const task = startTask(async (c) => {
        await c.sleep(500);
        return toolResult('failing_job ran and reported an error (a tool execution error, not a protocol error)', { isError: true });
      });
      return createTaskResult(task);
    },
  },

  protocol_error_job: {
    task: 'optional',
    definition: {
      name: 'protocol_error_job',
      description:
        'Fails with a JSON-RPC error (-32603). As a task it ends `failed` with the error inlined; synchronously it is the error response.',
      inputSchema: { type: 'object', properties: {} },
    },
    call(args, ctx) {
      const job = async (c) => {
        await c.sleep(200);
        throw new RpcError(INTERNAL_ERROR, 'protocol_error_job: internal failure during execution');
      };
      return ctx.tasks ? createTaskResult(startTask(job)) : job(ctx);
    },
  },

  confirm_delete: {
    task: 'optional',
    needs: ['elicitation'],
    definition: {
      name: 'confirm_delete',
      description:
        'Asks the user to confirm deleting `filename` (elicitation). As a task the question is an inputRequest answered by tasks/update; synchronously it is asked by an InputRequiredResult (MRTR). Nothing is actually deleted.',
      inputSchema: { type: 'object', properties: { filename: { type: 'string' } }, required: ['filename'] },
    },
    call(args, ctx, params) {
      const filename = stringArg(args, 'filename');
      const question = formRequest(`Delete ${filename}?`, {
        confirm: { type: 'boolean', title: 'Confirm', description: `Delete ${filename}` },
      });
      const outcome = (answer) =>
        answer.action === 'accept' && answer.content?.confirm === true
          ? toolResult(`Deleted ${filename} (pretend)`)
          : toolResult(`Kept ${filename} (the user answered '${answer.action}')`);
      if (ctx.tasks) {
        return createTaskResult(startTask(async (c) => outcome(await c.elicit('confirm', question))));
      }
      const gathered = gatherInputs('confirm_delete', params, { confirm: { method: 'elicitation/create', params: question } });
      return gathered.inputRequired ?? outcome(gathered.answers.confirm);
    },
  },

  multi_input: {
    task: 'optional',
    needs: ['elicitation'],
    definition: {
      name: 'multi_input',
      description:
        'Asks two questions at once (two elicitations pending together); completes when both are answered. A task when it can (partial tasks/update answers keep it input_required), MRTR otherwise.',
      inputSchema: { type: 'object', properties: {} },
    },
    call(args, ctx, params) {
      const questions = {
        name: formRequest('What is your name?', { name: { type: 'string' } }),
        color: formRequest('What is your favourite colour?', { color: { type: 'string' } }),
      };
      const outcome = (a, b) => toolResult(`multi_input answers: first ${JSON.stringify(a)}, second ${JSON.stringify(b)}`);
      if (ctx.tasks) {
        return createTaskResult(
          startTask(async (c) => {
            // Both questions are put before either is awaited: two keys pending.
            const [a, b] = await Promise.all([c.elicit('name', questions.name), c.elicit('color', questions.color)]);
            return outcome(a, b);
          }),
        );
      }
      const gathered = gatherInputs('multi_input', params, {
        name: { method: 'elicitation/create', params: questions.name },
        color: { method: 'elicitation/create', params: questions.color },
      });
      return gathered.inputRequired ?? outcome(gathered.answers.name, gathered.answers.color);
    },
  },

  test_tool_with_task: {
    task: 'required',
    needs: ['elicitation'],
    definition: {
      name: 'test_tool_with_task',
      description:
        'Task required. First asks `user_name` by MRTR (an InputRequiredResult, no task yet); the retry carrying the answer creates a task whose result greets that name.',
      inputSchema: { type: 'object', properties: {} },
    },
    call(args, ctx, params) {
      const gathered = gatherInputs('test_tool_with_task', params, {
        user_name: { method: 'elicitation/create', params: formRequest('What is your name?', { name: { type: 'string' } }) },
      });
      if (gathered.inputRequired) return gathered.inputRequired;
      const answer = gathered.answers.user_name;
      const name = answer.action === 'accept' && typeof answer.content?.name === 'string' ? answer.content.name : 'stranger';
      const task = startTask(async (c) => {
        await c.sleep(300);
        return toolResult(`Hello, ${name}! (the name was gathered by MRTR before this task was created)`);
      });
      return createTaskResult(task);
    },
  },

  big_task: {
    task: 'optional',
    definition: {
      name: 'big_task',
      description: `Completes (after \`delayMs\`, default 200) with one text block of \`bytes\` bytes (default ${BIG_TASK_DEFAULT_BYTES}) of numbered 60-byte lines ("line 000001 ..."). A task when it can, synchronous otherwise.`,
      inputSchema: {
        type: 'object',
        properties: {
          bytes: { type: 'integer', minimum: 1, maximum: BIG_TASK_MAX_BYTES },
          delayMs: { type: 'integer', minimum: 0, maximum: 600000 },
        },
      },
    },
    call(args, ctx) {
      const bytes = Math.floor(numberArg(args, 'bytes', BIG_TASK_DEFAULT_BYTES, 1, BIG_TASK_MAX_BYTES));
      const delayMs = numberArg(args, 'delayMs', 200, 0, 600000);
      const job = async (c) => {
        await c.sleep(delayMs);
        return toolResult(numberedLines(bytes));
      };
      return ctx.tasks ? createTaskResult(startTask(job)) : job(ctx);
    },
  },
};

// ---------------------------------------------------------------------------
// Methods
// ---------------------------------------------------------------------------

// Validates a request's _meta envelope (2026-07-28); returns its protocol
// version and the client's capabilities. A missing or malformed envelope is
// -32602 (HTTP 400).
function readEnvelope(method, params) {
  const meta = params?._meta;
  if (method === 'initialize' && !(isObject(meta) && META_PROTOCOL_VERSION in meta)) {
    // A legacy client's opening: name the versions this server speaks.
    throw unsupportedVersion(params?.protocolVersion ?? 'none (initialize without _meta)');
  }
  const bad = (what) => new RpcError(INVALID_PARAMS, `Invalid params: ${what}`, undefined, 400);
  if (params !== undefined && !isObject(params)) throw bad('params must be an object');
  if (!isObject(meta)) throw bad('_meta is required (the 2026-07-28 per-request envelope)');
  const version = meta[META_PROTOCOL_VERSION];
  if (typeof version !== 'string') throw bad(`_meta["${META_PROTOCOL_VERSION}"] is required`);
  const caps = meta[META_CLIENT_CAPABILITIES];
  if (!isObject(caps)) throw bad(`_meta["${META_CLIENT_CAPABILITIES}"] is required`);
  return { version, caps };
}

// Whether these (per-request) client capabilities declare the tasks extension.
function declaresTasks(caps) {
  return isObject(caps.extensions) && isObject(caps.extensions[TASKS_EXTENSION]);
}

function taskParam(params) {
  if (typeof params?.taskId !== 'string') throw invalidParams("'taskId' must be a string");
  return params.taskId;
}

function findTask(taskId) {
  const task = tasks.get(taskId);
  if (!task) throw invalidParams('Failed to retrieve task: Task not found');
  return task;
}

const METHODS = {
  'server/discover'() {
    return {
      resultType: 'complete',
      supportedVersions: SUPPORTED_VERSIONS,
      capabilities: { tools: {}, extensions: { [TASKS_EXTENSION]: {} } },
      instructions: 'Conformance target for the io.modelcontextprotocol/tasks extension (mcp-budget tests).',
      ttlMs: LIST_TTL_MS,
      cacheScope: 'public',
      _meta: { [META_SERVER_INFO]: SERVER_INFO },
    };
  },

  'tools/list'(params) {
    if (params?.cursor !== undefined) throw invalidParams('Invalid cursor: this server never paginates tools/list');
    return {
      resultType: 'complete',
      tools: Object.values(TOOLS).map((t) => t.definition),
      ttlMs: LIST_TTL_MS,
      cacheScope: 'public',
    };
  },

  async 'tools/call'(params, ctx) {
    const tool = typeof params?.name === 'string' && Object.hasOwn(TOOLS, params.name) ? TOOLS[params.name] : undefined;
    if (!tool) throw invalidParams(`Unknown tool: ${params?.name}`);
    const args = params.arguments ?? {};
    if (!isObject(args)) throw invalidParams("'arguments' must be an object");
    // A tool that cannot run without a task, for a client that cannot take one.
    if (tool.task === 'required' && !ctx.tasks) throw missingTasksExtension();
    for (const cap of tool.needs ?? []) {
      if (!isObject(ctx.caps[cap])) throw missingCapability({ [cap]: {} });
    }
    // A legacy (v1) `task` hint in params is ignored: the server alone decides.
    const toolCtx = {
      tasks: ctx.tasks && tool.task !== 'never',
      caps: ctx.caps,
      signal: ctx.signal,
      sleep: (ms) => sleep(ms, ctx.signal), // the synchronous path's sleep: cancelled with the request
    };
    return tool.call(args, toolCtx, params);
  },

  'tasks/get'(params, ctx) {
    if (!ctx.tasks) throw missingTasksExtension();
    return { resultType: 'complete', ...findTask(taskParam(params)).detailed() };
  },

  'tasks/update'(params, ctx) {
    if (!ctx.tasks) throw missingTasksExtension();
    const task = findTask(taskParam(params));
    if (!isObject(params.inputResponses)) throw invalidParams("'inputResponses' must be an object");
    // Answers to keys not outstanding (never issued, already answered, or the
    // task has ended) are ignored; the others must be ElicitResults.
    const answers = Object.entries(params.inputResponses).filter(([key]) => task.pending.has(key));
    for (const [key, answer] of answers) {
      if (!isElicitResult(answer)) throw invalidParams(`inputResponses["${key}"] is not an ElicitResult`);
    }
    if (answers.length > 0) {
      const resolvers = answers.map(([key, answer]) => {
        const { resolve } = task.pending.get(key);
        task.pending.delete(key);
        return () => resolve(answer);
      });
      // Back to working once nothing is pending; otherwise still input_required
      // with only the unanswered keys. The job resumes after this (promises).
      if (task.pending.size === 0) setStatus(task, 'working', { statusMessage: 'Input received; working.' });
      else setStatus(task, 'input_required', { statusMessage: 'Waiting for the client to answer inputRequests.' });
      for (const resolve of resolvers) resolve();
    }
    return { resultType: 'complete' };
  },

  'tasks/cancel'(params, ctx) {
    if (!ctx.tasks) throw missingTasksExtension();
    const task = findTask(taskParam(params));
    // Idempotent: cancelling an ended task is acknowledged the same way.
    stopTask(task, 'cancelled', { statusMessage: 'Cancelled by tasks/cancel.' });
    return { resultType: 'complete' };
  },

  // Opens a notification stream: the transport turns { listen } into one.
  'subscriptions/listen'(params, ctx) {
    const filter = params?.notifications;
    if (!isObject(filter)) throw invalidParams("'notifications' (the subscription filter) must be an object");
    const agreed = {};
    if (filter.taskIds !== undefined) {
      if (!Array.isArray(filter.taskIds) || !filter.taskIds.every((id) => typeof id === 'string')) {
        throw invalidParams("'notifications.taskIds' must be an array of strings");
      }
      if (!ctx.tasks) throw missingTasksExtension();
      // Only tasks this server knows are agreed to; the rest are left out.
      agreed.taskIds = [...new Set(filter.taskIds)].filter((id) => tasks.has(id));
    }
    // toolsListChanged and the like: the tool list never changes and there are
    // no resources or prompts, so they are not agreed to (left out).
    return { listen: agreed };
  },
};

// Runs one request (after the transport's own checks); returns its result, or
// { listen: agreedFilter } for subscriptions/listen. Throws RpcError.
async function dispatch(method, params, { signal } = {}) {
  const { version, caps } = readEnvelope(method, params);
  if (!SUPPORTED_VERSIONS.includes(version)) throw unsupportedVersion(version);
  const handler = Object.hasOwn(METHODS, method) ? METHODS[method] : undefined;
  if (!handler) throw new RpcError(METHOD_NOT_FOUND, `Method not found: ${method}`);
  return handler(params ?? {}, { caps, tasks: declaresTasks(caps), signal });
}

// Registers a listen stream; `send` writes one message on it. Returns the
// subscription (its end() sends the graceful closing result, then closes).
function openSubscription(id, agreed, send, close) {
  const sub = {
    id,
    taskIds: new Set(agreed.taskIds ?? []),
    send,
    end() {
      subscriptions.delete(sub);
      send({ jsonrpc: '2.0', id, result: { resultType: 'complete', _meta: { [META_SUBSCRIPTION_ID]: id } } });
      close();
    },
  };
  // The acknowledgement is the first message of the subscription.
  send({
    jsonrpc: '2.0',
    method: 'notifications/subscriptions/acknowledged',
    params: { _meta: { [META_SUBSCRIPTION_ID]: id }, notifications: agreed },
  });
  subscriptions.add(sub);
  return sub;
}

// Checks the JSON-RPC shape of an incoming message. Returns 'request' or
// 'notification'; throws -32600 otherwise.
function classify(msg) {
  if (Array.isArray(msg)) throw new RpcError(INVALID_REQUEST, 'Invalid Request: batches are not supported');
  if (!isObject(msg) || msg.jsonrpc !== '2.0') throw new RpcError(INVALID_REQUEST, 'Invalid Request: not a JSON-RPC 2.0 message');
  if (typeof msg.method !== 'string') throw new RpcError(INVALID_REQUEST, 'Invalid Request: clients send requests and notifications only');
  if (!('id' in msg)) return 'notification';
  if (typeof msg.id !== 'string' && typeof msg.id !== 'number') throw new RpcError(INVALID_REQUEST, 'Invalid Request: id must be a string or a number');
  return 'request';
}

const errorResponse = (id, err) => ({ jsonrpc: '2.0', id: id ?? null, error: err.toJSON() });

// ---------------------------------------------------------------------------
// Streamable HTTP
// ---------------------------------------------------------------------------

// Where each method's Mcp-Name comes from (SEP-2243; SEP-2663 for tasks/*).
const NAME_SOURCE = {
  'tools/call': 'name',
  'prompts/get': 'name',
  'resources/read': 'uri',
  'tasks/get': 'taskId',
  'tasks/update': 'taskId',
  'tasks/cancel': 'taskId',
};

// Decodes the Base64 sentinel form (=?base64?...?=) of a header value.
function decodeHeaderValue(value) {
  const m = /^=\?base64\?(.*)\?=$/.exec(value);
  if (!m) return value;
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(m[1])) throw headerMismatch('malformed Base64 header value');
  return Buffer.from(m[1], 'base64').toString('utf8');
}

// The request-metadata header checks of 2026-07-28 Streamable HTTP, in the
// order the suite expects: the envelope itself first (-32602), then
// MCP-Protocol-Version against it (-32020), the version's support (-32022),
// then Mcp-Method and Mcp-Name (-32020).
function checkHeaders(req, msg) {
  const { version } = readEnvelope(msg.method, msg.params);
  const headerVersion = req.headers['mcp-protocol-version'];
  if (headerVersion === undefined) throw headerMismatch('the MCP-Protocol-Version header is required');
  if (headerVersion !== version) {
    throw headerMismatch(`MCP-Protocol-Version header '${headerVersion}' does not match _meta protocolVersion '${version}'`);
  }
  if (!SUPPORTED_VERSIONS.includes(version)) throw unsupportedVersion(version);
  const method = req.headers['mcp-method'];
  if (method === undefined) throw headerMismatch('the Mcp-Method header is required');
  if (method !== msg.method) throw headerMismatch(`Mcp-Method header '${method}' does not match body method '${msg.method}'`);
  const field = NAME_SOURCE[msg.method];
  const bodyName = field ? msg.params?.[field] : undefined;
  if (typeof bodyName === 'string') {
    const raw = req.headers['mcp-name'];
    if (raw === undefined) throw headerMismatch(`the Mcp-Name header is required for ${msg.method}`);
    const name = decodeHeaderValue(raw);
    if (name !== bodyName) throw headerMismatch(`Mcp-Name header '${name}' does not match body value '${bodyName}'`);
  }
}

const LOOPBACK_HOSTS = new Set(['localhost', '127.0.0.1', '[::1]']);

// DNS-rebinding protection: Host must name a loopback host; Origin, when
// present, too.
function loopbackOk(req) {
  const hostOf = (authority) => authority.toLowerCase().replace(/:\d+$/, '');
  if (!req.headers.host || !LOOPBACK_HOSTS.has(hostOf(req.headers.host))) return false;
  const origin = req.headers.origin;
  if (origin === undefined) return true;
  try {
    return LOOPBACK_HOSTS.has(new URL(origin).host.toLowerCase().replace(/:\d+$/, ''));
  } catch {
    return false;
  }
}

function sendJson(res, status, body, headers = {}) {
  const data = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data), ...headers });
  res.end(data);
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) {
        reject(new RpcError(INVALID_REQUEST, 'request body too large', undefined, 413));
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

async function handleHttp(req, res) {
  const path = new URL(req.url ?? '/', 'http://127.0.0.1').pathname;
  if (path !== '/mcp') return sendJson(res, 404, errorResponse(null, new RpcError(INVALID_REQUEST, 'Not Found: the MCP endpoint is /mcp')));
  if (!loopbackOk(req)) return sendJson(res, 403, errorResponse(null, new RpcError(INVALID_REQUEST, 'Forbidden: Host/Origin is not a loopback address')));
  // 2026-07-28 has no GET stream and no sessions (so no DELETE): POST only.
  if (req.method !== 'POST') return sendJson(res, 405, errorResponse(null, new RpcError(INVALID_REQUEST, 'Method Not Allowed: POST only')), { Allow: 'POST' });

  let msg;
  try {
    const body = await readBody(req);
    try {
      msg = JSON.parse(body.toString('utf8'));
    } catch {
      throw new RpcError(PARSE_ERROR, 'Parse error: the body is not JSON');
    }
    if (classify(msg) === 'notification') {
      res.writeHead(202).end(); // accepted and ignored (no client notifications are defined on HTTP)
      return;
    }
  } catch (err) {
    if (!(err instanceof RpcError)) throw err;
    return sendJson(res, statusFor(err), errorResponse(null, err));
  }

  // The request's cancellation: the client closing the connection early.
  const abort = new AbortController();
  let answered = false;
  res.on('close', () => {
    if (!answered) abort.abort();
  });

  let outcome;
  try {
    checkHeaders(req, msg);
    outcome = await dispatch(msg.method, msg.params, { signal: abort.signal });
  } catch (err) {
    if (abort.signal.aborted) return; // the client is gone: nothing more for it
    if (err instanceof Cancelled) return;
    const rpc = err instanceof RpcError ? err : new RpcError(INTERNAL_ERROR, `Internal error: ${err?.message ?? err}`);
    if (!(err instanceof RpcError)) log('internal error:', err?.stack ?? err);
    answered = true;
    return sendJson(res, statusFor(rpc), errorResponse(msg.id, rpc));
  }
  if (abort.signal.aborted) return;

  if (outcome?.listen) {
    // subscriptions/listen: an SSE stream kept open until either side closes it.
    answered = true;
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache, no-transform', 'X-Accel-Buffering': 'no' });
    res.flushHeaders();
    const keepalive = setInterval(() => res.write(':\n\n'), KEEPALIVE_MS);
    const sub = openSubscription(
      msg.id,
      outcome.listen,
      (m) => res.write(`event: message\ndata: ${JSON.stringify(m)}\n\n`),
      () => res.end(),
    );
    res.on('close', () => {
      clearInterval(keepalive);
      subscriptions.delete(sub);
    });
    return;
  }
  answered = true;
  sendJson(res, 200, { jsonrpc: '2.0', id: msg.id, result: outcome });
}

async function runHttp(port) {
  const server = http.createServer((req, res) => {
    handleHttp(req, res).catch((err) => {
      log('request error:', err?.stack ?? err);
      if (!res.headersSent) sendJson(res, 500, errorResponse(null, new RpcError(INTERNAL_ERROR, 'Internal server error')));
      else res.end();
    });
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', resolve);
  });
  // Exact line, unprefixed: harnesses (run.sh's wait_url) wait for it.
  console.error(`listening on http://127.0.0.1:${server.address().port}/mcp`);

  const shutdown = () => {
    for (const sub of [...subscriptions]) sub.end(); // graceful end of listen streams
    server.close();
    server.closeAllConnections?.();
    process.exit(0);
  };
  process.on('SIGINT', shutdown);
  process.on('SIGTERM', shutdown);
}

// ---------------------------------------------------------------------------
// stdio
// ---------------------------------------------------------------------------

// Newline-delimited JSON-RPC. No HTTP headers to check; the _meta envelope is
// checked as on HTTP. notifications/cancelled (params.requestId) cancels a
// request in flight or ends a subscription.
function runStdio() {
  const write = (m) => process.stdout.write(`${JSON.stringify(m)}\n`);
  const inflight = new Map(); // request id -> AbortController
  const listens = new Map(); // request id -> subscription

  async function onMessage(msg) {
    let kind;
    try {
      kind = classify(msg);
    } catch (err) {
      return write(errorResponse(null, err));
    }
    if (kind === 'notification') {
      if (msg.method === 'notifications/cancelled') {
        const id = msg.params?.requestId;
        inflight.get(id)?.abort();
        const sub = listens.get(id);
        if (sub) {
          subscriptions.delete(sub);
          listens.delete(id);
        }
      }
      return;
    }
    const abort = new AbortController();
    inflight.set(msg.id, abort);
    try {
      const outcome = await dispatch(msg.method, msg.params, { signal: abort.signal });
      if (abort.signal.aborted) return;
      if (outcome?.listen) {
        listens.set(msg.id, openSubscription(msg.id, outcome.listen, write, () => listens.delete(msg.id)));
        return;
      }
      write({ jsonrpc: '2.0', id: msg.id, result: outcome });
    } catch (err) {
      if (abort.signal.aborted || err instanceof Cancelled) return;
      const rpc = err instanceof RpcError ? err : new RpcError(INTERNAL_ERROR, `Internal error: ${err?.message ?? err}`);
      write(errorResponse(msg.id, rpc));
    } finally {
      inflight.delete(msg.id);
    }
  }

  const lines = readline.createInterface({ input: process.stdin });
  lines.on('line', (line) => {
    if (!line.trim()) return;
    let msg;
    try {
      msg = JSON.parse(line);
    } catch {
      return write(errorResponse(null, new RpcError(PARSE_ERROR, 'Parse error')));
    }
    onMessage(msg).catch((err) => log('stdio error:', err?.stack ?? err));
  });
  const shutdown = () => {
    for (const sub of [...subscriptions]) sub.end();
    process.exit(0);
  };
  lines.on('close', shutdown);
  process.on('SIGINT', shutdown);
  process.on('SIGTERM', shutdown);
  log('ready on stdio');
}

// ---------------------------------------------------------------------------
// Entry point
// ---------------------------------------------------------------------------

function usage() {
  console.error('usage: node tasks-target.mjs --port <N> | --stdio   [--modern-only]');
  process.exit(2);
}

const argv = process.argv.slice(2).filter((a) => a !== '--modern-only');
if (argv.includes('--legacy-only')) {
  console.error('tasks-target: --legacy-only is not supported (this target serves 2026-07-28 only)');
  process.exit(2);
}
if (argv[0] === '--stdio' && argv.length === 1) {
  runStdio();
} else if (argv[0] === '--port' && argv.length === 2 && /^\d+$/.test(argv[1]) && Number(argv[1]) < 65536) {
  await runHttp(Number(argv[1]));
} else {
  usage();
}
