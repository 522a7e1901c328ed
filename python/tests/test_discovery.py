"""discover_tools: AST scan, only registering modules imported, broken ones logged and skipped."""

from __future__ import annotations

import logging
import textwrap

import pytest

import vibeos_exec
from vibeos_exec import registry
from vibeos_exec.discovery import module_registers_tools

from conftest import run_python


def write(dir_, name, body):
    (dir_ / name).write_text(textwrap.dedent(body))


@pytest.fixture
def tools_dir(tmp_path):
    d = tmp_path / "tools"
    d.mkdir()
    write(d, "alpha_tool.py", """
        from vibeos_exec import registry
        from alpha_helper import VALUE
        registry.register(name="alpha_tool", toolset="disc",
                          schema={"type": "object", "properties": {}},
                          handler=lambda args: {"value": VALUE})
    """)
    # A helper must not be imported by discovery (importing it would fail loudly) — but the
    # tool module above may import it.
    write(d, "alpha_helper.py", """
        VALUE = 41 + 1
    """)
    write(d, "not_a_tool.py", """
        raise RuntimeError("discovery must not import modules without a top-level register")
    """)
    write(d, "register_in_function.py", """
        import vibeos_exec
        raise RuntimeError("a register() inside a function does not count")
        def later():
            vibeos_exec.registry.register(name="never", toolset="disc", schema={}, handler=print)
    """)
    write(d, "broken_tool.py", """
        import module_that_does_not_exist_anywhere
        from vibeos_exec import registry
        registry.register(name="broken_tool", toolset="disc",
                          schema={"type": "object"}, handler=lambda a: {})
    """)
    write(d, "guarded_tool.py", """
        import vibeos_exec
        try:
            vibeos_exec.registry.register(name="guarded_tool", toolset="disc",
                                          schema={"type": "object"}, handler=lambda a: {"g": 1})
        except ValueError:
            pass
    """)
    write(d, "syntax_error.py", "registry.register(\n")
    write(d, "_private.py", "registry.register(name='private')\n")
    return d


def test_discovers_registering_modules_and_skips_broken_ones(tools_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="vibeos_exec.discovery"):
        loaded = vibeos_exec.discover_tools(tools_dir)
    assert loaded == ["alpha_tool", "guarded_tool"]
    names = registry.tool_names()
    assert "alpha_tool" in names and "guarded_tool" in names
    assert "broken_tool" not in names and "never" not in names
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "broken_tool.py" in messages and "ModuleNotFoundError" in messages
    assert "syntax_error.py" in messages
    assert registry.handle_function_call("alpha_tool", {}) == '{"value": 42}'


def test_a_module_calling_sys_exit_is_skipped_and_later_ones_load(tmp_path, caplog):
    d = tmp_path / "exiting"
    d.mkdir()
    write(d, "f_exits.py", """
        import sys
        sys.exit(1)
        from vibeos_exec import registry
        registry.register(name="f_exits", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {})
    """)
    write(d, "g_after.py", """
        from vibeos_exec import registry
        registry.register(name="g_after", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {"after": True})
    """)
    with caplog.at_level(logging.WARNING, logger="vibeos_exec.discovery"):
        loaded = vibeos_exec.discover_tools(d)
    assert loaded == ["g_after"]
    assert "g_after" in registry.tool_names() and "f_exits" not in registry.tool_names()
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "f_exits.py" in messages and "SystemExit" in messages


def test_a_plugin_calling_sys_exit_is_reported_and_skipped(tmp_path):
    d = tmp_path / "plugins"
    d.mkdir()
    write(d, "exits_plugin.py", """
        raise SystemExit("no optional dependency")
        from vibeos_exec import registry
        registry.register(name="exits_plugin", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {})
    """)
    report = vibeos_exec.load_plugins([d], entry_points=False, tracebacks=False)
    assert report.failed == {"exits_plugin": "SystemExit: no optional dependency"}


def test_module_registers_tools_reads_only_the_top_level(tools_dir):
    assert module_registers_tools(tools_dir / "alpha_tool.py")
    assert module_registers_tools(tools_dir / "guarded_tool.py")
    assert not module_registers_tools(tools_dir / "register_in_function.py")
    assert not module_registers_tools(tools_dir / "not_a_tool.py")


def test_bad_paths(tmp_path):
    with pytest.raises(TypeError, match="path"):
        vibeos_exec.discover_tools(3)
    with pytest.raises(NotADirectoryError):
        vibeos_exec.discover_tools(tmp_path / "missing")


