"""A minimal agent loop embedding vibeos_exec.

The "model" here is a scripted stand-in (no network, no API key): on its first turn it answers
with one execute_code call whose script chains a host tool written in Python (`ticket_lookup`)
with the built-in `read_file`, and on its second turn it reads the script's printed summary and
answers. Everything else is what a real agent loop does: register host tools, hand the model
the tool definitions, dispatch its tool calls, feed results back.

Run (after `pip install ./python`):  python examples/python_agent.py
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Dict, List

import vibeos_exec
from vibeos_exec import registry

TICKETS = {
    "T-1": {"title": "Login fails on Safari", "log": "auth.log"},
    "T-2": {"title": "Export times out", "log": "export.log"},
}


def ticket_lookup(args: Dict[str, Any]) -> Dict[str, Any]:
    """Looks a ticket up in the host's own data (a database in a real agent)."""
    ticket = TICKETS.get(args["id"])
    if ticket is None:
        raise KeyError(f"no ticket {args['id']}")
    return {"id": args["id"], **ticket}


registry.register(
    name="ticket_lookup",
    toolset="tickets",
    schema={
        "type": "object",
        "properties": {"id": {"type": "string", "description": "Ticket id, e.g. T-1"}},
        "required": ["id"],
    },
    handler=ticket_lookup,
    description="Look up a support ticket by id.",
    emoji="🎫",
    script_callable=True,  # scripts may call it, not only the model
)

SCRIPT = """
from vibeos_tools import ticket_lookup, read_file
summary = []
for tid in ["T-1", "T-2", "T-9"]:
    t = ticket_lookup(id=tid)
    if "error" in t:
        summary.append(f"{tid}: {t['error']}")
        continue
    page = read_file(t["log"])
    errors = [l for l in page.get("content", "").splitlines() if "ERROR" in l]
    summary.append(f"{tid} {t['title']!r}: {len(errors)} error line(s)")
print("\\n".join(summary))
"""


def scripted_model(messages: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Stands in for a chat-completions call: first a tool call, then a final answer."""
    tool_results = [m for m in messages if m["role"] == "tool"]
    if not tool_results:
        return {
            "role": "assistant",
            "tool_calls": [{"id": "call-1", "name": "execute_code", "arguments": {"code": SCRIPT}}],
        }
    result = json.loads(tool_results[-1]["content"])
    return {"role": "assistant", "content": "Triage done:\n" + result.get("output", "")}


def dispatch(call: Dict[str, Any], task_id: str, cwd: str) -> str:
    """Runs one tool call of the model: execute_code in-process, anything else via the registry."""
    if call["name"] == "execute_code":
        result = vibeos_exec.execute_code(call["arguments"]["code"], task_id=task_id, cwd=cwd,
                                          timeout=60)
        return json.dumps(result)
    return registry.handle_function_call(call["name"], call["arguments"], task_id=task_id, cwd=cwd)


def main() -> int:
    workdir = tempfile.mkdtemp(prefix="python-agent-")
    try:
        return run_session(workdir)
    finally:
        # The session's files are the example's own: leave nothing in the temp dir.
        shutil.rmtree(workdir, ignore_errors=True)


def run_session(workdir: str) -> int:
    """The agent loop over a session dir holding two log files to triage."""
    with open(os.path.join(workdir, "auth.log"), "w") as f:
        f.write("INFO start\nERROR token expired\nERROR token expired\n")
    with open(os.path.join(workdir, "export.log"), "w") as f:
        f.write("INFO export\nERROR timeout after 30s\n")

    tools = registry.get_tool_definitions()
    print("tools offered to the model:", ", ".join(t["function"]["name"] for t in tools))
    messages: List[Dict[str, Any]] = [{"role": "user", "content": "Triage tickets T-1, T-2, T-9."}]
    for _turn in range(5):
        reply = scripted_model(messages)
        messages.append(reply)
        if not reply.get("tool_calls"):
            print(reply["content"])
            return 0
        for call in reply["tool_calls"]:
            content = dispatch(call, task_id="example-session", cwd=workdir)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    print("the model did not finish")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
