"""Interop: the official Python MCP SDK drives real servers directly and through mcp-budget.

For each server and each transport combination (stdio→stdio, HTTP→stdio, stdio→HTTP,
HTTP→HTTP), a scripted session produces a transcript — initialize, tools, every tool that needs
no outside service (echo, sums, structured content, long-running with progress, resource links,
annotated messages, sampling and elicitation answered by this client), resources (all pages,
read, templates, subscribe), prompts, completion, logging level, ping, cancellation — and the
transcript through the proxy must equal the direct one. Without a policy, nothing may differ.

Prints one line per check and closes with "N passed, N failed".
"""

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from datetime import timedelta

import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError


# Results that differ between two direct runs of the same server, and why. They are compared by
# shape (keys and types) instead of by value; any other difference between two direct runs fails.
KNOWN_UNSTABLE = {
    "call get-resource-reference": "server-everything words the resource it returns differently from run to run",
}


def shape(value):
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


def dump(value):
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True, by_alias=True)
    return value


async def sampling_callback(context, params):
    text = params.messages[0].content.text if params.messages else ""
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text=f"sampled: {text[:40]}"),
        model="interop-model",
        stopReason="endTurn",
    )


async def elicitation_callback(context, params):
    return types.ElicitResult(action="decline")


async def list_all(method, key):
    items, cursor = [], None
    for _ in range(100):
        page = await method(cursor) if cursor else await method()
        items.extend(dump(x) for x in getattr(page, key))
        cursor = page.nextCursor
        if not cursor:
            return items
    return items


async def everything_scenario(session):
    out = {}
    init = await session.initialize()
    out["initialize"] = {"protocolVersion": init.protocolVersion, "capabilities": dump(init.capabilities), "serverInfo": dump(init.serverInfo)}
    # The sampling/elicitation tools appear after initialization (list_changed): wait for them
    # (bounded), rather than for a fixed time that a slow machine can overrun.
    for _ in range(100):
        tools = await list_all(session.list_tools, "tools")
        if any(t["name"] == "trigger-sampling-request" for t in tools):
            break
        await asyncio.sleep(0.1)
    out["tools"] = sorted(tools, key=lambda t: t["name"])
    names = {t["name"] for t in tools}
    calls = [
        ("echo", {"message": "hello through the proxy"}),
        ("get-sum", {"a": 2, "b": 40}),
        ("get-annotated-message", {"messageType": "error", "includeImage": True}),
        ("get-resource-links", {"count": 3}),
        ("get-resource-reference", {"resourceType": "Text", "resourceId": 2}),
        ("get-tiny-image", {}),
        ("trigger-sampling-request", {"prompt": "Say hi", "maxTokens": 20}),
        ("trigger-elicitation-request", {}),
    ]
    for name, arguments in calls:
        if name not in names:
            out[f"call {name}"] = "not offered"
            continue
        result = await session.call_tool(name, arguments)
        out[f"call {name}"] = dump(result)
    progress = []

    async def on_progress(value, total, message):
        progress.append([value, total])

    result = await session.call_tool("trigger-long-running-operation", {"duration": 0.3, "steps": 3}, progress_callback=on_progress)
    out["call trigger-long-running-operation"] = dump(result)
    out["progress"] = progress
    structured = await session.call_tool("get-structured-content", {"location": "New York"})
    out["structured content keys"] = sorted((structured.structuredContent or {}).keys())
    resources = await list_all(session.list_resources, "resources")
    out["resources"] = resources
    if resources:
        out["read"] = dump(await session.read_resource(resources[0]["uri"]))
        out["subscribe"] = dump(await session.subscribe_resource(resources[0]["uri"]))
        out["unsubscribe"] = dump(await session.unsubscribe_resource(resources[0]["uri"]))
    out["templates"] = await list_all(session.list_resource_templates, "resourceTemplates")
    out["prompts"] = await list_all(session.list_prompts, "prompts")
    out["prompt simple"] = dump(await session.get_prompt("simple-prompt"))
    out["prompt args"] = dump(await session.get_prompt("args-prompt", {"city": "Lyon", "state": "Rhône"}))
    out["completion"] = dump(
        await session.complete(types.PromptReference(type="ref/prompt", name="completable-prompt"), {"name": "department", "value": "E"})
    )
    out["logging"] = dump(await session.set_logging_level("error"))
    out["ping"] = dump(await session.send_ping())
    # Cancellation: a call the client gives up on, then the session still works.
    try:
        await session.call_tool("trigger-long-running-operation", {"duration": 5, "steps": 5}, read_timeout_seconds=timedelta(seconds=0.4))
        out["cancel"] = "not cancelled"
    except McpError as error:
        out["cancel"] = "timed out" if "Timed out" in str(error) or "timed out" in str(error).lower() else str(error)
    out["ping after cancel"] = dump(await session.send_ping())
    return out


