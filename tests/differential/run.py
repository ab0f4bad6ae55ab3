#!/usr/bin/env python3
"""The differential test: one reading decides.

Envelopes of the classes an outside fuzzer used (escapes, lone surrogates, duplicate keys,
number spellings, nulls, batches, whitespace) are sent through mcp-budget to three servers that
read JSON three ways: Python's json (reader.py), JavaScript's JSON.parse (reader.mjs) and
serde_json (examples/reader_server.rs). Each server logs what it read of each message: method,
id, tool name and arguments. For every message the proxy admits, all three read the same; a
message the proxy refuses reaches none of them.

usage: run.py --proxy BIN --serde BIN [--count N] [--seed S]
Prints one line per failure and closes with "N passed, M failed"; exit status 1 on any failure.
"""
import argparse, json, os, random, subprocess, sys, tempfile, threading, queue

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--proxy", required=True)
ap.add_argument("--serde", required=True)
ap.add_argument("--count", type=int, default=800)
ap.add_argument("--seed", type=int, default=1)
opts = ap.parse_args()
work = tempfile.mkdtemp(prefix="mcp-budget-differential-")


class Proxy:
    def __init__(self, name, server):
        self.name = name
        self.log = os.path.join(work, f"{name}.log")
        open(self.log, "w").close()
        self.proc = subprocess.Popen(
            [opts.proxy, "--policy", "none", "--", *server, self.log],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(os.path.join(work, f"{name}.err"), "w"))
        self.lines = queue.Queue()
        threading.Thread(target=self.pump, daemon=True).start()
        self.seen = 0

    def pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.decode("utf-8", "replace"))

    def send(self, text):
        self.proc.stdin.write(text.encode("utf-8", "surrogatepass") + b"\n")
        self.proc.stdin.flush()

    def until(self, sentinel):
        """Lines up to the answer to the sentinel ping."""
        got = []
        while True:
            line = self.lines.get(timeout=20)
            if f'"{sentinel}"' in line:
                return got
            got.append(line)

    def reads(self):
        """What the server logged since the last call (its reading of each message)."""
        with open(self.log, encoding="utf-8", errors="surrogatepass") as f:
            entries = [json.loads(l) for l in f.read().splitlines()]
        new, self.seen = entries[self.seen:], len(entries)
        # The sentinel pings are the driver's own.
        return [e for e in new if not (e.get("method") == "ping" and str(e.get("id", "")).startswith("sentinel-"))]


servers = {
    "python": [sys.executable, os.path.join(here, "reader.py")],
    "node": ["node", os.path.join(here, "reader.mjs")],
    "serde": [opts.serde],
}
proxies = [Proxy(name, cmd) for name, cmd in servers.items()]
for p in proxies:
    p.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "differential", "version": "1"}}}))
    p.send('{"jsonrpc":"2.0","method":"notifications/initialized"}')
    p.send('{"jsonrpc":"2.0","id":"sentinel-0","method":"ping"}')
    p.until("sentinel-0")
    p.reads()

# ---- the generator -------------------------------------------------------------------------
rng = random.Random(opts.seed)
next_id = [1]


def fresh_id():
    next_id[0] += 1
    return next_id[0]


def key(k):
    """A key, sometimes spelled with escapes."""
    r = rng.random()
    if r < 0.1:
        return "".join(f"\\u{ord(c):04x}" for c in k)
    if r < 0.15:
        return k[:-1] + "\\ud800" if len(k) > 1 else k
    return k


def ws():
    return rng.choice(["", "", "", " ", "\t", " \r ", "  "])


def number():
    return rng.choice(["1", "-3", "0", "-0", "1.0", "1e2", "1E400", "-1e999", "9007199254740991",
                       "9007199254740992", "9007199254740993", "12345678901234567890", "0.1", "2.5e-7"])


def string():
    return rng.choice(['"plain"', '"caf\\u00e9"', '"\\ud83d\\ude00"', '"\\ud800"', '"\\udc00x"',
                       '"a\\\\ud800"', '"tab\\there"', '"\\/slash"', '""'])


def value(depth=0):
    r = rng.random()
    if depth > 2 or r < 0.35:
        return number()
    if r < 0.65:
        return string()
    if r < 0.75:
        return rng.choice(["null", "true", "false"])
    if r < 0.88:
        return "[" + ",".join(value(depth + 1) for _ in range(rng.randint(0, 3))) + "]"
    return obj([(rng.choice(["a", "b", "c", "after", "limit"]), value(depth + 1)) for _ in range(rng.randint(0, 3))])


def obj(members):
    if members and rng.random() < 0.15:
        members = members + [rng.choice(members)]  # a key twice
    return "{" + ws() + ",".join(f'{ws()}"{key(k)}"{ws()}:{ws()}{v}' for k, v in members) + ws() + "}"


def an_id():
    r = rng.random()
    if r < 0.6:
        return str(fresh_id())
    if r < 0.75:
        return f'"s{fresh_id()}"'
    return rng.choice(["null", f"{fresh_id()}.0", f"1e{rng.randint(15, 17)}", "-0",
                       "9007199254740993", "12345678901234567890", f'"\\u0073{fresh_id()}"', "[1]"])


def message():
    method = rng.choice(['"tools/call"', '"tools/call"', '"tools/list"', '"ping"', '"\\u0074ools/call"', '"tools/call\\ud800"'])
    members = [("jsonrpc", '"2.0"')]
    if rng.random() < 0.9:
        members.append(("id", an_id()))
    members.append(("method", method))
    params = [("name", rng.choice(['"t"', '"t"', '"\\u0074"', '"t\\udc00"', "null", "7"]))]
    params.append(("arguments", obj([(rng.choice(["x", "y", "z"]), value()) for _ in range(rng.randint(0, 3))])))
    if rng.random() < 0.3:
        params.append(("_meta", obj([(rng.choice(["progressToken", "k"]), value())])))
    members.append(("params", obj(params) if rng.random() < 0.95 else "null"))
    return obj(members)


def line():
    if rng.random() < 0.15:
        return "[" + ",".join(message() for _ in range(rng.randint(1, 3))) + "]"
    return message()


# ---- the run --------------------------------------------------------------------------------
passed = failed = admitted = refused = 0
for n in range(1, opts.count + 1):
    text = line()
    sentinel = f"sentinel-{n}"
    readings = {}
    for p in proxies:
        p.send(text)
        p.send(json.dumps({"jsonrpc": "2.0", "id": sentinel, "method": "ping"}))
        p.until(sentinel)
        readings[p.name] = p.reads()
    seen = [r for r in readings.values() if r]
    if not seen:
        refused += 1
        passed += 1
        continue
    admitted += 1
    first = readings["python"]
    if all(r == first for r in readings.values()):
        passed += 1
    else:
        failed += 1
        print(f"FAIL message {n}: the servers read it differently: {text}")
        for name, r in readings.items():
            print(f"    {name}: {json.dumps(r, ensure_ascii=True)[:400]}")

for p in proxies:
    p.proc.stdin.close()
    p.proc.wait(timeout=10)
print(f"differential: {opts.count} messages, {admitted} admitted (read alike by Python, Node and serde), {refused} refused (read by none)")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
