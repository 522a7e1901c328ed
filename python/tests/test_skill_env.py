"""Skill passthrough: required_environment_variables reach scripts and their children."""

from __future__ import annotations

import os

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
    with pytest.raises(ValueError, match="not an environment variable name"):
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
