// A 2026-07-28 client (plain fetch, the wire as the spec writes it) calls tasks-target.mjs's
// `big_task` as a task, polls `tasks/get` until it completes, and prints what it got:
//   node tasks-budget.mjs URL  ->  {"taskId": ..., "bytes": N, "paged": bool, "after": ...}
// Against the target directly the final result is 600,000 bytes of text; through mcp-budget
// it must be a page under the budget, with a continuation, and the task named by a token.
const url = process.argv[2];
if (!url) {
  console.error('usage: node tasks-budget.mjs URL');
  process.exit(2);
}
const VERSION = '2026-07-28';
const meta = {
  'io.modelcontextprotocol/protocolVersion': VERSION,
  'io.modelcontextprotocol/clientInfo': { name: 'tasks-budget', version: '1' },
  'io.modelcontextprotocol/clientCapabilities': { extensions: { 'io.modelcontextprotocol/tasks': {} } },
};
let id = 0;

async function post(method, params, name) {
  id += 1;
  const body = JSON.stringify({ jsonrpc: '2.0', id, method, params: { ...params, _meta: meta } });
  const headers = {
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
    'mcp-protocol-version': VERSION,
    'mcp-method': method,
  };
  if (name !== undefined) headers['mcp-name'] = name;
  const response = await fetch(url, { method: 'POST', headers, body });
  const text = await response.text();
  if (text.trimStart().startsWith('{')) return JSON.parse(text);
  const events = text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).filter(Boolean);
  if (events.length === 0) throw new Error(`no answer to ${method}: HTTP ${response.status} ${text.slice(0, 300)}`);
  return JSON.parse(events[events.length - 1]);
}

const created = await post('tools/call', { name: 'big_task', arguments: {} }, 'big_task');
if (created.result?.resultType !== 'task') throw new Error(`not a task: ${JSON.stringify(created).slice(0, 300)}`);
const taskId = created.result.taskId;
let state;
for (let i = 0; i < 200; i += 1) {
  state = await post('tasks/get', { taskId }, taskId);
  if (state.error) throw new Error(`tasks/get: ${JSON.stringify(state.error)}`);
  if (state.result.status === 'completed') break;
  await new Promise((resolve) => setTimeout(resolve, 100));
}
if (state.result.status !== 'completed') throw new Error(`never completed: ${JSON.stringify(state).slice(0, 300)}`);
if (state.result.taskId !== taskId) throw new Error(`tasks/get named the task ${state.result.taskId}, not ${taskId}`);
const result = state.result.result;
const meta_after = result?._meta?.['io.github.mcp-budget/after'];
const text = JSON.stringify(result?.content ?? []);
console.log(JSON.stringify({
  taskId,
  bytes: JSON.stringify(result).length,
  paged: /after/.test(text) || meta_after !== undefined,
  after: meta_after ?? null,
}));
