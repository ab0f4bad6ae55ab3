"""Interop: the official Python MCP SDK 2.x client (`mcp.Client`) against real servers, directly
and through mcp-budget, in the three ways a 2.x client connects:

  legacy   the 2025-11-25 initialize handshake (mode="legacy");
  auto     probe with server/discover, fall back to initialize (mode="auto", the default);
  pinned   mode="2026-07-28": no probe and no handshake, every request carries the
           per-request _meta (protocol version, client info, client capabilities).

The same checks as the TypeScript v2 client (tests/interop/v2/client.mjs), against the same
servers (server-everything and server-filesystem, 2025 only; the dual-era conformance target,
tests/conformance/target.mjs) and transports (direct; through the proxy as a stdio child,
`--listen -- SERVER` and `--listen --upstream URL`):
  1. automatic paging reassembles the direct result exactly;
  2. codex-mcp-client pages stay under 10 KiB, claude-code's under 50,000 bytes;
  3. the built-in server-filesystem policy pages read_text_file by 20,000 bytes;
  4. refusals are tool errors the client parses (resultType on the wire in 2026-07-28);
  5. MRTR: an input_required tool's retry reaches the final result.

client.py is the 1.x client (its API differs: ClientSession over streams); this file needs
mcp 2.x. Prints one line per check and closes with "N passed, M failed".
"""

import argparse
import asyncio
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client

CLIENT = "py-v2"
MODERN = "2026-07-28"
MODES = {"legacy": "legacy", "auto": "auto", "pinned": MODERN}
TRANSPORTS = ["direct", "direct-http", "stdio", "http", "http-upstream"]

passed = failed = skipped = 0


