"""Python tools in the shared registry: sync/async handlers, error wrapping, overrides, opt-in."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

import vibeos_exec
from vibeos_exec import registry

from conftest import echo_schema, run_python


def call_in_script(tool: str, args: str = "x='hi'", **kwargs) -> dict:
    r = vibeos_exec.execute_code(
        f"import json\nfrom vibeos_tools import {tool}\nprint(json.dumps({tool}({args})))",
        **kwargs,
    )
    assert r["status"] == "success", r
    return json.loads(r["output"])


def test_exceptions_become_the_wrapped_error_in_scripts_and_direct_calls():
    def broken(args):
        raise ValueError(f"bad input {args['x']}")

    registry.register(name="broken", toolset="host", schema=echo_schema(), handler=broken,
                      script_callable=True)
    assert call_in_script("broken") == {"error": "Tool execution failed: ValueError: bad input hi"}
    direct = json.loads(registry.handle_function_call("broken", {"x": "yo"}))
    assert direct == {"error": "Tool execution failed: ValueError: bad input yo"}


def test_an_exception_whose_message_cannot_be_read_is_reported_under_its_own_type():
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no str")

    def broken(args):
        raise Unprintable()

    registry.register(name="unprintable", toolset="host", schema=echo_schema(), handler=broken)
    direct = json.loads(registry.handle_function_call("unprintable", {"x": "yo"}))
    assert direct == {"error": "Tool execution failed: Unprintable: <the exception's message "
                               "could not be read: RuntimeError>"}


def test_results_that_are_not_json():
    registry.register(name="objy", toolset="host", schema=echo_schema(),
                      handler=lambda a: {"thing": object()}, script_callable=True)
    registry.register(name="texty", toolset="host", schema=echo_schema(),
                      handler=lambda a: "plain words", script_callable=True)
    registry.register(name="jsony", toolset="host", schema=echo_schema(),
                      handler=lambda a: json.dumps({"ok": a["x"]}), script_callable=True)
    err = call_in_script("objy")["error"]
    assert err.startswith("Tool execution failed: TypeError: `objy` returned a dict, which is not JSON")
    texty = call_in_script("texty")
    assert texty["result"] == "plain words" and "not JSON" in texty["note"]
    assert call_in_script("jsony") == {"ok": "hi"}
    # NaN and infinities are not JSON: an error naming them, not the dict passed off as text.
    registry.register(name="nanny", toolset="host", schema=echo_schema(),
                      handler=lambda a: {"v": float("nan")}, script_callable=True)
    err = call_in_script("nanny")["error"]
    assert err.startswith("Tool execution failed: ValueError: `nanny` returned a dict, which is not JSON"), err
    assert "NaN" in err or "nan" in err, err


def test_async_handlers_run_and_their_errors_are_wrapped():
    async def slow_upper(args):
        await asyncio.sleep(0.01)
        return {"upper": args["x"].upper()}

    async def async_fail(args):
        await asyncio.sleep(0)
        raise KeyError("missing")

    registry.register(name="slow_upper", toolset="host", schema=echo_schema(),
                      handler=slow_upper, script_callable=True)
    registry.register(name="async_fail", toolset="host", schema=echo_schema(),
                      handler=async_fail, is_async=True, script_callable=True)
    assert call_in_script("slow_upper") == {"upper": "HI"}
    assert call_in_script("async_fail") == {"error": "Tool execution failed: KeyError: 'missing'"}


def test_handlers_get_the_task_id_and_coerced_arguments():
    seen = []

    def record(args, task_id=None):
        seen.append((args, task_id))
        return {"ok": True}

    registry.register(name="record", toolset="host",
                      schema={"type": "object", "properties": {"n": {"type": "integer"}}},
                      handler=record, script_callable=True)
    call_in_script("record", "n='7'", task_id="task-42")
    assert seen == [({"n": 7}, "task-42")]


def test_register_and_handle_function_call_take_the_specs_arguments_in_order():
    # SPEC §7 writes register(name, toolset, schema, handler, check_fn, requires_env, is_async,
    # description, emoji, max_result_size_chars, override) and handle_function_call(name, args,
    # task_id, ...): `override` and `task_id` were keyword-only (stop 56's probe).
    seen = []

    def record(args, task_id=None):
        seen.append(task_id)
        return {"ok": True}

    registry.register("pos_tool", "host_a", echo_schema(), record, None, [], False, "d", "",
                      None, False)
    with pytest.raises(ValueError):
        registry.register("pos_tool", "host_b", echo_schema(), record, None, [], False, "d", "",
                          None, False)
    registry.register("pos_tool", "host_b", echo_schema(), record, None, [], False, "d2", "",
                      None, True)
    assert json.loads(registry.handle_function_call("pos_tool", {"x": "1"}, "task-7")) == {
        "ok": True}
    assert seen == ["task-7"]


def test_a_blocking_handler_does_not_deadlock_and_the_timeout_holds():
    release = threading.Event()
    entered = threading.Event()

    def stuck(args):
        entered.set()
        release.wait(60)
        return {"late": True}

    registry.register(name="stuck", toolset="host", schema=echo_schema(), handler=stuck,
                      script_callable=True)
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    started = time.monotonic()
    try:
        r = vibeos_exec.execute_code("from vibeos_tools import stuck\nprint(stuck(x='a'))", timeout=2)
    finally:
        stop.set()
        counter.join()
        release.set()
    assert entered.is_set()
    assert r["status"] == "timeout", r
    assert time.monotonic() - started < 15
    assert ticks > 100


def test_same_toolset_replaces_cross_toolset_needs_override():
    proc = run_python(
        """
        import json, vibeos_exec
        from vibeos_exec import registry
        schema = {"type": "object", "properties": {"path": {"type": "string"},
                  "content": {"type": "string"}}, "required": ["path", "content"]}
        # Another toolset: shadowing the built-in is refused without override=True.
        try:
            registry.register(name="write_file", toolset="host", schema=schema,
                              handler=lambda a: {"host": a["path"]})
            print("registered without override")
        except ValueError as e:
            print("refused:", "override=True" in str(e), "`file`" in str(e))
        # The same toolset (as the original system's web_search example): last wins.
        registry.register(name="web_search", toolset="web",
                          schema={"type": "object", "properties": {"query": {"type": "string"}}},
                          handler=lambda a: {"mine": a["query"]})
        print(registry.handle_function_call("web_search", {"query": "q"}))
        registry.register(name="write_file", toolset="host", schema=schema,
                          handler=lambda a: {"host": a["path"]}, override=True)
        r = vibeos_exec.execute_code("from vibeos_tools import write_file\\nprint(write_file('p', 'c'))")
        print(r["output"].strip())
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "refused: True True",
        '{"mine": "q"}',
        "{'host': 'p'}",
    ]


