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