def check(label, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok {label}")
    else:
        failed += 1
        print(f"FAIL {label}: {detail}")
    sys.stdout.flush()


def skip(label, why):
    global skipped
    skipped += 1
    print(f"skip {label}: {why}")


def clip(value, n=400):
    s = json.dumps(value, ensure_ascii=False, default=str)  # strings quoted too: one line
    return s if len(s) <= n else f"{s[:n]}…({len(s)} chars)"


def describe(error):
    causes = [error]
    while len(causes) == 1 and getattr(causes[0], "exceptions", None):
        causes = list(causes[0].exceptions)
    # One line: a pydantic error spans several.
    return "; ".join(f"{type(e).__name__}: {' '.join(str(e).split())[:400]}" for e in causes)


# ---------------------------------------------------------------------------------------------
# Sessions over tapped transports: the last request sent and the last response received, raw.


class Tap:
    """The last request sent and the last response received; and the response to the last
    tools/call (the client may send tools/list around a call, to validate its output)."""

    def __init__(self):
        self.sent = None
        self.received = None
        self.call_id = None
        self.call_response = None

    @property
    def call(self):
        return self.call_response


class TapRead:
    def __init__(self, inner, tap):
        self.inner, self.tap = inner, tap

    async def receive(self):
        item = await self.inner.receive()
        message = getattr(item, "message", None)
        if message is not None and (hasattr(message, "result") or hasattr(message, "error")):
            self.tap.received = message.model_dump(by_alias=True, exclude_none=True, mode="json")
            if self.tap.call_id is not None and self.tap.received.get("id") == self.tap.call_id:
                self.tap.call_response = self.tap.received
        return item

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration

    async def aclose(self):
        await self.inner.aclose()

    async def __aenter__(self):
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self.inner.__aexit__(*exc)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class TapWrite:
    def __init__(self, inner, tap):
        self.inner, self.tap = inner, tap

    async def send(self, item):
        message = getattr(item, "message", None)
        if message is not None and hasattr(message, "method") and hasattr(message, "id"):
            self.tap.sent = message.model_dump(by_alias=True, exclude_none=True, mode="json")
            if self.tap.sent.get("method") == "tools/call":
                self.tap.call_id, self.tap.call_response = self.tap.sent.get("id"), None
        await self.inner.send(item)

    async def aclose(self):
        await self.inner.aclose()

    async def __aenter__(self):
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self.inner.__aexit__(*exc)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@asynccontextmanager
async def tapped(transport, tap):
    async with transport as (read, write):
        yield TapRead(read, tap), TapWrite(write, tap)


def evidence(tap):
    if tap is None:
        return ""
    return f" | request: {clip(tap.sent, 300)} | response: {clip(tap.call_response or tap.received, 500)}"


def child_env():
    # As the SDK's stdio transport gives it (its inherited defaults first): get-env lists the
    # environment in order, and direct and proxied legs compare.
    return get_default_environment() | dict(os.environ)


class Session:
    def __init__(self):
        self.elicitations = []
        self.answer_name = "octocat"
        self.tap = Tap()
        self.client = None
        self.era = None
        self.note = ""


@asynccontextmanager
async def open_session(route, mode, name="mcp-budget-interop"):
    session = Session()

    async def elicit(context, params):
        schema = (getattr(params, "requested_schema", None) or {}).get("properties", {})
        session.elicitations.append(params.message)
        if "color" in schema:
            return types.ElicitResult(action="accept", content={"color": "teal"})
        if "ok" in schema:
            return types.ElicitResult(action="accept", content={"ok": True})
        return types.ElicitResult(action="accept", content={"name": session.answer_name})

    if "url" in route:
        transport = streamable_http_client(route["url"])
    else:
        transport = stdio_client(StdioServerParameters(command=route["command"], args=route["args"], env=child_env()), errlog=open(os.devnull, "w"))
    client = Client(
        tapped(transport, session.tap),
        mode=MODES[mode],
        elicitation_callback=elicit,
        client_info=types.Implementation(name=name, version="1.0.0"),
        read_timeout_seconds=60,
    )
    connected = False
    try:
        async with client:
            connected = True
            session.client = client
            session.era = "modern" if client.protocol_version == MODERN else "legacy"
            yield session
    except BaseException as error:
        if not connected:
            error.tap = session.tap
        raise


# ---------------------------------------------------------------------------------------------
# Paging helpers (as client.py)


def texts_of(result):
    return [b.text for b in result.content if getattr(b, "type", "") == "text"]


def last_notice(result):
    texts = texts_of(result)
    return texts[-1] if texts else ""


def cursor_in(notice):
    found = re.search(r'after:"([^"]*)"', notice)
    return found.group(1) if found else None


def wire_size(raw):
    return len(json.dumps((raw or {}).get("result"), separators=(",", ":"), ensure_ascii=False).encode())


def resolve(doc, path):
    for name, index, quoted in re.findall(r'\.([A-Za-z0-9_]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]', path[1:]):
        doc = doc[name] if name else doc[int(index)] if index else doc[json.loads(quoted)]
    return doc


def reassemble(pages, texts):
    found = re.search(r"(?:items|members) \d+-\d+ of \d+ in (\$\S*?)(?:;|\.(?:\s|$)| \()", last_notice(pages[0]))
    if not found:
        return "".join(texts)
    whole = json.loads(texts[0])
    items = resolve(whole, found.group(1))
    for text in texts[1:]:
        more = resolve(json.loads(text), found.group(1))
        # A list's items, or (a document with no list) an object's members.
        items.update(more) if isinstance(items, dict) else items.extend(more)
    return whole


def first_difference(expected, rebuilt):
    if isinstance(expected, str) or isinstance(rebuilt, str):
        a, b = str(expected), str(rebuilt)
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return f"False (lengths {len(a)} and {len(b)}; first difference at {i}: direct {clip(a[i:i + 80])}, reassembled {clip(b[i:i + 80])})"
    differ = [k for k in set(expected) | set(rebuilt) if expected.get(k) != rebuilt.get(k)]
    return f"False ({len(differ)} members differ: {differ[:5]})"


async def chain(session, tool, args, max_pages=1000):
    pages, call = [], dict(args)
    for _ in range(max_pages):
        result = await session.client.call_tool(tool, call)
        if result.is_error:
            raise RuntimeError(f"page {len(pages) + 1} is an error: {clip(texts_of(result)[0] if texts_of(result) else '', 300)}")
        pages.append((result, session.tap.call))
        cursor = cursor_in(last_notice(result))
        if not cursor:
            return pages
        call = dict(args, after=cursor)
    raise RuntimeError("the chain does not end")


def page_texts(pages):
    return ["".join(texts_of(result)[:-1]) for result, _ in pages]


# ---------------------------------------------------------------------------------------------
# Processes


children = []


def start(args, env=None, url_from=None, logdir=None):
    out = tempfile.NamedTemporaryFile("w+", dir=logdir, delete=False, suffix=".out")
    err = tempfile.NamedTemporaryFile("w+", dir=logdir, delete=False, suffix=".err")
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env or child_env())
    children.append(process)
    if not url_from:
        return process, None
    watched = out.name if url_from == "stdout" else err.name
    deadline = time.time() + 20
    while time.time() < deadline:
        with open(watched) as f:
            found = re.search(r"listening on (http://\S+)", f.read())
        if found:
            return process, found.group(1)
        if process.poll() is not None:
            raise RuntimeError(f"{args[0]} exited ({process.returncode}) before listening")
        time.sleep(0.05)
    raise RuntimeError(f"{args[0]} printed no 'listening on' line in 20 s")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def stop_all():
    for process in children:
        if process.poll() is None:
            process.terminate()
    for process in children:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


