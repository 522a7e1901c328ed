"""The process-wide tool registry, seen from Python (SPEC §7).

``register(...)`` adds a Python tool to the same registry the built-in Rust tools live in, so a
call from an execute_code script (or a direct call through :func:`handle_function_call`) reaches
it through the one dispatch path: argument coercion, hooks, error wrapping, result caps.

Handlers are called as ``handler(args)`` or, when they accept it, ``handler(args, task_id=...)``
(a ``**kwargs`` parameter counts). They may be plain functions or ``async def`` coroutines (run on
a shared event loop in a daemon thread). They return a dict/list/number/bool/None (sent as JSON)
or a string (JSON text passes verbatim; other text is wrapped as ``{"result": ..., "note": ...}``).
An exception becomes ``{"error": "Tool execution failed: <ExceptionType>: <message>"}``.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import sys
import threading
from typing import (
    Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple,
)

from . import _async, _native

__all__ = [
    "register",
    "unregister",
    "tool_names",
    "script_tools",
    "get_tool_definitions",
    "handle_function_call",
    "handle_function_calls",
]

Handler = Callable[..., Any]

#: Largest count the extension takes (a Rust ``usize``); a larger int would raise
#: ``OverflowError`` at the boundary instead of the documented ``ValueError``.
_USIZE_MAX = sys.maxsize * 2 + 1


def _shown(value: Any) -> str:
    """``value`` for a message: an int too long to print usefully is described by its size."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    return repr(value)


def _check_str(param: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{param} must be a str, got {type(value).__name__}")
    return value


def check_task_id(value: Any) -> str:
    """``value`` as a task id: a non-empty str. An empty id would name the executions and
    calls made without one (other callers' included), so ``interrupt("")`` could stop them."""
    _check_str("task_id", value)
    if not value:
        raise ValueError("task_id must not be empty: pass None for a call outside any task")
    # It names containers, sessions and log lines, and reaches engine command lines, where a
    # NUL cannot go and a megabyte-long id was a megabyte per log line and label.
    if "\0" in value:
        raise ValueError("task_id must not contain a NUL character")
    if len(value) > _MAX_TASK_ID:
        raise ValueError(
            f"task_id must be at most {_MAX_TASK_ID} characters, got {len(value)}: "
            "pass a short id (a UUID, a session name)")
    return value


#: The longest task id taken.
_MAX_TASK_ID = 1024


def _check_str_list(param: str, value: Any) -> List[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{param} must be a list of str, got {type(value).__name__}")
    out = list(value)
    for item in out:
        if not isinstance(item, str):
            raise TypeError(f"{param} must be a list of str, but holds a {type(item).__name__}")
    return out


def _accepts_task_id(handler: Handler) -> bool:
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == "task_id" and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        for p in params
    )


def _message_of(exc: BaseException) -> str:
    """``str(exc)``, or what can be said of it when its ``__str__`` fails: raised from here,
    that failure was reported instead of the handler's own exception, under its own type."""
    try:
        return str(exc)
    except BaseException as inner:  # noqa: BLE001 - any failure of __str__
        return f"<the exception's message could not be read: {type(inner).__name__}>"


#: The script call a tool handler is answering (a ``_native.ScriptCall``), while it runs; None
#: for the agent's calls and outside handlers. An ``execute_code`` made inside the handler
#: passes it on, so that execution runs one level deeper (bounded) and ends with the execution
#: whose script made the call. A thread the handler starts does not inherit it.
calling_script: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "vibeos_exec_calling_script", default=None
)


async def _answering(call: Any, awaitable: Any) -> Any:
    """``awaitable`` run with :data:`calling_script` set to ``call``: an async handler runs in a
    task of the package's loop, whose context is the loop thread's, not the calling thread's."""
    calling_script.set(call)
    return await awaitable


