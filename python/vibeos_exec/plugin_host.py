"""The plugin host: serves this interpreter's plugins' tools to the ``vibeos-exec`` CLI over MCP.

The CLI embeds no Python, so it runs ``python -m vibeos_exec.plugin_host --dir D ...``, which
loads the plugins (:func:`vibeos_exec.plugins.load_plugins`) and answers MCP over stdio:
``initialize``, ``ping``, ``tools/list`` and ``tools/call``. Each listed tool carries its plugin
in ``_meta["vibeos/plugin"]`` (the CLI registers it in toolset ``plugin-<module>``) and
``_meta["vibeos/script_callable"]`` when the plugin opened it to scripts; plugins that failed to
load are listed in ``instructions`` as ``{"vibeos_plugin_failures": {name: reason}}``. Calls run
through this process's registry (hooks, error wrapping), each on its own thread.

A small JSON-RPC loop is written here rather than requiring the ``mcp`` package: the host only
needs these four methods, and plugins should not have to pull an SDK into every interpreter.
Anything plugins print goes to stderr: stdout carries only the protocol.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from typing import Any, Dict, List, Optional, TextIO

from . import __version__, registry
from .plugins import PluginReport, load_plugins

#: Protocol versions this host speaks, newest first (its methods are the same in each).
PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")

log = logging.getLogger("vibeos_exec.plugin_host")


class Host:
    """One session: the loaded plugins and the protocol stream."""

    def __init__(self, report: PluginReport, out: TextIO) -> None:
        self.report = report
        self.out = out
        self.lock = threading.Lock()
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
        out = []
        for d in registry.get_tool_definitions():
            fn = d.get("function", {})
            name = fn.get("name")
            if name not in self.plugin_of:
                continue
            out.append({
                "name": name,
                "description": fn.get("description", ""),
                "inputSchema": fn.get("parameters") or {"type": "object", "properties": {}},
                "_meta": {
                    "vibeos/plugin": self.plugin_of[name],
                    "vibeos/script_callable": name in script,
                },
            })
        return out

    def call(self, msg_id: Any, params: Dict[str, Any]) -> None:
        name = params.get("name")
        args = params.get("arguments") or {}
        if not isinstance(name, str) or name not in self.plugin_of:
            self.error(msg_id, -32602, f"unknown tool: {name!r}")
            return
        if not isinstance(args, dict):
            self.error(msg_id, -32602, "arguments must be an object")
            return
        try:
            text = registry.handle_function_call(name, args)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, host keeps serving
            self.reply(msg_id, {"content": [{"type": "text", "text": f"{type(exc).__name__}: {exc}"}],
                                "isError": True})
            return
        self.reply(msg_id, {"content": [{"type": "text", "text": text}], "isError": False})

    def handle(self, msg: Any) -> None:
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            self.error(None, -32600, "not a JSON-RPC 2.0 message")
            return
        method = msg.get("method")
        msg_id = msg.get("id")
        if method is None:
            return  # a response to nothing we asked; ignore
        if "id" not in msg:
            return  # notifications (initialized, cancelled) need no answer
        params = msg.get("params") or {}
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
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

    def serve(self, stream: TextIO) -> None:
        for line in stream:
            line = line.strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError as exc:
                self.error(None, -32700, f"parse error: {exc}")
                continue
            self.handle(msg)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m vibeos_exec.plugin_host``."""
    parser = argparse.ArgumentParser(prog="python -m vibeos_exec.plugin_host")
    parser.add_argument("--dir", action="append", default=[], help="plugin directory (repeatable)")
    parser.add_argument("--no-entry-points", action="store_true",
                        help="do not load the vibeos.plugins entry points")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    # Keep the real stdout for the protocol; everything else written to fd 1 goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # One line per broken plugin: the CLI logs it again with the reason, by name.
    report = load_plugins(args.dir, entry_points=not args.no_entry_points, tracebacks=False)
    Host(report, protocol).serve(sys.stdin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