# ---------------------------------------------------------------------------------------------
# Checks


def expected_era(server, mode, transport="direct"):
    # The target is dual-era; the reference servers speak only 2025-11-25: directly an auto
    # client falls back to it, through the proxy (which bridges the eras) it stays modern.
    if mode == "legacy":
        return "legacy"
    return "modern" if server == "target" or is_proxy(transport) else "legacy"


def reference_of(transport):
    return "direct-http" if transport == "http-upstream" else "direct"


def is_proxy(transport):
    return not transport.startswith("direct")


class Suite:
    def __init__(self, options, work):
        self.o = options
        self.work = work
        self.references = {}
        self.fs_root = os.path.realpath(tempfile.mkdtemp(dir=work))
        self.big_log = os.path.join(self.fs_root, "big.log")
        with open(self.big_log, "w") as f:
            for i in range(4000):
                f.write(f"2026-11-20T12:00:{i % 60:02d}Z worker-{i % 7} stream st-{i % 240:04d} état ok — line {i}\n")
        self.big_name = "\n".join(f"name line {i:04d} " + "z" * 88 for i in range(3000))
        self.one_line_name = "q" * 300_000
        self.policy = os.path.join(work, "target-policy.toml")
        with open(self.policy, "w") as f:
            f.write('[[tool]]\nname = "test_simple_text"\nitems = "$.items"\nnoun = "items"\n[tool.limit]\ndefault = 5\nmax = 10\n')

    def start_routes(self):
        o = self.o
        everything = {"command": "node", "args": [o.everything]}
        filesystem = {"command": "node", "args": [o.filesystem, self.fs_root]}
        target = {"command": "node", "args": [o.target, "--stdio"]}

        def via(server, policy):
            return {"command": o.proxy, "args": policy + ["--", server["command"]] + server["args"]}

        port = free_port()
        start(["node", o.everything, "streamableHttp"], env=dict(child_env(), PORT=str(port)), logdir=self.work)
        _, target_url = start(["node", o.target, "--port", "0"], url_from="stderr", logdir=self.work)
        wait_port(port)
        everything_url = f"http://127.0.0.1:{port}/mcp"
        listen = ["--listen", "http://127.0.0.1:0/mcp"]

        def listener(args):
            return {"url": start([o.proxy] + args, url_from="stdout", logdir=self.work)[1]}

        self.routes = {
            "everything": {
                "direct": everything,
                "direct-http": {"url": everything_url},
                "stdio": via(everything, ["--policy", "none"]),
                "http": listener(["--policy", "none"] + listen + ["--", "node", o.everything]),
                "http-upstream": listener(["--policy", "none"] + listen + ["--upstream", everything_url]),
            },
            "filesystem": {
                "direct": filesystem,
                "stdio": via(filesystem, []),  # no --policy: the built-in one, picked by server name
                "http": listener(listen + ["--", "node", o.filesystem, self.fs_root]),
            },
            "target": {
                "direct": target,
                "direct-http": {"url": target_url},
                "stdio": via(target, ["--policy", self.policy]),
                "http": listener(["--policy", self.policy] + listen + ["--", "node", o.target, "--stdio"]),
                "http-upstream": listener(["--policy", self.policy] + listen + ["--upstream", target_url]),
            },
        }

    async def session_checks(self, labels, route, mode, fn, name="mcp-budget-interop", note=""):
        """Runs fn(session); a session that cannot be opened fails every check it was for."""
        tap = None
        try:
            async with open_session(route, mode, name) as session:
                tap = session.tap
                session.note = note
                await fn(session)
        except Exception as error:
            if tap is None:
                for label in labels:
                    check(label, False, f"{note}connect: {describe(error)}{evidence(getattr(error, 'tap', None))}")
            else:
                check(f"{labels[0]} (session)", False, f"{note}{describe(error)}{evidence(tap)}")

    async def attempt(self, label, session, fn):
        try:
            ok, detail = await fn()
            check(label, ok, "" if ok else f"{session.note}{detail}{evidence(session.tap)}")
        except Exception as error:
            check(label, False, f"{session.note}{describe(error)}{evidence(session.tap)}")

    async def reference(self, key, route, mode, tool, args, name=None):
        if key in self.references:
            return self.references[key]
        try:
            async with open_session(route, mode) as session:
                if name is not None:
                    session.answer_name = name
                result = await session.client.call_tool(tool, args)
                self.references[key] = {"text": "".join(texts_of(result))}
        except Exception as error:
            self.references[key] = {"error": describe(error)}
        return self.references[key]

    async def everything_checks(self, mode, transport, prefix):
        route = self.routes["everything"][transport]
        ref = await self.reference(f"everything {reference_of(transport)}", self.routes["everything"][reference_of(transport)], "legacy", "get-env", {})
        whole = ref.get("text")
        if not is_proxy(transport):
            size = len(whole.encode()) if whole else 0
            check(f"{prefix}: everything get-env answers {size} bytes in one result (the reference)", size > 200_000, ref.get("error", "too small"))
            return

        def rebuild(pages):
            rebuilt = reassemble([p for p, _ in pages], page_texts(pages))
            expected = whole if isinstance(rebuilt, str) else json.loads(whole)
            return True if rebuilt == expected else first_difference(expected, rebuilt)

        label = f"{prefix}: automatic paging of everything get-env"

        async def paging(session):
            async def run():
                if not whole:
                    return False, f"no direct reference: {ref.get('error')}"
                if session.era != expected_era("everything", mode, transport):
                    return False, f"era {session.era}, expected {expected_era('everything', mode, transport)}"
                await session.client.list_tools()
                pages = await chain(session, "get-env", {})
                sizes = [wire_size(raw) for _, raw in pages]
                equal = rebuild(pages)
                ok = len(pages) > 1 and max(sizes) < 200_000 and equal is True and 'after:"' in last_notice(pages[0][0])
                print(f"     {len(pages)} pages of at most {max(sizes)} bytes for {len(whole.encode())} bytes direct")
                return ok, f"{len(pages)} pages, sizes {sizes[:4]}, reassembled equal: {equal}"

            await self.attempt(label, session, run)

        await self.session_checks([label], route, mode, paging)
        for name, limit, unit in [("codex-mcp-client", 10 * 1024, "10 KiB"), ("claude-code", 50_000, "50,000 bytes")]:
            plabel = f"{prefix}: profile {name}: everything get-env pages under {unit}"

            async def profile(session, plabel=plabel, limit=limit):
                async def run():
                    if not whole:
                        return False, f"no direct reference: {ref.get('error')}"
                    pages = await chain(session, "get-env", {})
                    sizes = [wire_size(raw) for _, raw in pages]
                    equal = rebuild(pages)
                    ok = len(pages) >= math.ceil(len(whole.encode()) / limit) and max(sizes) <= limit and equal is True
                    print(f"     {len(pages)} pages of at most {max(sizes)} bytes")
                    return ok, f"{len(pages)} pages, largest {max(sizes)} bytes (limit {limit}), reassembled equal: {equal}"

                await self.attempt(plabel, session, run)

            await self.session_checks([plabel], route, mode, profile, name=name)

    async def filesystem_checks(self, mode, transport, prefix):
        route = self.routes["filesystem"].get(transport)
        if route is None:
            return
        with open(self.big_log, encoding="utf-8") as f:
            whole = f.read()
        if not is_proxy(transport):
            if mode == "pinned":
                skip(f"{prefix}: filesystem read_text_file", "server-filesystem speaks only 2025-11-25: a client pinned to 2026-07-28 cannot reach it directly")
                return
            label = f"{prefix}: filesystem read_text_file answers the whole file in one result (the reference)"

            async def direct(session):
                async def run():
                    result = await session.client.call_tool("read_text_file", {"path": self.big_log})
                    text = texts_of(result)[0] if texts_of(result) else ""
                    return text == whole, f"text of {len(text.encode())} bytes, file {len(whole.encode())}"

                await self.attempt(label, session, run)

            await self.session_checks([label], route, mode, direct)
            return
        label = f"{prefix}: filesystem built-in policy: read_text_file in pages of at most 20,000 bytes"

        async def policy(session):
            async def run():
                listed = await session.client.list_tools()
                described = any(t.name == "read_text_file" and "Budgeted by mcp-budget" in (t.description or "") for t in listed.tools)
                pages, args = [], {"path": self.big_log}
                for _ in range(500):
                    result = await session.client.call_tool("read_text_file", args)
                    if result.is_error:
                        raise RuntimeError(f"page {len(pages) + 1} is an error: {clip(texts_of(result)[0], 300)}")
                    pages.append(result)
                    texts = texts_of(result)
                    cursor = cursor_in(texts[1] if len(texts) > 1 else "")
                    if not cursor:
                        break
                    args = {"path": self.big_log, "after": cursor}
                sizes = [len(texts_of(p)[0].encode()) for p in pages]
                equal = "".join(texts_of(p)[0] for p in pages) == whole
                ok = described and len(pages) > 1 and max(sizes) <= 20_000 and equal
                print(f"     {len(pages)} pages of at most {max(sizes)} bytes for {len(whole.encode())} bytes")
                return ok, f'{len(pages)} pages, text sizes {sizes[:4]}, reassembled equal: {equal}, descriptor says "Budgeted by mcp-budget": {described}'

            await self.attempt(label, session, run)

        # server-filesystem speaks only 2025-11-25: a pinned client gets its pages through the
        # proxy's era bridge (directly, it cannot reach the server at all).
        await self.session_checks([label], route, mode, policy, note="through the era bridge: " if mode == "pinned" else "")

    async def target_checks(self, mode, transport, prefix):
        route = self.routes["target"][transport]
        modern = expected_era("target", mode) == "modern"
        proxied = is_proxy(transport)
        ref = await self.reference(f"target {reference_of(transport)} {mode}", self.routes["target"][reference_of(transport)], mode, "test_input_required_result_elicitation", {}, name=self.big_name)
        whole = ref.get("text")
        how = "input_required, retried" if modern else "legacy: a server-to-client elicitation request"
        labels = {
            "era": f"{prefix}: target connects in the {'2026-07-28' if modern else '2025-11-25'} era",
            "elicit": f"{prefix}: MRTR elicitation round trip ({how})",
            "rounds": f"{prefix}: MRTR two rounds with requestState ({how})",
            "forged": f"{prefix}: refusal: a forged after cursor is a tool error the client parses",
            "limit": f"{prefix}: refusal: limit out of range is a tool error the client parses",
            "line": f"{prefix}: refusal: a line no page can hold is a tool error the client parses",
            "paging": f"{prefix}: automatic paging of a result reached through {'input_required' if modern else 'elicitation'}",
        }

        async def main(session):
            check(labels["era"], session.era == ("modern" if modern else "legacy"), f"protocol version {session.client.protocol_version}")

            async def elicit():
                session.elicitations, session.answer_name = [], "octocat"
                result = await session.client.call_tool("test_input_required_result_elicitation", {})
                text = "".join(texts_of(result))
                raw = (session.tap.call or {}).get("result", {})
                typed = not modern or raw.get("resultType") == "complete"
                return text == "Hello, octocat!" and len(session.elicitations) == 1 and not result.is_error and typed, f"text {clip(text, 200)}, elicitations {len(session.elicitations)}, final resultType {raw.get('resultType')}"

            await self.attempt(labels["elicit"], session, elicit)

            async def rounds():
                session.elicitations = []
                result = await session.client.call_tool("test_input_required_result_multi_round", {})
                text = "".join(texts_of(result))
                if modern:
                    ok = text == "Multi-round complete: octocat likes teal" and len(session.elicitations) == 2
                else:
                    ok = not result.is_error and len(session.elicitations) >= 1
                return ok, f"text {clip(text, 200)}, elicitations {len(session.elicitations)}"

            await self.attempt(labels["rounds"], session, rounds)
            if not proxied:
                return

            def refusal(tool, args, pattern):
                async def run():
                    result = await session.client.call_tool(tool, args)
                    raw = (session.tap.call or {}).get("result", {})
                    text = " ".join(texts_of(result))
                    typed = not modern or raw.get("resultType") == "complete"
                    return result.is_error and re.search(pattern, text) is not None and typed, f"isError {result.is_error}, resultType on the wire {raw.get('resultType')}, text {clip(text, 250)}"

                return run

            await self.attempt(labels["forged"], session, refusal("test_input_required_result_elicitation", {"after": "bm90LWEtY3Vyc29y"}, r"after"))
            await self.attempt(labels["limit"], session, refusal("test_simple_text", {"limit": 500}, r"limit must be an integer between 1 and 10"))
            session.answer_name = self.one_line_name
            await self.attempt(labels["line"], session, refusal("test_input_required_result_elicitation", {}, r"result-too-large|cannot be paged"))

            async def paging():
                if not whole:
                    return False, f"no direct reference: {ref.get('error')}"
                session.answer_name, session.elicitations = self.big_name, []
                pages = await chain(session, "test_input_required_result_elicitation", {})
                sizes = [wire_size(raw) for _, raw in pages]
                equal = "".join(page_texts(pages)) == whole
                typed = not modern or all((raw or {}).get("result", {}).get("resultType") == "complete" for _, raw in pages)
                ok = len(pages) > 1 and max(sizes) < 200_000 and equal and typed and len(session.elicitations) == 1
                print(f"     {len(pages)} pages of at most {max(sizes)} bytes for {len(whole.encode())} bytes direct")
                return ok, f"{len(pages)} pages, sizes {sizes[:4]}, reassembled equal: {equal}, resultType on every page: {typed}, elicitations {len(session.elicitations)} (1 expected: later pages come from the proxy)"

            await self.attempt(labels["paging"], session, paging)

        wanted = [label for key, label in labels.items() if proxied or key in ("era", "elicit", "rounds")]
        await self.session_checks(wanted, route, mode, main)
        if not proxied:
            size = len(whole.encode()) if whole else 0
            check(f"{prefix}: target's greeting with a ~300 KB name is {size} bytes in one result (the reference)", size > 200_000, ref.get("error", "too small"))
            return
        for name, limit, unit in [("codex-mcp-client", 10 * 1024, "10 KiB"), ("claude-code", 50_000, "50,000 bytes")]:
            plabel = f"{prefix}: profile {name}: target pages under {unit}"

            async def profile(session, plabel=plabel, limit=limit):
                async def run():
                    if not whole:
                        return False, "no direct reference"
                    session.answer_name = self.big_name
                    pages = await chain(session, "test_input_required_result_elicitation", {})
                    sizes = [wire_size(raw) for _, raw in pages]
                    equal = "".join(page_texts(pages)) == whole
                    ok = len(pages) >= math.ceil(len(whole.encode()) / limit) and max(sizes) <= limit and equal
                    print(f"     {len(pages)} pages of at most {max(sizes)} bytes")
                    return ok, f"{len(pages)} pages, largest {max(sizes)} bytes (limit {limit}), reassembled equal: {equal}"

                await self.attempt(plabel, session, run)

            await self.session_checks([plabel], route, mode, profile, name=name)


