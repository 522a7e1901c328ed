"""Tool discovery (SPEC §7, the seeds' ``discover_builtin_tools``).

A tools directory may hold helper modules next to tool modules, and importing a helper can be
slow or have side effects. So each ``*.py`` file is parsed first, and only modules with a
*top-level* ``registry.register(...)`` call (or ``<anything>.registry.register(...)``) are
imported; calls inside functions do not count. A module that fails to import (a missing optional
dependency, a syntax error, a ``sys.exit()`` while importing) is logged and skipped; the others
still load. Skipped means skipped whole: the tools it registered before it failed are removed
again, since their module never finished loading (its handlers may need what never ran), and a
tool it replaced gets its earlier registration back.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Union

from . import _native, registry

__all__ = ["discover_tools", "module_registers_tools"]

log = logging.getLogger("vibeos_exec.discovery")


def _is_register_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if not (isinstance(func, ast.Attribute) and func.attr == "register"):
        return False
    target = func.value
    return (isinstance(target, ast.Name) and target.id == "registry") or (
        isinstance(target, ast.Attribute) and target.attr == "registry"
    )


def module_registers_tools(path: Union[str, "os.PathLike[str]"]) -> bool:
    """Whether the file at ``path`` has a top-level ``registry.register(...)`` call.

    Statements directly in the module body count, including those under a top-level ``if``,
    ``try`` or ``with`` (optional-dependency guards); function and class bodies do not.
    Unreadable or unparsable files count as not registering (and are logged).
    """
    try:
        source = Path(path).read_text(encoding="utf-8")
        tree = ast.parse(source, filename=os.fspath(path))
    except (OSError, SyntaxError, ValueError) as exc:
        log.warning("tool discovery: cannot parse %s: %s", path, exc)
        return False

    def body_registers(stmts: List[ast.stmt]) -> bool:
        for stmt in stmts:
            if isinstance(stmt, ast.Expr) and _is_register_call(stmt.value):
                return True
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                if _is_register_call(stmt.value):
                    return True
            nested: List[List[ast.stmt]] = []
            if isinstance(stmt, ast.If):
                nested = [stmt.body, stmt.orelse]
            elif isinstance(stmt, ast.Try):
                nested = [stmt.body, stmt.orelse, stmt.finalbody] + [h.body for h in stmt.handlers]
            elif isinstance(stmt, ast.With):
                nested = [stmt.body]
            if any(body_registers(b) for b in nested):
                return True
        return False

    return body_registers(tree.body)


def tool_module_files(directory: Path) -> List[Path]:
    """The tool modules of ``directory`` in name order: ``*.py`` files not starting with ``_``
    that have a top-level ``registry.register(...)`` call."""
    return [
        f
        for f in sorted(directory.glob("*.py"))
        if not f.name.startswith("_") and module_registers_tools(f)
    ]


def import_module_file(file: Path) -> None:
    """Imports ``file`` under its stem (kept in ``sys.modules``); raises what the import raised.

    When the import raises, the module's registrations are undone: a tool it added is removed,
    a tool it replaced (a built-in included) gets its earlier registration back, opening to
    scripts included. The caller puts the file's directory on ``sys.path`` if siblings must
    resolve.
    """
    name = file.stem
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot build an import spec for {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # Record this module's registrations and what each name held before, and hand them on to
    # an enclosing recorder (a plugin being loaded, or a module, that discovers tools) only if
    # the module loads.
    outer, outer_previous = registry._recorder, registry._previous
    recorded: List[str] = []
    previous: Dict[str, Any] = {}
    registry._recorder, registry._previous = recorded, previous
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        _undo_registrations(file, previous)
        raise
    finally:
        registry._recorder, registry._previous = outer, outer_previous
    if outer is not None:
        outer.extend(recorded)
    if outer_previous is not None:
        for tool, held in previous.items():
            outer_previous.setdefault(tool, held)


def _undo_registrations(file: Path, previous: Dict[str, Any]) -> None:
    """Gives every name ``file`` registered before its import failed what it held before (see
    :func:`import_module_file`)."""
    for tool, held in previous.items():
        if held.replaced:
            log.info("tool discovery: %s failed after replacing tool `%s`; its earlier "
                     "registration is restored", file, tool)
        _native.restore_tool(held)


def discover_tools(path: Union[str, "os.PathLike[str]"]) -> List[str]:
    """Imports every tool module in directory ``path`` and returns the imported module names.

    Files are visited in name order; ``__init__.py`` and files starting with ``_`` are skipped.
    Each module is imported under its file stem (and kept in ``sys.modules``), with ``path`` on
    ``sys.path`` while it imports so sibling helpers resolve. Import failures (any exception,
    ``SystemExit`` and any other ``BaseException``; not ``KeyboardInterrupt``) are logged with
    their traceback at WARNING and skipped, and the failed module's registrations are undone
    (tools it added removed, tools it replaced given their earlier registration back).

    Raises:
        TypeError: ``path`` is not a str or os.PathLike.
        NotADirectoryError: ``path`` is not a directory.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    directory = Path(path)
    if not directory.is_dir():
        raise NotADirectoryError(f"tool discovery: {directory} is not a directory")
    loaded: List[str] = []
    with importable_from(directory):
        for file in tool_module_files(directory):
            name = file.stem
            try:
                import_module_file(file)
            except KeyboardInterrupt:
                # That is the user: stop discovering.
                raise
            # Every other BaseException too: a module calling sys.exit() while importing (a
            # missing optional dependency, often), or raising its own BaseException subclass, is
            # one failing module, not a request to stop the host.
            except BaseException as exc:  # noqa: BLE001 - one broken module must not stop the rest
                log.warning("tool discovery: skipping %s: %s: %s", file, type(exc).__name__, exc,
                            exc_info=True)
                continue
            loaded.append(name)
    return loaded


@contextlib.contextmanager
def importable_from(directory: Path) -> Iterator[None]:
    """Puts ``directory`` first on ``sys.path`` while the block runs (so modules found there can
    import their sibling helpers), and takes it off again unless it was already there."""
    dir_str = str(directory.resolve())
    added = dir_str not in sys.path
    if added:
        sys.path.insert(0, dir_str)
    try:
        yield
    finally:
        if added:
            try:
                sys.path.remove(dir_str)
            except ValueError:
                pass