def test_a_module_that_fails_after_registering_leaves_no_tool_behind(tmp_path, caplog):
    d = tmp_path / "late_failure"
    d.mkdir()
    write(d, "a_kept.py", """
        from vibeos_exec import registry
        registry.register(name="a_kept", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {"kept": True})
    """)
    # Registers two tools and replaces a_kept (twice, opening it to scripts), then fails:
    # skipped whole, so a_kept gets its first registration back, closed to scripts again.
    write(d, "b_half.py", """
        from vibeos_exec import registry
        registry.register(name="b_half", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {})
        registry.register(name="a_kept", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {"kept": False}, script_callable=True)
        registry.register(name="a_kept", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {"kept": "twice"})
        registry.register(name="b_half_too", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {})
        import module_that_does_not_exist_anywhere
    """)
    write(d, "c_after.py", """
        from vibeos_exec import registry
        registry.register(name="c_after", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {})
    """)
    with caplog.at_level(logging.WARNING, logger="vibeos_exec.discovery"):
        loaded = vibeos_exec.discover_tools(d)
    assert loaded == ["a_kept", "c_after"]
    names = registry.tool_names()
    assert "a_kept" in names and "c_after" in names
    assert "b_half" not in names and "b_half_too" not in names
    assert "b_half" not in {
        d["function"]["name"] for d in registry.get_tool_definitions(["disc"])
    }
    assert "b_half.py" in caplog.text and "ModuleNotFoundError" in caplog.text
    assert registry.handle_function_call("a_kept", {}) == '{"kept": true}'
    assert "a_kept" not in registry.script_tools()


def test_a_base_exception_from_a_module_skips_only_that_module(tmp_path, caplog):
    d = tmp_path / "base_exc"
    d.mkdir()
    write(d, "a_raises.py", """
        from vibeos_exec import registry
        registry.register(name="a_raises", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {})
        class Abort(BaseException):
            pass
        raise Abort("not an Exception")
    """)
    write(d, "b_generator_exit.py", """
        from vibeos_exec import registry
        registry.register(name="b_generator_exit", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {})
        raise GeneratorExit()
    """)
    # Not c_after.py: the previous test imported a module of that name from another file,
    # which this one would replace for the whole process (refused).
    write(d, "c_after_base.py", """
        from vibeos_exec import registry
        registry.register(name="c_after_base", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {})
    """)
    with caplog.at_level(logging.WARNING, logger="vibeos_exec.discovery"):
        loaded = vibeos_exec.discover_tools(d)
    assert loaded == ["c_after_base"]
    names = registry.tool_names()
    assert "c_after_base" in names
    assert "a_raises" not in names and "b_generator_exit" not in names
    assert "a_raises.py" in caplog.text and "Abort" in caplog.text
    assert "GeneratorExit" in caplog.text


def test_keyboard_interrupt_still_stops_discovery(tmp_path):
    d = tmp_path / "interrupted"
    d.mkdir()
    write(d, "a_interrupts.py", """
        from vibeos_exec import registry
        registry.register(name="a_interrupts", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {})
        raise KeyboardInterrupt
    """)
    write(d, "b_never.py", """
        from vibeos_exec import registry
        registry.register(name="b_never", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {})
    """)
    with pytest.raises(KeyboardInterrupt):
        vibeos_exec.discover_tools(d)
    names = registry.tool_names()
    assert "b_never" not in names and "a_interrupts" not in names


def test_a_plugin_that_fails_after_registering_leaves_no_tool_behind(tmp_path):
    # Plugins of a directory are imported by the same helper as discovered modules.
    d = tmp_path / "half_plugins"
    d.mkdir()
    write(d, "half_plugin.py", """
        from vibeos_exec import registry
        registry.register(name="half_plugin_tool", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {})
        raise RuntimeError("broken after registering")
    """)
    report = vibeos_exec.load_plugins([d], entry_points=False, tracebacks=False)
    assert report.failed == {"half_plugin": "RuntimeError: broken after registering"}
    assert "half_plugin_tool" not in registry.tool_names()


