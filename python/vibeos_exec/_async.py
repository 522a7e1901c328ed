"""One asyncio loop on a daemon thread, for ``async def`` tool handlers.

Tool calls arrive on the registry's threads, which have no event loop. Running each coroutine
with ``asyncio.run`` would create and destroy a loop per call and break clients a tool caches
between calls (sessions, connection pools); one persistent loop keeps them alive. The calling
thread waits on a ``concurrent.futures.Future``, which releases the GIL while it waits.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Optional

_lock = threading.Lock()
_loop: Optional[asyncio.AbstractEventLoop] = None


def _start() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is not None and not _loop.is_closed():
            return _loop
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        threading.Thread(target=run, name="vibeos-exec-async-tools", daemon=True).start()
        ready.wait()
        _loop = loop
        return loop


def run_coroutine(awaitable: Awaitable[Any]) -> Any:
    """Runs ``awaitable`` on the shared tool loop and returns its result (or raises its error)."""
    loop = _start()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        raise RuntimeError("an async tool handler was called from its own event loop")

    async def wrap() -> Any:
        return await awaitable

    return asyncio.run_coroutine_threadsafe(wrap(), loop).result()
