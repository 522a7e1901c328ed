"""The bundled example and the execute_code entry the package registers for agent loops."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import vibeos_exec
from vibeos_exec import registry

from conftest import REPO, echo_schema


def test_python_agent_example_runs():
    import glob
    import tempfile

    pattern = os.path.join(tempfile.gettempdir(), "python-agent-*")
    before = set(glob.glob(pattern))
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "python_agent.py")],
                          capture_output=True, text=True, timeout=120, env=os.environ)
    assert proc.returncode == 0, proc.stderr
    # The example removes its session dir: nothing of it is left in the temp dir.
    assert set(glob.glob(pattern)) == before
    assert "execute_code" in proc.stdout.splitlines()[0]
    assert "T-1 'Login fails on Safari': 2 error line(s)" in proc.stdout
    assert "T-9: Tool execution failed: KeyError: 'no ticket T-9'" in proc.stdout


def test_execute_code_is_offered_and_dispatchable_with_the_host_tools_listed():
    registry.register(name="host_note", toolset="host", schema=echo_schema(),
                      handler=lambda a: {"note": a["x"]}, script_callable=True)
    defs = {d["function"]["name"]: d for d in registry.get_tool_definitions()}
    assert "host_note(" in defs["execute_code"]["function"]["description"]
    out = json.loads(registry.handle_function_call(
        "execute_code",
        {"code": "from vibeos_tools import host_note\nprint(host_note(x='via agent')['note'])"}))
    assert out["status"] == "success", out
    assert out["output"] == "via agent\n"
    assert out["interpreter"] == sys.executable


def test_a_host_tool_returning_pretty_printed_json_keeps_the_channel_working():
    # The handler's text is embedded in the reply frame as JSON; its line breaks once ended
    # the frame early and broke every later call of the script.
    registry.register(name="host_pretty", toolset="host", schema=echo_schema(),
                      handler=lambda a: json.dumps({"a": 1, "b": [a["x"], "y\nz"]}, indent=2),
                      script_callable=True)
    out = vibeos_exec.execute_code(
        "from vibeos_tools import host_pretty, host_pretty as again\n"
        "print(host_pretty(x='one'))\n"
        "print(again(x='two')['b'])\n")
    assert out["status"] == "success", out
    assert out["output"] == "{'a': 1, 'b': ['one', 'y\\nz']}\n['two', 'y\\nz']\n"
