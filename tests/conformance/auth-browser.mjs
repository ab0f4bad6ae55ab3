#!/usr/bin/env node
// A headless "browser" for the OAuth conformance runs (auth.sh): mcp-budget runs
// `$BROWSER <authorization URL>`, and this script plays the user who approves.
//
// The suite's authorization server approves every request at once: its
// authorization endpoint answers 302 to the redirect_uri (mcp-budget's loopback
// listener, http://127.0.0.1:<port>/callback) with code, state and iss. So the
// script GETs the URL and follows redirects (http and https only, at most 10),
// reading each body, and exits 0 when the last answer is 2xx, 1 otherwise (2
// on a usage error). It prints nothing on stdout; one line per hop on stderr.
//
//   node auth-browser.mjs URL
//
// Environment: MCP_BUDGET_AUTH_BROWSER_TIMEOUT_MS (default 20000), the whole
// walk's deadline.

const url = process.argv[2];
const log = (line) => process.stderr.write(`auth-browser: ${line}\n`);

if (process.argv.length !== 3 || !url) {
  log('usage: auth-browser.mjs URL');
  process.exit(2);
}

const timeoutMs = Number(process.env.MCP_BUDGET_AUTH_BROWSER_TIMEOUT_MS ?? 20000);
const deadline = AbortSignal.timeout(Number.isFinite(timeoutMs) && timeoutMs > 0 ? timeoutMs : 20000);
const MAX_HOPS = 10;

// Query parameters that would leak a secret into the log are shortened.
function shown(target) {
  return String(target).replace(/([?&](?:code|code_challenge|state)=)([^&#]{8})[^&#]{4,}/g, '$1$2…');
}

async function main() {
  let current;
  try {
    current = new URL(url);
  } catch {
    log(`not a URL: ${url}`);
    return 2;
  }
  for (let hop = 0; hop <= MAX_HOPS; hop++) {
    if (current.protocol !== 'http:' && current.protocol !== 'https:') {
      log(`will not open ${current.protocol} URL ${shown(current.toString())}`);
      return 1;
    }
    const response = await fetch(current, { redirect: 'manual', signal: deadline });
    const body = await response.text();
    const location = response.headers.get('location');
    if (response.status >= 300 && response.status < 400 && location) {
      const next = new URL(location, current);
      log(`GET ${shown(current.toString())} -> ${response.status} ${shown(next.toString())}`);
      current = next;
      continue;
    }
    const snippet = body.replace(/\s+/g, ' ').trim().slice(0, 200);
    log(`GET ${shown(current.toString())} -> ${response.status}${snippet ? `: ${snippet}` : ''}`);
    return response.status >= 200 && response.status < 300 ? 0 : 1;
  }
  log(`more than ${MAX_HOPS} redirects`);
  return 1;
}

main().then(
  (code) => process.exit(code),
  (error) => {
    log(`failed: ${error?.cause?.message ?? error?.message ?? error}`);
    process.exit(1);
  }
);
