"""Tool discovery (SPEC §7, the seeds' ``discover_builtin_tools``).

A tools directory may hold helper modules next to tool modules, and importing a helper can be
slow or have side effects. So each ``*.py`` file is parsed first, and only modules with a
*top-level* ``registry.register(...)`` call (or ``<anything>.registry.register(...)``, or
``<name>.register(...)`` where a top-level import bound ``<name>`` to a registry module) are
imported; calls inside functions and classes do not count. A file is parsed as Python would
import it (its bytes, so a UTF-8 BOM and a PEP 263 coding cookie are honoured). A module that
fails to import (a missing optional dependency, a ``sys.exit()`` while importing) is logged and
skipped; the others still load. Skipped means skipped whole: the tools it registered before it
failed are removed again, since their module never finished loading (its handlers may need what
never ran), and a tool it replaced gets its earlier registration back.

Each module is imported under its file stem, so a file whose stem names a standard-library
module or a module already imported from elsewhere (``json.py``, ``logging.py``) is refused
rather than imported: it would replace that module for the whole process.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import logging
import os
import stat
import sys
from pathlib import Path
from typing import AbstractSet, Any, Dict, Iterator, List, Optional, Set, Union

from . import registry

__all__ = ["discover_tools", "module_registers_tools"]

log = logging.getLogger("vibeos_exec.discovery")


def _is_registry_module(module: str) -> bool:
    """Whether the dotted ``module`` names a registry module (``registry``, ``x.registry``)."""
    return module.rsplit(".", 1)[-1] == "registry"


def _registry_aliases(stmts: List[ast.stmt]) -> Set[str]:
    """Names a top-level import binds to a registry module: ``from vibeos_exec import registry
    as reg``, ``import vibeos_exec.registry as reg`` (any module named ``registry``, as the
    ``registry.register`` rule takes any ``registry``)."""
    names: Set[str] = set()
    for stmt in _top_level(stmts):
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if alias.name == "registry":
                    names.add(alias.asname or alias.name)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname and _is_registry_module(alias.name):
                    names.add(alias.asname)
    return names


def _is_register_call(node: ast.AST, aliases: AbstractSet[str] = frozenset()) -> bool:
    """Whether ``node`` is ``registry.register(...)``, ``<anything>.registry.register(...)`` or
    ``<alias>.register(...)`` for a name in ``aliases`` (see :func:`_registry_aliases`)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if not (isinstance(func, ast.Attribute) and func.attr == "register"):
        return False
    target = func.value
    return (isinstance(target, ast.Name) and (target.id == "registry" or target.id in aliases)) or (
        isinstance(target, ast.Attribute) and target.attr == "registry"
    )


#: ``try`` statements: ``try ... except*`` (``ast.TryStar``) is 3.11+.
_TRY = tuple(getattr(ast, n) for n in ("Try", "TryStar") if hasattr(ast, n))
#: ``match`` statements (3.10+); an empty tuple matches nothing before.
_MATCH = tuple(getattr(ast, n) for n in ("Match",) if hasattr(ast, n))


def _nested_bodies(stmt: ast.stmt) -> List[List[ast.stmt]]:
    """The statement blocks of ``stmt`` that run when the module body runs: those of ``if``,
    ``for``, ``while``, ``try``, ``with`` (async ones too) and ``match``; not function or class
    bodies, which run (if ever) when called."""
    if isinstance(stmt, (ast.If, ast.For, ast.AsyncFor, ast.While)):
        return [stmt.body, stmt.orelse]
    if isinstance(stmt, _TRY):
        return [stmt.body, stmt.orelse, stmt.finalbody] + [h.body for h in stmt.handlers]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [stmt.body]
    if isinstance(stmt, _MATCH):
        return [case.body for case in stmt.cases]  # type: ignore[attr-defined]
    return []


