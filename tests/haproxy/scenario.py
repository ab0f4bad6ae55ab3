"""Replicas behind HAProxy, on loopback.

Three `mcp-budget --listen` replicas in front of the quirky test server, one shared cursor key
(the policy's cursor_key_env), behind HAProxy configured by deploy/haproxy.cfg. Checks:

1. 30 concurrent sessions through HAProxy, 10 calls each: every call answered (a request that
   reached another replica than its session's would get 404), and the sessions spread over the
   three replicas (their /metrics count the calls).
2. A page chain begun on one replica goes on after that replica is killed: a new session,
   on another replica, continues it (the read-only tool is called again there; the shared key
   makes the cursor valid), and a tool that is not read-only gets the clear expired-cache error.
3. What HAProxy adds: calls/s of 8 sessions through it, against the same 8 sessions on one
   replica directly (printed, for the README).

Only the standard library: http.client, threads, subprocess.
"""

import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

ACCEPT = "application/json, text/event-stream"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Session:
    """One MCP session over Streamable HTTP, on one kept-alive connection."""

    def __init__(self, port, client="haproxy-scenario"):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.session = None
        self.next_id = 0
        status, answer = self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": client, "version": "1"}})
        if status != 200 or "result" not in answer:
            raise RuntimeError(f"initialize: {status} {answer}")
        self.notify("notifications/initialized")
        # As clients do: the tools first (metrics label calls by the tools listed).
        status, answer = self.request("tools/list", {})
        if status != 200 or "result" not in answer:
            raise RuntimeError(f"tools/list: {status} {answer}")

    def post(self, message):
        headers = {"Content-Type": "application/json", "Accept": ACCEPT}
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        self.conn.request("POST", "/mcp", body=json.dumps(message), headers=headers)
        response = self.conn.getresponse()
        body = response.read().decode()
        if response.getheader("Mcp-Session-Id"):
            self.session = response.getheader("Mcp-Session-Id")
        return response.status, response.getheader("Content-Type") or "", body

    def notify(self, method):
        status, _, _ = self.post({"jsonrpc": "2.0", "method": method})
        if status != 202:
            raise RuntimeError(f"{method}: {status}")

    def request(self, method, params):
        self.next_id += 1
        status, kind, body = self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        if status != 200:
            return status, {"http": status, "body": body[:200]}
        if kind.startswith("text/event-stream"):
            for line in body.splitlines():
                if line.startswith("data:"):
                    message = json.loads(line[5:].strip())
                    if message.get("id") == self.next_id:
                        return status, message
            return status, {"no answer": body[:200]}
        return status, json.loads(body)

    def call(self, tool, arguments):
        return self.request("tools/call", {"name": tool, "arguments": arguments})

    def close(self):
        self.conn.close()


def metric(port, name, labels):
    """One sample of a replica's /metrics (0 when absent)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    want = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_ready(port, path, deadline=30.0, process=None):
    end = time.time() + deadline
    while time.time() < end:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the process for port {port} exited ({process.returncode}) before answering {path}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"nothing answered 200 on port {port}{path} within {deadline} s")


def next_after(result):
    """The cursor a page's notice gives."""
    found = re.search(r'after:"([^"]+)"', result["content"][-1]["text"])
    return found.group(1) if found else None