def test_host_tools_reach_scripts_only_when_opted_in():
    registry.register(name="private_tool", toolset="host", schema=echo_schema(),
                      handler=lambda a: {"secret": 1})
    assert "private_tool" not in registry.script_tools()
    r = vibeos_exec.execute_code("import vibeos_tools\nprint(hasattr(vibeos_tools, 'private_tool'))")
    assert r["output"].strip() == "False"
    vibeos_exec.allow_in_scripts(["private_tool"])
    try:
        assert call_in_script("private_tool") == {"secret": 1}
    finally:
        vibeos_exec.disallow_in_scripts("private_tool")
    assert "private_tool" not in registry.script_tools()


def test_a_tool_closed_while_a_script_runs_is_refused_to_it(tmp_path):
    """A script's tools are fixed when it starts; a host that re-registers one without
    `script_callable` meanwhile closes it: the running script's later calls are refused, not
    handed to the new handler (stop 58's probe reached both later handlers)."""
    registry.register(name="closing_tool", toolset="host", schema=echo_schema(),
                      handler=lambda a: {"ver": 1}, script_callable=True)
    code = (
        "import os, time\nfrom vibeos_tools import closing_tool\n"
        "print(closing_tool()['ver'])\nopen('ready', 'w').close()\n"
        "while not os.path.exists('closed'):\n    time.sleep(0.01)\n"
        "try:\n    print(closing_tool())\nexcept Exception as e:\n    print('refused:', e)\n"
    )
    out = {}
    runner = threading.Thread(
        target=lambda: out.update(vibeos_exec.execute_code(code, cwd=str(tmp_path), timeout=60)))
    runner.start()
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    registry.register(name="closing_tool", toolset="host", schema=echo_schema(),
                      handler=lambda a: {"ver": 2})
    (tmp_path / "closed").touch()
    runner.join(60)
    lines = out["output"].splitlines()
    assert lines[0] == "1", out
    assert "no longer available" in lines[1] and "'ver': 2" not in lines[1], out