def _make_invoker(
    name: str, handler: Handler
) -> Callable[[str, Optional[str], Any], Tuple[bool, str, Optional[str]]]:
    pass_task_id = _accepts_task_id(handler)

    def invoke(
        args_json: str, task_id: Optional[str], call: Any = None
    ) -> Tuple[bool, str, Optional[str]]:
        # An agent call made inside a handler (``handle_function_call``) answers the same
        # script call as that handler: it keeps the value, so nesting stays counted.
        answering = calling_script.set(call if call is not None else calling_script.get())
        try:
            args = json.loads(args_json)
            result = handler(args, task_id=task_id) if pass_task_id else handler(args)
            # What the handler returned decides, not the flag: `is_async=True` on a handler
            # that returns its result directly (a sync wrapper) failed every call with
            # "object dict can't be used in 'await' expression".
            if inspect.isawaitable(result):
                result = _async.run_coroutine(_answering(call, result))
        except BaseException as exc:  # noqa: BLE001 - every failure becomes the tool's error
            return (False, type(exc).__name__, _message_of(exc))
        finally:
            calling_script.reset(answering)
        if isinstance(result, str):
            return (True, result, None)
        try:
            # allow_nan=False: JSON has no NaN or Infinity; written as json.dumps writes them,
            # the result would reach the agent as text that is not JSON, not as the dict it was.
            return (True, json.dumps(result, allow_nan=False), None)
        except (TypeError, ValueError) as exc:
            return (
                False,
                "TypeError" if isinstance(exc, TypeError) else "ValueError",
                f"`{name}` returned a {type(result).__name__}, which is not JSON ({exc}); "
                "return a dict, list, str, number (not NaN or infinite), bool or None",
            )

    return invoke


def _parameters_of(name: str, schema: Mapping[str, Any]) -> Tuple[Dict[str, Any], Optional[str]]:
    """The arguments schema and the description inside ``schema``.

    Accepts either an OpenAI function schema (``{"name", "description", "parameters"}``, as the
    seeds' tools pass) or the parameters object itself.
    """
    if "parameters" in schema and schema.get("type") != "object":
        params = schema["parameters"]
        if not isinstance(params, Mapping):
            raise TypeError(f"schema['parameters'] of `{name}` must be a dict")
        desc = schema.get("description")
        return dict(params), desc if isinstance(desc, str) else None
    return dict(schema), None


#: While a plugin loads, the names it registers (see :mod:`vibeos_exec.plugins`); None otherwise.
_recorder: Optional[List[str]] = None

class _Registration(NamedTuple):
    """What the Python side knows of a registration made through :func:`register`, for those
    that list tools with more than the definitions say (the plugin host sends ``requires_env``,
    ``emoji`` and, for a tool whose check fails, why; the extension's definitions leave those
    tools out)."""

    toolset: str
    description: str
    parameters: Dict[str, Any]
    emoji: str
    requires_env: Tuple[str, ...]
    check_fn: Optional[Callable[[], Any]]
    script_callable: bool


#: Name → its last registration through :func:`register` (kept in step by :func:`unregister`
#: and :func:`_restore`; a tool replaced later by a Rust-side registration keeps its entry).
_registrations: Dict[str, _Registration] = {}


class _Previous(NamedTuple):
    """What a name held before a registration: the extension's entry (for
    ``_native.restore_tool``) and the Python-side record (see :func:`_restore`)."""

    native: "_native.PreviousTool"
    registration: Optional[_Registration]

    @property
    def replaced(self) -> bool:
        return self.native.replaced


def _restore(held: _Previous) -> None:
    """Undoes a registration: the name gets back what ``held`` says it held, in the extension
    and in :data:`_registrations` (or is removed)."""
    _native.restore_tool(held.native)
    name = held.native.name
    if held.registration is None:
        _registrations.pop(name, None)
    else:
        _registrations[name] = held.registration


def _registration(name: str) -> Optional[_Registration]:
    """The last :func:`register` of ``name`` still in force, or None."""
    return _registrations.get(name)


#: While a tool module or a plugin loads, what each name it registers held before its first
#: registration there (see :mod:`vibeos_exec.discovery` and :mod:`vibeos_exec.plugins`, which
#: give it back if the module or plugin fails); None otherwise.
_previous: Optional[Dict[str, _Previous]] = None