def _top_level(stmts: List[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement that runs as part of the module body: ``stmts`` and, recursively, the
    blocks of :func:`_nested_bodies`."""
    for stmt in stmts:
        yield stmt
        for body in _nested_bodies(stmt):
            yield from _top_level(body)


#: Largest file the scan parses. Tool modules are small; parsing costs about 600 MB of memory
#: and 3 s per MiB, so one huge file must not hold up (or exhaust) the discovery of the rest.
MAX_SCANNED_BYTES = 1 << 20


def _read_module_source(path: Union[str, "os.PathLike[str]"]) -> bytes:
    """The bytes of the regular file at ``path`` (at most :data:`MAX_SCANNED_BYTES`). Opened
    without blocking, so a FIFO named ``*.py`` cannot hang the scan, and refused unless it is a
    regular file (a link to ``/dev/zero`` would read for ever): ``ValueError``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > MAX_SCANNED_BYTES:
            raise ValueError(
                f"{info.st_size} bytes, more than the {MAX_SCANNED_BYTES} a tool module may have"
            )
        chunks = []
        left = MAX_SCANNED_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise ValueError(f"more than the {MAX_SCANNED_BYTES} bytes a tool module may have")
        return b"".join(chunks)
    finally:
        os.close(fd)


def scan_module_file(path: Union[str, "os.PathLike[str]"]) -> bool:
    """Whether the file at ``path`` has a top-level ``registry.register(...)`` call (see
    :func:`module_registers_tools`); raises what reading or parsing it raised (``OSError``,
    ``SyntaxError``, ``ValueError`` — also for a file that is not a regular one, is larger than
    :data:`MAX_SCANNED_BYTES`, or nests too deeply for the parser), so a caller can report an
    unparsable file.

    The file is parsed from its bytes, as the import system compiles it: a UTF-8 BOM and a
    PEP 263 coding cookie are honoured, and a file Python cannot import fails here too.
    """
    source = _read_module_source(path)
    try:
        return _registers_tools(ast.parse(source, filename=os.fspath(path)))
    except (RecursionError, MemoryError) as exc:
        raise ValueError(f"too deeply nested or too large to parse ({type(exc).__name__})") from None


def _registers_tools(tree: ast.Module) -> bool:
    aliases = _registry_aliases(tree.body)
    for stmt in _top_level(tree.body):
        if isinstance(stmt, ast.Expr) and _is_register_call(stmt.value, aliases):
            return True
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            if _is_register_call(stmt.value, aliases):
                return True
    return False


def module_registers_tools(path: Union[str, "os.PathLike[str]"]) -> bool:
    """Whether the file at ``path`` has a top-level ``registry.register(...)`` call.

    Statements directly in the module body count, including those under a top-level ``if``,
    ``try``, ``with``, ``for``, ``while`` or ``match`` (optional-dependency guards, loops
    registering a family of tools); function and class bodies do not. The registry may be
    reached as ``registry``, ``<anything>.registry``, or any name a top-level import bound to a
    registry module (``from vibeos_exec import registry as reg``). Unreadable or unparsable
    files count as not registering (and are logged); :func:`scan_module_file` raises instead.
    """
    try:
        return scan_module_file(path)
    except (OSError, SyntaxError, ValueError) as exc:
        log.warning("tool discovery: cannot parse %s: %s", path, exc)
        return False


def tool_module_files(
    directory: Path, unparsable: Optional[Dict[Path, str]] = None
) -> List[Path]:
    """The tool modules of ``directory`` in name order: ``*.py`` files not starting with ``_``
    that have a top-level ``registry.register(...)`` call.

    A file that cannot be read or parsed is logged and left out; given ``unparsable``, it is
    put there instead (file → ``ExceptionType: message``), so a caller that reports failures
    (:func:`vibeos_exec.load_plugins`) can list it rather than drop it silently.
    """
    files = []
    for f in sorted(directory.glob("*.py")):
        if f.name.startswith("_"):
            continue
        if unparsable is None:
            if module_registers_tools(f):
                files.append(f)
            continue
        try:
            if scan_module_file(f):
                files.append(f)
        except (OSError, SyntaxError, ValueError) as exc:
            unparsable[f] = f"{type(exc).__name__}: {exc}"
    return files


def _taken_by(name: str, file: Path) -> Optional[str]:
    """What already owns the module name ``name``, when importing ``file`` under it would
    replace that for the whole process: a module in ``sys.modules`` not loaded from ``file``, or
    a standard-library or builtin module (imported or not: a later ``import json`` anywhere in
    the process would get the plugin). None when the name is free or already ``file``'s."""
    existing = sys.modules.get(name)
    if existing is not None and _loaded_from(existing, file):
        return None
    if name in sys.builtin_module_names or name in getattr(sys, "stdlib_module_names", ()):
        return f"the standard-library module `{name}`"
    if existing is not None:
        origin = getattr(existing, "__file__", None)
        return f"the module `{name}`" + (f" already imported from {origin}" if origin else
                                          " already imported")
    return None


def _loaded_from(module: Any, file: Path) -> bool:
    origin = getattr(module, "__file__", None)
    if not origin:
        return False
    try:
        return os.path.samefile(origin, file)
    except OSError:
        return False


def import_module_file(file: Path) -> None:
    """Imports ``file`` under its stem (kept in ``sys.modules``); raises what the import raised.

    When the import raises, the module's registrations are undone: a tool it added is removed,
    a tool it replaced (a built-in included) gets its earlier registration back, opening to
    scripts included. The caller puts the file's directory on ``sys.path`` if siblings must
    resolve. Importing the same file again (a second :func:`discover_tools`) runs it again.

    Raises:
        ImportError: The stem names a standard-library or builtin module, or a module already
            imported from another file: imported under that name, the file would replace it
            for the whole process (a plugin ``json.py`` breaking every later ``json.dumps``).
    """
    name = file.stem
    taken = _taken_by(name, file)
    if taken is not None:
        raise ImportError(
            f"cannot import {file} as module `{name}`: that name is taken by {taken}; "
            "rename the file",
            name=name,
            path=str(file),
        )
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
        # Only if they are still ours: when a plugin loader gave up on this import (its
        # import_timeout) it moved on and set its own, which this late finish must not undo.
        ours = registry._recorder is recorded and registry._previous is previous
        if ours:
            registry._recorder, registry._previous = outer, outer_previous
    if not ours:
        # Given up on: the loader reported it failed, so it is undone as a failed one is.
        _undo_registrations(file, previous)
        return
    if outer is not None:
        outer.extend(recorded)
    if outer_previous is not None:
        for tool, held in previous.items():
            outer_previous.setdefault(tool, held)


def _undo_registrations(what: Union[Path, str], previous: Dict[str, Any]) -> None:
    """Gives every name ``what`` (a module file, or a plugin) registered before it failed what
    it held before (see :func:`import_module_file`)."""
    for tool, held in previous.items():
        if held.replaced:
            log.info("tool discovery: %s failed after replacing tool `%s`; its earlier "
                     "registration is restored", what, tool)
        registry._restore(held)


def discover_tools(path: Union[str, "os.PathLike[str]"]) -> List[str]:
    """Imports every tool module in directory ``path`` and returns the imported module names.

    Files are visited in name order; ``__init__.py`` and files starting with ``_`` are skipped.
    Each module is imported under its file stem (and kept in ``sys.modules``), with ``path`` on
    ``sys.path`` while it imports so sibling helpers resolve. Import failures (any exception,
    ``SystemExit`` and any other ``BaseException``; not ``KeyboardInterrupt``) are logged with
    their traceback at WARNING and skipped, and the failed module's registrations are undone
    (tools it added removed, tools it replaced given their earlier registration back).

    A module whose stem names a standard-library module or a module already imported from
    another file is refused (logged, skipped): see :func:`import_module_file`. Files that cannot
    be parsed are logged and skipped.

    Raises:
        TypeError: ``path`` is not a str, bytes or os.PathLike.
        ValueError: ``path`` is empty (``Path("")`` is the current directory, which a caller
            passing an unset setting did not mean to scan).
        NotADirectoryError: ``path`` is not a directory.
    """
    path = registry.path_str("path", path)
    if not path:
        raise ValueError("tool discovery: path is empty; pass a directory (\".\" for the "
                         "current one)")
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
