"""vibeos_exec: execute_code for Python agents.

An agent that would make ten tool calls in ten model turns writes one Python script instead; the
script does ``from vibeos_tools import read_file, ...``, calls tools in loops, and only what it
prints comes back. This package runs such scripts in-process (the sandboxing supervisor is
compiled in) and lets the host register its own Python tools into the same registry::

    import vibeos_exec
    from vibeos_exec import registry

    registry.register(name="lookup", toolset="host", schema={"type": "object", "properties":
                      {"key": {"type": "string"}}}, handler=lambda args: {"value": args["key"]},
                      script_callable=True)
    result = vibeos_exec.execute_code("from vibeos_tools import lookup\\nprint(lookup(key='x'))")
    print(result["status"], result["output"])

Configuration is read from ``$VIBEOS_HOME/config.yaml`` as the ``vibeos-exec`` CLI reads it;
keyword arguments override it per call.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import json
import os
import sys
import threading
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from . import _native, registry
from .approval import set_approval_callback, set_smart_approver
from .discovery import discover_tools
from .plugins import PluginReport, load_plugins
from .registry import _USIZE_MAX, _shown

__all__ = [
    "execute_code",
    "aexecute_code",
    "execute_code_async",
    "interrupt",
    "interrupt_all",
    "allow_in_scripts",
    "disallow_in_scripts",
    "register_skill_env",
    "clear_skill_env",
    "skill_env",
    "discover_tools",
    "load_plugins",
    "load_mcp_servers",
    "mcp_servers",
    "PluginReport",
    "set_approval_callback",
    "set_smart_approver",
    "registry",
    "STATUSES",
    "__version__",
]

__version__: str = _native.__version__

#: The values a result's ``status`` can take.
STATUSES = tuple(_native.statuses())

PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

_skill_env_lock = threading.Lock()
_skill_env: List[str] = []

# Calls of execute_code in progress (Python side), so shutdown can wait for them to return.
_active_lock = threading.Condition()
_active = 0

# The process whose native threads (the execution runtime, the warm pool's, the MCP servers')
# serve this module: a fork copies none of them, so a child forked after the parent used them
# would wait for them for ever (a multiprocessing pool's `fork` workers hung past their
# timeout). Such a child gets a RuntimeError that says what to do instead.
_native_threads_of: Optional[int] = None


def _threads_here(what: str) -> None:
    global _native_threads_of
    pid = os.getpid()
    if _native_threads_of is None:
        _native_threads_of = pid
    elif _native_threads_of != pid:
        raise RuntimeError(
            f"{what} cannot run in this process: it was forked from process "
            f"{_native_threads_of} after vibeos_exec ran there, and a fork does not copy the "
            "threads that run executions. Start worker processes with the 'spawn' or "
            "'forkserver' method (multiprocessing.get_context('spawn')), or fork before the "
            "first execute_code"
        )


def _type_error(param: str, expected: str, value: Any) -> TypeError:
    return TypeError(f"{param} must be {expected}, got {type(value).__name__}")


def _number(param: str, value: Any, integral: bool) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int,) if integral else (int, float)):
        raise _type_error(param, "an int or None" if integral else "a number or None", value)
    return value


#: Longest ``timeout`` (seconds), as the supervisor checks it.
_MAX_TIMEOUT = 86_400
# Per-call output caps (the config file has only the floor; see overrides.rs).
_MIN_OUTPUT_LIMIT = 64
_MAX_OUTPUT_LIMIT = 64 * 1024 * 1024


def _int_in_range(param: str, value: Optional[int], low: int, high: int, what: str) -> Optional[int]:
    """``value`` when None or within ``low..=high``; else ``ValueError`` naming ``param``,
    what it must be and the range."""
    if value is not None and not low <= value <= high:
        raise ValueError(f"{param} must be {what} from {low} to {high}, got {_shown(value)}")
    return value


def _one_or_more_names(value: Any) -> List[str]:
    """``names`` of the functions that take one name or a list of them (said so when wrong:
    "a list of str or None" was the message for a str they take)."""
    if isinstance(value, str):
        return [value]
    if value is None or isinstance(value, bytes) or not isinstance(value, Iterable):
        raise _type_error("names", "a str or a list of str", value)
    return _names("names", value) or []


def _names(param: str, value: Any) -> Optional[List[str]]:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise _type_error(param, "a list of str or None", value)
    out = list(value)
    for item in out:
        if not isinstance(item, str):
            raise TypeError(f"{param} must be a list of str, but holds a {type(item).__name__}")
    return out


#: Largest script execute_code takes, as ``vibeos-exec run`` reads at most 16 MiB.
_MAX_SCRIPT_BYTES = 16 << 20


def _check_script_text(code: str) -> None:
    """``code`` as a script: text UTF-8 can encode (the script file is UTF-8), at most
    :data:`_MAX_SCRIPT_BYTES` of it."""
    if len(code) <= _MAX_SCRIPT_BYTES:
        try:
            size = len(code.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise ValueError(
                f"code holds a character UTF-8 cannot encode ({code[e.start]!r} at index "
                f"{e.start}, a lone surrogate); pass text a file can hold"
            ) from None
    else:
        size = len(code)
    if size > _MAX_SCRIPT_BYTES:
        raise ValueError(
            f"code is larger than {_MAX_SCRIPT_BYTES >> 20} MiB ({size} bytes); pass the script "
            "itself (a few KB), not its data: a script can read its data with the file tools"
        )


def execute_code(
    code: str,
    *,
    mode: Optional[str] = None,
    timeout: Optional[float] = None,
    max_tool_calls: Optional[int] = None,
    cwd: Optional[PathArg] = None,
    enabled_tools: Optional[Sequence[str]] = None,
    task_id: Optional[str] = None,
    stdout_limit: Optional[int] = None,
    stderr_limit: Optional[int] = None,
) -> Dict[str, Any]:
    """Runs ``code`` as an execute_code script and returns the result object (SPEC §10).

    The GIL is released while the script runs, so other Python threads (and the Python tool
    handlers the script calls) keep running. Ctrl-C in the host interrupts the script, waits for
    its cleanup, and raises ``KeyboardInterrupt``.

    Args:
        code: The script's Python source.
        mode: ``"project"`` or ``"strict"``; default from config.
        timeout: Seconds before the script is killed; default from config (300).
        max_tool_calls: Tool-call budget of the script; default from config (50).
        cwd: Session working dir (str, bytes or os.PathLike, as ``os`` functions take paths);
            default ``TERMINAL_CWD``, else the process cwd. One that
            does not exist or is not a directory is a result with ``status`` ``error`` naming
            it (a directory can disappear between calls, like any condition of a run), not a
            ``ValueError``.
        enabled_tools: Script tools the script may call (a subset of the allowed ones);
            default every available one.
        task_id: Agent task id (not empty), handed to tools; :func:`interrupt` stops executions
            by it.
        stdout_limit: Bytes of stdout kept (its first 40% and last 60%), 64 to 64 MiB;
            default from config (51200).
        stderr_limit: Bytes of stderr kept, 64 to 64 MiB; default from config (10240).

    Returns:
        A dict with the keys of ``vibeos-exec run --json``: ``status``
        (success|error|timeout|interrupted), ``output``, ``tool_calls_made``,
        ``duration_seconds``, ``exit_code``, ``error`` (when not success), ``truncated``,
        ``stdout_bytes``, ``stdout_bytes_omitted``, ``stderr_bytes``, ``stderr_bytes_omitted``,
        ``mode``, ``interpreter`` and ``redactions`` (secrets replaced by ``[REDACTED:…]``
        markers in ``output`` and ``error``; ``security.redact_output``).

    Raises:
        TypeError: An argument has the wrong type (the message names it).
        ValueError: An argument has a wrong value (``code`` over 16 MiB or holding a lone
            surrogate, unknown mode, a timeout that is not
            positive or over 86400 seconds, a negative or too large max_tool_calls, an output
            limit outside 64 bytes to 64 MiB, a tool scripts may not call, an empty task_id); the message names it
            and the allowed values.
        RuntimeError: The config file cannot be read or holds a bad value, such as a
            ``code_execution.python`` that is missing, not executable or older than Python 3.8.
        RuntimeError: Called from a tool handler answering a script whose execution already
            runs 3 executions deep (a tool that runs code for scripts, called from the scripts
            it runs): an execution started from a handler runs one level below the calling
            one, and is interrupted when that one ends.
    """
    return _execute_code(
        code,
        mode=mode,
        timeout=timeout,
        max_tool_calls=max_tool_calls,
        cwd=cwd,
        enabled_tools=enabled_tools,
        task_id=task_id,
        stdout_limit=stdout_limit,
        stderr_limit=stderr_limit,
        cancellation=None,
        called_from=registry.calling_script.get(),
    )


def _execute_code(
    code: str,
    *,
    mode: Optional[str] = None,
    timeout: Optional[float] = None,
    max_tool_calls: Optional[int] = None,
    cwd: Optional[PathArg] = None,
    enabled_tools: Optional[Sequence[str]] = None,
    task_id: Optional[str] = None,
    stdout_limit: Optional[int] = None,
    stderr_limit: Optional[int] = None,
    cancellation: Any,
    called_from: Any = None,
) -> Dict[str, Any]:
    """:func:`execute_code` with ``cancellation`` (a ``_native.Cancellation`` or None): cancelled
    before the script starts, the call returns an ``interrupted`` result without running it.
    ``called_from`` is the script call a tool handler is answering when it calls this
    (:data:`registry.calling_script`): the execution then runs one level deeper, refused past
    the limit, and ends when the calling execution does."""
    global _active
    if not isinstance(code, str):
        raise _type_error("code", "a str", code)
    _check_script_text(code)
    if mode is not None and not isinstance(mode, str):
        raise _type_error("mode", "a str or None", mode)
    timeout = _number("timeout", timeout, integral=False)
    if timeout is not None:
        try:
            timeout = float(timeout)
        except OverflowError:
            # An int too large for a float is far above the longest timeout.
            raise ValueError(
                f"timeout must be a positive number of seconds (at most {_MAX_TIMEOUT}), "
                f"got {_shown(timeout)}"
            ) from None
    max_tool_calls = _int_in_range(
        "max_tool_calls",
        _number("max_tool_calls", max_tool_calls, integral=True),
        0,
        _USIZE_MAX,
        "a whole number of calls",
    )
    limits = {
        name: _int_in_range(
            name,
            _number(name, value, integral=True),
            _MIN_OUTPUT_LIMIT,
            _MAX_OUTPUT_LIMIT,
            "a whole number of bytes",
        )
        for name, value in (("stdout_limit", stdout_limit), ("stderr_limit", stderr_limit))
    }
    cwd = registry._path_or_none("cwd", cwd)
    tools = _names("enabled_tools", enabled_tools)
    if task_id is not None and not isinstance(task_id, str):
        raise _type_error("task_id", "a str or None", task_id)
    if task_id is not None:
        registry.check_task_id(task_id)
    with _skill_env_lock:
        passthrough = list(_skill_env)
    _threads_here("execute_code")
    with _active_lock:
        if _shutting_down:
            raise RuntimeError("the interpreter is shutting down; execute_code is no longer available")
        _active += 1
    try:
        text = _native.execute_code(
            code,
            mode,
            timeout,
            max_tool_calls,
            cwd,
            tools,
            task_id,
            sys.executable or None,
            passthrough,
            limits["stdout_limit"],
            limits["stderr_limit"],
            cancellation,
            called_from,
        )
    finally:
        with _active_lock:
            _active -= 1
            _active_lock.notify_all()
    result: Dict[str, Any] = json.loads(text)
    return result


async def aexecute_code(code: str, **kwargs: Any) -> Dict[str, Any]:
    """Awaitable :func:`execute_code` for asyncio hosts: runs it in a worker thread.

    Cancelling the awaiting task interrupts the script (when a ``task_id`` was given, every
    execution of that task) and waits for its cleanup before the cancellation propagates; a
    call cancelled before its script started (still waiting for a worker thread) never runs it.
    """
    # Wrong arguments are the caller's error now, named as execute_code names them.
    inspect.signature(execute_code).bind(code, **kwargs)
    given_id = kwargs.get("task_id")
    if given_id is None:
        kwargs["task_id"] = f"aexecute-{id(object())}-{threading.get_ident()}-{os.urandom(4).hex()}"
    # The call's own interrupt, made before it is queued: a task cancelled while its call still
    # waits for a worker thread (or before the execution is tracked under its task id) must
    # not run the script afterwards. Interrupting by task id alone missed those, and the
    # script ran in full after the cancellation.
    cancellation = _native.Cancellation()
    # Read here: the worker thread does not see this task's context variables.
    called_from = registry.calling_script.get()
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(
        None,
        lambda: _execute_code(code, cancellation=cancellation, called_from=called_from, **kwargs),
    )
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        cancellation.cancel()
        if given_id is not None:
            _native.interrupt(given_id)
        try:
            await future
        except Exception:  # noqa: BLE001 - the cancellation is what the caller sees
            pass
        raise


#: Alias of :func:`aexecute_code`.
execute_code_async = aexecute_code


def interrupt(task_id: str) -> int:
    """Stops every running execution of ``task_id`` (status ``interrupted``), from any thread.

    Returns how many executions were signalled (0 when none was running).

    Raises:
        TypeError: ``task_id`` is not a str.
        ValueError: ``task_id`` is empty (executions without a task id cannot be picked out;
            :func:`interrupt_all` stops every one).
    """
    if not isinstance(task_id, str):
        raise _type_error("task_id", "a str", task_id)
    if not task_id:
        raise ValueError(
            "task_id must not be empty: executions started without a task id cannot be picked "
            "out; interrupt_all() stops every execution"
        )
    return _native.interrupt(task_id)


def interrupt_all() -> int:
    """Stops every running execution; returns how many were signalled."""
    return _native.interrupt_all()


def allow_in_scripts(names: Union[str, Sequence[str]]) -> None:
    """Lets execute_code scripts call the host tools ``names`` (besides the built-in script tools).

    ``execute_code``, ``delegate_task``, agent-loop tools (``todo``, ``memory``,
    ``session_search``), MCP tools and names ``vibeos_tools`` cannot define as functions (not a
    Python identifier, a keyword, ``_``-prefixed, or a helper's name such as ``retry``) can
    never be opened: ``ValueError``. Names may be
    registered later; a tool must still be registered and available to appear in a script.
    """
    for name in _one_or_more_names(names):
        _native.allow_in_scripts(name)


def disallow_in_scripts(names: Union[str, Sequence[str]]) -> None:
    """Closes tools opened with :func:`allow_in_scripts` again."""
    for name in _one_or_more_names(names):
        _native.disallow_in_scripts(name)


def register_skill_env(names: Union[str, Sequence[str]]) -> None:
    """Passes the environment variables ``names`` (a skill's ``required_environment_variables``)
    through to execute_code scripts and the terminal commands they run, for this session (this
    process), even when they look secret (SPEC §4 rule 1).

    Provider credentials the product manages can never be passed through: ``ValueError`` naming
    them, and nothing is registered.
    """
    items = _one_or_more_names(names)
    for name in items:
        if not name or "=" in name or "\0" in name:
            raise ValueError(f"names must be environment variable names, got {name!r}")
    refused = _native.provider_credentials(items)
    if refused:
        raise ValueError(
            "provider credentials cannot be passed through to scripts: "
            + ", ".join(refused)
            + " (the product manages them; scripts never see them)"
        )
    with _skill_env_lock:
        for name in items:
            if name not in _skill_env:
                _skill_env.append(name)


def clear_skill_env() -> None:
    """Forgets every name registered with :func:`register_skill_env`."""
    with _skill_env_lock:
        _skill_env.clear()


def skill_env() -> List[str]:
    """The names registered with :func:`register_skill_env`."""
    with _skill_env_lock:
        return list(_skill_env)


def load_mcp_servers() -> bool:
    """Starts the ``mcp_servers:`` of ``$VIBEOS_HOME/config.yaml`` and registers their tools
    (toolsets ``mcp-<name>``), as the CLI does. Eager servers start now, lazy ones on the first
    :func:`registry.get_tool_definitions`. Broken servers are logged by name and skipped. Call
    it once; later calls do nothing and return False. The servers stop at interpreter exit.
    Plugins are loaded separately, in this interpreter, with :func:`load_plugins`.
    """
    _threads_here("load_mcp_servers")
    loaded = _native.load_mcp_servers()
    if loaded:
        atexit.register(_native.mcp_server_status, True)
    return loaded


def mcp_servers() -> List[Dict[str, Any]]:
    """The loaded MCP servers: ``{"name", "status", "toolsets"}`` each (empty before
    :func:`load_mcp_servers`)."""
    return [
        {"name": n, "status": s, "toolsets": list(t)}
        for n, s, t in _native.mcp_server_status(False)
    ]


_shutting_down = False

#: Longest wait at shutdown for interrupted executions to finish their cleanup.
SHUTDOWN_WAIT_SECONDS = 15.0


def _shutdown() -> None:
    """Interrupts running executions and waits for them to return before the interpreter goes.

    Registered with ``threading._register_atexit`` where it exists, so it runs before Python
    joins non-daemon threads (otherwise shutdown would first wait out their scripts' timeouts),
    and with ``atexit`` for daemon threads. Waiting matters: a thread still inside the extension
    when the interpreter finalizes could not take the GIL back.
    """
    global _shutting_down
    if _native_threads_of not in (None, os.getpid()):
        return  # a forked child: no execution of ours runs here, and no thread to stop
    with _active_lock:
        if _shutting_down and _active == 0:
            return
        _shutting_down = True
    import time

    deadline = time.monotonic() + SHUTDOWN_WAIT_SECONDS
    # Repeat the interrupt: a call may have passed the shutdown check but not yet started.
    while True:
        _native.interrupt_all()
        with _active_lock:
            left = deadline - time.monotonic()
            if _active_lock.wait_for(lambda: _active == 0, timeout=max(0.0, min(0.2, left))):
                break
        if left <= 0:
            break
    # Containers and ssh masters of a remote backend (terminal.backend) stop with the host.
    _native.shutdown_backends()


#: Longest wait at exit for calls from the extension into Python (tool handlers, checks,
#: approval callbacks on threads Python did not start) to return.
NATIVE_CALLS_WAIT_SECONDS = 3.0


def _quiesce_native_calls() -> None:
    """Lets no call from the extension's own threads into Python start any more, and waits
    (up to :data:`NATIVE_CALLS_WAIT_SECONDS`) for those running to return.

    The last exit hook (registered first, so ``atexit`` runs it after :func:`_shutdown`; non-daemon
    threads were joined before either). Without it, an approval callback or a tool handler that
    returned while the interpreter finalized took the whole process down with SIGABRT: CPython
    ends such a thread with ``pthread_exit``, which cannot unwind through the extension's frames.
    Later calls get a "host is exiting" answer (a tool error, an unavailable tool, no approval).
    """
    if _native_threads_of not in (None, os.getpid()):
        return  # a forked child: the extension's threads did not come along
    _native.quiesce_native_callers(NATIVE_CALLS_WAIT_SECONDS)


atexit.register(_quiesce_native_calls)
try:
    threading._register_atexit(_shutdown)  # type: ignore[attr-defined]
except (AttributeError, RuntimeError):
    pass
atexit.register(_shutdown)
