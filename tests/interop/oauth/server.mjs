#!/usr/bin/env node
// An OAuth-protected MCP server for the interop check of mcp-budget's sign-in (run.sh): the
// resource server is built on the official TypeScript SDK v2 (@modelcontextprotocol/server,
// pinned by ../v2/package-lock.json) and its auth support for a resource server:
//
//   createMcpHandler          the MCP endpoint, both eras (2026-07-28 stateless, and the
//                             2025-11-25 handshake served statelessly, the SDK's default);
//   requireBearerAuth         every request to /mcp needs a valid bearer token (issued for
//                             this resource, with the scope `mcp`, not expired); else 401
//                             with `WWW-Authenticate: Bearer ... resource_metadata="..."`;
//   oauthMetadataResponse     the protected resource metadata (RFC 9728) at
//                             /.well-known/oauth-protected-resource/mcp, and the
//                             authorization server metadata (RFC 8414) at
//                             /.well-known/oauth-authorization-server.
//
// The SDK v2 ships no authorization server (its server-auth-legacy package is a deprecated,
// frozen copy of v1's, for migration only), so a tiny one runs in this process, on the same
// origin (the issuer is http://127.0.0.1:PORT):
//
//   POST /register    dynamic client registration (RFC 7591); a secret unless the client
//                     asks for token_endpoint_auth_method "none";
//   GET  /authorize   approves at once: 302 to the redirect_uri with code, state and iss
//                     (RFC 9207); checks the client, the redirect URI (a loopback one may
//                     differ in port, RFC 8252), response_type=code, PKCE S256 and the
//                     resource indicator (RFC 8707);
//   POST /token       authorization_code (PKCE verified, redirect_uri and resource checked,
//                     the code single-use) and refresh_token (rotated: a refresh token is
//                     spent by its first use; a second use is counted and refused).
//                     Access tokens live --token-ttl-secs seconds (default 3).
//
// Tools: `echo` (returns its text), `big` (3,000,000 bytes of numbered lines, content.mjs).
//
// For the client's assertions:
//   GET  /stats                 the counts (JSON): registrations, authorizations (codes
//                               issued by /authorize, i.e. browser sign-ins), code exchanges,
//                               refreshes, refresh reuses, tokens issued, rejected requests
//                               on /mcp by reason, tool calls, the resource indicators seen;
//   POST /admin/revoke-access   revokes every access token issued so far (not the refresh
//                               tokens): the next request with one gets a 401.
//
//   node server.mjs [--port N] [--token-ttl-secs S]
// Prints `listening on http://127.0.0.1:N/mcp` on stderr once it listens (port 0, the
// default, picks a free one); logs every grant and refusal on stderr. SIGTERM/SIGINT stop it.

import http from 'node:http';
import { createHash, randomBytes } from 'node:crypto';
import {
  McpServer,
  OAuthError,
  OAuthErrorCode,
  createMcpHandler,
  fromJsonSchema,
  getOAuthProtectedResourceMetadataUrl,
  oauthMetadataResponse,
  requireBearerAuth,
} from '@modelcontextprotocol/server';
import { bigText } from './content.mjs';

const log = (line) => process.stderr.write(`[oauth-server] ${line}\n`);

// ---------------------------------------------------------------------------------------------
// Options

function usage() {
  log('usage: node server.mjs [--port N] [--token-ttl-secs S]');
  process.exit(2);
}
let port = 0;
let ttlSecs = 3;
{
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const value = argv[i + 1];
    if (value === undefined || !/^\d+$/.test(value)) usage();
    if (argv[i] === '--port' && Number(value) < 65536) port = Number(value);
    else if (argv[i] === '--token-ttl-secs' && Number(value) > 0) ttlSecs = Number(value);
    else usage();
  }
}

// ---------------------------------------------------------------------------------------------
// State and counts

const SCOPE = 'mcp';
const clients = new Map(); // client_id -> { secret, authMethod, redirectUris }
const codes = new Map(); // code -> { clientId, redirectUri, challenge, resource, scopes, expires }
const accessTokens = new Map(); // token -> { clientId, scopes, resource, expiresMs, revoked }
const refreshTokens = new Map(); // token -> { clientId, scopes, resource, spent }