def test_a_failed_module_gives_replaced_tools_their_earlier_registration_back(tmp_path):
    # In a fresh interpreter: without the rollback, the built-in read_file would stay replaced
    # for every later test of this session.
    d = tmp_path / "replacing"
    d.mkdir()
    (tmp_path / "in.txt").write_text("hello\n")
    write(d, "a_replaces.py", """
        from vibeos_exec import registry
        S = {"type": "object", "properties": {"path": {"type": "string"}}}
        registry.register("read_file", "file", S, lambda a: {"mine": 1})
        # A host tool opened to scripts, re-registered closed by the module.
        registry.register("host_open", "disc", S, lambda a: {"host": 2})
        import missing_dep_xyz
    """)
    proc = run_python(f"""
        import json, vibeos_exec
        from vibeos_exec import registry
        S = {{"type": "object", "properties": {{"path": {{"type": "string"}}}}}}
        registry.register("host_open", "disc", S, lambda a: {{"host": 1}}, script_callable=True)
        print(vibeos_exec.discover_tools({str(d)!r}))
        print(registry.handle_function_call("read_file", {{"path": "in.txt"}},
                                            cwd={str(tmp_path)!r}))
        print(registry.handle_function_call("host_open", {{}}))
        print("host_open" in registry.script_tools(), "read_file" in registry.script_tools())
    """)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "[]"
    assert "hello" in lines[1] and "mine" not in lines[1], lines
    assert lines[2:] == ['{"host": 1}', "True True"]


