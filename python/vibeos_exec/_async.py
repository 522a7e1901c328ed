"""The bridge that runs ``async def`` tool handlers from synchronous dispatch (SPEC §7).

Tool calls arrive on the registry's threads, which have no event loop. Running each coroutine
with ``asyncio.run`` would create and destroy a loop per call and break clients a tool caches
between calls (sessions, connection pools); one persistent loop on a daemon thread keeps them
alive. The calling thread waits on a ``concurrent.futures.Future``, which releases the GIL while
it waits.

A handler running on that loop may call another async tool synchronously
(``registry.handle_function_call`` inside an ``async def``). The loop is then blocked by that
very call, so the inner coroutine cannot run on it: it runs on a worker thread with its own
loop instead, and so does every call made from such a worker while it waits. A host calling from
its *own* running loop still uses the persistent one, which is free.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, List, Optional

_lock = threading.Lock()
_loop: Optional[asyncio.AbstractEventLoop] = None

#: Marks the threads whose waiting may hold up the persistent loop (the loop's own thread and
#: the bridge's workers): a coroutine called from one of them runs on a worker of its own.
_blocks_loop = threading.local()


def _start() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is not None and not _loop.is_closed():
            return _loop
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            _blocks_loop.value = True
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        threading.Thread(target=run, name="vibeos-exec-async-tools", daemon=True).start()
        ready.wait()
        _loop = loop
        return loop


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _run_on_worker(awaitable: Awaitable[Any]) -> Any:
    """Runs ``awaitable`` to completion on a fresh loop in a new thread; returns its result or
    raises its error here."""
    outcome: List[Any] = []

    def work() -> None:
        _blocks_loop.value = True
        try:
            outcome.append((True, asyncio.run(_await(awaitable))))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            outcome.append((False, exc))

    worker = threading.Thread(target=work, name="vibeos-exec-async-worker", daemon=True)
    worker.start()
    worker.join()
    ok, value = outcome[0]
    if ok:
        return value
    raise value


def run_coroutine(awaitable: Awaitable[Any]) -> Any:
    """Runs ``awaitable`` and returns its result (or raises its error): on the shared tool loop,
    or on a worker thread when the calling thread is the one that loop is waiting for."""
    if getattr(_blocks_loop, "value", False):
        return _run_on_worker(awaitable)
    return asyncio.run_coroutine_threadsafe(_await(awaitable), _start()).result()
