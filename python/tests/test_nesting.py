"""Executions started by tool handlers that answer scripts: bounded depth, and they end with the
execution whose script called the tool (stop 58's probe: a "run this code" tool called from the
scripts it ran started 285 executions in 4 s, and nested ones outlived the outer timeout)."""

from __future__ import annotations

import asyncio
import json
import os
import time

import vibeos_exec
from vibeos_exec import registry

from conftest import echo_schema

NEST = """
from vibeos_tools import nest_again
r = nest_again(x="")
print("inner:" + r["output"] if "output" in r else "refused:" + r["error"])
"""


def _register_nest(handler):
    registry.register(name="nest_again", toolset="host", schema=echo_schema(), handler=handler,
                      script_callable=True)


def test_executions_started_by_handlers_nest_at_most_three_deep():
    def nest(args):
        r = vibeos_exec.execute_code(NEST, timeout=120)
        return {"status": r["status"], "output": r["output"]}

    _register_nest(nest)
    r = vibeos_exec.execute_code(NEST, timeout=120)
    assert r["status"] == "success", r
    out = r["output"]
    # The top-level script and three nested ones ran; the fourth was refused, and the script
    # that asked for it got the reason as its tool call's error.
    assert out.count("inner:") == 3, out
    assert out.count("refused:") == 1, out
    assert "at most 3" in out and "3 executions deep" in out, out
    # The bound is on nesting, not on the process: a top-level call still runs.
    assert vibeos_exec.execute_code("print('top')")["output"] == "top\n"


def test_async_handlers_nest_the_same_way():
    async def nest(args):
        r = await vibeos_exec.aexecute_code(NEST, timeout=120)
        return {"status": r["status"], "output": r["output"]}

    _register_nest(nest)
    r = vibeos_exec.execute_code(NEST, timeout=120)
    assert r["status"] == "success", r
    assert r["output"].count("inner:") == 3, r["output"]
    assert "at most 3" in r["output"], r["output"]


def test_an_execution_started_by_a_handler_ends_with_the_calling_execution(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    inner = (
        "import os, time\n"
        f"open(os.path.join({str(marks)!r}, 'started'), 'w').close()\n"
        "time.sleep(60)\n"
        f"open(os.path.join({str(marks)!r}, 'finished'), 'w').close()\n"
    )
    results = []

    def slow_code(args):
        r = vibeos_exec.execute_code(inner, timeout=120)
        results.append((r, time.monotonic()))
        return {"status": r["status"]}

    _register_nest(slow_code)
    started = time.monotonic()
    r = vibeos_exec.execute_code(
        "from vibeos_tools import nest_again\nnest_again(x='')\n", timeout=3)
    assert r["status"] == "timeout", r
    assert (marks / "started").exists(), "the nested script never ran"
    # The handler's execution was interrupted when the outer one timed out, not 60 s later.
    deadline = time.monotonic() + 20
    while not results and time.monotonic() < deadline:
        time.sleep(0.05)
    assert results, "the nested execution was still running 20 s after the outer one ended"
    nested, ended_at = results[0]
    assert nested["status"] == "interrupted", nested
    assert ended_at - started < 15, ended_at - started
    assert not (marks / "finished").exists()
    assert vibeos_exec._native.running_count() == 0
