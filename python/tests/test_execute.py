"""execute_code from Python: results, overrides, bad arguments, threads, interrupts, shutdown."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import vibeos_exec
from vibeos_exec import registry

from conftest import REPO, echo_schema, pid_alive, run_python

RESULT_KEYS = {
    "status", "output", "tool_calls_made", "duration_seconds", "exit_code", "truncated",
    "stdout_bytes", "stdout_bytes_omitted", "stderr_bytes", "stderr_bytes_omitted", "mode",
}


def test_success_result_has_the_result_object_keys():
    r = vibeos_exec.execute_code("print('hello')")
    assert r["status"] == "success"
    assert r["output"] == "hello\n"
    assert r["exit_code"] == 0
    assert RESULT_KEYS <= set(r)
    assert r["tool_calls_made"] == 0
    assert "error" not in r


def test_same_keys_as_cli_run_json(tmp_path):
    binary = REPO / "target" / "debug" / "vibeos-exec"
    if not binary.exists():
        pytest.skip(f"{binary} is missing: run `cargo build --bins` first")
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint('x')\nsys.exit(3)\n")
    cli = json.loads(subprocess.run([str(binary), "run", "--json", str(script)],
                                    capture_output=True, text=True, env=os.environ).stdout)
    ours = vibeos_exec.execute_code(script.read_text())
    assert set(cli) == set(ours)
    assert (ours["status"], ours["exit_code"]) == (cli["status"], cli["exit_code"]) == ("error", 3)


def test_script_calls_a_python_tool_and_a_builtin(tmp_path):
    (tmp_path / "notes.txt").write_text("alpha\nbeta\n")
    calls = []

    def shout(args):
        calls.append(args)
        return {"loud": args["x"].upper()}

    registry.register(name="shout", toolset="host", schema=echo_schema(), handler=shout,
                      script_callable=True)
    r = vibeos_exec.execute_code(
        "from vibeos_tools import shout, read_file\n"
        "page = read_file('notes.txt')\n"
        "print(shout(x=page['content'].splitlines()[0].split('|')[-1])['loud'])\n",
        cwd=tmp_path,
    )
    assert r["status"] == "success", r
    assert r["output"] == "ALPHA\n"
    assert r["tool_calls_made"] == 2
    assert calls == [{"x": "alpha"}]


def test_default_interpreter_is_the_hosts():
    r = vibeos_exec.execute_code("import sys; print(sys.executable)")
    assert r["status"] == "success", r
    assert r["interpreter"] == sys.executable
    assert os.path.normpath(r["output"].strip()) == os.path.normpath(sys.executable)


def test_config_is_read_and_arguments_override_it(home, tmp_path):
    (home / "config.yaml").write_text("code_execution:\n  max_tool_calls: 1\n  timeout: 1\n")
    script = ("from vibeos_tools import read_file\n"
              "print([('error' in read_file('/etc/hostname')) for _ in range(3)])\n")
    r = vibeos_exec.execute_code(script)
    assert r["output"].strip() == "[False, True, True]", r
    r = vibeos_exec.execute_code(script, max_tool_calls=2)
    assert r["output"].strip() == "[False, False, True]", r
    r = vibeos_exec.execute_code("import time; time.sleep(30)")
    assert r["status"] == "timeout"
    assert r["output"].rstrip().endswith("Script timed out after 1s and was killed.")
    r = vibeos_exec.execute_code("import os; print(os.getcwd())", timeout=20, cwd=str(tmp_path))
    assert r["output"].strip() == str(tmp_path.resolve())
    r = vibeos_exec.execute_code("print(1)", mode="project")
    assert r["mode"] == "project"


def test_an_unknown_mode_is_logged_and_runs_in_project_mode(home, caplog):
    (home / "config.yaml").write_text("code_execution:\n  mode: weird\n")
    with caplog.at_level(logging.DEBUG, logger="vibeos_exec"):
        r = vibeos_exec.execute_code("print(1)")
        again = vibeos_exec.execute_code("print(2)")
    assert r["status"] == "success" and r["mode"] == "project", r
    assert again["status"] == "success", again
    warnings = [rec.getMessage() for rec in caplog.records
                if rec.levelno == logging.WARNING and "is not a known mode" in rec.getMessage()]
    # Said when it appears, not at every call while the file stays as it is.
    assert warnings == ['code_execution.mode "weird" is not a known mode (project, strict); '
                        'using project'], warnings
    started = [rec.getMessage() for rec in caplog.records if "script started" in rec.getMessage()]
    # The interpreter is the host's own, not a code_execution.python setting (none is set).
    assert started and all("source=host sys.executable" in m for m in started), started


def test_a_configured_interpreter_is_named_as_the_setting(home, caplog):
    (home / "config.yaml").write_text(f"code_execution:\n  python: {sys.executable}\n")
    with caplog.at_level(logging.INFO, logger="vibeos_exec"):
        r = vibeos_exec.execute_code("print(1)")
    assert r["status"] == "success", r
    started = [rec.getMessage() for rec in caplog.records if "script started" in rec.getMessage()]
    assert started and "source=code_execution.python" in started[-1], started


def test_the_type_stubs_cover_every_native_function():
    """_native.pyi declares every function the extension exports, with its parameters."""
    import ast
    import inspect

    from vibeos_exec import _native

    tree = ast.parse((Path(vibeos_exec.__file__).parent / "_native.pyi").read_text())
    declared = {
        node.name: [a.arg for a in node.args.args]
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }
    # Classes a caller makes, by their constructor's parameters (the others are only returned).
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            init = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
            if init:
                declared[node.name] = [a.arg for a in init[0].args.args[1:]]
    exported = {
        name: [p for p in inspect.signature(fn).parameters]
        for name, fn in vars(_native).items()
        if callable(fn) and not name.startswith("_")
    }
    assert "shutdown_backends" in exported
    assert declared == exported


def test_a_broken_config_is_a_runtime_error(home):
    (home / "config.yaml").write_text("code_execution: [unclosed\n")
    with pytest.raises(RuntimeError, match="config"):
        vibeos_exec.execute_code("print(1)")


def test_an_unusable_configured_interpreter_is_a_config_error(home, tmp_path):
    """A code_execution.python that is missing or not executable is a broken config, raised as
    one (it came back as a failed execution; the CLI exits 2 for it)."""
    not_executable = tmp_path / "python3"
    not_executable.write_text("#!/bin/sh\n")
    for python in (tmp_path / "no-such-python", not_executable):
        (home / "config.yaml").write_text(f"code_execution:\n  python: {python}\n")
        words = (
            rf"vibeos config: config file {home}.*: "
            r"code_execution\.python is .*not an executable"
        )
        with pytest.raises(RuntimeError, match=words):
            vibeos_exec.execute_code("print(1)")
    # The host's own interpreter stays the default when nothing is configured.
    (home / "config.yaml").write_text("")
    assert vibeos_exec.execute_code("print(1)")["status"] == "success"


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"code": b"print(1)"}, "code"),
        ({"code": "print(1)", "mode": 3}, "mode"),
        ({"code": "print(1)", "timeout": "10"}, "timeout"),
        ({"code": "print(1)", "timeout": True}, "timeout"),
        ({"code": "print(1)", "max_tool_calls": 2.5}, "max_tool_calls"),
        ({"code": "print(1)", "cwd": 7}, "cwd"),
        ({"code": "print(1)", "enabled_tools": "read_file"}, "enabled_tools"),
        ({"code": "print(1)", "enabled_tools": [1]}, "enabled_tools"),
        ({"code": "print(1)", "task_id": 5}, "task_id"),
        ({"code": "print(1)", "stdout_limit": "big"}, "stdout_limit"),
        ({"code": "print(1)", "stderr_limit": 1.5}, "stderr_limit"),
    ],
)
def test_wrong_argument_types_name_the_parameter(kwargs, param):
    with pytest.raises(TypeError, match=param):
        vibeos_exec.execute_code(**kwargs)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"mode": "sandbox"}, "mode"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": -3}, "timeout"),
        ({"max_tool_calls": -1}, "max_tool_calls"),
        # Past what the extension takes: a ValueError naming the range, not an OverflowError.
        ({"max_tool_calls": 2**64}, "max_tool_calls must be a whole number of calls from 0 to"),
        ({"max_tool_calls": 2**80}, "max_tool_calls"),
        ({"timeout": 10**400}, r"timeout must be a positive number of seconds \(at most 86400\)"),
        ({"timeout": float("nan")}, "timeout"),
        ({"enabled_tools": ["execute_code"]}, "execute_code"),
        ({"enabled_tools": ["no_such_tool"]}, "no_such_tool"),
        ({"stdout_limit": 63}, "stdout_limit must be a whole number of bytes from 64 to 67108864"),
        ({"stderr_limit": 2**70}, "stderr_limit"),
    ],
)
def test_wrong_argument_values_are_value_errors(kwargs, words):
    with pytest.raises(ValueError, match=words):
        vibeos_exec.execute_code("print(1)", **kwargs)


class _BytesPath:
    """An os.PathLike whose path is bytes, as os functions accept."""

    def __init__(self, path: bytes) -> None:
        self.path = path

    def __fspath__(self) -> bytes:
        return self.path


def test_cwd_takes_str_bytes_and_path_likes_as_os_functions_do(tmp_path):
    """``cwd=b"/tmp"`` raised TypeError; os functions take bytes and os.PathLike of either."""
    code = "import os\nprint(os.getcwd())"
    expected = str(tmp_path.resolve())
    for cwd in (str(tmp_path), os.fsencode(tmp_path), tmp_path, _BytesPath(os.fsencode(tmp_path))):
        r = vibeos_exec.execute_code(code, cwd=cwd)
        assert r["status"] == "success" and r["output"].strip() == expected, (cwd, r)
    # The registry's direct calls take the same paths.
    (tmp_path / "f.txt").write_text("hi\n")
    out = json.loads(registry.handle_function_call(
        "read_file", {"path": "f.txt"}, cwd=os.fsencode(tmp_path)))
    assert "hi" in json.dumps(out), out
    for bad in (7, 1.5, ["/tmp"]):
        with pytest.raises(TypeError, match=(
                r"^cwd must be a str, bytes, os.PathLike or None, got " + type(bad).__name__)):
            vibeos_exec.execute_code(code, cwd=bad)
        with pytest.raises(TypeError, match=r"^cwd must be a str, bytes, os.PathLike or None"):
            registry.handle_function_call("read_file", {"path": "f.txt"}, cwd=bad)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"mode": "sandbox"}, "mode"),
        ({"mode": 3}, "mode"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"timeout": 10**400}, "timeout"),
        ({"timeout": "10"}, "timeout"),
        ({"max_tool_calls": -1}, "max_tool_calls"),
        ({"max_tool_calls": 2.5}, "max_tool_calls"),
        ({"stdout_limit": 1}, "stdout_limit"),
        ({"stderr_limit": "big"}, "stderr_limit"),
        ({"cwd": 7}, "cwd"),
        ({"enabled_tools": "read_file"}, "enabled_tools"),
        ({"enabled_tools": ["no_such_tool"]}, "enabled_tools"),
        ({"task_id": ""}, "task_id"),
        ({"task_id": 5}, "task_id"),
        ({"task_id": "a\0b"}, "task_id"),
        ({"task_id": "t" * 1025}, "task_id"),
    ],
)
def test_every_argument_error_names_the_argument_the_same_way(kwargs, param):
    """One form for every argument error: ``<name> must …`` (or ``<name> names …``). The
    limits checked by the extension read ``argument `timeout` must …`` while the ones checked
    in Python read ``max_tool_calls must …``."""
    with pytest.raises((TypeError, ValueError)) as info:
        vibeos_exec.execute_code("print(1)", **kwargs)
    message = str(info.value)
    assert message.startswith(f"{param} "), message
    assert "argument `" not in message, message


def test_aexecute_code_argument_errors_read_as_execute_codes():
    import asyncio

    with pytest.raises(ValueError) as info:
        asyncio.run(vibeos_exec.aexecute_code("print(1)", timeout=-1))
    assert str(info.value) == (
        "timeout must be a positive number of seconds (at most 86400), got -1")


@pytest.mark.parametrize("timeout", [1e-320, 5e-10])
def test_a_timeout_under_a_nanosecond_is_refused(timeout):
    """It was a zero duration: the script was killed at once, "timed out after 0s"."""
    with pytest.raises(ValueError, match=r"^timeout must be at least a nanosecond \(1e-9 seconds"):
        vibeos_exec.execute_code("print(1)", timeout=timeout)
    out = json.loads(registry.handle_function_call(
        "execute_code", {"code": "print(1)", "timeout": timeout}))
    assert "argument `timeout` must be at least a nanosecond" in out["error"], out


def test_output_limits_are_per_call(home):
    """SPEC §5: every limit is overridable per call, the output caps included."""
    (home / "config.yaml").write_text("code_execution:\n  stdout_limit: 100000\n")
    code = "import sys\nprint('x' * 5000)\nsys.stderr.write('e' * 5000)\nsys.exit(1)\n"
    r = vibeos_exec.execute_code(code, stdout_limit=1000, stderr_limit=300)
    assert 4001 <= r["stdout_bytes_omitted"] <= 5000, r
    assert r["stderr_bytes_omitted"] >= 4700, r
    assert vibeos_exec.execute_code(code)["stdout_bytes_omitted"] == 0


def test_empty_code_is_an_error_result():
    r = vibeos_exec.execute_code("   ")
    assert r["status"] == "error"
    assert "empty" in r["error"]


def test_a_start_error_quoting_a_secret_is_redacted(monkeypatch):
    """The error of an execution that could not start quotes what the caller gave (here a
    working dir named after a secret's value); it is redacted as a script's output is."""
    monkeypatch.setenv("MY_PROBE_API_TOKEN", "Zq9SuperSecretValue123")
    r = vibeos_exec.execute_code("print(1)", cwd="/nonexistent/Zq9SuperSecretValue123")
    assert r["status"] == "error", r
    assert "Zq9SuperSecretValue123" not in r["error"], r
    assert "[REDACTED" in r["error"] and r["redactions"] >= 1, r


def test_enabled_tools_narrows_the_stub():
    r = vibeos_exec.execute_code(
        "import vibeos_tools\nprint(hasattr(vibeos_tools, 'read_file'), hasattr(vibeos_tools, 'write_file'))",
        enabled_tools=["read_file"],
    )
    assert r["output"].strip() == "True False", r


def test_the_gil_is_released_while_a_script_runs():
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    try:
        r = vibeos_exec.execute_code("import time; time.sleep(1.0); print('done')")
    finally:
        stop.set()
        t.join()
    assert r["status"] == "success"
    assert ticks > 100, f"the counting thread only ran {ticks} times: the GIL was held"


def test_many_threads_at_once():
    registry.register(name="double", toolset="host",
                      schema={"type": "object", "properties": {"n": {"type": "integer"}}},
                      handler=lambda a: {"n": a["n"] * 2}, script_callable=True)
    results = {}

    def run(i):
        results[i] = vibeos_exec.execute_code(
            f"from vibeos_tools import double\nprint(sum(double(n={i})['n'] for _ in range(5)))",
            task_id=f"many-{i}",
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 8
    for i, r in results.items():
        assert r["status"] == "success", r
        assert r["output"].strip() == str(10 * i)
        assert r["tool_calls_made"] == 5


def test_interrupt_from_another_thread_kills_everything(tmp_path):
    pid_file = tmp_path / "pid"
    script = (
        "import subprocess, time\n"
        f"p = subprocess.Popen(['sleep', '300'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(300)\n"
    )
    box = {}
    t = threading.Thread(target=lambda: box.update(r=vibeos_exec.execute_code(script, task_id="int-1")))
    started = time.monotonic()
    t.start()
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert vibeos_exec.interrupt("int-1") == 1
    t.join(timeout=30)
    r = box["r"]
    assert r["status"] == "interrupted", r
    assert r["output"].startswith("started")
    assert r["output"].rstrip().endswith("[execution interrupted — user sent a new message]")
    assert time.monotonic() - started < 20
    assert not pid_alive(int(pid_file.read_text()))


def test_a_script_too_large_or_not_encodable_is_refused_naming_code():
    with pytest.raises(ValueError, match=r"^code is larger than 16 MiB"):
        vibeos_exec.execute_code("x = 1\n#" + "a" * (16 << 20))
    # Multi-byte characters count as their UTF-8 bytes, as the file holds them.
    with pytest.raises(ValueError, match=r"^code is larger than 16 MiB"):
        vibeos_exec.execute_code("#" + "\u00e9" * (9 << 20))
    with pytest.raises(ValueError, match=r"^code holds a character UTF-8 cannot encode.*index 7"):
        vibeos_exec.execute_code("print('\ud800')")
    r = vibeos_exec.execute_code("print(len('\u00e9' * 3))")
    assert r["output"] == "3\n", r


def test_interrupting_nothing_returns_zero():
    assert vibeos_exec.interrupt("nobody") == 0
    with pytest.raises(TypeError, match="task_id"):
        vibeos_exec.interrupt(3)


def test_an_empty_task_id_is_refused_and_cannot_interrupt_executions_without_one(tmp_path):
    # "" used to name every execution started without a task id: interrupt("") stopped them.
    marker = tmp_path / "started"
    script = (
        "import pathlib, time\n"
        f"pathlib.Path({str(marker)!r}).write_text('x')\n"
        "time.sleep(1.5)\n"
        "print('finished')\n"
    )
    box = {}
    t = threading.Thread(target=lambda: box.update(r=vibeos_exec.execute_code(script)))
    t.start()
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists()
    with pytest.raises(ValueError, match="task_id must not be empty.*interrupt_all"):
        vibeos_exec.interrupt("")
    t.join(timeout=30)
    assert box["r"]["status"] == "success", box["r"]
    assert box["r"]["output"] == "finished\n"
    with pytest.raises(ValueError, match="task_id must not be empty"):
        vibeos_exec.execute_code("print(1)", task_id="")
    with pytest.raises(ValueError, match="task_id must not be empty"):
        vibeos_exec.registry.handle_function_call("read_file", {"path": "x"}, task_id="")
    with pytest.raises(ValueError, match="task_id must not be empty"):
        vibeos_exec.registry.handle_function_calls([], task_id="")


SHUTDOWN_SCRIPT = """
    import os, sys, threading, time
    import vibeos_exec
    pid_file = sys.argv[1] if len(sys.argv) > 1 else {pid_file!r}
    script = (
        "import subprocess, time\\n"
        "p = subprocess.Popen(['sleep', '300'])\\n"
        f"open({{pid_file!r}}, 'w').write(str(p.pid))\\n"
        "time.sleep(300)\\n"
    )
    t = threading.Thread(target=lambda: vibeos_exec.execute_code(script), daemon={daemon})
    t.start()
    while not (os.path.exists(pid_file) and open(pid_file).read()):
        time.sleep(0.05)
    print("exiting", flush=True)
"""


@pytest.mark.parametrize("daemon", [True, False])
def test_interpreter_shutdown_with_a_running_execution(tmp_path, daemon):
    pid_file = str(tmp_path / "pid")
    started = time.monotonic()
    proc = run_python(SHUTDOWN_SCRIPT.format(pid_file=pid_file, daemon=daemon), timeout=60)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert "exiting" in proc.stdout
    assert "panick" not in proc.stderr and "Fatal" not in proc.stderr, proc.stderr
    assert elapsed < 30, f"shutdown waited {elapsed:.1f}s for the script"
    assert not pid_alive(int(Path(pid_file).read_text()))


# Each host below leaves a call from the extension into Python blocked past the wait that
# started it, then releases it as its last line: the call returns while the interpreter exits.
LATE_RETURNS = {
    "approval callback past approvals.timeout": """
        import threading, vibeos_exec
        from vibeos_exec import registry as R
        released = threading.Event()
        def ask(task_id, command, descriptions):
            released.wait(30)
            return "deny"
        vibeos_exec.set_approval_callback(ask)
        print(R.handle_function_call("terminal", {"command": "rm -rf ./nothing-here"},
                                     task_id="t"), flush=True)
        released.set()
    """,
    "tool handler past its execution's timeout": """
        import threading, vibeos_exec
        from vibeos_exec import registry as R
        released = threading.Event()
        def slow(args):
            released.wait(30)
            return {"ok": True}
        R.register(name="slow_tool", toolset="host", schema={"type": "object", "properties": {}},
                   handler=slow, script_callable=True)
        r = vibeos_exec.execute_code("from vibeos_tools import slow_tool\\nprint(slow_tool())",
                                     timeout=1)
        print(r["status"], flush=True)
        released.set()
    """,
    "check_fn past the check timeout": """
        import threading, vibeos_exec
        from vibeos_exec import registry as R
        released = threading.Event()
        def check():
            released.wait(30)
            return True
        R.register(name="checked_tool", toolset="host", schema={"type": "object", "properties": {}},
                   handler=lambda a: 1, check_fn=check)
        print(len(R.get_tool_definitions()), flush=True)
        released.set()
    """,
}


@pytest.mark.parametrize("case", sorted(LATE_RETURNS))
def test_a_call_into_python_returning_as_the_host_exits_does_not_abort_it(home, case):
    # It took the host down with SIGABRT ("FATAL: exception not rethrown"): CPython ends a
    # thread that takes the GIL while it finalizes with pthread_exit, which cannot unwind
    # through the extension's frames (stop 56's probe, 6 of 6 runs each).
    (home / "config.yaml").write_text("approvals:\n  timeout: 1\n")
    proc = run_python(LATE_RETURNS[case], timeout=90)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout.strip(), proc.stderr
    assert "FATAL" not in proc.stderr, proc.stderr


def test_ctrl_c_in_the_host_interrupts_and_raises_keyboard_interrupt():
    proc = run_python(
        """
        import os, signal, threading, time
        import vibeos_exec
        # A shell that starts the suite in the background leaves SIGINT ignored, and Python
        # then keeps it ignored: restore what an interactive host has.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        started = time.monotonic()
        try:
            vibeos_exec.execute_code("import time; time.sleep(60)")
            print("not interrupted")
        except KeyboardInterrupt:
            print("KeyboardInterrupt after", round(time.monotonic() - started))
        """,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out.startswith("KeyboardInterrupt after"), out
    assert int(out.split()[-1]) < 15


def test_shell_session_dirs_are_removed_when_the_host_exits():
    # terminal keeps each task's cwd and exported variables in a private dir of the host's
    # TMPDIR; a host that exits (without anyone calling a cleanup) must not leave them there.
    # (A short TMPDIR: the staging dir's socket path must fit in sun_path.)
    host_tmp = Path(tempfile.mkdtemp(prefix="vs-", dir="/tmp"))
    try:
        _check_session_dirs_removed(host_tmp)
    finally:
        shutil.rmtree(host_tmp, ignore_errors=True)


def _check_session_dirs_removed(host_tmp):
    proc = run_python(
        """
        import os, vibeos_exec
        r = vibeos_exec.execute_code(
            "from vibeos_tools import terminal\\n"
            "print(terminal('export SESSION_SECRET=kept-for-the-next-call; echo ran')['output'])\\n"
        )
        print(r["status"], r["output"].strip())
        print(sorted(n for n in os.listdir(os.environ["TMPDIR"]) if n.startswith("vibeos-shell-")))
        """,
        env={"TMPDIR": str(host_tmp)},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "success ran", proc.stdout
    # The session existed while the host ran ...
    assert lines[1] != "[]", proc.stdout
    # ... and is gone with it.
    assert [p.name for p in host_tmp.iterdir() if p.name.startswith("vibeos-shell-")] == []


def test_a_child_forked_after_use_gets_a_clear_error_and_a_spawned_worker_runs(tmp_path):
    # A fork copies none of the threads that run executions: the child waited for them for
    # ever, past its timeout (multiprocessing's default `fork` workers hung the same way).
    # From a file: spawned workers import the main module by its path.
    script = tmp_path / "host.py"
    script.write_text(
        """
import json, multiprocessing, os
import vibeos_exec


def job(n):
    return vibeos_exec.execute_code(f"print({n} * 2)")["output"]


if __name__ == "__main__":
    assert vibeos_exec.execute_code("print(0)")["status"] == "success"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            vibeos_exec.execute_code("print(1)", timeout=2)
            said = "ran"
        except RuntimeError as e:
            said = str(e)
        os.write(w, said.encode())
        os._exit(0)
    os.close(w)
    said = os.read(r, 4096).decode()
    os.waitpid(pid, 0)
    print(json.dumps(said))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(json.dumps(pool.map(job, [3])))
    # The parent still runs executions.
    print(json.dumps(vibeos_exec.execute_code("print(5)")["output"]))
"""
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(l) for l in proc.stdout.splitlines()]
    assert "forked from process" in lines[0] and "spawn" in lines[0], lines
    assert lines[1:] == [["6\n"], "5\n"], lines