const stats = {
  registrations: 0,
  authorizations: 0, // codes issued by /authorize: one per browser sign-in
  authorizeRefused: 0,
  codeExchanges: 0,
  refreshes: 0,
  refreshReuses: 0, // a rotated (spent) refresh token presented again
  tokenRefused: 0,
  accessTokensIssued: 0,
  mcpRequests: 0, // requests on /mcp with a valid token
  rejected: { missing: 0, expired: 0, revoked: 0, unknown: 0, other: 0 },
  toolCalls: { echo: 0, big: 0 },
  resourceIndicators: [], // the distinct `resource` values seen at /authorize and /token
  tokenTtlSecs: ttlSecs,
};

const token = () => randomBytes(24).toString('base64url');
const sha256url = (text) => createHash('sha256').update(text).digest('base64url');
const trimSlash = (text) => String(text).replace(/\/+$/, '');
function seenResource(value) {
  if (value && !stats.resourceIndicators.includes(value)) stats.resourceIndicators.push(value);
}

// ---------------------------------------------------------------------------------------------
// The MCP server (SDK v2)

function createServer() {
  const mcp = new McpServer({ name: 'mcp-budget-oauth-interop-server', version: '1.0.0' }, { capabilities: { tools: {} } });
  mcp.registerTool(
    'echo',
    {
      description: 'Returns its text',
      inputSchema: fromJsonSchema({ type: 'object', properties: { text: { type: 'string' } }, required: ['text'] }),
    },
    async ({ text }) => {
      stats.toolCalls.echo += 1;
      return { content: [{ type: 'text', text: `echo: ${text}` }] };
    },
  );
  mcp.registerTool(
    'big',
    {
      description: 'Returns 3,000,000 bytes of numbered lines',
      inputSchema: fromJsonSchema({ type: 'object', properties: {} }),
    },
    async () => {
      stats.toolCalls.big += 1;
      return { content: [{ type: 'text', text: BIG }] };
    },
  );
  return mcp;
}
const BIG = bigText();

// ---------------------------------------------------------------------------------------------
// HTTP plumbing (node:http <-> web-standard Request/Response)

function readBody(req, limit = 4 << 20) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > limit) {
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

function toWebRequest(req, res, origin, body) {
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) {
    if (Array.isArray(value)) for (const v of value) headers.append(name, v);
    else if (value !== undefined) headers.set(name, value);
  }
  const controller = new AbortController();
  res.on('close', () => controller.abort());
  return new Request(new URL(req.url ?? '/', origin), {
    method: req.method,
    headers,
    body: body && body.length > 0 ? body : undefined,
    signal: controller.signal,
  });
}

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
    // the client went away
  }
  res.end();
}

const json = (body, status = 200, headers = {}) =>
  Response.json(body, { status, headers: { 'Cache-Control': 'no-store', ...headers } });
const oauthError = (error, description, status = 400) => json({ error, error_description: description }, status);

// ---------------------------------------------------------------------------------------------
// The authorization server

function isLoopback(url) {
  return url.protocol === 'http:' && ['127.0.0.1', '[::1]', 'localhost'].includes(url.hostname);
}

// A registered redirect URI, or a loopback one that differs only in its port (RFC 8252 7.3).
function redirectAllowed(client, redirectUri) {
  if (client.redirectUris.includes(redirectUri)) return true;
  let asked;
  try {
    asked = new URL(redirectUri);
  } catch {
    return false;
  }
  if (!isLoopback(asked)) return false;
  return client.redirectUris.some((registered) => {
    try {
      const r = new URL(registered);
      return isLoopback(r) && r.hostname === asked.hostname && r.pathname === asked.pathname && r.search === asked.search;
    } catch {
      return false;
    }
  });
}

