"""One real MCP session through an installed mcp-budget (tests/packages/run.sh).

Usage: session.py ROOT -- COMMAND...

COMMAND starts mcp-budget in front of server-filesystem serving ROOT (however it was installed:
a venv, uv, npx). The session reads a 3 MB file with read_text_file through the official Python
SDK client, follows the proxy's `after` cursors to the end, and checks that the pages put back
together are the file, byte for byte. Prints one line, "ok: …" or "FAIL: …"; exit status 0/1.
"""

import asyncio
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def cursor_in(result):
    texts = [b.text for b in result.content if getattr(b, "type", "") == "text"]
    notice = texts[-1] if texts else ""
    return notice.split('after:"')[1].split('"')[0] if 'after:"' in notice else None


async def main(root, command):
    path = os.path.join(root, "big.log")
    with open(path, "w") as f:
        i = 0
        while f.tell() < 3_000_000:
            f.write(f"2026-12-01T12:00:{i % 60:02d}Z worker-{i % 7} stream st-{i % 240:04d} ok \"line\" {i}\n")
            i += 1
    with open(path) as f:
        expected = f.read()
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            read_tool = "read_text_file" if any(t.name == "read_text_file" for t in tools.tools) else "read_file"
            pages, text, args = 0, "", {"path": path}
            while True:
                result = await session.call_tool(read_tool, args)
                if result.isError:
                    raise RuntimeError(f"page {pages + 1} is an error: {result.content[0].text[:300]}")
                pages += 1
                cursor = cursor_in(result)
                blocks = result.content[:-1] if cursor or len(result.content) > 1 else result.content
                text += "".join(b.text for b in blocks if getattr(b, "type", "") == "text")
                if not cursor:
                    break
                if pages > 200:
                    raise RuntimeError("the chain of pages does not end")
                args = {"path": path, "after": cursor}
    if pages < 2:
        return f"FAIL: {len(expected)} bytes came in {pages} page (no paging)"
    if text != expected:
        return f"FAIL: {pages} pages put back together are {len(text)} bytes, not the file's {len(expected)}"
    return f"ok: {read_tool} of {len(expected)} bytes in {pages} pages, put back together exactly"


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit(__doc__)
    try:
        line = asyncio.run(main(sys.argv[1], sys.argv[3:]))
    except BaseException as error:  # an ExceptionGroup from the SDK's task group, too
        causes = getattr(error, "exceptions", None) or [error]
        line = "FAIL: " + "; ".join(f"{type(e).__name__}: {str(e)[:300]}" for e in causes)
    print(line)
    sys.exit(0 if line.startswith("ok") else 1)
