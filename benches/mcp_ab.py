"""A/B of `serve` builds through the official MCP client, in one process: one stdio session
per build, no-op `execute_code` calls 100 ms apart alternated one build at a time (so both
see the same phases of the machine), then back to back in blocks. Prints each build's medians.

usage: mcp_ab.py RUNS BIN [BIN ...]   (each BIN may carry VAR=VALUE words after it, quoted:
       'path/to/vibeos-exec TOKIO_WORKER_THREADS=1')
"""

import asyncio
import os
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def open_session(stack, spec):
    words = spec.split()
    home = stack.enter_context(tempfile.TemporaryDirectory(prefix="mcp-ab-"))
    env = dict(os.environ, VIBEOS_HOME=home)
    for word in words[1:]:
        name, _eq, value = word.partition("=")
        env[name] = value
    params = StdioServerParameters(command=words[0], args=["serve"], env=env)
    read, write = await stack.enter_async_context(stdio_client(params))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    for _ in range(3):
        await call(session)
    return session


async def call(session):
    t = time.perf_counter()
    r = await session.call_tool("execute_code", {"code": "pass"})
    took = time.perf_counter() - t
    if getattr(r, "is_error", getattr(r, "isError", False)):
        raise SystemExit("the call failed: %r" % (r,))
    return took


async def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    runs, specs = int(sys.argv[1]), sys.argv[2:]
    async with AsyncExitStack() as stack:
        sessions = [await open_session(stack, s) for s in specs]
        paced = [[] for _ in specs]
        b2b = [[] for _ in specs]
        for _ in range(runs):
            for i, s in enumerate(sessions):
                await asyncio.sleep(0.1)
                paced[i].append(await call(s))
        for _ in range(3):
            for i, s in enumerate(sessions):
                for _ in range(max(runs // 3, 1)):
                    b2b[i].append(await call(s))
    for i, spec in enumerate(specs):
        print("%-60s paced %.3f ms  back to back %.3f ms" % (
            spec[-60:], statistics.median(paced[i]) * 1e3, statistics.median(b2b[i]) * 1e3))


if __name__ == "__main__":
    asyncio.run(main())
