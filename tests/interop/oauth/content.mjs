// The text of the OAuth interop server's `big` tool (server.mjs), which the client
// (client.mjs) rebuilds from its pages and compares with this, byte for byte.
//
// 40,000 numbered lines of 75 bytes: 3,000,000 bytes, far over any client's budget, so
// mcp-budget pages it. Every line differs from its neighbours (its number is in its filler
// too), so a page cut in the wrong place, or a page lost or served twice, shows.

export const BIG_LINES = 40_000;

export function bigLine(i) {
  const head = `line ${String(i).padStart(6, '0')}: `; // 13 bytes
  const filler = `${i.toString(36)}-${((i * 7919) % 1_000_003).toString(16)}|`.repeat(12).slice(0, 61);
  return `${head}${filler}\n`; // 13 + 61 + 1 = 75 bytes
}

export function bigText(lines = BIG_LINES) {
  const parts = new Array(lines);
  for (let i = 1; i <= lines; i += 1) parts[i - 1] = bigLine(i);
  return parts.join('');
}