def lines_of(result):
    """(first, last, total) line numbers a paged text result says it holds."""
    notice = result["content"][-1]["text"]
    found = re.search(r"lines (\d+)-(\d+) of (\d+)", notice)
    return tuple(int(n) for n in found.groups()) if found else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proxy", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--config", required=True)
    options = parser.parse_args()
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

    processes = []
    work = tempfile.mkdtemp(prefix="mcp-budget-haproxy-")
    policy = os.path.join(work, "shared.toml")
    with open(policy, "w") as f:
        f.write('[budget]\ncursor_key_env = "MCP_BUDGET_SHARED_KEY"\n')
    env = dict(os.environ, MCP_BUDGET_SHARED_KEY="one key for every replica of this deployment")
    # Every request reaches the replicas from HAProxy's address: without tokens, one client to
    # their rate limit, so it is off here (with tokens, each token has its own).
    replicas = []
    try:
        for n in range(3):
            # A free port can be taken again before the replica binds it (another replica's, or
            # an outgoing connection's): a replica that exits at once is started on new ports.
            for attempt in range(5):
                port, metrics = free_port(), free_port()
                process = subprocess.Popen(
                    [options.proxy, "--listen", f"http://127.0.0.1:{port}/mcp", "--rate-limit", "0", "--policy", policy, "--metrics", f"127.0.0.1:{metrics}", "--", options.server],
                    env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, f"replica-{n + 1}.log"), "w"),
                )
                try:
                    wait_ready(port, "/healthz", process=process)
                    break
                except RuntimeError:
                    process.kill()
                    process.wait()
                    if attempt == 4:
                        raise
            processes.append(process)
            replicas.append({"name": f"r{n + 1}", "port": port, "metrics": metrics, "process": process})
        front = free_port()
        haproxy_env = dict(os.environ, FRONT_PORT=str(front), REPLICA_1=str(replicas[0]["port"]), REPLICA_2=str(replicas[1]["port"]), REPLICA_3=str(replicas[2]["port"]))
        haproxy = subprocess.Popen(["haproxy", "-db", "-f", options.config], env=haproxy_env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "haproxy.log"), "w"))
        processes.append(haproxy)
        wait_ready(front, "/healthz")

        # 1. 30 concurrent sessions, 10 calls each.
        errors, lock = [], threading.Lock()

        def session_work(k):
            try:
                s = Session(front, f"client-{k}")
                for _ in range(10):
                    status, answer = s.call("executions", {})
                    if status != 200 or "result" not in answer:
                        with lock:
                            errors.append(f"session {k}: {status} {answer}")
                s.close()
            except Exception as error:  # a failed session is a failed check, not a crash
                with lock:
                    errors.append(f"session {k}: {type(error).__name__}: {error}")

        threads = [threading.Thread(target=session_work, args=(k,)) for k in range(30)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        per_replica = [metric(r["metrics"], "mcp_budget_tool_calls_total", {"tool": "executions"}) for r in replicas]
        check(f"30 concurrent sessions through HAProxy, 300 calls, each session on one replica: calls per replica {per_replica}",
              not errors and sum(per_replica) == 300 and all(c > 0 for c in per_replica), "; ".join(errors[:5]))

        # 2. A chain begun on a replica that is then killed.
        before = [metric(r["metrics"], "mcp_budget_tool_calls_total", {"tool": "big"}) for r in replicas]
        a = Session(front, "chain-a")
        _, first = a.call("big", {"bytes": 450000, "line": 100})
        _, journal_first = a.call("journal", {"lines": 30000})
        after = [metric(r["metrics"], "mcp_budget_tool_calls_total", {"tool": "big"}) for r in replicas]
        holders = [i for i in range(3) if after[i] > before[i]]
        if len(holders) != 1:
            raise RuntimeError(f"the chain's replica is not known: big calls before {before}, after {after}")
        holder = holders[0]
        first = first["result"]
        cursor = next_after(first)
        journal_cursor = next_after(journal_first["result"])
        replicas[holder]["process"].kill()
        replicas[holder]["process"].wait()
        b = Session(front, "chain-b")
        _, second = b.call("big", {"bytes": 450000, "line": 100, "after": cursor})
        _, journal_second = b.call("journal", {"lines": 30000, "after": journal_cursor})
        served_by = [i for i in range(3) if i != holder and metric(replicas[i]["metrics"], "mcp_budget_tool_calls_total", {"tool": "big"}) > after[i]]
        one, two = lines_of(first), lines_of(second.get("result", {"content": [{"text": ""}]}))
        ok = one is not None and two is not None and two[0] == one[1] + 1 and two[2] == one[2] and served_by
        check(f"a chain begun on {replicas[holder]['name']} goes on after it is killed: page 2 (lines {two and two[0]}-{two and two[1]}) from {[replicas[i]['name'] for i in served_by]}, the read-only tool called again there",
              ok, f"page 1 {one}, page 2 {two}: {json.dumps(second)[:300]}")
        text = json.dumps(journal_second)
        check("a tool that is not read-only gets the expired-cache error on another replica",
              journal_second.get("result", {}).get("isError") is True and "no longer in mcp-budget's cache" in text, text[:300])

        # 3. What HAProxy adds: 8 sessions × 150 calls, through it and on one replica directly.
        live = next(r for i, r in enumerate(replicas) if i != holder)

        def throughput(port):
            sessions = [Session(port, f"load-{k}") for k in range(8)]
            start = time.perf_counter()

            def load(s):
                for _ in range(150):
                    s.call("executions", {})

            threads = [threading.Thread(target=load, args=(s,)) for s in sessions]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - start
            for s in sessions:
                s.close()
            return 8 * 150 / elapsed

        direct = throughput(live["port"])
        through = throughput(front)
        print(f"calls/s, 8 sessions: through HAProxy {through:.0f}, one replica directly {direct:.0f} ({through / direct:.2f}x)")
        check("HAProxy served the load", through > 0 and direct > 0)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
    print(f"{passed} passed, {failed} failed")
    if failed:
        for name in sorted(os.listdir(work)):
            with open(os.path.join(work, name)) as f:
                tail = f.read()[-2000:]
            print(f"--- {name} (end)\n{tail}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
