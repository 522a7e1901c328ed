"""Dangerous-command approval from Python hosts: sync and async callbacks, the timeout, the
smart approver, and the hardline tier that nothing approves."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest

import vibeos_exec
from vibeos_exec import registry


@pytest.fixture(autouse=True)
def _no_callbacks():
    yield
    vibeos_exec.set_approval_callback(None)
    vibeos_exec.set_smart_approver(None)


def terminal(command: str, cwd: Path) -> dict:
    # One task id per test directory: a task's terminal keeps its shell session (cwd) between
    # calls, so a shared id would run this test's commands in another test's directory.
    return json.loads(registry.handle_function_call(
        "terminal", {"command": command}, task_id=f"approval-{cwd.name}", cwd=str(cwd)))


def doomed(tmp_path: Path, name: str = "doomed") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "f").write_text("x")
    return d


def test_async_callback_answers_from_another_task(tmp_path):
    target = doomed(tmp_path)
    asked: list = []

    async def main():
        questions: asyncio.Queue = asyncio.Queue()
        answers: asyncio.Queue = asyncio.Queue()

        async def approve(task_id, command, descriptions):
            await questions.put((task_id, command, descriptions))
            return await answers.get()

        async def ui():
            # Another task of the host's loop: sees the question, answers it.
            while True:
                q = await questions.get()
                asked.append(q)
                await answers.put("session")

        vibeos_exec.set_approval_callback(approve)
        ui_task = asyncio.create_task(ui())
        try:
            return await vibeos_exec.aexecute_code(
                "from vibeos_tools import terminal\n"
                "r = terminal('rm -rf doomed')\n"
                "print(r.get('exit_code'), r.get('error'))\n",
                cwd=str(tmp_path), task_id="async-approval")
        finally:
            ui_task.cancel()

    r = asyncio.run(main())
    assert r["status"] == "success", r
    assert r["output"].startswith("0 None"), r
    assert not target.exists()
    # Interactive approvals: the whole script was asked about first; "session" then covered
    # the terminal command of the same task.
    assert len(asked) == 1, asked
    task_id, command, descriptions = asked[0]
    assert task_id == "async-approval"
    assert "from vibeos_tools import terminal" in command
    assert any("recursive delete" in d for d in descriptions), descriptions


def test_sync_callback_deny_once_and_bad_answers(tmp_path):
    target = doomed(tmp_path)
    answers = iter(["deny", "maybe", None, 42, False, "once"])
    seen = []

    def approve(task_id, command, descriptions):
        seen.append(command)
        return next(answers)

    vibeos_exec.set_approval_callback(approve)
    r = terminal("rm -rf doomed", tmp_path)
    assert "denied by the user" in r["error"], r
    # An answer that is none of the four words refuses, naming it: nobody chose to deny.
    for said in ("'maybe'", "None", "42"):
        r = terminal("rm -rf doomed", tmp_path)
        assert "denied by the user" not in r["error"], r
        assert f"was {said}, not one of once, session, always, deny" in r["error"], r
    r = terminal("rm -rf doomed", tmp_path)  # False: a plain denial
    assert "denied by the user" in r["error"], r
    assert target.exists()
    r = terminal("rm -rf doomed", tmp_path)
    assert r["exit_code"] == 0, r
    assert not target.exists()
    assert seen == ["rm -rf doomed"] * 6
    with pytest.raises(TypeError):
        vibeos_exec.set_approval_callback(42)


def test_an_unanswered_request_times_out_to_deny(home, tmp_path):
    (home / "config.yaml").write_text("approvals:\n  timeout: 0.5\n")
    target = doomed(tmp_path)

    async def never(task_id, command, descriptions):
        await asyncio.sleep(30)
        return "once"

    vibeos_exec.set_approval_callback(never)
    started = time.monotonic()
    r = terminal("rm -rf doomed", tmp_path)
    assert "approvals.timeout" in r["error"], r
    assert time.monotonic() - started < 10
    assert target.exists()


def test_hardline_refuses_even_with_mode_off(home, tmp_path):
    (home / "config.yaml").write_text(
        "approvals:\n  mode: off\ncommand_allowlist:\n  - root_delete\n  - recursive_delete\n")
    calls = []
    vibeos_exec.set_approval_callback(lambda *a: calls.append(a) or "always")
    # `--help` makes rm print its usage and exit, should this ever run at all.
    r = terminal("rm -rf / --help", tmp_path)
    assert "hardline" in r["error"], r
    assert "Usage" not in json.dumps(r)
    assert calls == []
    # mode off approves what is merely dangerous, without asking.
    target = doomed(tmp_path)
    assert terminal("rm -rf doomed", tmp_path)["exit_code"] == 0
    assert not target.exists() and calls == []


def test_smart_approver_approves_denies_and_escalates(home, tmp_path):
    (home / "config.yaml").write_text("approvals:\n  mode: smart\n")
    scratch, keep, other = (doomed(tmp_path, n) for n in ("scratch", "keep", "other"))

    async def smart(task_id, command, descriptions):
        if "scratch" in command:
            return "approve"
        return "deny" if "keep" in command else "escalate"

    vibeos_exec.set_smart_approver(smart)
    assert terminal("rm -rf scratch", tmp_path)["exit_code"] == 0
    assert "smart approver" in terminal("rm -rf keep", tmp_path)["error"]
    # Escalated with nobody to ask: the non-interactive denial.
    assert "non-interactive" in terminal("rm -rf other", tmp_path)["error"]
    assert not scratch.exists() and keep.exists() and other.exists()


def test_rust_log_records_reach_python_logging(home, tmp_path, caplog):
    import logging

    (home / "config.yaml").write_text("approvals:\n  mode: sometimes\n")
    with caplog.at_level(logging.WARNING, logger="vibeos_exec"):
        terminal("rm -rf not-there", tmp_path)
    records = [r for r in caplog.records if "approvals.mode" in r.getMessage()]
    assert records, [r.getMessage() for r in caplog.records]
    assert records[0].name.startswith("vibeos_exec.vibeos_tools")
    assert records[0].levelno == logging.WARNING


def test_whole_script_guard_asks_only_where_approvals_are_interactive(tmp_path):
    target = doomed(tmp_path)
    script = "import subprocess\nsubprocess.run('rm -rf doomed', shell=True)\nprint('ran')\n"
    # Headless (no callback, no TTY): today's policy, the script runs.
    r = vibeos_exec.execute_code(script, cwd=str(tmp_path), task_id="guard-1")
    assert r["output"].strip() == "ran" and not target.exists(), r
    # A host is there to ask: the script is asked about before it runs; "deny" stops it.
    target = doomed(tmp_path)
    seen = []
    vibeos_exec.set_approval_callback(lambda t, c, d: seen.append((t, c, d)) or "deny")
    r = vibeos_exec.execute_code(script, cwd=str(tmp_path), task_id="guard-2")
    assert r["status"] == "error" and "was not run" in r["error"], r
    assert target.exists()
    assert seen and seen[0][0] == "guard-2" and "subprocess.run" in seen[0][1]
    # A script without dangerous patterns is not asked about.
    seen.clear()
    r = vibeos_exec.execute_code("print(1 + 1)", cwd=str(tmp_path), task_id="guard-3")
    assert r["output"].strip() == "2" and seen == [], r


def test_a_session_answer_without_task_id_does_not_outlive_its_call(tmp_path):
    # Without a task id, "session" lasts while calls without one run: the next execution and
    # the next direct call are asked again (not approved for every later caller).
    answers = ["session", "deny", "deny"]
    asked = []

    def approve(task_id, command, descriptions):
        asked.append(task_id)
        return answers[len(asked) - 1]

    vibeos_exec.set_approval_callback(approve)
    # `exit 0; ` first: the check sees the whole line, the shell stops before git.
    script = ("from vibeos_tools import terminal\n"
              "c = 'echo RAN; exit 0; git clean' + ' -f'\n"
              "print(terminal(c).get('output'))\nprint(terminal(c).get('output'))\n")
    r = vibeos_exec.execute_code(script, cwd=str(tmp_path))
    assert r["output"].split() == ["RAN", "RAN"], r
    assert len(asked) == 1, asked  # the second command of the same execution: remembered
    r = vibeos_exec.execute_code(script, cwd=str(tmp_path))
    assert "RAN" not in r["output"] and len(asked) == 2, (r, asked)
    out = json.loads(registry.handle_function_call(
        "terminal", {"command": "echo RAN; exit 0; git clean -f"}, cwd=str(tmp_path)))
    assert "denied by the user" in out["error"] and len(asked) == 3, (out, asked)


def test_a_failing_callback_is_not_reported_as_the_users_denial(tmp_path):
    def broken(task_id, command, descriptions):
        raise RuntimeError("approval UI is down")

    vibeos_exec.set_approval_callback(broken)
    r = terminal("echo RAN; exit 0; rm -rf doomed", tmp_path)
    assert "denied by the user" not in r["error"], r
    assert "RuntimeError: approval UI is down" in r["error"], r
    assert "approval callback failed" in r["error"], r


def test_a_failing_callback_s_exception_is_logged_redacted(tmp_path, caplog):
    # The exception's text quoted a token; the refusal redacted it, the log line did not.
    token = "sk-proj-Q9x7Lm2Pz8Rt4Vb6Nc1Kd5Fg3Hj0WsAb12Cd34"

    def broken(task_id, command, descriptions):
        raise RuntimeError(f"kaboom {token}")

    vibeos_exec.set_approval_callback(broken)
    with caplog.at_level(logging.WARNING, logger="vibeos_exec"):
        r = terminal("echo RAN; exit 0; rm -rf doomed", tmp_path)
    assert "approval callback failed" in r["error"] and token not in r["error"], r
    logged = [rec.getMessage() for rec in caplog.records if "kaboom" in rec.getMessage()]
    assert logged, [rec.getMessage() for rec in caplog.records]
    assert all(token not in m and "[REDACTED" in m for m in logged), logged


def test_an_answer_whose_repr_fails_is_refused_without_a_logging_error(tmp_path, capfd, caplog):
    class Odd:
        def __repr__(self):
            raise RuntimeError("no repr")

    vibeos_exec.set_approval_callback(lambda task_id, command, descriptions: Odd())
    with caplog.at_level(logging.WARNING, logger="vibeos_exec"):
        r = terminal("echo RAN; exit 0; rm -rf doomed", tmp_path)
    assert "denied by the user" not in r["error"], r
    assert "<Odd object whose repr failed>" in r["error"], r
    assert "Logging error" not in capfd.readouterr().err


def test_a_command_approved_after_its_execution_ended_does_not_run(tmp_path):
    """An approval can outlast the script that asked: the command must not run once its
    execution is over (it once ran after the timeout, and what it started outlived it)."""
    target = doomed(tmp_path)

    def slow_yes(task_id, command, descriptions):
        if "vibeos_tools" in command:  # the whole-script check, where interactive
            return "once"
        time.sleep(3)
        return "once"

    vibeos_exec.set_approval_callback(slow_yes)
    marker = tmp_path / "ran"
    code = (
        "from vibeos_tools import terminal\n"
        f"print(terminal('rm -rf {target} && touch {marker}'))\n"
    )
    r = vibeos_exec.execute_code(code, timeout=1, cwd=str(tmp_path))
    assert r["status"] == "timeout", r
    # The callback answers 2 s after the result; give the command every chance to run.
    time.sleep(3)
    assert target.exists() and not marker.exists(), "the approved command ran after its execution"