async def main():
    parser = argparse.ArgumentParser()
    for name in ("proxy", "everything", "filesystem", "target"):
        parser.add_argument(f"--{name}", required=True)
    options = parser.parse_args()
    only = re.compile(os.environ["INTEROP_ONLY"]) if os.environ.get("INTEROP_ONLY") else None
    # server-everything's get-env returns the environment: 3,000 variables make it ~370 KB.
    for i in range(3000):
        os.environ[f"MCP_BUDGET_AUTO_{i:04d}"] = f"value-{i}-" + "y" * 80
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="mcp-budget-interop-py2-") as work:
        suite = Suite(options, work)
        try:
            suite.start_routes()
            for mode in MODES:
                for transport in TRANSPORTS:
                    prefix = f"{CLIENT}/{mode}/{transport}"
                    if only and not only.search(prefix):
                        continue
                    t0 = time.time()
                    if mode == "pinned" and not is_proxy(transport):
                        skip(f"{prefix}: everything get-env", "server-everything speaks only 2025-11-25: a pinned client cannot reach it directly")
                    elif transport in suite.routes["everything"]:
                        await suite.everything_checks(mode, transport, prefix)
                    await suite.filesystem_checks(mode, transport, prefix)
                    await suite.target_checks(mode, transport, prefix)
                    print(f"     ({prefix}: {time.time() - t0:.1f} s)")
        except Exception as error:
            check(f"{CLIENT}: setup", False, describe(error))
        finally:
            stop_all()
    print(f"{CLIENT}: {time.time() - started:.1f} s, {skipped} not applicable")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
