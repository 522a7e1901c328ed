"""Warm no-op executions through the two long-lived hosts, against the bare interpreter of the
same venv, measured in one run:

(a) the Python package: `vibeos_exec.execute_code("pass")`, calls 100 ms apart and back to back,
    and back to back a script that imports its tools and makes one `read_file` call;
(b) `vibeos-exec serve` driven by the official MCP client (the `mcp` SDK over stdio), the same
    two ways;
(c) 16 concurrent MCP callers on one session (`--max-concurrent 16`): executions per second.

Targets (issue 15): (a) and (b) medians <= 0.15 x bare `python -c 'import json, socket'`;
(c) >= 200 executions/s on 2 cores. Both hosts fork warm executions from their fork server.

Run with the venv that has the package and the SDK (scripts/test-all builds target/pyvenv):
    target/pyvenv/bin/python benches/warm_hosts.py [--runs N] [--bin PATH]
`--bin` defaults to target/release/vibeos-exec, else target/debug/vibeos-exec.
"""

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def median(v):
    return statistics.median(v)


def p90(v):
    s = sorted(v)
    return s[round((len(s) - 1) * 0.9)]


def bare(runs):
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import json, socket"], check=True,
                       stdin=subprocess.DEVNULL)
        out.append(time.perf_counter() - t)
    return out


def package(runs, gap, code="pass"):
    import vibeos_exec

    vibeos_exec.execute_code(code)
    out = []
    for _ in range(runs):
        time.sleep(gap)
        t = time.perf_counter()
        r = vibeos_exec.execute_code(code)
        out.append(time.perf_counter() - t)
        assert r["status"] == "success", r
    return out


async def mcp_figures(binary, home, runs):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = dict(os.environ, VIBEOS_HOME=str(home))
    params = StdioServerParameters(command=str(binary),
                                   args=["serve", "--max-concurrent", "16"], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()

            async def call():
                t = time.perf_counter()
                r = await session.call_tool("execute_code", {"code": "pass"})
                took = time.perf_counter() - t
                assert not getattr(r, "is_error", getattr(r, "isError", False)), r
                return took

            await call()
            paced, b2b = [], []
            for _ in range(runs):
                await asyncio.sleep(0.1)
                paced.append(await call())
            for _ in range(runs):
                b2b.append(await call())
            total = max(runs * 8, 320)

            async def caller(n):
                for _ in range(n):
                    await call()

            t = time.perf_counter()
            await asyncio.gather(*(caller(total // 16) for _ in range(16)))
            rate = (total // 16) * 16 / (time.perf_counter() - t)
            return paced, b2b, rate


def row(name, v, base):
    print("  %-44s median %7.2f ms  p90 %7.2f ms  / bare %.3f  %s" % (
        name, median(v) * 1e3, p90(v) * 1e3, median(v) / base,
        "OK" if median(v) / base <= 0.15 else "MISSED"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--bin", type=Path)
    args = ap.parse_args()
    binary = args.bin
    if binary is None:
        binary = ROOT / "target/release/vibeos-exec"
        if not binary.exists():
            binary = ROOT / "target/debug/vibeos-exec"
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        (home / "config.yaml").write_text(
            "code_execution:\n  python: %s\n  pool_size: 2\n" % sys.executable)
        os.environ["VIBEOS_HOME"] = str(home)
        os.chdir(tmp)
        print("interpreter: %s; server: %s; %d runs each" % (sys.executable, binary, args.runs))
        print("load before: %s" % load())
        # The bare baseline is sampled before and after the warm runs and the ratios use the
        # median of both halves: the machine's speed drifts over a run, and one half alone
        # was off by a third in some runs.
        before = bare(args.runs)
        loads = {"a": load()}
        pkg_paced = package(args.runs, 0.1)
        pkg_b2b = package(args.runs, 0.0)
        # What a script that uses its tools adds: importing the stub and one call.
        Path("tiny.txt").write_text("hello\n")
        pkg_call = package(args.runs, 0.0, "from vibeos_tools import read_file\nread_file('tiny.txt')")
        loads["b"] = load()
        paced, b2b, rate = asyncio.run(mcp_figures(binary, home, args.runs))
        loads["c"] = load()
        after = bare(args.runs)
        base = median(before + after)
        print("  %-44s median %7.2f ms  p90 %7.2f ms  (before %.2f, after %.2f)" % (
            "bare `python -c 'import json, socket'`", base * 1e3, p90(before + after) * 1e3,
            median(before) * 1e3, median(after) * 1e3))
        print("(a) Python package, load %s" % loads["a"])
        row("execute_code('pass'), 100 ms apart", pkg_paced, base)
        row("execute_code('pass'), back to back", pkg_b2b, base)
        print("  %-44s median %7.2f ms  p90 %7.2f ms  / pass back to back %.3f" % (
            "import vibeos_tools + one read_file, b2b", median(pkg_call) * 1e3,
            p90(pkg_call) * 1e3, median(pkg_call) / median(pkg_b2b)))
        print("(b) serve + official MCP client, load %s" % loads["b"])
        row("tools/call execute_code, 100 ms apart", paced, base)
        row("tools/call execute_code, back to back", b2b, base)
        print("(c) 16 concurrent MCP callers: %.0f executions/s (target >= 200) %s; load %s" % (
            rate, "OK" if rate >= 200 else "MISSED", loads["c"]))

if __name__ == "__main__":
    main()