async def filesystem_scenario(session, root):
    out = {}
    init = await session.initialize()
    out["initialize"] = {"protocolVersion": init.protocolVersion, "capabilities": dump(init.capabilities), "serverInfo": dump(init.serverInfo)}
    tools = await list_all(session.list_tools, "tools")
    out["tools"] = sorted(tools, key=lambda t: t["name"])
    names = {t["name"] for t in tools}
    calls = [
        ("list_allowed_directories", {}),
        ("list_directory", {"path": root}),
        ("directory_tree", {"path": root}),
        ("read_text_file", {"path": os.path.join(root, "notes.txt")}),
        ("read_text_file", {"path": os.path.join(root, "notes.txt"), "head": 2}),
        ("read_multiple_files", {"paths": [os.path.join(root, "notes.txt"), os.path.join(root, "src", "main.rs")]}),
        ("search_files", {"path": root, "pattern": "*.rs"}),
        ("list_directory", {"path": "/definitely/not/allowed"}),
    ]
    for name, arguments in calls:
        key = f"call {name} {json.dumps(arguments, sort_keys=True)}"
        if name not in names:
            out[key] = "not offered"
            continue
        out[key] = dump(await session.call_tool(name, arguments))
    out["ping"] = dump(await session.send_ping())
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@asynccontextmanager
async def stdio_session(command, args):
    params = StdioServerParameters(command=command, args=args, env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, sampling_callback=sampling_callback, elicitation_callback=elicitation_callback) as session:
            yield session


@asynccontextmanager
async def http_session(url):
    async with streamablehttp_client(url) as (read, write, _):
        async with ClientSession(read, write, sampling_callback=sampling_callback, elicitation_callback=elicitation_callback) as session:
            yield session


def start(args, env=None, url_from_stdout=False):
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env or dict(os.environ), text=True)
    url = None
    if url_from_stdout:
        url = process.stdout.readline().strip().removeprefix("listening on ")
    return process, url


def wait_http(port, timeout=15.0):
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def strip_after(tool):
    """A descriptor without what automatic paging adds: `after` and the continuation fields."""
    tool = json.loads(json.dumps(tool))
    schema = tool.get("inputSchema", {})
    properties = schema.get("properties")
    if isinstance(properties, dict) and properties.get("after", {}).get("description", "").startswith("Continue a result that mcp-budget paged"):
        del properties["after"]
    if properties == {}:
        del schema["properties"]
    # And the continuation fields declared in its output schema.
    output = tool.get("outputSchema", {}).get("properties")
    if isinstance(output, dict):
        for name in [k for k, v in output.items() if isinstance(v, dict) and v.get("description", "").startswith("Set by mcp-budget")]:
            del output[name]
    return tool


def wire_size(result):
    """The bytes of a tool result as JSON (what the client receives, near enough)."""
    return len(json.dumps(dump(result), separators=(",", ":"), ensure_ascii=False).encode())


def last_notice(result):
    texts = [b.text for b in result.content if getattr(b, "type", "") == "text"]
    return texts[-1] if texts else ""


def cursor_in(notice):
    return notice.split('after:"')[1].split('"')[0] if 'after:"' in notice else None


def resolve(doc, path):
    """The value at a JSONPath of the forms the proxy writes ($, $.a.b, $[0].c, $["x y"])."""
    import re

    for name, index, quoted in re.findall(r'\.([A-Za-z0-9_]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]', path[1:]):
        doc = doc[name] if name else doc[int(index)] if index else doc[json.loads(quoted)]
    return doc


def reassemble(pages, texts):
    """The whole result from its pages: texts concatenated, or (for a list paged out of a JSON
    text) the first page's document with every page's items. `texts` gives each page's text."""
    import re

    notice = last_notice(pages[0])
    found = re.search(r"(?:items|members) \d+-\d+ of \d+ in (\$\S*?)(?:;|\.(?:\s|$)| \()", notice)
    if not found:
        return "".join(texts)
    path = found.group(1)
    whole = json.loads(texts[0])
    items = resolve(whole, path)
    for text in texts[1:]:
        more = resolve(json.loads(text), path)
        # A list's items, or (a document with no list) an object's members.
        items.update(more) if isinstance(items, dict) else items.extend(more)
    return whole


async def auto_chain(session, tool, arguments, structured_only=False):
    """Follows automatic paging's chain: by the notice's cursor, or by structuredContent alone."""
    pages, args = [], dict(arguments)
    for _ in range(1000):
        result = await session.call_tool(tool, args)
        if result.isError:
            raise RuntimeError(f"page {len(pages) + 1} is an error: {result.content[0].text[:300]}")
        pages.append(result)
        cursor = (result.structuredContent or {}).get("next_after") if structured_only else cursor_in(last_notice(result))
        if not cursor:
            return pages
        args = dict(arguments, after=cursor)
    raise RuntimeError("the chain does not end")