@pytest.mark.parametrize("name", ["execute_code", "delegate_task", "todo", "memory"])
def test_some_tools_can_never_be_opened_to_scripts(name):
    with pytest.raises(ValueError, match=name):
        vibeos_exec.allow_in_scripts([name])


def test_check_fn_gates_availability():
    registry.register(name="gated_off", toolset="host", schema=echo_schema(),
                      handler=lambda a: {}, check_fn=lambda: False, script_callable=True)

    def explode():
        raise RuntimeError("probe failed")

    registry.register(name="gated_err", toolset="host", schema=echo_schema(),
                      handler=lambda a: {}, check_fn=explode, script_callable=True)
    registry.register(name="gated_on", toolset="host", schema=echo_schema(),
                      handler=lambda a: {}, check_fn=lambda: True, script_callable=True)
    tools = registry.script_tools()
    assert "gated_on" in tools
    assert "gated_off" not in tools and "gated_err" not in tools
    names = [d["function"]["name"] for d in registry.get_tool_definitions()]
    assert "gated_on" in names and "gated_off" not in names


def test_openai_style_schema_and_definitions():
    registry.register(
        name="weather", toolset="host", emoji="☀",
        schema={"name": "weather", "description": "Weather for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}},
        handler=lambda a: {"city": a["city"], "sky": "clear"},
    )
    defs = {d["function"]["name"]: d for d in registry.get_tool_definitions(["host"])}
    assert defs["weather"]["function"]["description"] == "Weather for a city."
    assert defs["weather"]["function"]["parameters"]["required"] == ["city"]
    out = json.loads(registry.handle_function_call("weather", {"city": "Oslo"}))
    assert out == {"city": "Oslo", "sky": "clear"}
    missing = json.loads(registry.handle_function_call("weather", {}))
    assert "error" in missing


def test_results_over_the_cap_are_truncated():
    registry.register(name="big", toolset="host", schema=echo_schema(),
                      handler=lambda a: "y" * 500, max_result_size_chars=50, script_callable=True)
    out = call_in_script("big")
    assert out["truncated"] is True and len(out["content"]) == 50


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"name": 1}, "name"),
        ({"toolset": None}, "toolset"),
        ({"schema": "object"}, "schema"),
        ({"handler": 3}, "handler"),
        ({"check_fn": "yes"}, "check_fn"),
        ({"requires_env": "KEY"}, "requires_env"),
        ({"is_async": "no"}, "is_async"),
        ({"description": 5}, "description"),
        ({"max_result_size_chars": "10"}, "max_result_size_chars"),
        ({"override": 1}, "override"),
    ],
)
def test_register_type_errors_name_the_parameter(kwargs, param):
    base = dict(name="typed", toolset="host", schema=echo_schema(), handler=lambda a: {})
    base.update(kwargs)
    with pytest.raises(TypeError, match=param):
        registry.register(**base)


