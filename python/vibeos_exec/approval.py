"""Dangerous-command approval from Python hosts (SPEC §8).

Before a dangerous ``terminal`` command runs — called by the agent or by an execute_code script
— and, where approvals are interactive, before a script whose source matches a dangerous
pattern runs, the host is asked::

    def approve(task_id, command, descriptions):
        return "once"          # or "session", "always", "deny"

    vibeos_exec.set_approval_callback(approve)

The callback may be ``async def``. A coroutine is run on the event loop that was running when
the callback was installed (so it can wait on the host's UI, queues or other tasks), else on
the package's own loop thread. It has ``approvals.timeout`` seconds (config, default 60) to
answer; no answer, an exception or an answer other than the four words is a refusal that names
what happened (``False`` is a plain denial). Do not block that event loop
while a tool call is in flight (call tools through ``asyncio.to_thread`` or
:func:`vibeos_exec.aexecute_code`): the answer could then never be produced.

The hardline tier (``rm -rf /``, formatting a mounted disk, fork bombs, …) is refused before
any callback is asked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
from typing import Any, Awaitable, Callable, List, Optional

from . import _async, _native

__all__ = ["set_approval_callback", "set_smart_approver", "CHOICES", "VERDICTS"]

#: Answers an approval callback may give.
CHOICES = ("once", "session", "always", "deny")
#: Answers a smart approver may give.
VERDICTS = ("approve", "deny", "escalate")

_log = logging.getLogger("vibeos_exec.approval")

Callback = Callable[[Optional[str], str, List[str]], Any]


def _running_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _settle(result: Any, loop: Optional[asyncio.AbstractEventLoop], timeout: float) -> Any:
    """The value of ``result``, awaiting it on ``loop`` (or the package's loop) when needed."""
    if not inspect.isawaitable(result):
        return result

    async def wrap(awaitable: Awaitable[Any]) -> Any:
        return await awaitable

    if loop is not None and loop.is_running() and not loop.is_closed() and _running_loop() is not loop:
        future = asyncio.run_coroutine_threadsafe(wrap(result), loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise
    return _async.run_coroutine(result)


#: Prefixes of what the approval adapter returns when the callback gave no answer, so the
#: refusal names the reason instead of "denied by the user" (read by ``src/lib.rs``).
FAILED_PREFIX = "!failed: "
TIMEOUT_ANSWER = "!timeout"
#: Prefix of an answer that is none of the choices (the native side names it in the refusal).
NOT_A_CHOICE_PREFIX = "!not-a-choice: "


def _adapter(fn: Callback, allowed: tuple, fallback: str, what: str,
             report: bool = False) -> Callable[..., str]:
    """Wraps ``fn`` for the native side. A timeout or an exception gives ``fallback`` — or,
    with ``report``, :data:`TIMEOUT_ANSWER` / :data:`FAILED_PREFIX` and the error, which the
    native side turns into a refusal naming that reason."""
    loop = _running_loop()

    def adapter(task_id: Optional[str], command: str, descriptions: List[str],
                is_script: bool, timeout: float) -> str:
        try:
            answer = _settle(fn(task_id, command, list(descriptions)), loop, timeout)
        except concurrent.futures.TimeoutError:
            _log.warning("%s did not answer within %ss; using %r", what, timeout, fallback)
            return TIMEOUT_ANSWER if report else fallback
        except BaseException as exc:  # noqa: BLE001 - a failing callback must not approve
            # The exception's text can quote what the callback saw (a command, a token): it
            # goes to the log and into the tool's refusal, redacted in both.
            text = _native.redact(str(exc))
            _log.warning("%s raised %s: %s; using %r", what, type(exc).__name__, text, fallback)
            if report:
                return f"{FAILED_PREFIX}{what} raised {type(exc).__name__}: {text}"
            return fallback
        if answer is True:
            return allowed[0]
        if answer is False:
            return fallback
        if isinstance(answer, str) and answer.strip().lower() in allowed:
            return answer.strip().lower()
        shown = _shown(answer)
        _log.warning("%s answered %s; expected one of %s; using %r", what, shown,
                     ", ".join(allowed), fallback)
        if report:
            # Not "denied by the user": nobody chose to deny (docs/approvals.md).
            return f"{NOT_A_CHOICE_PREFIX}{shown}"
        return fallback

    return adapter


def set_approval_callback(fn: Optional[Callback]) -> None:
    """Installs ``fn(task_id, command, descriptions)`` as the approval prompt of this process
    (``None`` removes it). It returns ``"once"``, ``"session"``, ``"always"`` or ``"deny"``
    (``True`` means once); sync or ``async def``. ``descriptions`` are the matched patterns'
    descriptions. For a whole script, ``command`` is the script's source. An exception or no
    answer within ``approvals.timeout`` refuses the command with a message naming that reason
    (not "denied by the user"); so does an answer that is none of the four words (``False`` is a
    denial).

    "session" is remembered per ``task_id``. Calls without a task id share one session that
    lasts only while such calls run: once no execution or direct call without a task id is in
    flight, it is forgotten, so one answer does not approve a pattern for every later caller
    of the process. Pass task ids to keep callers' approvals apart.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if fn is None:
        _native.set_approval_callback(None)
        return
    if not callable(fn):
        raise TypeError(f"the approval callback must be callable or None, got {type(fn).__name__}")
    _native.set_approval_callback(
        _adapter(fn, CHOICES, "deny", "the approval callback", report=True))


def set_smart_approver(fn: Optional[Callback]) -> None:
    """Installs ``fn(task_id, command, descriptions)`` as the smart approver consulted in
    ``approvals.mode: smart`` before anyone is asked (``None`` removes it). It returns
    ``"approve"``, ``"deny"`` or ``"escalate"`` (ask as in manual mode); sync or ``async def``
    (an auxiliary model call, say). Failures and unknown answers escalate.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if fn is None:
        _native.set_smart_approver(None)
        return
    if not callable(fn):
        raise TypeError(f"the smart approver must be callable or None, got {type(fn).__name__}")
    _native.set_smart_approver(_adapter(fn, VERDICTS, "escalate", "the smart approver"))


def _shown(answer: object) -> str:
    """A callback's answer as the log and the refusal show it: its repr, redacted and cut to
    200 characters, or its type when its ``__repr__`` fails (logged lazily, that failure
    printed Python's "--- Logging error ---" dump on stderr)."""
    try:
        text = repr(answer)
    except BaseException:  # noqa: BLE001 - any failure of __repr__
        return f"<{type(answer).__name__} object whose repr failed>"
    return _native.redact(text)[:200]