async function register(request) {
  let body;
  try {
    body = await request.json();
  } catch {
    return oauthError('invalid_client_metadata', 'the body is not JSON');
  }
  const redirectUris = Array.isArray(body?.redirect_uris) ? body.redirect_uris.filter((u) => typeof u === 'string') : [];
  if (redirectUris.length === 0) return oauthError('invalid_redirect_uri', 'redirect_uris is required');
  const authMethod = body.token_endpoint_auth_method ?? 'client_secret_basic';
  if (!['none', 'client_secret_basic', 'client_secret_post'].includes(authMethod)) {
    return oauthError('invalid_client_metadata', `token_endpoint_auth_method ${authMethod} is not supported`);
  }
  const clientId = `client-${token()}`;
  const secret = authMethod === 'none' ? undefined : token();
  clients.set(clientId, { secret, authMethod, redirectUris });
  stats.registrations += 1;
  log(`registered ${clientId} (${authMethod}; redirect_uris ${redirectUris.join(' ')}; client_name ${body.client_name ?? '-'})`);
  return json(
    {
      ...body,
      client_id: clientId,
      client_id_issued_at: Math.floor(Date.now() / 1000),
      ...(secret && { client_secret: secret, client_secret_expires_at: 0 }),
      token_endpoint_auth_method: authMethod,
      redirect_uris: redirectUris,
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
    },
    201,
  );
}

function authorize(request, issuer, resource) {
  const params = new URL(request.url).searchParams;
  const refuse = (why) => {
    stats.authorizeRefused += 1;
    log(`/authorize refused: ${why}`);
    return new Response(`authorization refused: ${why}\n`, { status: 400, headers: { 'Content-Type': 'text/plain' } });
  };
  const client = clients.get(params.get('client_id') ?? '');
  if (!client) return refuse(`unknown client_id ${params.get('client_id')}`);
  const redirectUri = params.get('redirect_uri') ?? '';
  if (!redirectAllowed(client, redirectUri)) return refuse(`redirect_uri ${redirectUri} is not registered`);
  // Past this point the errors go back to the client, as RFC 6749 4.1.2.1 says.
  const back = (query) => {
    const target = new URL(redirectUri);
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null) target.searchParams.set(k, v);
    target.searchParams.set('iss', issuer);
    return new Response(null, { status: 302, headers: { Location: target.href } });
  };
  const state = params.get('state') ?? undefined;
  const error = (code, why) => {
    stats.authorizeRefused += 1;
    log(`/authorize refused: ${why}`);
    return back({ error: code, error_description: why, state });
  };
  if (params.get('response_type') !== 'code') return error('unsupported_response_type', 'response_type must be code');
  const challenge = params.get('code_challenge');
  if (!challenge || params.get('code_challenge_method') !== 'S256') return error('invalid_request', 'PKCE with S256 is required');
  const asked = params.get('resource');
  seenResource(asked);
  if (!asked || trimSlash(asked) !== trimSlash(resource)) return error('invalid_target', `resource must be ${resource}, not ${asked}`);
  const requested = (params.get('scope') ?? '').split(' ').filter(Boolean);
  const scopes = requested.length === 0 ? [SCOPE] : requested.filter((s) => s === SCOPE);
  const code = token();
  codes.set(code, { clientId: params.get('client_id'), redirectUri, challenge, resource: asked, scopes, expires: Date.now() + 60_000 });
  stats.authorizations += 1;
  log(`/authorize: code issued to ${params.get('client_id')} (scope "${scopes.join(' ')}", resource ${asked})`);
  return back({ code, state });
}

