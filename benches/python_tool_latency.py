"""Per-call latency of a script calling a Python-registered tool vs. a Rust-registered one.

One run, same process, same execution settings: an execute_code script calls `read_file` (Rust,
on a one-line file), a sync Python tool and an async Python tool N times each, timing each loop
with perf_counter inside the script, so the figures are round trips over the RPC channel plus
dispatch. The Python tools pay for taking the GIL and JSON conversion on the host side.

Run (after installing the package):  python benches/python_tool_latency.py [N]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import vibeos_exec
from vibeos_exec import registry

N = int(sys.argv[1]) if len(sys.argv) > 1 else 400
ROUNDS = 3

SCRIPT = """
import json, time
from vibeos_tools import read_file, py_echo, py_async_echo
N = {n}
out = {{}}
for name, fn, kw in [("rust read_file", read_file, {{"path": {path!r}}}),
                     ("python sync", py_echo, {{"x": "hello"}}),
                     ("python async", py_async_echo, {{"x": "hello"}})]:
    fn(**kw)  # warm up
    t = time.perf_counter()
    for _ in range(N):
        r = fn(**kw)
    assert "error" not in r, r
    out[name] = (time.perf_counter() - t) / N * 1e6
print(json.dumps(out))
"""


async def _async_echo(args):
    return {"x": args["x"]}


def main() -> int:
    registry.register(name="py_echo", toolset="bench", handler=lambda a: {"x": a["x"]},
                      schema={"type": "object", "properties": {"x": {"type": "string"}}},
                      script_callable=True)
    registry.register(name="py_async_echo", toolset="bench", handler=_async_echo,
                      schema={"type": "object", "properties": {"x": {"type": "string"}}},
                      script_callable=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("one line\n")
    try:
        best = {}
        for _ in range(ROUNDS):
            r = vibeos_exec.execute_code(SCRIPT.format(n=N, path=f.name),
                                         max_tool_calls=3 * N + 10, timeout=600)
            if r["status"] != "success":
                print("benchmark script failed:", r, file=sys.stderr)
                return 1
            for k, v in json.loads(r["output"]).items():
                best[k] = min(v, best.get(k, float("inf")))
    finally:
        os.unlink(f.name)
    base = best["rust read_file"]
    print(f"per-call latency from a script, best of {ROUNDS} runs of {N} calls each:")
    for name, us in best.items():
        print(f"  {name:<16} {us:8.1f} µs/call   {us / base:5.2f}x read_file")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