def test_register_value_errors():
    with pytest.raises(ValueError, match="requires `ghost`"):
        registry.register(name="bad_schema", toolset="host",
                          schema={"type": "object", "required": ["ghost"]}, handler=lambda a: {})
    with pytest.raises(ValueError, match="names must be"):
        registry.register(name="bad name!", toolset="host", schema=echo_schema(),
                          handler=lambda a: {})
    # Longer than model APIs accept as a function name: one such tool made a provider refuse
    # the whole tool list.
    with pytest.raises(ValueError, match="1 to 64 characters"):
        registry.register(name="x" * 65, toolset="host", schema=echo_schema(),
                          handler=lambda a: {})
    registry.register(name="y" * 64, toolset="host", schema=echo_schema(), handler=lambda a: {})
    assert registry.unregister("y" * 64)
    with pytest.raises(ValueError, match="execute_code"):
        registry.register(name="execute_code", toolset="host", schema=echo_schema(),
                          handler=lambda a: {}, script_callable=True)


def test_unregister():
    registry.register(name="temp_tool", toolset="host", schema=echo_schema(), handler=lambda a: {})
    assert "temp_tool" in registry.tool_names()
    assert registry.unregister("temp_tool") is True
    assert registry.unregister("temp_tool") is False


def test_tool_definitions_describe_the_configured_execute_code(home):
    (home / "config.yaml").write_text(
        "code_execution:\n  mode: strict\n  timeout: 42\n  max_tool_calls: 7\n"
        "  stdout_limit: 2048\n"
    )
    defs = registry.get_tool_definitions(["code_execution"])
    desc = next(d for d in defs if d["function"]["name"] == "execute_code")["function"][
        "description"
    ]
    assert "Mode strict" in desc, desc
    assert "killed after 42s" in desc and "at most 7 tool calls" in desc, desc
    assert "stdout is capped at 2 KB" in desc, desc


def test_handle_function_calls_plans_a_turn_and_keeps_call_order(tmp_path):
    import threading

    inside = 0
    peak = 0
    lock = threading.Condition()

    def slow_read(args):
        # Waits (bounded) for a partner call to be inside at the same time: observation, not
        # timing, of parallel execution.
        nonlocal inside, peak
        with lock:
            inside += 1
            peak = max(peak, inside)
            lock.notify_all()
            lock.wait_for(lambda: inside >= 2, timeout=1.0)
            peak = max(peak, inside)
            inside -= 1
        return {"read": args["x"]}

    registry.register(name="slow_read", toolset="host", schema=echo_schema(), handler=slow_read,
                      parallel_safe=True)
    (tmp_path / "in.txt").write_text("hello\n")
    out = registry.handle_function_calls(
        [
            {"name": "slow_read", "arguments": {"x": "a"}},
            {"function": {"name": "slow_read", "arguments": json.dumps({"x": "b"})}},
            {"name": "write_file", "arguments": {"path": "out1.txt", "content": "1"}},
            {"name": "write_file", "args": {"path": "out2.txt", "content": "2"}},
            {"name": "read_file", "arguments": {"path": "in.txt"}},
            {"name": "nope", "arguments": "{not json"},
            ("write_file", {"path": "out3.txt", "content": "3"}),
        ],
        cwd=str(tmp_path),
    )
    results = [json.loads(r) for r in out]
    assert results[0] == {"read": "a"} and results[1] == {"read": "b"}
    assert peak == 2, "the two read-only calls did not run in parallel"
    assert (tmp_path / "out1.txt").read_text() == "1" and (tmp_path / "out2.txt").read_text() == "2"
    assert "hello" in out[4]
    assert "error" in results[5]
    assert (tmp_path / "out3.txt").read_text() == "3" and len(out) == 7
    with pytest.raises(TypeError):
        registry.handle_function_calls("write_file")


def test_interrupt_stops_execute_code_started_through_handle_function_call():
    import threading

    box = {}

    def run():
        box["r"] = json.loads(registry.handle_function_call(
            "execute_code", {"code": "import time\nprint('started', flush=True)\ntime.sleep(60)"},
            task_id="hfc-interrupt"))

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 20
    while vibeos_exec.interrupt("hfc-interrupt") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    t.join(30)
    assert not t.is_alive()
    assert box["r"]["status"] == "interrupted", box["r"]


