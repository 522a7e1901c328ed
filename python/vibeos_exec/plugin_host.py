"""The plugin host: serves this interpreter's plugins' tools to the ``vibeos-exec`` CLI over MCP.

The CLI embeds no Python, so it runs ``python -m vibeos_exec.plugin_host --dir D ...``, which
loads the plugins (:func:`vibeos_exec.plugins.load_plugins`) and answers MCP over stdio:
``initialize``, ``ping``, ``tools/list`` and ``tools/call``. Each listed tool carries in
``_meta``:

- ``"vibeos/plugin"`` (str): its plugin (the CLI registers it in toolset ``plugin-<module>``);
- ``"vibeos/script_callable"`` (bool): whether the plugin opened it to scripts;
- ``"vibeos/requires_env"`` (list of str) and ``"vibeos/emoji"`` (str), as registered (``[]``
  and ``""`` when not given);
- ``"vibeos/unavailable"`` (str), only on a tool whose ``check_fn`` fails (returns false,
  raises, hangs): why, in the registry's words (``check failed``, ``check raised an error:
  <Type>: <message>``, ``check did not finish within 3s``, then ``; missing env: A, B`` when
  ``requires_env`` names unset variables). Such a tool is listed anyway, so the CLI can show it
  as unavailable rather than not at all.

Plugins that failed to load are listed in ``instructions`` as
``{"vibeos_plugin_failures": {name: reason}}``. Calls run through this process's registry
(hooks, error wrapping), each on its own thread. Every request gets an answer: one the host
cannot take (params that are not an object, say) gets a JSON-RPC error naming what is wrong.

A small JSON-RPC loop is written here rather than requiring the ``mcp`` package: the host only
needs these four methods, and plugins should not have to pull an SDK into every interpreter.
The protocol runs on private copies of fds 0 and 1 (close-on-exec, so no child inherits them);
fd 0 and ``sys.stdin`` are ``/dev/null`` and fd 1 and ``sys.stdout`` are stderr while plugins
run, so a plugin that reads stdin or starts a subprocess (``head``, a shell) cannot swallow
requests, and anything it prints goes to stderr rather than into the protocol.

Each plugin is imported on a thread of its own, bounded by ``--import-timeout`` (20 s): one
that hangs while importing is reported failed and the others are still served (its thread is
left running). A plugin that must install signal handlers at import cannot, off the main thread.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
import threading
from typing import Any, BinaryIO, Dict, List, Optional, Set, TextIO, Union

from . import __version__, _async, registry
from .plugins import PluginReport, load_plugins

#: Protocol versions this host speaks, newest first (its methods are the same in each).
PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")

log = logging.getLogger("vibeos_exec.plugin_host")

#: Default bound (seconds) on one plugin's import (``--import-timeout``).
DEFAULT_IMPORT_TIMEOUT = 20.0

#: Bound (seconds) on re-running a failed tool's check to say why it failed: the registry's
#: own default check timeout.
CHECK_TIMEOUT = 3.0


def _json_type(value: Any) -> str:
    """The JSON name of ``value``'s type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