#: The ``source`` of the host's own registrations; the extension records it as the host's
#: (``ToolSource::Host``), which the plugin override policy does not apply to.
_HOST_SOURCE = "python"

#: Threads of plugin imports the loader gave up on (``load_plugins(import_timeout=...)``): a
#: registration from one of them is refused, since the loader has moved on and would record it
#: as another plugin's, or as the host's. Thread objects; a thread leaves when its import ends.
_abandoned: "set[threading.Thread]" = set()

#: While a plugin loads, the source its registrations are recorded under (its name; see
#: :mod:`vibeos_exec.plugins`); None otherwise. Process-wide rather than per thread: a plugin
#: that registers from a thread it starts while loading is still the plugin.
_plugin_source: Optional[str] = None


def register(
    name: str,
    toolset: str,
    schema: Mapping[str, Any],
    handler: Handler,
    check_fn: Optional[Callable[[], Any]] = None,
    requires_env: Optional[Sequence[str]] = None,
    is_async: Optional[bool] = None,
    description: str = "",
    emoji: str = "",
    max_result_size_chars: Optional[int] = None,
    override: bool = False,
    *,
    script_callable: bool = False,
    parallel_safe: bool = False,
    source: str = "python",
) -> None:
    """Registers (or replaces) the tool ``name`` in the process-wide registry.

    Args:
        name: What the model and scripts call it (letters, digits, ``_``, ``-``).
        toolset: The bundle it belongs to.
        schema: JSON schema of its arguments object, or an OpenAI function schema holding it
            under ``parameters`` (its ``description`` is used when ``description`` is empty).
        handler: ``handler(args)`` or ``handler(args, task_id=...)``; sync or ``async def``.
        check_fn: Returns truthy when the tool is usable now; an exception means unavailable.
            May be ``async def`` (awaited on the loop async handlers run on). Tools registered
            with the same callable share one check, run once per definitions call.
        requires_env: Environment variables the tool needs (shown when it is unavailable).
        is_async: Whether ``handler`` returns a coroutine; detected when ``None``.
        description: What the tool does; its first line is the doc line scripts see.
        emoji: Shown in listings.
        max_result_size_chars: Longer results are truncated with a note.
        override: Allow shadowing a tool of the same name in a *different* toolset. A
            registration in the same toolset replaces the previous one without it (last wins,
            logged), e.g. ``register(name="web_search", toolset="web", ...)``; shadowing
            another toolset's tool without it raises ``ValueError``.
        script_callable: Also let execute_code scripts call it (see :func:`vibeos_exec.allow_in_scripts`);
            the name must then be a Python identifier that is not a keyword or a stub helper
            (``json_parse``, ``shell_quote``, ``retry``), as ``vibeos_tools`` defines it. A
            re-registration without it closes what the replaced registration opened (an
            opening made with ``allow_in_scripts`` stays).
        parallel_safe: Calls may run alongside other calls of the same model turn.
        source: ``"python"`` (default): the host's own tool. Any other name records it as
            that plugin's, which also needs the operator's plugin override policy to replace a
            built-in. While :func:`vibeos_exec.load_plugins` loads a plugin, its registrations
            are that plugin's whatever ``source`` says, and its ``override`` is ignored: a
            plugin cannot replace a built-in or host tool, nor shadow another toolset's tool.

    Raises:
        TypeError: An argument has the wrong type (the message names it).
        ValueError: The name, schema or override is refused by the registry, the name cannot be
            a script's function (with ``script_callable``), or ``max_result_size_chars`` is
            not from 1 to the largest size the platform has.
    """
    _check_str("name", name)
    _check_str("toolset", toolset)
    if not isinstance(schema, Mapping):
        raise TypeError(f"schema must be a dict, got {type(schema).__name__}")
    if not callable(handler):
        raise TypeError(f"handler must be callable, got {type(handler).__name__}")
    if check_fn is not None and not callable(check_fn):
        raise TypeError(f"check_fn must be callable or None, got {type(check_fn).__name__}")
    env = _check_str_list("requires_env", requires_env) if requires_env is not None else []
    if is_async is not None and not isinstance(is_async, bool):
        raise TypeError(f"is_async must be a bool or None, got {type(is_async).__name__}")
    _check_str("description", description)
    _check_str("emoji", emoji)
    if max_result_size_chars is not None and (
        isinstance(max_result_size_chars, bool) or not isinstance(max_result_size_chars, int)
    ):
        raise TypeError(
            f"max_result_size_chars must be an int or None, got {type(max_result_size_chars).__name__}"
        )
    if max_result_size_chars is not None and not 0 < max_result_size_chars <= _USIZE_MAX:
        # Checked here: past the extension's usize it would be an OverflowError.
        raise ValueError(
            f"max_result_size_chars must be a positive int from 1 to {_USIZE_MAX} (or None for "
            f"no cap), got {_shown(max_result_size_chars)}"
        )
    for flag, value in (("override", override), ("script_callable", script_callable),
                        ("parallel_safe", parallel_safe)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, got {type(value).__name__}")
    _check_str("source", source)
    if _abandoned and threading.current_thread() in _abandoned:
        raise RuntimeError(
            f"tool `{name}` not registered: this plugin's import was given up on (it did not "
            "finish within the plugin loader's import timeout) and the plugin reported failed"
        )
    if _plugin_source is not None:
        # A plugin's registrations are the plugin's, whatever it passes: as the host's they
        # would escape the operator's override policy (a plugin replacing `read_file` or
        # `terminal`), and its own ``override=True`` is no consent of the operator's, so the
        # extension must not take it as one (it opens the name in the policy for the host).
        # The CLI registers plugin tools the same way (docs/mcp-and-plugins.md).
        source = _plugin_source
        override = False
    params, schema_desc = _parameters_of(name, schema)
    if not description:
        description = schema_desc or (inspect.getdoc(handler) or "").strip()
    if is_async is None:
        is_async = inspect.iscoroutinefunction(handler)
    try:
        # allow_nan=False: JSON has no NaN or Infinity, and the registry would name only a
        # column of the text json.dumps made of them.
        params_json = json.dumps(params, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"schema of `{name}` must be JSON-serialisable: {exc}") from None
    before = _registrations.get(name)
    previous = _native.register_tool(
        name,
        toolset,
        params_json,
        _make_invoker(name, handler),
        description,
        emoji,
        env,
        max_result_size_chars,
        check_fn,
        source,
        override,
        parallel_safe,
        script_callable,
    )
    _registrations[name] = _Registration(toolset, description, params, emoji, tuple(env),
                                         check_fn, script_callable)
    if _recorder is not None:
        _recorder.append(name)
    if _previous is not None:
        _previous.setdefault(name, _Previous(previous, before))


def unregister(name: str) -> bool:
    """Removes the tool ``name`` (and its opening to scripts); returns whether it existed."""
    _check_str("name", name)
    _registrations.pop(name, None)
    return _native.unregister_tool(name)


def tool_names() -> List[str]:
    """Names of every registered tool, sorted."""
    return _native.tool_names()


def script_tools() -> List[str]:
    """Names of the tools an execute_code script would get now (allowed, registered, available)."""
    return _native.script_tools()


def get_tool_definitions(
    enabled_toolsets: Optional[Sequence[str]] = None,
    disabled_toolsets: Optional[Sequence[str]] = None,
) -> List[Dict[str, Any]]:
    """OpenAI function-calling schemas of the selected, available tools (SPEC §7).

    The execute_code schema lists only the script tools that survived the selection, and the
    selection is remembered: a later execute_code call through :func:`handle_function_call` or
    :func:`handle_function_calls` that names no toolsets of its own gives its script those same
    tools, so the script cannot reach a tool the model was not told of. The memory is one per
    process: a host that serves several sessions or sub-agents with different toolsets passes
    ``enabled_toolsets`` / ``disabled_toolsets`` with each call instead.

    ``enabled_toolsets=None`` selects every toolset; an empty list selects none (no
    definitions: the selection fails closed, as ``execute_code(enabled_tools=[])`` gives an
    empty stub).
    """
    enabled = _optional_str_list("enabled_toolsets", enabled_toolsets)
    disabled = _check_str_list("disabled_toolsets", disabled_toolsets or [])
    return json.loads(_native.get_tool_definitions(enabled, disabled))


def _optional_str_list(param: str, value: Any) -> Optional[List[str]]:
    """``value`` checked as a list of str, or None; an empty list stays an empty list (it
    means "none", not "no selection")."""
    return None if value is None else _check_str_list(param, value)


def handle_function_call(
    name: str,
    args: Optional[Mapping[str, Any]] = None,
    task_id: Optional[str] = None,
    *,
    cwd: Optional[str] = None,
    enabled_toolsets: Optional[Sequence[str]] = None,
    disabled_toolsets: Optional[Sequence[str]] = None,
) -> str:
    """Calls a tool as the agent would (outside any script); returns its JSON result text.

    Failures come back as ``{"error": ...}`` JSON, never as exceptions (bad argument types
    excepted). The GIL is released while the tool runs. A tool whose ``check_fn`` fails now
    (returns false, raises, hangs past the check timeout) is not run: the result is
    ``{"error": "Error executing <name>: unavailable: <why>"}``, the reason
    ``vibeos-exec tools list`` gives.

    ``enabled_toolsets`` / ``disabled_toolsets`` are the session's toolsets, as
    :func:`get_tool_definitions` takes them: an ``execute_code`` call gives its script only the
    script tools they keep (``enabled_toolsets=[]``: none). Given neither, the selection of the
    last :func:`get_tool_definitions` call applies (every tool before the first). An unknown
    toolset name raises ``ValueError``.
    """
    _check_str("name", name)
    if args is not None and not isinstance(args, Mapping):
        raise TypeError(f"args must be a dict or None, got {type(args).__name__}")
    if task_id is not None:
        check_task_id(task_id)
    try:
        args_json = json.dumps(dict(args or {}), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"args must be JSON-serialisable: {exc}") from None
    enabled, disabled = _selection(enabled_toolsets, disabled_toolsets)
    return _native.handle_function_call(
        name, args_json, task_id, _path_or_none("cwd", cwd), enabled, disabled
    )


def _selection(
    enabled_toolsets: Optional[Sequence[str]], disabled_toolsets: Optional[Sequence[str]]
) -> Tuple[Optional[List[str]], Optional[List[str]]]:
    """The toolsets a call names, checked; ``(None, None)`` when it names none. An empty
    ``enabled_toolsets`` stays empty: it selects no toolset."""
    if enabled_toolsets is None and disabled_toolsets is None:
        return None, None
    return (
        _optional_str_list("enabled_toolsets", enabled_toolsets),
        _check_str_list("disabled_toolsets", disabled_toolsets or []),
    )


class _NotJson:
    """Arguments text of one call that is not JSON: that call is answered with this error and
    not dispatched (the registry would only see a string, and say "got a string")."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _no_constant(name: str) -> Any:
    # json.loads takes NaN and Infinity, which JSON has not: passed on, they would make the
    # whole turn's JSON unreadable for the registry instead of failing this one call.
    raise ValueError(f"{name} is not a JSON value")


def _not_json_result(name: str, bad: _NotJson) -> str:
    """The result of a call whose arguments text is not JSON, worded as the registry words a
    call whose arguments are not an object (``Error executing <tool>: ...``)."""
    message = (f"Error executing {name}: arguments are not valid JSON ({bad.reason}); "
               "they must be a JSON object")
    # Written as the registry writes its JSON (compact, UTF-8 as is).
    return json.dumps({"error": message}, separators=(",", ":"), ensure_ascii=False)


def _call_of(i: int, call: Any) -> Tuple[str, Any]:
    """``(name, args)`` of one call: ``{"name", "arguments"|"args"}`` or an OpenAI tool call
    ``{"function": {"name", "arguments"}}``; arguments may be a dict, JSON text or None.

    Arguments that are not an object (JSON text of a list or a number, a Python list) are
    passed on for the registry to refuse in that call's result, and text that is not JSON
    comes back as a :class:`_NotJson`: a model's malformed arguments are its error, answered in
    its call's result, not the host's, which would fail the whole turn.
    """
    if isinstance(call, (list, tuple)) and len(call) == 2:
        call = {"name": call[0], "arguments": call[1]}
    if not isinstance(call, Mapping):
        raise TypeError(f"calls[{i}] must be a dict or a (name, arguments) pair, got {type(call).__name__}")
    fn = call.get("function")
    if isinstance(fn, Mapping):
        call = fn
    name = call.get("name")
    if not isinstance(name, str):
        raise TypeError(f"calls[{i}] must have a str 'name'")
    args = call.get("arguments", call.get("args"))
    if isinstance(args, str):
        try:
            args = json.loads(args, parse_constant=_no_constant) if args.strip() else None
        except ValueError as exc:
            return name, _NotJson(str(exc))
    if args is None:
        return name, {}
    if isinstance(args, Mapping):
        return name, dict(args)
    if isinstance(args, (list, tuple, int, float, str)):
        return name, args
    raise TypeError(
        f"calls[{i}] arguments must be a dict, JSON text or None, got {type(args).__name__}"
    )


def handle_function_calls(
    calls: Sequence[Mapping[str, Any]],
    *,
    task_id: Optional[str] = None,
    cwd: Optional[str] = None,
    enabled_toolsets: Optional[Sequence[str]] = None,
    disabled_toolsets: Optional[Sequence[str]] = None,
) -> List[str]:
    """Runs one model turn's tool calls as the planner segments them (SPEC §7): read-only
    tools (reads, searches, web) in parallel, writes and patches in parallel when their paths
    differ, everything else in order. Returns each call's JSON result text, in call order.

    Each call is ``{"name": ..., "arguments": {...}}`` (or ``"args"``), or an OpenAI tool call
    ``{"function": {"name": ..., "arguments": "<json>"}}``. The GIL is released while tools run.
    ``enabled_toolsets`` / ``disabled_toolsets`` as for :func:`handle_function_call`.
    """
    if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Iterable):
        raise TypeError(f"calls must be a list of dicts, got {type(calls).__name__}")
    if task_id is not None:
        check_task_id(task_id)
    pairs = [_call_of(i, c) for i, c in enumerate(calls)]
    try:
        calls_json = json.dumps([p for p in pairs if not isinstance(p[1], _NotJson)])
    except (TypeError, ValueError) as exc:
        raise TypeError(f"calls must hold JSON-serialisable arguments: {exc}") from None
    enabled, disabled = _selection(enabled_toolsets, disabled_toolsets)
    results = iter(json.loads(_native.handle_function_calls(
        calls_json, task_id, _path_or_none("cwd", cwd), enabled, disabled)))
    # A call left out for its arguments has its error in its place: results stay in call order.
    return [_not_json_result(n, a) if isinstance(a, _NotJson) else next(results) for n, a in pairs]


def _path_or_none(param: str, value: Any) -> Optional[str]:
    """``value`` as a path str, or None: a str, bytes or os.PathLike as ``os`` functions take
    them (bytes decoded with ``os.fsdecode``); anything else is a ``TypeError`` naming
    ``param``."""
    if value is None:
        return None
    return path_str(param, value, "a str, bytes, os.PathLike or None")


def path_str(param: str, value: Any, expected: str = "a str, bytes or os.PathLike") -> str:
    """A path argument as str: str, bytes or os.PathLike (of either), decoded as ``os``
    functions decode them (``os.fsdecode``); else a ``TypeError`` naming ``param``."""
    import os

    try:
        path = os.fspath(value)
    except TypeError:
        raise TypeError(f"{param} must be {expected}, got {type(value).__name__}") from None
    return os.fsdecode(path)