def test_a_check_fn_shared_by_tools_runs_once_per_definitions_call():
    calls = []

    def check():
        calls.append(1)
        return True

    class Probe:
        def __init__(self):
            self.calls = 0

        def ready(self):
            self.calls += 1
            return True

    probe = Probe()
    for name in ("shared_a1", "shared_a2", "shared_a3"):
        registry.register(name=name, toolset="shared", schema=echo_schema(),
                          handler=lambda a: {}, check_fn=check)
    # A bound method is a new object at every attribute access: still one check.
    for name in ("method_b1", "method_b2"):
        registry.register(name=name, toolset="shared", schema=echo_schema(),
                          handler=lambda a: {}, check_fn=probe.ready)
    names = [d["function"]["name"] for d in registry.get_tool_definitions(["shared"])]
    assert names == ["method_b1", "method_b2", "shared_a1", "shared_a2", "shared_a3"]
    assert (len(calls), probe.calls) == (1, 1)
    # Cached per definitions call, not forever.
    registry.get_tool_definitions(["shared"])
    assert (len(calls), probe.calls) == (2, 2)
    # Another instance's method is another check.
    registry.register(name="method_b3", toolset="shared", schema=echo_schema(),
                      handler=lambda a: {}, check_fn=Probe().ready)
    registry.get_tool_definitions(["shared"])
    assert (len(calls), probe.calls) == (3, 3)


def test_the_stub_the_script_tools_and_the_description_agree(tmp_path):
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    # Names vibeos_tools cannot define are refused when opened, and nothing is registered.
    for bad in ("with-dash", "1abc", "class", "json_parse", "retry"):
        with pytest.raises(ValueError, match=f"cannot let scripts call `{bad}`: vibeos_tools "
                                             "cannot define it"):
            registry.register(name=bad, toolset="host", schema=schema, handler=lambda a: a,
                              script_callable=True)
        assert bad not in registry.tool_names()
        with pytest.raises(ValueError, match="vibeos_tools cannot define it"):
            vibeos_exec.allow_in_scripts(bad)
    seen = []

    def k(args):
        seen.append(args)
        return args

    registry.register(name="k", toolset="host", handler=k, script_callable=True,
                      schema={"type": "object", "properties": {
                          "class": {"type": "string"}, "a-b": {"type": "integer"}}})
    defs = registry.get_tool_definitions()
    desc = next(d for d in defs if d["function"]["name"] == "execute_code")["function"][
        "description"]
    import_line = next(line for line in desc.splitlines() if "from vibeos_tools import" in line)
    listed = import_line.split("import ", 1)[1].split("`", 1)[0].split(", ")
    assert listed == registry.script_tools(), (listed, registry.script_tools())
    assert "k" in listed
    # No description: the signature alone, no dangling colon.
    assert "- k(class_=None, a_b=None)\n" in desc, desc
    r = vibeos_exec.execute_code(
        "import json, inspect, vibeos_tools\n"
        "from vibeos_tools import k\n"
        f"print(json.dumps(sorted(vibeos_tools._TOOLS)))\n"
        "print(inspect.signature(k))\n"
        "print(json.dumps([k(**{'class': 'a'}), k(class_='b'), k(**{'a-b': 1}), k(a_b=2)]))\n"
        "try:\n    k(class_='c', **{'class': 'd'})\nexcept TypeError as e:\n    print('TypeError')\n",
        cwd=tmp_path,
    )
    assert r["status"] == "success", r
    stub_tools, signature, results, refused = r["output"].splitlines()
    assert json.loads(stub_tools) == sorted(listed)
    assert signature == "(class_=None, a_b=None)"
    expected = [{"class": "a"}, {"class": "b"}, {"a-b": 1}, {"a-b": 2}]
    assert json.loads(results) == expected
    assert seen == expected
    assert refused == "TypeError"


