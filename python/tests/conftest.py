"""Shared fixtures: an isolated VIBEOS_HOME, a clean environment, and helpers.

Every test drives real executions: a real interpreter child, a real Unix socket, real tools.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

import vibeos_exec
from vibeos_exec import registry

REPO = Path(__file__).resolve().parents[2]

# Config is read at every call from $VIBEOS_HOME/config.yaml: point it at an empty home so the
# developer's own config cannot change what the tests see.
_HOME = tempfile.mkdtemp(prefix="vibeos-pytest-home-")
atexit.register(shutil.rmtree, _HOME, True)
os.environ["VIBEOS_HOME"] = _HOME
# The host interpreter must be the default one: no activated venv or conda env on the way.
os.environ.pop("VIRTUAL_ENV", None)
os.environ.pop("CONDA_PREFIX", None)
os.environ.pop("TERMINAL_CWD", None)


@pytest.fixture
def home() -> Path:
    """The VIBEOS_HOME of the tests; config.yaml written here is read by the next call."""
    path = Path(_HOME)
    yield path
    (path / "config.yaml").unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _clean_session() -> Iterator[None]:
    before = set(registry.tool_names())
    yield
    vibeos_exec.clear_skill_env()
    for name in set(registry.tool_names()) - before:
        registry.unregister(name)
    # A test's toolset selection would narrow the next test's execute_code scripts.
    registry.get_tool_definitions()
    assert vibeos_exec._native.running_count() == 0, "an execution outlived its test"


def run_python(code: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (the one running the tests) and returns the outcome."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def echo_schema() -> dict:
    return {"type": "object", "properties": {"x": {"type": "string"}}}
