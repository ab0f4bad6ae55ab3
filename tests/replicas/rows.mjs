// The rows the counting server (server.mjs) answers, and what the scenario (clients.mjs)
// expects of every page: one generator for both, so that a chain's pages can be checked
// against the result the server produced without keeping it.
//
// A result is `lines` lines of exactly LINE bytes (ASCII, the newline included):
//
//   line 0   "<tool> seed <seed> run <run> bytes <total> lines <lines>", space-padded;
//   line i   "<tool> seed <seed> run <run> line <i> " then filler drawn from (tool, seed, run, i).
//
// export_rows numbers its runs (the server's call counter, from 1): two runs of one seed differ
// on every line, and each line names its run, so a chain stitched from two runs is caught at the
// first line of the second. read_rows has run 0 whatever the call: its result depends on the
// seed alone, as a read-only tool's should.
//
// Any byte range of a result can be generated on its own (slice), so a page is checked when it
// arrives and a 10 MB result is never held by the checker.

export const LINE = 100;
export const TOOLS = ['export_rows', 'read_rows'];

const ALPHABET = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_';

// FNV-1a over a string, then a 32-bit mixer: the per-line seed of the filler.
function hash(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i += 1) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** The shape of one result: lines of LINE bytes, at least two, about `bytes` in all. */
export function shape(tool, seed, run, bytes) {
  const lines = Math.max(2, Math.round(bytes / LINE));
  return { tool, seed, run, lines, total: lines * LINE };
}

// Writes line i (0-based) of a result, with its newline, at buf[at..at+LINE).
function writeLine(s, i, buf, at) {
  const head = i === 0 ? `${s.tool} seed ${s.seed} run ${s.run} bytes ${s.total} lines ${s.lines}` : `${s.tool} seed ${s.seed} run ${s.run} line ${i} `;
  if (head.length > LINE - 1) throw new Error(`a row of ${head.length} bytes does not fit in ${LINE}`);
  buf.write(head, at, 'latin1');
  let p = at + head.length;
  const end = at + LINE - 1;
  if (i === 0) {
    buf.fill(0x20, p, end);
  } else {
    let x = hash(`${s.tool}/${s.seed}/${s.run}/${i}`) || 1;
    while (p < end) {
      // xorshift32: five characters of six bits per draw.
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      x >>>= 0;
      for (let k = 0; k < 5 && p < end; k += 1) buf[p++] = ALPHABET_CODES[(x >>> (k * 6)) & 63];
    }
  }
  buf[end] = 0x0a;
}

const ALPHABET_CODES = Uint8Array.from(ALPHABET, (c) => c.charCodeAt(0));

/** Line i (0-based) of a result, with its newline. */
export function line(s, i) {
  const buf = Buffer.allocUnsafe(LINE);
  writeLine(s, i, buf, 0);
  return buf.toString('latin1');
}

/** Bytes [from, to) of a result. */
export function slice(s, from, to) {
  to = Math.min(to, s.total);
  if (from >= to) return '';
  const first = Math.floor(from / LINE);
  const last = Math.ceil(to / LINE);
  const buf = Buffer.allocUnsafe((last - first) * LINE);
  for (let i = first; i < last; i += 1) writeLine(s, i, buf, (i - first) * LINE);
  return buf.toString('latin1', from - first * LINE, to - first * LINE);
}

/** The whole result (what the server answers). */
export function rows(tool, seed, run, bytes) {
  const s = shape(tool, seed, run, bytes);
  return slice(s, 0, s.total);
}

/**
 * The shape a result's first line declares ("<tool> seed S run R bytes B lines L"), or null.
 * A checker learns the run from the first page, then generates the rest.
 */
export function parseHeader(text) {
  const found = /^(\w+) seed (-?\d+) run (\d+) bytes (\d+) lines (\d+) *\n/.exec(text);
  if (!found) return null;
  const [, tool, seed, run, total, lines] = found;
  const s = { tool, seed: Number(seed), run: Number(run), lines: Number(lines), total: Number(total) };
  return s.total === s.lines * LINE ? s : null;
}

/** The runs a text's lines name (a chain reassembled from two runs names two). */
export function runsNamed(text) {
  const runs = new Set();
  for (const m of text.matchAll(/^\w+ seed -?\d+ run (\d+) /gm)) runs.add(Number(m[1]));
  return [...runs];
}