@pytest.mark.parametrize("size", [0, -1, 2**64, 2**80])
def test_max_result_size_chars_out_of_range_is_a_value_error(size):
    with pytest.raises(ValueError, match="max_result_size_chars must be a positive int from 1 to"):
        registry.register(name="sized", toolset="host", schema=echo_schema(),
                          handler=lambda a: {}, max_result_size_chars=size)
    assert "sized" not in registry.tool_names()


def test_execute_code_calls_give_scripts_only_the_tools_the_definitions_named(tmp_path):
    probe = ("import vibeos_tools\n"
             "print(','.join(n for n in ('terminal', 'read_file', 'web_search')"
             " if hasattr(vibeos_tools, n)))")

    def stub_tools(**kw):
        r = json.loads(registry.handle_function_call("execute_code", {"code": probe},
                                                     cwd=str(tmp_path), **kw))
        assert r["status"] == "success", r
        return r["output"].strip().split(",")

    try:
        defs = registry.get_tool_definitions(disabled_toolsets=["terminal"])
        desc = next(d for d in defs if d["function"]["name"] == "execute_code")
        assert "terminal(" not in desc["function"]["description"]
        # What the model was told is what its script gets.
        assert "terminal" not in stub_tools()
        assert "read_file" in stub_tools()
        turn = registry.handle_function_calls(
            [{"name": "execute_code", "arguments": {"code": probe}}], cwd=str(tmp_path))
        assert "terminal" not in json.loads(turn[0])["output"]
        # A call's own selection comes first.
        assert stub_tools(enabled_toolsets=["terminal"]) == ["terminal"]
        assert "terminal" in stub_tools(disabled_toolsets=[])
        with pytest.raises(ValueError, match="no_such_toolset"):
            stub_tools(enabled_toolsets=["no_such_toolset"])
        # Definitions of everything select everything again.
        registry.get_tool_definitions()
        assert {"terminal", "read_file"} <= set(stub_tools())
    finally:
        registry.get_tool_definitions()


def test_an_async_check_fn_is_awaited_and_counts_like_a_sync_one():
    async def off():
        return False

    async def on():
        await asyncio.sleep(0)
        return True

    async def broken():
        raise RuntimeError("probe failed")

    for name, check in (("ac_off", off), ("ac_on", on), ("ac_err", broken),
                        # A sync callable handing back a coroutine is awaited too.
                        ("ac_lambda", lambda: off())):
        registry.register(name=name, toolset="acheck", schema=echo_schema(),
                          handler=lambda a: {}, check_fn=check, script_callable=True)
    names = {d["function"]["name"] for d in registry.get_tool_definitions(enabled_toolsets=["acheck"])}
    assert names == {"ac_on"}
    tools = registry.script_tools()
    assert "ac_on" in tools
    assert not {"ac_off", "ac_err", "ac_lambda"} & set(tools)