def test_a_failed_module_closes_the_override_it_opened_for_a_plugin_source(tmp_path):
    # The host's override=True for a plugin source opens the name in the plugin override
    # policy; rolled back with the failed module, it must not stay open for the plugin.
    d = tmp_path / "widening"
    d.mkdir()
    write(d, "a_widens.py", """
        from vibeos_exec import registry
        S = {"type": "object", "properties": {"path": {"type": "string"}}}
        registry.register("read_file", "file", S, lambda a: {"mine": 1}, source="acme",
                          override=True)
        import missing_dep_xyz
    """)
    proc = run_python(f"""
        import vibeos_exec
        from vibeos_exec import registry
        S = {{"type": "object", "properties": {{"path": {{"type": "string"}}}}}}
        print(vibeos_exec.discover_tools({str(d)!r}))
        try:
            registry.register("read_file", "file", S, lambda a: {{"again": 1}}, source="acme")
            print("replaced by the plugin")
        except ValueError as e:
            print("refused:", "override policy" in str(e))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "refused: True"]


def test_discover_tools_refuses_an_empty_path(tmp_path, monkeypatch):
    # Path("") is ".": an unset setting passed on scanned (and imported from) the cwd.
    (tmp_path / "cwd_tool.py").write_text(
        "raise RuntimeError('the current directory was scanned')\n"
        "from vibeos_exec import registry\nregistry.register('cwd_tool', 'x', {}, len)\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="path is empty"):
        vibeos_exec.discover_tools("")


def test_the_scan_finds_aliases_and_loops_but_not_function_bodies(tmp_path):
    cases = {
        "alias_from.py": """
            from vibeos_exec import registry as reg
            reg.register(name="a", toolset="t", schema={}, handler=len)
        """,
        "alias_import.py": """
            import vibeos_exec.registry as r
            r.register(name="a", toolset="t", schema={}, handler=len)
        """,
        "alias_guarded.py": """
            try:
                from vibeos_exec import registry as reg
            except ImportError:
                reg = None
            if reg:
                reg.register(name="a", toolset="t", schema={}, handler=len)
        """,
        "for_loop.py": """
            from vibeos_exec import registry
            for n in ("a", "b"):
                registry.register(name=n, toolset="t", schema={}, handler=len)
        """,
        "while_loop.py": """
            import vibeos_exec
            while True:
                vibeos_exec.registry.register(name="a", toolset="t", schema={}, handler=len)
                break
        """,
        "for_else.py": """
            from vibeos_exec import registry
            for _ in ():
                pass
            else:
                registry.register(name="a", toolset="t", schema={}, handler=len)
        """,
        "match_block.py": """
            import sys
            from vibeos_exec import registry
            match sys.platform:
                case "linux":
                    registry.register(name="a", toolset="t", schema={}, handler=len)
                case _:
                    pass
        """,
    }
    not_registering = {
        "in_function.py": """
            from vibeos_exec import registry as reg
            def later():
                reg.register(name="a", toolset="t", schema={}, handler=len)
        """,
        "in_class.py": """
            from vibeos_exec import registry as reg
            class Later:
                reg.register(name="a", toolset="t", schema={}, handler=len)
        """,
        "alias_in_function.py": """
            def setup():
                from vibeos_exec import registry as reg
            reg.register(name="a", toolset="t", schema={}, handler=len)
        """,
        "other_module_alias.py": """
            import logging as reg
            reg.register(name="a", toolset="t", schema={}, handler=len)
        """,
    }
    for name, body in {**cases, **not_registering}.items():
        write(tmp_path, name, body)
    for name in cases:
        assert module_registers_tools(tmp_path / name), name
    for name in not_registering:
        assert not module_registers_tools(tmp_path / name), name
    # async with / async for blocks are walked too (valid only where top-level await is).
    import ast
    from vibeos_exec.discovery import _is_register_call, _top_level

    tree = compile("async with x:\n    registry.register(name='a')\n", "<top-level await>",
                   "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    assert any(isinstance(s, ast.Expr) and _is_register_call(s.value)
               for s in _top_level(tree.body))


def test_the_scan_reads_files_as_python_decodes_them(tmp_path):
    body = ('from vibeos_exec import registry\n'
            'registry.register(name="é", toolset="t", schema={}, handler=len)\n')
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbf" + body.encode())
    (tmp_path / "latin1.py").write_bytes(("# -*- coding: latin-1 -*-\n" + body).encode("latin-1"))
    (tmp_path / "not_utf8.py").write_bytes(body.encode("latin-1"))
    assert module_registers_tools(tmp_path / "bom.py")
    assert module_registers_tools(tmp_path / "latin1.py")
    assert not module_registers_tools(tmp_path / "not_utf8.py")


def test_discovering_a_directory_twice_imports_its_modules_again(tmp_path):
    d = tmp_path / "twice"
    d.mkdir()
    write(d, "twice_tool.py", """
        from vibeos_exec import registry
        registry.register(name="twice_tool", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {"twice": True})
    """)
    assert vibeos_exec.discover_tools(d) == ["twice_tool"]
    assert vibeos_exec.discover_tools(d) == ["twice_tool"]
    assert registry.handle_function_call("twice_tool", {}) == '{"twice": true}'


def test_a_tool_module_named_like_a_standard_module_is_refused(tmp_path, caplog):
    d = tmp_path / "shadowing"
    d.mkdir()
    write(d, "json.py", """
        from vibeos_exec import registry
        registry.register(name="json_shadow", toolset="disc", schema={"type": "object"},
                          handler=lambda a: {})
    """)
    with caplog.at_level(logging.WARNING, logger="vibeos_exec.discovery"):
        assert vibeos_exec.discover_tools(d) == []
    import json
    import sys

    assert sys.modules["json"] is json and json.dumps([1]) == "[1]"
    assert "json_shadow" not in registry.tool_names()
    assert "standard-library module `json`; rename the file" in caplog.text


def test_files_that_would_hang_or_exhaust_the_scan_are_skipped_and_the_rest_load(tmp_path):
    # A FIFO named *.py hung discovery for ever, a link to /dev/zero read until memory ran out,
    # and a deeply nested expression raised RecursionError out of discover_tools (and out of
    # the plugin host, losing every plugin): stop 56's probe. Each is now logged and skipped.
    import os

    d = tmp_path / "tools"
    d.mkdir()
    register = ("from vibeos_exec import registry\n"
                "registry.register(name='{name}', toolset='disc-edge',"
                " schema={{'type': 'object', 'properties': {{}}}}, handler=lambda a: {{}})\n")
    os.mkfifo(d / "b_fifo.py")
    os.symlink("/dev/zero", d / "c_zero.py")
    (d / "d_deep.py").write_text(register.format(name="deep_tool") + "x = " + "1+" * 200_000 + "1\n")
    (d / "e_huge.py").write_text(register.format(name="huge_tool") + "x = 1\n" * 200_000)
    (d / "z_good.py").write_text(register.format(name="edge_good_tool"))
    proc = run_python(
        f"""
        import logging, sys
        logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
        import vibeos_exec
        print(vibeos_exec.discover_tools({str(d)!r}))
        """,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['z_good']", (proc.stdout, proc.stderr)
    for name, why in [("b_fifo.py", "not a regular file"), ("c_zero.py", "not a regular file"),
                      ("d_deep.py", "too deeply nested"), ("e_huge.py", "bytes")]:
        assert name in proc.stderr and why in proc.stderr, (name, proc.stderr)