// The client's identity at /token: its secret by HTTP Basic or in the form, or none for a
// public client. Returns the client id, or a Response refusing it.
function authenticate(request, form) {
  let clientId = form.get('client_id');
  let secret = form.get('client_secret');
  const basic = /^Basic\s+(\S+)$/i.exec(request.headers.get('authorization') ?? '');
  if (basic) {
    const decoded = Buffer.from(basic[1], 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    clientId = decodeURIComponent(decoded.slice(0, colon));
    secret = decodeURIComponent(decoded.slice(colon + 1));
  }
  const client = clients.get(clientId ?? '');
  if (!client) return oauthError('invalid_client', `unknown client ${clientId}`, 401);
  if (client.secret !== undefined && secret !== client.secret) return oauthError('invalid_client', 'wrong or missing client secret', 401);
  return clientId;
}

function issue(clientId, scopes, resource) {
  const access = token();
  const refresh = token();
  accessTokens.set(access, { clientId, scopes, resource, expiresMs: Date.now() + ttlSecs * 1000, revoked: false });
  refreshTokens.set(refresh, { clientId, scopes, resource, spent: false });
  stats.accessTokensIssued += 1;
  return json({ access_token: access, token_type: 'Bearer', expires_in: ttlSecs, refresh_token: refresh, scope: scopes.join(' ') });
}

async function tokenEndpoint(request, resource) {
  const form = new URLSearchParams(await request.text());
  const refuse = (error, why, status = 400) => {
    stats.tokenRefused += 1;
    log(`/token refused (${form.get('grant_type')}): ${why}`);
    return oauthError(error, why, status);
  };
  const clientId = authenticate(request, form);
  if (clientId instanceof Response) {
    stats.tokenRefused += 1;
    log(`/token refused: client authentication failed`);
    return clientId;
  }
  const asked = form.get('resource');
  seenResource(asked);
  if (asked && trimSlash(asked) !== trimSlash(resource)) return refuse('invalid_target', `resource must be ${resource}, not ${asked}`);
  switch (form.get('grant_type')) {
    case 'authorization_code': {
      const code = codes.get(form.get('code') ?? '');
      codes.delete(form.get('code') ?? '');
      if (!code || code.expires < Date.now()) return refuse('invalid_grant', 'unknown, used or expired code');
      if (code.clientId !== clientId) return refuse('invalid_grant', 'the code was issued to another client');
      if (form.get('redirect_uri') !== code.redirectUri) return refuse('invalid_grant', `redirect_uri ${form.get('redirect_uri')} is not the authorization request's`);
      const verifier = form.get('code_verifier') ?? '';
      if (!/^[A-Za-z0-9\-._~]{43,128}$/.test(verifier)) return refuse('invalid_grant', 'code_verifier missing or malformed');
      if (sha256url(verifier) !== code.challenge) return refuse('invalid_grant', 'PKCE verification failed');
      if (!asked) return refuse('invalid_target', 'the resource indicator is missing');
      stats.codeExchanges += 1;
      log(`/token: code exchanged by ${clientId}`);
      return issue(clientId, code.scopes, code.resource);
    }
    case 'refresh_token': {
      const presented = form.get('refresh_token') ?? '';
      const kept = refreshTokens.get(presented);
      if (!kept) return refuse('invalid_grant', 'unknown refresh token');
      if (kept.clientId !== clientId) return refuse('invalid_grant', 'the refresh token was issued to another client');
      if (kept.spent) {
        stats.refreshReuses += 1;
        return refuse('invalid_grant', 'refresh token already used (rotated)');
      }
      kept.spent = true;
      stats.refreshes += 1;
      log(`/token: refresh by ${clientId}`);
      return issue(clientId, kept.scopes, kept.resource);
    }
    default:
      return refuse('unsupported_grant_type', `grant_type ${form.get('grant_type')} is not supported`);
  }
}

// ---------------------------------------------------------------------------------------------
// The server

const httpServer = http.createServer();
await new Promise((resolve, reject) => {
  httpServer.once('error', reject);
  httpServer.listen(port, '127.0.0.1', resolve);
});
const origin = `http://127.0.0.1:${httpServer.address().port}`;
const mcpUrl = new URL(`${origin}/mcp`);
const issuer = origin;

const oauthMetadata = {
  issuer,
  authorization_endpoint: `${issuer}/authorize`,
  token_endpoint: `${issuer}/token`,
  registration_endpoint: `${issuer}/register`,
  response_types_supported: ['code'],
  grant_types_supported: ['authorization_code', 'refresh_token'],
  code_challenge_methods_supported: ['S256'],
  token_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post', 'none'],
  scopes_supported: [SCOPE],
  authorization_response_iss_parameter_supported: true,
};
const metadataOptions = {
  oauthMetadata,
  resourceServerUrl: mcpUrl,
  scopesSupported: [SCOPE],
  resourceName: 'mcp-budget OAuth interop server',
  // The issuer is http://127.0.0.1: a local test only.
  dangerouslyAllowInsecureIssuerUrl: true,
};
const resourceMetadataUrl = getOAuthProtectedResourceMetadataUrl(mcpUrl);

const verifier = {
  async verifyAccessToken(presented) {
    const kept = accessTokens.get(presented);
    if (!kept) {
      stats.rejected.unknown += 1;
      throw new OAuthError(OAuthErrorCode.InvalidToken, 'unknown token');
    }
    if (kept.revoked) {
      stats.rejected.revoked += 1;
      throw new OAuthError(OAuthErrorCode.InvalidToken, 'token revoked');
    }
    if (kept.expiresMs <= Date.now()) {
      stats.rejected.expired += 1;
      throw new OAuthError(OAuthErrorCode.InvalidToken, 'token expired');
    }
    return { token: presented, clientId: kept.clientId, scopes: kept.scopes, expiresAt: kept.expiresMs / 1000, resource: new URL(kept.resource) };
  },
};
const gate = requireBearerAuth({ verifier, requiredScopes: [SCOPE], resourceMetadataUrl, expectedResource: mcpUrl });
const mcp = createMcpHandler(() => createServer(), { onerror: (err) => log(`mcp: ${err?.message ?? err}`) });

async function serveMcp(request) {
  const hadToken = request.headers.has('authorization');
  const before = JSON.stringify(stats.rejected);
  const auth = await gate(request);
  if (auth instanceof Response) {
    if (!hadToken) stats.rejected.missing += 1;
    else if (JSON.stringify(stats.rejected) === before) stats.rejected.other += 1; // scope, audience, format
    const reason = hadToken ? (await auth.clone().json().catch(() => ({})))?.error_description : 'no token';
    log(`/mcp ${request.method}: ${auth.status} (${reason})`);
    return auth;
  }
  stats.mcpRequests += 1;
  return mcp.fetch(request, { authInfo: auth });
}

async function route(request) {
  const { pathname } = new URL(request.url);
  const metadata = oauthMetadataResponse(request, metadataOptions);
  if (metadata) return metadata;
  if (pathname === '/mcp') return serveMcp(request);
  if (pathname === '/register' && request.method === 'POST') return register(request);
  if (pathname === '/authorize' && request.method === 'GET') return authorize(request, issuer, mcpUrl.href);
  if (pathname === '/token' && request.method === 'POST') return tokenEndpoint(request, mcpUrl.href);
  if (pathname === '/stats' && request.method === 'GET') return json(stats);
  if (pathname === '/admin/revoke-access' && request.method === 'POST') {
    let count = 0;
    for (const kept of accessTokens.values()) {
      if (!kept.revoked) count += 1;
      kept.revoked = true;
    }
    log(`revoked ${count} access token(s)`);
    return json({ revoked: count });
  }
  return new Response('Not Found\n', { status: 404, headers: { 'Content-Type': 'text/plain' } });
}

httpServer.on('request', (req, res) => {
  (async () => {
    const body = req.method === 'POST' ? await readBody(req) : undefined;
    await writeWebResponse(res, await route(toWebRequest(req, res, origin, body)));
  })().catch((err) => {
    log(`request error: ${err?.stack ?? err}`);
    if (!res.headersSent) res.writeHead(err?.status ?? 500, { 'Content-Type': 'text/plain' });
    res.end();
  });
});

// Exact line: run.sh waits for it to learn the URL.
process.stderr.write(`listening on ${mcpUrl.href}\n`);

const shutdown = () => {
  mcp.close?.().catch?.(() => {});
  httpServer.close();
  httpServer.closeAllConnections?.();
  process.exit(0);
};
process.on('SIGINT', shutdown);
process.on('SIGTERM', shutdown);