def test_bad_arguments_of_one_call_fail_that_call_only(tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    out = registry.handle_function_calls(
        [
            {"name": "read_file", "arguments": "[1]"},
            {"name": "read_file", "arguments": "42"},
            {"name": "read_file", "arguments": '"str"'},
            {"name": "read_file", "arguments": [1]},
            {"function": {"name": "read_file", "arguments": "{not json"}},
            {"name": "read_file", "arguments": {"path": "in.txt"}},
            {"name": "read_file", "arguments": '{"path": NaN}'},
        ],
        cwd=str(tmp_path),
    )
    results = [json.loads(r) for r in out]
    assert results[6]["error"].startswith(
        "Error executing read_file: arguments are not valid JSON (NaN is not a JSON value"), results[6]
    prefix = "Error executing read_file: arguments must be a JSON object, got "
    assert [r["error"] for r in results[:4]] == [
        prefix + "an array", prefix + "a number", prefix + "a string", prefix + "an array"]
    # Text that is not JSON says so, with the parser's reason, not "got a string".
    err = results[4]["error"]
    assert err.startswith("Error executing read_file: arguments are not valid JSON (Expecting"), err
    assert "JSON object" in err, err
    assert "hello" in out[5]


def test_re_registering_without_script_callable_closes_the_tool_again():
    registry.register(name="st", toolset="host", schema=echo_schema(),
                      handler=lambda a: {"v": 1}, script_callable=True)
    assert "st" in registry.script_tools()
    registry.register(name="st", toolset="host", schema=echo_schema(), handler=lambda a: {"v": 2})
    assert "st" not in registry.script_tools()
    r = vibeos_exec.execute_code("import vibeos_tools\nprint(hasattr(vibeos_tools, 'st'))")
    assert r["output"].strip() == "False"
    # An opening the host made with allow_in_scripts is its own decision, not the
    # registration's: re-registering keeps it.
    vibeos_exec.allow_in_scripts("st")
    try:
        registry.register(name="st", toolset="host", schema=echo_schema(),
                          handler=lambda a: {"v": 3})
        assert "st" in registry.script_tools()
        assert call_in_script("st") == {"v": 3}
    finally:
        vibeos_exec.disallow_in_scripts("st")


def test_host_tools_refuse_missing_required_arguments_before_the_handler():
    seen = []
    registry.register(
        name="needs_city", toolset="host",
        schema={"type": "object",
                "properties": {"city": {"type": "string"}, "note": {"type": ["string", "null"]},
                               "days": {"type": "integer"}},
                "required": ["city", "note"]},
        handler=lambda a: seen.append(a) or {"ok": a["city"]})
    missing = "Tool execution failed: InvalidArguments: missing required argument"
    assert json.loads(registry.handle_function_call("needs_city", {"note": "n"})) == {
        "error": f"{missing} `city`"}
    # null stands for "not given" unless the schema lets the argument be null.
    assert json.loads(registry.handle_function_call("needs_city", {"city": None, "note": None})) == {
        "error": f"{missing} `city`"}
    assert json.loads(registry.handle_function_call("needs_city", {})) == {
        "error": "Tool execution failed: InvalidArguments: missing required arguments `city`, `note`"}
    # The same shape as the type check's.
    assert json.loads(registry.handle_function_call("needs_city", {"city": "x", "days": "many"})) == {
        "error": "Tool execution failed: InvalidArguments: argument `days` must be an integer, "
                 "got \"many\""}
    assert seen == []
    assert json.loads(registry.handle_function_call("needs_city", {"city": "Oslo", "note": None})) == {
        "ok": "Oslo"}
    assert seen == [{"city": "Oslo", "note": None}]


def test_execute_code_refuses_an_argument_it_cannot_take():
    r = json.loads(registry.handle_function_call(
        "execute_code", {"code": "print('ran')", "mode": "strict"}))
    assert "no argument `mode`" in r["error"], r
    assert "mode and cwd are the host's settings" in r["error"], r


def test_is_async_on_a_handler_that_returns_its_result_directly():
    registry.register(name="flagged_sync", toolset="host", schema=echo_schema(),
                      handler=lambda a: {"got": a}, is_async=True)
    assert json.loads(registry.handle_function_call("flagged_sync", {"x": "a"})) == {
        "got": {"x": "a"}}


def test_an_empty_toolset_name_is_an_error_not_every_tool():
    # [""] used to select every toolset, terminal included (stop 53).
    for kwargs in ({"enabled_toolsets": [""]}, {"disabled_toolsets": [" "]}):
        with pytest.raises(ValueError, match="empty toolset name"):
            registry.get_tool_definitions(**kwargs)


def test_an_empty_enabled_toolsets_list_selects_no_tool(tmp_path):
    """SPEC §7: enabled → only those. ``enabled_toolsets=[]`` returned every tool (``[]`` was
    taken for "no selection"), where ``execute_code(enabled_tools=[])`` gives an empty stub."""
    probe = ("import vibeos_tools\n"
             "print(sorted(n for n in ('terminal', 'read_file', 'web_search')"
             " if hasattr(vibeos_tools, n)))")

    def stub_tools(**kw):
        r = json.loads(registry.handle_function_call("execute_code", {"code": probe},
                                                     cwd=str(tmp_path), **kw))
        assert r["status"] == "success", r
        return r["output"].strip()

    assert len(registry.get_tool_definitions()) > 0
    try:
        assert registry.get_tool_definitions(enabled_toolsets=[]) == []
        assert registry.get_tool_definitions([], ["web"]) == []
        # The remembered selection is "none" too: the script the model was told nothing of
        # gets no tool.
        assert stub_tools() == "[]"
        registry.get_tool_definitions()
        assert stub_tools() == "['read_file', 'terminal']"
        # A call's own empty selection: none, not every one.
        assert stub_tools(enabled_toolsets=[]) == "[]"
        turn = registry.handle_function_calls(
            [{"name": "execute_code", "arguments": {"code": probe}}], cwd=str(tmp_path),
            enabled_toolsets=[], disabled_toolsets=None)
        assert json.loads(turn[0])["output"].strip() == "[]"
        # None still means every toolset.
        assert "terminal" in stub_tools(enabled_toolsets=None, disabled_toolsets=[])
    finally:
        registry.get_tool_definitions()


def test_a_direct_call_of_an_unavailable_tool_is_refused_with_why():
    """SPEC §7: check_fn gates availability. A tool left out of the definitions and the stub
    ran anyway when the host called it by name."""
    ran = []

    def handler(args):
        ran.append(args)
        return {"ran": True}

    def explode():
        raise RuntimeError("probe failed")

    async def async_off():
        return False

    registry.register(name="gated_off", toolset="gates", schema=echo_schema(), handler=handler,
                      check_fn=lambda: False, requires_env=["VIBEOS_TEST_SURELY_UNSET"])
    registry.register(name="gated_err", toolset="gates", schema=echo_schema(), handler=handler,
                      check_fn=explode)
    registry.register(name="gated_async", toolset="gates", schema=echo_schema(),
                      handler=handler, check_fn=async_off)
    registry.register(name="gated_on", toolset="gates", schema=echo_schema(), handler=handler,
                      check_fn=lambda: True)
    assert [d["function"]["name"] for d in registry.get_tool_definitions(["gates"])] == [
        "gated_on"]
    expected = {
        "gated_off": "check failed; missing env: VIBEOS_TEST_SURELY_UNSET",
        "gated_err": "check raised an error: RuntimeError: probe failed",
        "gated_async": "check failed",
    }
    for name, why in expected.items():
        out = json.loads(registry.handle_function_call(name, {"x": "a"}))
        assert out == {"error": f"Error executing {name}: unavailable: {why}"}, out
    turn = registry.handle_function_calls([("gated_err", {"x": "b"}), ("gated_on", {"x": "c"})])
    assert json.loads(turn[0]) == {
        "error": "Error executing gated_err: unavailable: " + expected["gated_err"]}
    assert json.loads(turn[1]) == {"ran": True}
    assert ran == [{"x": "c"}], "an unavailable tool ran"
    assert json.loads(registry.handle_function_call("gated_on", {"x": "d"})) == {"ran": True}
    # `requires_env` alone describes, it does not gate (SPEC §7: the check does), here as in
    # the definitions.
    registry.register(name="env_only", toolset="gates", schema=echo_schema(), handler=handler,
                      requires_env=["VIBEOS_TEST_SURELY_UNSET"])
    assert "env_only" in [d["function"]["name"] for d in registry.get_tool_definitions(["gates"])]
    assert json.loads(registry.handle_function_call("env_only", {"x": "e"})) == {"ran": True}


@pytest.mark.parametrize("call", [vibeos_exec.allow_in_scripts, vibeos_exec.disallow_in_scripts,
                                  vibeos_exec.register_skill_env])
def test_functions_taking_names_say_they_take_a_str_or_a_list(call):
    for wrong in (5, None, b"x"):
        with pytest.raises(TypeError) as info:
            call(wrong)
        assert str(info.value) == f"names must be a str or a list of str, got {type(wrong).__name__}"
    with pytest.raises(TypeError, match="names must be a list of str, but holds a int"):
        call(["ok", 5])
