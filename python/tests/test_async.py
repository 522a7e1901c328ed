"""The awaitable variant for asyncio hosts."""

from __future__ import annotations

import asyncio
import time

import vibeos_exec
from vibeos_exec import registry

from conftest import echo_schema


def test_aexecute_code_runs_concurrently_with_an_async_tool():
    async def fetch(args):
        await asyncio.sleep(0.05)
        return {"got": args["x"]}

    registry.register(name="afetch", toolset="host", schema=echo_schema(), handler=fetch,
                      script_callable=True)

    async def main():
        started = time.monotonic()
        results = await asyncio.gather(*[
            vibeos_exec.aexecute_code(
                f"import time\nfrom vibeos_tools import afetch\ntime.sleep(0.5)\nprint(afetch(x='{i}')['got'])")
            for i in range(3)
        ])
        return results, time.monotonic() - started

    results, elapsed = asyncio.run(main())
    assert [r["output"].strip() for r in results] == ["0", "1", "2"]
    assert all(r["status"] == "success" for r in results)
    assert elapsed < 1.4, f"three 0.5 s scripts took {elapsed:.2f}s: they did not overlap"
    assert vibeos_exec.execute_code_async is vibeos_exec.aexecute_code


def test_cancelling_the_awaiting_task_interrupts_the_script():
    async def main():
        task = asyncio.create_task(vibeos_exec.aexecute_code("import time; time.sleep(60)"))
        await asyncio.sleep(0.5)
        task.cancel()
        started = time.monotonic()
        try:
            await task
        except asyncio.CancelledError:
            return time.monotonic() - started
        return None

    waited = asyncio.run(main())
    assert waited is not None, "the task was not cancelled"
    assert waited < 10
    assert vibeos_exec._native.running_count() == 0


def test_a_call_cancelled_before_its_script_started_never_runs_it(tmp_path):
    """More calls than the loop's worker threads: the ones still queued when their tasks are
    cancelled were not yet tracked under any task id, so an interrupt missed them and each
    script ran in full afterwards (stop 58's probe: side effects of cancelled calls)."""
    import concurrent.futures
    import os

    marks = tmp_path / "marks"
    marks.mkdir()

    async def main():
        loop = asyncio.get_running_loop()
        # Two workers: of six calls, four wait in the queue.
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=2))
        tasks = [
            asyncio.create_task(vibeos_exec.aexecute_code(
                f"import time\ntime.sleep(2)\nopen({str(marks / str(i))!r}, 'w').write('ran')"))
            for i in range(6)
        ]
        await asyncio.sleep(0.5)
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(3)
        return outcomes

    outcomes = asyncio.run(main())
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
    assert sorted(os.listdir(marks)) == [], "cancelled calls ran their scripts"
    assert vibeos_exec._native.running_count() == 0


def test_a_cancellation_made_before_the_call_returns_an_interrupted_result():
    cancellation = vibeos_exec._native.Cancellation()
    assert not cancellation.cancelled()
    cancellation.cancel()
    assert cancellation.cancelled()
    result = vibeos_exec._execute_code("print('ran')", cancellation=cancellation)
    assert result["status"] == "interrupted", result
    assert "ran" not in result["output"], result
    assert result["error"] == "interrupted before the script started", result


def test_an_async_handler_may_call_another_async_tool():
    """The outer handler blocks the shared loop while it waits for the inner call, so the inner
    coroutine runs on a worker thread with its own loop (SPEC §7), at any depth."""
    import json
    import threading

    schema = {"type": "object", "properties": {}}
    threads = {}

    async def inner(args):
        threads["inner"] = threading.current_thread().name
        await asyncio.sleep(0.01)
        return {"depth": 0}

    async def middle(args):
        threads["middle"] = threading.current_thread().name
        return {"inner": json.loads(registry.handle_function_call("nested_inner", {}))}

    async def outer(args):
        threads["outer"] = threading.current_thread().name
        return {"middle": json.loads(registry.handle_function_call("nested_middle", {}))}

    registry.register(name="nested_inner", toolset="host", schema=schema, handler=inner)
    registry.register(name="nested_middle", toolset="host", schema=schema, handler=middle)
    registry.register(name="nested_outer", toolset="host", schema=schema, handler=outer,
                      script_callable=True)
    expected = {"middle": {"inner": {"depth": 0}}}
    assert json.loads(registry.handle_function_call("nested_outer", {})) == expected
    assert threads["outer"] == "vibeos-exec-async-tools"
    assert threads["middle"] == threads["inner"] == "vibeos-exec-async-worker"
    r = vibeos_exec.execute_code(
        "import json\nfrom vibeos_tools import nested_outer\nprint(json.dumps(nested_outer()))")
    assert r["status"] == "success", r
    assert json.loads(r["output"]) == expected
    # The shared loop is still the one a plain call uses afterwards.
    assert json.loads(registry.handle_function_call("nested_inner", {})) == {"depth": 0}
    assert threads["inner"] == "vibeos-exec-async-tools"