class Host:
    """One session: the loaded plugins and the protocol stream."""

    def __init__(self, report: PluginReport, out: TextIO) -> None:
        self.report = report
        self.out = out
        self.lock = threading.Lock()
        #: Checks re-run for a reason that have not finished (see :meth:`run_check`).
        self.hung: Set[int] = set()
        self.plugin_of: Dict[str, str] = {}
        for plugin, tools in report.loaded.items():
            for tool in tools:
                self.plugin_of[tool] = plugin

    def send(self, message: Dict[str, Any]) -> None:
        text = json.dumps(message, separators=(",", ":"))
        with self.lock:
            self.out.write(text + "\n")
            self.out.flush()

    def reply(self, msg_id: Any, result: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": msg_id, "result": result})

    def error(self, msg_id: Any, code: int, message: str) -> None:
        self.send({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})

    def tools(self) -> List[Dict[str, Any]]:
        script = set(registry.script_tools())
        offered = {}
        for d in registry.get_tool_definitions():
            fn = d.get("function", {})
            offered[fn.get("name")] = fn
        registered = set(registry.tool_names())
        checks: Dict[int, str] = {}  # one run per distinct check and listing, as the registry
        out = []
        for name in sorted(self.plugin_of):
            reg = registry._registration(name)
            fn = offered.get(name)
            meta: Dict[str, Any] = {
                "vibeos/plugin": self.plugin_of[name],
                "vibeos/script_callable": name in script,
                "vibeos/requires_env": list(reg.requires_env) if reg else [],
                "vibeos/emoji": reg.emoji if reg else "",
            }
            if fn is not None:
                description = fn.get("description", "")
                schema = fn.get("parameters")
            elif reg is not None and name in registered:
                # Left out of the definitions: its check failed. Listed anyway, saying why.
                description, schema = reg.description, reg.parameters
                meta["vibeos/script_callable"] = reg.script_callable or name in script
                meta["vibeos/unavailable"] = self.unavailable_reason(reg, checks)
            else:
                continue  # no longer registered
            out.append({
                "name": name,
                "description": description,
                "inputSchema": schema or {"type": "object", "properties": {}},
                "_meta": meta,
            })
        return out

    def unavailable_reason(self, reg: "registry._Registration", checks: Dict[int, str]) -> str:
        """Why the registry left out a tool registered as ``reg``, worded as the registry's
        tool listing words it. The definitions say only that it was left out, so its check is
        run again (once per listing, bounded by :data:`CHECK_TIMEOUT`; a check still hung from
        an earlier listing is not started again)."""
        check = reg.check_fn
        if check is None:
            why = "left out of the definitions by the registry"
        else:
            key = id(check)
            if key not in checks:
                checks[key] = self.run_check(check)
            why = checks[key]
        missing = [v for v in reg.requires_env if not os.environ.get(v)]
        return f"{why}; missing env: {', '.join(missing)}" if missing else why

    def run_check(self, check: Any) -> str:
        key = id(check)
        with self.lock:
            if key in self.hung:
                return "check is still running from an earlier call (hung)"
        outcome: List[str] = []

        def run() -> None:
            try:
                answer = check()
                if inspect.isawaitable(answer):
                    answer = _async.run_coroutine(answer)
                outcome.append("check failed")  # whatever it answers now, it failed just now
            except BaseException as exc:  # noqa: BLE001 - the reason is the point
                outcome.append(f"check raised an error: {type(exc).__name__}: {exc}")
            finally:
                with self.lock:
                    self.hung.discard(key)

        thread = threading.Thread(target=run, name="vibeos-plugin-check", daemon=True)
        with self.lock:
            self.hung.add(key)
        thread.start()
        thread.join(CHECK_TIMEOUT)
        if outcome:
            return outcome[0]
        return f"check did not finish within {CHECK_TIMEOUT:g}s"

    def call(self, msg_id: Any, params: Dict[str, Any]) -> None:
        try:
            self._call(msg_id, params)
        except Exception as exc:  # noqa: BLE001 - every request gets an answer
            log.exception("tools/call failed")
            self.error(msg_id, -32603, f"internal error: {type(exc).__name__}: {exc}")

    def _call(self, msg_id: Any, params: Dict[str, Any]) -> None:
        name = params.get("name")
        args = params.get("arguments")
        if args is None:
            args = {}
        if not isinstance(name, str) or name not in self.plugin_of:
            self.error(msg_id, -32602, f"unknown tool: {name!r}")
            return
        if not isinstance(args, dict):
            self.error(msg_id, -32602, f"arguments must be an object, got {_json_type(args)}")
            return
        try:
            text = registry.handle_function_call(name, args)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, host keeps serving
            self.reply(msg_id, {"content": [{"type": "text", "text": f"{type(exc).__name__}: {exc}"}],
                                "isError": True})
            return
        self.reply(msg_id, {"content": [{"type": "text", "text": text}], "isError": False})

    def handle(self, msg: Any) -> None:
        """Answers one message. Every request (a message with a ``method`` and an ``id``) gets
        an answer, an error when it cannot be taken; notifications and responses get none."""
        if not isinstance(msg, dict):
            self.error(None, -32600,
                       f"not a JSON-RPC 2.0 message: {_json_type(msg)}, not an object")
            return
        method = msg.get("method")
        msg_id = msg.get("id")
        if method is None:
            return  # a response to nothing we asked; ignore
        is_request = "id" in msg  # notifications (initialized, cancelled) need no answer
        if msg.get("jsonrpc") != "2.0":
            self.error(msg_id if is_request else None, -32600,
                       'not a JSON-RPC 2.0 message: "jsonrpc" must be "2.0"')
            return
        if not is_request:
            return
        if not isinstance(method, str):
            self.error(msg_id, -32600, f"method must be a string, got {_json_type(method)}")
            return
        params = msg.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            self.error(msg_id, -32602, f"params of {method} must be an object, got "
                       f"{_json_type(params)}")
            return
        try:
            self.dispatch(msg_id, method, params)
        except Exception as exc:  # noqa: BLE001 - the request is answered, the host keeps serving
            log.exception("%s failed", method)
            self.error(msg_id, -32603, f"internal error: {type(exc).__name__}: {exc}")

    def dispatch(self, msg_id: Any, method: str, params: Dict[str, Any]) -> None:
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = asked if isinstance(asked, str) and asked in PROTOCOL_VERSIONS \
                else PROTOCOL_VERSIONS[0]
            self.reply(msg_id, {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "vibeos-plugin-host", "version": __version__},
                "instructions": json.dumps({"vibeos_plugin_failures": self.report.failed}),
            })
        elif method == "ping":
            self.reply(msg_id, {})
        elif method == "tools/list":
            self.reply(msg_id, {"tools": self.tools()})
        elif method == "tools/call":
            threading.Thread(target=self.call, args=(msg_id, params), daemon=True).start()
        else:
            self.error(msg_id, -32601, f"method not found: {method}")

    def serve(self, stream: Union[BinaryIO, TextIO]) -> None:
        """Answers the messages of ``stream`` (one per line) until it ends. A line that is not
        UTF-8 JSON gets a parse error; the host keeps serving."""
        for raw in stream:
            try:
                line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
                line = line.strip()
                if not line:
                    continue
                msg = json.loads(line)
            except ValueError as exc:  # UnicodeDecodeError included
                self.error(None, -32700, f"parse error: {exc}")
                continue
            self.handle(msg)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m vibeos_exec.plugin_host``."""
    parser = argparse.ArgumentParser(prog="python -m vibeos_exec.plugin_host")
    parser.add_argument("--dir", action="append", default=[], type=_directory,
                        help="plugin directory (repeatable)")
    parser.add_argument("--no-entry-points", action="store_true",
                        help="do not load the vibeos.plugins entry points")
    parser.add_argument("--import-timeout", type=_positive_seconds,
                        default=DEFAULT_IMPORT_TIMEOUT, metavar="SECONDS",
                        help="report a plugin failed if importing it takes longer than this "
                             f"(default {DEFAULT_IMPORT_TIMEOUT:g})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    # Keep the real stdin and stdout for the protocol, on private fds (os.dup makes them
    # close-on-exec), before any plugin runs. fd 0 becomes /dev/null: left as the protocol
    # pipe, a plugin's `subprocess.run(["head", ...])` or `sys.stdin.read()` would consume
    # requests meant for the host. Everything else written to fd 1 goes to stderr.
    requests = os.fdopen(os.dup(0), "rb")
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(0, "r", encoding="utf-8", closefd=False)  # noqa: SIM115 - fd 0 for good
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # One line per broken plugin: the CLI logs it again with the reason, by name.
    report = load_plugins(args.dir, entry_points=not args.no_entry_points, tracebacks=False,
                          import_timeout=args.import_timeout)
    Host(report, protocol).serve(requests)
    return 0


def _directory(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("empty directory (\"\" would be the current one)")
    return text


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


if __name__ == "__main__":
    sys.exit(main())
