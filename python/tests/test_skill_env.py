"""Skill passthrough: required_environment_variables reach scripts and their children."""

from __future__ import annotations

import os
import threading
import time

import pytest

import vibeos_exec
from vibeos_exec import registry

# The script reports whether it got the value rather than printing it: printed secrets are
# redacted from the output (security.redact_output), which test_redaction_* covers.
SCRIPT = (
    "import os, subprocess\n"
    "print(os.environ.get('MY_SKILL_TOKEN') == 's3cret-value')\n"
    "print(subprocess.run(['sh', '-c', 'echo $MY_SKILL_TOKEN'], capture_output=True, text=True).stdout.strip() == 's3cret-value')\n"
)


@pytest.fixture
def skill_var(monkeypatch):
    monkeypatch.setenv("MY_SKILL_TOKEN", "s3cret-value")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never")


def test_secret_looking_vars_are_dropped_until_a_skill_declares_them(skill_var):
    r = vibeos_exec.execute_code(SCRIPT)
    assert r["output"].splitlines() == ["False", "False"]
    vibeos_exec.register_skill_env(["MY_SKILL_TOKEN"])
    assert vibeos_exec.skill_env() == ["MY_SKILL_TOKEN"]
    r = vibeos_exec.execute_code(SCRIPT)
    assert r["output"].splitlines() == ["True", "True"]
    # Printed as it is, it comes back redacted, and counted.
    r = vibeos_exec.execute_code("import os; print(os.environ['MY_SKILL_TOKEN'])")
    assert r["output"].strip() == "[REDACTED:MY_SKILL_TOKEN]" and r["redactions"] == 1, r


def test_terminal_children_of_scripts_get_them(skill_var):
    if "terminal" not in registry.script_tools():
        pytest.skip("the terminal tool is not registered in this build")
    vibeos_exec.register_skill_env("MY_SKILL_TOKEN")
    r = vibeos_exec.execute_code(
        "from vibeos_tools import terminal\n"
        "print(terminal('test \"$MY_SKILL_TOKEN\" = s3cret-value && echo got-it')['output'].strip())")
    assert r["output"].strip() == "got-it", r


def test_provider_credentials_are_refused(skill_var):
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        vibeos_exec.register_skill_env(["MY_SKILL_TOKEN", "OPENAI_API_KEY"])
    assert vibeos_exec.skill_env() == []
    r = vibeos_exec.execute_code("import os; print(os.environ.get('OPENAI_API_KEY'))")
    assert r["output"].strip() == "None"


def test_bad_names():
    with pytest.raises(TypeError, match="names"):
        vibeos_exec.register_skill_env([1])
    with pytest.raises(ValueError, match="^names must be environment variable names, got .A=B.$"):
        vibeos_exec.register_skill_env(["A=B"])


def test_the_configured_backend_applies_and_a_bad_one_refuses(home):
    """terminal.backend in config.yaml selects the backend for the Python host as for the CLI;
    a bad setting refuses the call by name instead of running the script on this machine."""
    (home / "config.yaml").write_text("terminal:\n  backend: bogus\n")
    with pytest.raises(ValueError, match="unknown backend `bogus`"):
        vibeos_exec.execute_code("print('ran here')")
    (home / "config.yaml").write_text("terminal:\n  backend: docker\n")
    with pytest.raises(ValueError, match="terminal.docker_image"):
        vibeos_exec.execute_code("print('ran here')")
    # Back to local: scripts run here again.
    (home / "config.yaml").write_text("terminal:\n  backend: local\n")
    r = vibeos_exec.execute_code("print('ran here')")
    assert r["output"] == "ran here\n" and "backend" not in r, r


def _processes_named(name: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if f.read().split(b"\0")[0] == name.encode():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_tasks_terminal_session_keeps_its_exports_not_an_earlier_executions_environment(skill_var):
    """A task's shell session carries what its commands exported into later executions, and
    nothing else: not a value a later execution's scrubbing drops (the session once saved
    the whole environment), not an earlier execution's scope marker (a later execution's
    background job then outlived it)."""
    if "terminal" not in registry.script_tools():
        pytest.skip("the terminal tool is not registered in this build")
    vibeos_exec.register_skill_env(["MY_SKILL_TOKEN"])
    r = vibeos_exec.execute_code(
        "from vibeos_tools import terminal\n"
        "print(terminal('export KEPT_ACROSS=yes; test -n \"$MY_SKILL_TOKEN\" && echo has-it')['output'].strip())",
        task_id="session-task")
    assert r["output"].strip() == "has-it", r
    vibeos_exec.clear_skill_env()
    name = "vibeos-orphan-probe-%d" % os.getpid()
    r = vibeos_exec.execute_code(
        "from vibeos_tools import terminal\n"
        "print(terminal('echo \"[$KEPT_ACROSS][${MY_SKILL_TOKEN:-dropped}]\"; "
        "(exec -a %s sleep 60) >/dev/null 2>&1 &')['output'].strip())" % name,
        task_id="session-task")
    assert r["output"].strip() == "[yes][dropped]", r
    # The job carries this execution's marker, so the execution's end took it.
    for _ in range(50):
        if not _processes_named(name):
            break
        time.sleep(0.1)
    left = _processes_named(name)
    for pid in left:
        os.kill(pid, 9)
    assert not left, "a background job of the second execution outlived it"


def test_one_executions_end_does_not_kill_another_executions_command_of_the_same_task():
    if "terminal" not in registry.script_tools():
        pytest.skip("the terminal tool is not registered in this build")
    results = {}

    def first():
        results["first"] = vibeos_exec.execute_code(
            "from vibeos_tools import terminal\nimport time\nterminal('true')\ntime.sleep(1.5)\n",
            task_id="shared-task")

    def second():
        time.sleep(0.7)
        results["second"] = vibeos_exec.execute_code(
            "from vibeos_tools import terminal\nprint(terminal('sleep 2.5; echo finished')['output'])",
            task_id="shared-task")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["first"]["status"] == "success", results
    out = results["second"]["output"]
    assert "finished" in out and "Killed" not in out, results["second"]