def diff(a, b, path=""):
    """The first differing path between two transcripts, or None."""
    if type(a) is not type(b):
        return f"{path}: {str(a)[:120]} != {str(b)[:120]}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: present on one side only"
            d = diff(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = diff(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {str(a)[:120]} != {str(b)[:120]}"


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proxy", required=True)
    parser.add_argument("--everything", required=True)
    parser.add_argument("--filesystem", required=True)
    parser.add_argument("--target", help="the conformance target (target.mjs): its --modern-only mode is a modern-only server")
    options = parser.parse_args()
    proxy, everything, filesystem = options.proxy, options.everything, options.filesystem
    passed = failed = 0

    def check(label, ok, detail=""):
        nonlocal passed, failed
        if ok:
            passed += 1
            print(f"ok    {label}")
        else:
            failed += 1
            print(f"FAIL  {label}: {detail}")
        sys.stdout.flush()

    async def run(label, scenario, opener):
        try:
            async with opener as session:
                return await asyncio.wait_for(scenario(session), 60)
        except Exception as error:  # a broken mode is a failed check, not a crash
            check(label, False, f"{type(error).__name__}: {error}")
            return None

    # server-everything over stdio, directly and through the proxy.
    node = "node"
    direct = await run("everything direct stdio", everything_scenario, stdio_session(node, [everything]))
    again = await run("everything direct stdio (again)", everything_scenario, stdio_session(node, [everything]))
    if direct:
        # The session really exercised what it claims to.
        sampled = json.dumps(direct.get("call trigger-sampling-request"))
        elicited = json.dumps(direct.get("call trigger-elicitation-request"))
        check("everything: the client answered a sampling request", "sampled: " in sampled, sampled[:200])
        check("everything: the client answered an elicitation request", "decline" in elicited, elicited[:200])
        check("everything: progress arrived", len(direct.get("progress", [])) == 3, str(direct.get("progress")))
        check("everything: a cancelled call left the session working", direct.get("cancel") == "timed out" and direct.get("ping after cancel") == {}, str(direct.get("cancel")))
        check("everything: resources, templates, prompts, completion", bool(direct.get("resources")) and bool(direct.get("templates")) and bool(direct.get("prompts")) and bool(direct.get("completion", {}).get("completion", {}).get("values")), "")
    unstable = {k for k in (direct or {}) if again and direct.get(k) != again.get(k)}
    unexpected = sorted(unstable - KNOWN_UNSTABLE.keys())
    check("everything: two direct runs agree, except where known", not unexpected, f"also differ: {unexpected}")
    comparisons = 0

    def compare(label, reference, transcript):
        nonlocal comparisons
        if reference is None or transcript is None:
            check(f"{label}: compared with direct", False, "a run is missing, so nothing was compared")
            return
        # Automatic paging adds one optional `after` to each descriptor, and the proxy's search
        # tool after the server's tools; nothing else.
        if "tools" in transcript:
            added = [t for t in transcript["tools"] if t["name"] == "mcp_budget_search"]
            check(f"{label}: the proxy's mcp_budget_search is listed with the server's tools", len(added) == 1 and not any(t["name"] == "mcp_budget_search" for t in reference["tools"]), f"listed {len(added)} times")
            transcript = dict(transcript, tools=[t for t in transcript["tools"] if t["name"] != "mcp_budget_search"])
            missing = [t["name"] for t in transcript["tools"] if "after" not in t.get("inputSchema", {}).get("properties", {})]
            check(f"{label}: every tool gained the automatic paging argument after", not missing, f"missing on {missing}")
            transcript = dict(transcript, tools=[strip_after(t) for t in transcript["tools"]])
            reference = dict(reference, tools=[strip_after(t) for t in reference["tools"]])
        # Known-unstable results are compared by shape, the rest by value: nothing is left out.
        a = {k: (shape(v) if k in unstable else v) for k, v in reference.items()}
        b = {k: (shape(v) if k in unstable else v) for k, v in transcript.items()}
        d = diff(a, b)
        comparisons += len(a)
        by_shape = len([k for k in a if k in unstable])
        check(f"{label}: {len(a)} results identical to direct ({by_shape} by shape)", d is None, d)

    via = await run("everything stdio→stdio", everything_scenario, stdio_session(proxy, ["--policy", "none", "--", node, everything]))
    compare("everything stdio→stdio", direct, via)

    listener, url = start([proxy, "--policy", "none", "--listen", "http://127.0.0.1:0/mcp", "--", node, everything], url_from_stdout=True)
    try:
        via = await run("everything HTTP→stdio", everything_scenario, http_session(url))
        compare("everything HTTP→stdio", direct, via)
    finally:
        listener.terminate()
        listener.wait(10)

    # server-everything over Streamable HTTP, directly and through the proxy.
    port = free_port()
    server, _ = start([node, everything, "streamableHttp"], env=dict(os.environ, PORT=str(port)))
    try:
        wait_http(port)
        upstream = f"http://127.0.0.1:{port}/mcp"
        direct_http = await run("everything direct HTTP", everything_scenario, http_session(upstream))
        via = await run("everything stdio→HTTP", everything_scenario, stdio_session(proxy, ["--policy", "none", "--upstream", upstream]))
        compare("everything stdio→HTTP", direct_http, via)
        listener, url = start([proxy, "--policy", "none", "--listen", "http://127.0.0.1:0/mcp", "--upstream", upstream], url_from_stdout=True)
        try:
            via = await run("everything HTTP→HTTP", everything_scenario, http_session(url))
            compare("everything HTTP→HTTP", direct_http, via)
        finally:
            listener.terminate()
            listener.wait(10)
    finally:
        server.terminate()
        server.wait(10)

    # server-filesystem (stdio only).
    with tempfile.TemporaryDirectory() as root:
        root = os.path.realpath(root)
        os.makedirs(os.path.join(root, "src"))
        with open(os.path.join(root, "notes.txt"), "w") as f:
            f.write("first line\nsecond line\nthird line\n")
        with open(os.path.join(root, "src", "main.rs"), "w") as f:
            f.write("fn main() {}\n")
        scenario = lambda s: filesystem_scenario(s, root)  # noqa: E731
        direct = await run("filesystem direct", scenario, stdio_session(node, [filesystem, root]))
        via = await run("filesystem stdio→stdio", scenario, stdio_session(proxy, ["--policy", "none", "--", node, filesystem, root]))
        compare("filesystem stdio→stdio", direct, via)
        listener, url = start([proxy, "--policy", "none", "--listen", "http://127.0.0.1:0/mcp", "--", node, filesystem, root], url_from_stdout=True)
        try:
            via = await run("filesystem HTTP→stdio", scenario, http_session(url))
            compare("filesystem HTTP→stdio", direct, via)
        finally:
            listener.terminate()
            listener.wait(10)

    # The shipped policies against the live servers: page chains reassemble the direct result.
    policies = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "policies")

    async def text_of(session, tool, arguments):
        result = await session.call_tool(tool, arguments)
        return result.content[0].text, result

    async def page_chain(session, tool, arguments, budget, results=None):
        pages, args, sizes = [], dict(arguments), []
        for _ in range(500):
            result = await session.call_tool(tool, args)
            if results is not None:
                results.append(result)
            page = result.content[0].text
            pages.append(page)
            sizes.append(len(page.encode()))
            notice = result.content[-1].text if len(result.content) > 1 else ""
            if 'after:"' not in notice:
                return pages, sizes
            args = dict(arguments, after=notice.split('after:"')[1].split('"')[0])
        return pages, sizes

    async def policy_check(label, policy, server_args, tool, arguments, budget, opener_direct):
        # policy None: no --policy at all, so the proxy picks the built-in policy written for
        # the server from the serverInfo.name it answers initialize with.
        try:
            async with opener_direct as direct_session:
                await direct_session.initialize()
                whole, _ = await text_of(direct_session, tool, arguments)
            options = ["--policy", os.path.join(policies, policy)] if policy else []
            async with stdio_session(proxy, options + ["--"] + server_args) as session:
                await session.initialize()
                listed = await session.list_tools()
                described = [t for t in listed.tools if t.name == tool and "Budgeted by mcp-budget" in (t.description or "")]
                results = []
                pages, sizes = await page_chain(session, tool, arguments, budget, results)
            # A JSON document is paged as JSON: every page parses, and their lists make it up.
            try:
                document = json.loads(whole) if whole.lstrip()[:1] in ("{", "[") else None
            except ValueError:
                document = None
            if document is not None:
                same = all(json.loads(p) is not None for p in pages) and reassemble(results, pages) == document
            else:
                same = "".join(pages) == whole
            ok = same and len(pages) > 1 and max(sizes) <= budget and bool(described)
            through = policy or "no --policy (the built-in policy picked by serverInfo.name)"
            check(f"{label}: {len(whole.encode())} bytes direct, {len(pages)} pages of at most {max(sizes)} bytes through {through}, reassembled exactly", ok, f"{len(pages)} pages, sizes {sizes[:5]}, descriptor rewritten: {bool(described)}")
        except Exception as error:
            check(label, False, f"{type(error).__name__}: {error}")

    with tempfile.TemporaryDirectory() as root:
        root = os.path.realpath(root)
        with open(os.path.join(root, "big.log"), "w") as f:
            for i in range(4000):
                f.write(f"2026-11-20T12:00:{i % 60:02d}Z worker-{i % 7} stream st-{i % 240:04d} état ok — line {i}\n")
        await policy_check("filesystem read_text_file (live)", "filesystem.toml", [node, filesystem, root], "read_text_file", {"path": os.path.join(root, "big.log")}, 20000, stdio_session(node, [filesystem, root]))
        await policy_check("filesystem read_text_file, built-in policy", None, [node, filesystem, root], "read_text_file", {"path": os.path.join(root, "big.log")}, 20000, stdio_session(node, [filesystem, root]))
    # A realistic environment is a few KB; make sure this one is, whatever the machine.
    for i in range(60):
        os.environ[f"MCP_BUDGET_DEMO_{i:02d}"] = "value-" + "x" * 50
    await policy_check("everything get-env (live)", "everything.toml", [node, everything], "get-env", {}, 2000, stdio_session(node, [everything]))
    # [tools] allow/deny against server-everything: hidden tools are absent and refused.
    with tempfile.TemporaryDirectory() as d:
        deny = os.path.join(d, "deny.toml")
        with open(deny, "w") as f:
            f.write('[tools]\ndeny = ["get-env", "trigger-*"]\n')
        try:
            async with stdio_session(node, [everything]) as direct_session:
                await direct_session.initialize()
                every = [t.name for t in (await direct_session.list_tools()).tools]
            async with stdio_session(proxy, ["--policy", deny, "--", node, everything]) as session:
                await session.initialize()
                shown = [t.name for t in (await session.list_tools()).tools]
                refused = await session.call_tool("get-env", {})
                echoed = await session.call_tool("echo", {"message": "still here"})
            expected = [n for n in every if n != "get-env" and not n.startswith("trigger-")] + ["mcp_budget_search"]
            text = refused.content[0].text if refused.content else ""
            ok = shown == expected and len(expected) < len(every) and refused.isError and text.startswith("get-env is not available") and "still here" in echoed.content[0].text
            check(f"everything [tools] deny: {len(every) - len(shown)} of {len(every)} tools hidden, a call to one refused, the others answer", ok, f"shown {shown}, refused {refused.isError}: {text[:120]}")
        except Exception as error:
            causes = getattr(error, "exceptions", None) or [error]
            check("everything [tools] deny", False, "; ".join(f"{type(e).__name__}: {str(e)[:300]}" for e in causes))
    git_server = os.environ.get("MCP_BUDGET_GIT_SERVER")
    if git_server:
        with tempfile.TemporaryDirectory() as repo:
            env = dict(os.environ, GIT_AUTHOR_NAME="Fleet Bot", GIT_AUTHOR_EMAIL="bot@example.com", GIT_COMMITTER_NAME="Fleet Bot", GIT_COMMITTER_EMAIL="bot@example.com")
            subprocess.run(["git", "init", "-q", "-b", "main", repo], check=True, env=env)
            for i in range(150):
                with open(os.path.join(repo, "ledger.txt"), "a") as f:
                    f.write(f"entry {i}\n")
                subprocess.run(["git", "-C", repo, "add", "ledger.txt"], check=True, env=env)
                subprocess.run(["git", "-C", repo, "commit", "-q", "-m", f"Record entry {i}: the reviewer confirmed the change and the liveness probe"], check=True, env=env)
            await policy_check("git git_log (live)", "git.toml", [git_server, "--repository", repo], "git_log", {"repo_path": repo, "max_count": 150}, 16000, stdio_session(git_server, ["--repository", repo]))
            await policy_check("git git_log, built-in policy", None, [git_server, "--repository", repo], "git_log", {"repo_path": repo, "max_count": 150}, 16000, stdio_session(git_server, ["--repository", repo]))
    else:
        check("git git_log (live)", False, "MCP_BUDGET_GIT_SERVER is not set (run through tests/interop/run.sh)")

    # Automatic paging, no policy (--policy none): large results from the real servers, through the official
    # SDK client. Every page fits the default 200,000-byte budget; the chain reassembles the
    # direct result exactly, from content and from structuredContent; a client that reads only
    # structuredContent finds the continuation there.
    async def auto_check(label, command, args, tool, arguments, structured_field=None):
        try:
            async with stdio_session(command, args) as direct_session:
                await direct_session.initialize()
                whole = await direct_session.call_tool(tool, arguments)
            whole_text = whole.content[0].text
            async with stdio_session(proxy, ["--policy", "none", "--", command] + args) as session:
                await session.initialize()
                await session.list_tools()
                pages = await auto_chain(session, tool, arguments)
                sizes = [wire_size(p) for p in pages]
                texts = ["".join(b.text for b in p.content[:-1] if b.type == "text") for p in pages]
                rebuilt = reassemble(pages, texts)
                expected = json.loads(whole_text) if not isinstance(rebuilt, str) else whole_text
                ok = rebuilt == expected and len(pages) > 1 and max(sizes) < 200_000
                detail = f"{len(pages)} pages, sizes {sizes[:4]}…, equal: {rebuilt == expected}"
                if structured_field and ok:
                    structured_pages = await auto_chain(session, tool, arguments, structured_only=True)
                    stexts = [(p.structuredContent or {}).get(structured_field, "") for p in structured_pages]
                    srebuilt = reassemble(structured_pages, stexts)
                    continued = all((p.structuredContent or {}).get("next_after") for p in structured_pages[:-1])
                    ok = srebuilt == expected and continued and len(structured_pages) == len(pages)
                    detail += f"; structuredContent alone: {len(structured_pages)} pages, equal: {srebuilt == expected}, continuation on every page: {continued}"
            check(f"{label} (no policy): {len(whole_text.encode())} bytes direct, {len(pages)} pages of at most {max(sizes)} bytes, reassembled exactly" + (" from content and from structuredContent" if structured_field else ""), ok, detail)
        except Exception as error:
            causes = getattr(error, "exceptions", None) or [error]
            check(f"{label} (no policy)", False, "; ".join(f"{type(e).__name__}: {str(e)[:400]}" for e in causes))

    with tempfile.TemporaryDirectory() as root:
        root = os.path.realpath(root)
        with open(os.path.join(root, "big.log"), "w") as f:
            i = 0
            while f.tell() < 3_000_000:
                f.write(f"2026-11-20T12:00:{i % 60:02d}Z worker-{i % 7} stream st-{i % 240:04d} état ok — \"line\" {i}\n")
                i += 1
        tree = os.path.join(root, "tree")
        for d in range(200):
            os.makedirs(os.path.join(tree, f"dir-{d:03d}"))
            for n in range(99):
                open(os.path.join(tree, f"dir-{d:03d}", f"file-{n:02d}.txt"), "w").close()
        await auto_check("filesystem read_text_file 3 MB", node, [filesystem, root], "read_text_file", {"path": os.path.join(root, "big.log")}, structured_field="content")
        await auto_check("filesystem directory_tree of 20,000 entries", node, [filesystem, root], "directory_tree", {"path": tree}, structured_field="content")
    if git_server:
        with tempfile.TemporaryDirectory() as repo:
            env = dict(os.environ, GIT_AUTHOR_NAME="Fleet Bot", GIT_AUTHOR_EMAIL="bot@example.com", GIT_COMMITTER_NAME="Fleet Bot", GIT_COMMITTER_EMAIL="bot@example.com")
            subprocess.run(["git", "init", "-q", "-b", "main", repo], check=True, env=env)
            # 2,000 commits in one fast-import stream (a commit per process would take minutes).
            stream = []
            for i in range(2000):
                message = f"Record entry {i}: the reviewer confirmed the change and the liveness probe\n"
                content = f"entry {i}\n"
                stream.append(f"commit refs/heads/main\ncommitter Fleet Bot <bot@example.com> {1700000000 + i} +0000\ndata {len(message.encode())}\n{message}")
                stream.append(f"M 644 inline ledger.txt\ndata {len(content.encode())}\n{content}\n")
            subprocess.run(["git", "-C", repo, "fast-import", "--quiet"], input="".join(stream).encode(), check=True, env=env)
            subprocess.run(["git", "-C", repo, "checkout", "-q", "main"], check=True, env=env)
            await auto_check("git git_log of 2,000 commits", git_server, ["--repository", repo], "git_log", {"repo_path": repo, "max_count": 2000})
    # mcp_budget_search over the chain of a large result, with a shipped policy (a rule chain)
    # and without one (an automatic chain): the matches are what grep -n finds in the text the
    # server returns directly, and the tool ran once.
    async def search_check(label, options, command, args, tool, arguments, pattern):
        try:
            async with stdio_session(command, args) as direct_session:
                await direct_session.initialize()
                whole = (await direct_session.call_tool(tool, arguments)).content[0].text
            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
                f.write(whole)
            grepped = subprocess.run(["grep", "-n", "-E", pattern, f.name], capture_output=True, text=True).stdout
            os.unlink(f.name)
            expected = [(int(line.split(":", 1)[0]), line.split(":", 1)[1]) for line in grepped.splitlines()]
            async with stdio_session(proxy, options + ["--", command] + args) as session:
                await session.initialize()
                listed = [t.name for t in (await session.list_tools()).tools]
                first = await session.call_tool(tool, arguments)
                cursor = (first.structuredContent or {}).get("next_after") or cursor_in(last_notice(first))
                found, pages, search = [], 0, {"cursor": cursor, "pattern": pattern}
                while True:
                    answer = await session.call_tool("mcp_budget_search", search)
                    body = answer.structuredContent or {}
                    found += [(m["line"], m["text"]) for m in body.get("matches", [])]
                    pages += 1
                    if not body.get("next_after") or pages > 100:
                        break
                    search = dict(search, after=body["next_after"])
            ok = "mcp_budget_search" in listed and bool(expected) and found == expected and body.get("total_matches") == len(expected)
            check(f"{label}: mcp_budget_search {pattern!r} over the chain of {len(whole.encode())} bytes finds the {len(expected)} lines grep -n finds ({pages} page(s) of answer)", ok, f"found {len(found)}, expected {len(expected)}, listed: {'mcp_budget_search' in listed}; {json.dumps(body)[:300] if not ok else ''}")
        except Exception as error:
            causes = getattr(error, "exceptions", None) or [error]
            check(f"{label} search", False, "; ".join(f"{type(e).__name__}: {str(e)[:400]}" for e in causes))

    with tempfile.TemporaryDirectory() as root:
        root = os.path.realpath(root)
        with open(os.path.join(root, "big.log"), "w") as f:
            i = 0
            while f.tell() < 3_000_000:
                state = "ERROR timeout" if i % 1999 == 0 else "ok"
                f.write(f"2026-11-20T12:00:{i % 60:02d}Z worker-{i % 7} stream st-{i % 240:04d} état {state} — \"line\" {i}\n")
                i += 1
        big = {"path": os.path.join(root, "big.log")}
        await search_check("filesystem read_text_file 3 MB, filesystem.toml", ["--policy", os.path.join(policies, "filesystem.toml")], node, [filesystem, root], "read_text_file", big, "ERROR timeout")
        await search_check("filesystem read_text_file 3 MB, no policy", ["--policy", "none"], node, [filesystem, root], "read_text_file", big, "ERROR timeout")
    if git_server:
        with tempfile.TemporaryDirectory() as repo:
            env = dict(os.environ, GIT_AUTHOR_NAME="Fleet Bot", GIT_AUTHOR_EMAIL="bot@example.com", GIT_COMMITTER_NAME="Fleet Bot", GIT_COMMITTER_EMAIL="bot@example.com")
            subprocess.run(["git", "init", "-q", "-b", "main", repo], check=True, env=env)
            stream = []
            for i in range(2000):
                message = f"Record entry {i}: the reviewer confirmed the change and the liveness probe\n"
                content = f"entry {i}\n"
                stream.append(f"commit refs/heads/main\ncommitter Fleet Bot <bot@example.com> {1700000000 + i} +0000\ndata {len(message.encode())}\n{message}")
                stream.append(f"M 644 inline ledger.txt\ndata {len(content.encode())}\n{content}\n")
            subprocess.run(["git", "-C", repo, "fast-import", "--quiet"], input="".join(stream).encode(), check=True, env=env)
            subprocess.run(["git", "-C", repo, "checkout", "-q", "main"], check=True, env=env)
            log = {"repo_path": repo, "max_count": 2000}
            await search_check("git git_log of 2,000 commits, git.toml", ["--policy", os.path.join(policies, "git.toml")], git_server, ["--repository", repo], "git_log", log, "Record entry 1[0-9]{2}:")
            await search_check("git git_log of 2,000 commits, no policy", ["--policy", "none"], git_server, ["--repository", repo], "git_log", log, "Record entry 1[0-9]{2}:")
    # A tool that runs only as a task (2025-11-25): server-everything's simulate-research-query,
    # spoken as raw JSON-RPC (tools/call with params.task, tasks/get until completed,
    # tasks/result), directly and through the proxy; then under a budget its report does not
    # fit, where tasks/result comes in pages that reassemble it and continue with `after`.
    def research(command, policy=None):
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ids = iter(range(1, 10_000))

        def ask(method, params):
            n = next(ids)
            proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}) + "\n")
            proc.stdin.flush()
            while True:
                message = json.loads(proc.stdout.readline())
                if message.get("id") == n:
                    return message

        try:
            ask("initialize", {"protocolVersion": "2025-11-25", "capabilities": {"tasks": {"requests": {"tools": {"call": {}}}}}, "clientInfo": {"name": "interop-tasks", "version": "1"}})
            proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
            proc.stdin.flush()
            ask("tools/list", {})
            arguments = {"topic": "budgets for tool results\n" * 150}
            created = ask("tools/call", {"name": "simulate-research-query", "arguments": arguments, "task": {"ttl": 120000}})
            task = created["result"]["task"]["taskId"]
            for _ in range(300):
                status = ask("tasks/get", {"taskId": task})["result"]["status"]
                if status not in ("working", "input_required"):
                    break
                time.sleep(0.1)
            first = ask("tasks/result", {"taskId": task})["result"]
            pages = [first]
            while len(pages) < 50:
                cursor = (pages[-1].get("structuredContent") or {}).get("next_after") or cursor_in(pages[-1]["content"][-1].get("text", ""))
                if not cursor:
                    break
                pages.append(ask("tools/call", {"name": "simulate-research-query", "arguments": dict(arguments, after=cursor)})["result"])
            return created, status, pages
        finally:
            proc.kill()
            proc.wait()

    try:
        created, status, direct_pages = research([node, everything])
        direct = direct_pages[0]["content"][0]["text"]
        created_via, status_via, via = research([proxy, "--policy", "none", "--", node, everything])
        same = [p["content"] for p in via] == [p["content"] for p in direct_pages] and status_via == status == "completed" and "task" in created_via["result"]
        check(f"everything simulate-research-query as a task: CreateTaskResult, tasks/get until {status_via}, tasks/result's content through the proxy equal to direct (its _meta names the task) ({len(direct.encode())} bytes)", same, f"{str(via)[:400]} vs {str(direct_pages)[:400]}")
        with tempfile.TemporaryDirectory() as d:
            small = os.path.join(d, "small.toml")
            with open(small, "w") as f:
                f.write("[budget]\nmax_bytes = 4000\n")
            _, _, pages = research([proxy, "--policy", small, "--", node, everything])
            text = "".join("".join(b["text"] for b in p["content"][:-1] if b.get("type") == "text") for p in pages)
            sizes = [len(json.dumps(p, separators=(",", ":"), ensure_ascii=False).encode()) for p in pages]
            check(f"everything simulate-research-query as a task, under a 4,000-byte budget: tasks/result in {len(pages)} pages of at most {max(sizes)} bytes, continued with after, reassembled exactly", text == direct and len(pages) > 1 and max(sizes) < 4000, f"{len(pages)} pages, sizes {sizes}, equal: {text == direct}")
    except Exception as error:
        check("everything simulate-research-query as a task", False, f"{type(error).__name__}: {error}")

    for i in range(3000):
        os.environ[f"MCP_BUDGET_AUTO_{i:04d}"] = f"value-{i}-" + "y" * 80
    await auto_check("everything get-env of 3,000 variables", node, [everything], "get-env", {})

    if options.target:
        # The dual-era target: this legacy (1.x) client gets a 2025-11-25 session from it,
        # directly and through the proxy, and the same answers both ways.
        dual = [options.target, "--stdio"]

        async def listed_and_called(session):
            init = await session.initialize()
            tools = await session.list_tools()
            result = await session.call_tool("test_simple_text", {})
            # (The proxy adds its own search tool to the list.)
            names = sorted(t.name for t in tools.tools if t.name != "mcp_budget_search")
            return init.protocolVersion, names, dump(result)

        plain = await run("dual-era target directly", listed_and_called, stdio_session(node, dual))
        proxied = await run("dual-era target through the proxy", listed_and_called, stdio_session(proxy, ["--policy", "none", "--", node, *dual]))
        if plain and proxied:
            check("dual-era target: initialize (2025-11-25), tools/list and a call through the proxy equal to direct",
                  plain == proxied and plain[0] == "2025-11-25" and "test_simple_text" in plain[1],
                  f"direct {str(plain)[:200]} vs proxied {str(proxied)[:200]}")

        # The era bridge: this legacy (1.x) client and a server that speaks 2026-07-28 only.
        modern_only = [options.target, "--stdio", "--modern-only"]

        async def bridged(session):
            init = await session.initialize()
            tools = await session.list_tools()
            result = await session.call_tool("test_simple_text", {})
            return init, tools, result

        try:
            async with stdio_session(node, modern_only) as session:
                await asyncio.wait_for(session.initialize(), 20)
            check("modern-only target directly: a legacy client cannot initialize", False, "it initialized")
        except Exception:
            check("modern-only target directly: a legacy client cannot initialize", True)
        out = await run("modern-only target through the era bridge", bridged, stdio_session(proxy, ["--policy", "none", "--", node, *modern_only]))
        if out:
            init, tools, result = out
            names = [t.name for t in tools.tools]
            text = "".join(b.text for b in result.content if b.type == "text")
            check("modern-only target through the era bridge: initialize, tools/list and a call in the legacy era",
                  init.serverInfo.name == "mcp-budget-conformance-target" and "test_simple_text" in names and text == "This is a simple text response for testing.",
                  f"server {init.serverInfo.name}, {len(names)} tools, text {text[:80]!r}")

    print(f"{comparisons} results compared with a direct run")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
