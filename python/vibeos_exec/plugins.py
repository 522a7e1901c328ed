"""Plugins (SPEC §7): Python modules that register tools, found in plugin directories and in
installed packages' ``vibeos.plugins`` entry points.

The directories are ``$VIBEOS_HOME/plugins`` (user) and ``<cwd>/.vibeos/plugins`` (project);
a plugin there is a tool module as :func:`vibeos_exec.discover_tools` understands it (a
top-level ``registry.register(...)`` call). An entry point names a module, or a callable that
is called once after loading. Each plugin is loaded on its own: one that raises is logged with
its name and skipped whole (the tools it registered removed, those it replaced given back), the
others still load. A file of a plugin directory that cannot be parsed, or whose name would
replace a module of the process (``json.py``), is reported failed too, so nothing is dropped
unsaid. :func:`load_plugins` records which tools each plugin registered, so the plugin host
(:mod:`vibeos_exec.plugin_host`) can serve them as ``plugin-<module>`` toolsets.

A plugin's registrations are recorded as the plugin's (``source`` = its name, its own
``override`` ignored), so the operator's plugin override policy applies in-process as it does in
the CLI: a plugin registering ``read_file`` or ``terminal`` is refused (``ValueError``) and
reported as failed, and the built-in stays.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Union

from . import registry
from .discovery import (
    _undo_registrations,
    import_module_file,
    importable_from,
    tool_module_files,
)

__all__ = ["ENTRY_POINT_GROUP", "PluginReport", "default_plugin_dirs", "load_plugins"]

#: Entry-point group installed packages use to expose plugins.
ENTRY_POINT_GROUP = "vibeos.plugins"

log = logging.getLogger("vibeos_exec.plugins")


@dataclass
class PluginReport:
    """What :func:`load_plugins` did."""

    #: Plugin name → names of the tools it registered, in load order.
    loaded: Dict[str, List[str]] = field(default_factory=dict)
    #: Plugin name → why it was skipped (``ExceptionType: message``).
    failed: Dict[str, str] = field(default_factory=dict)


def default_plugin_dirs(cwd: Optional[Union[str, "os.PathLike[str]"]] = None) -> List[Path]:
    """``$VIBEOS_HOME/plugins`` (``~/.vibeos`` when unset), then ``<cwd>/.vibeos/plugins``."""
    home = os.environ.get("VIBEOS_HOME") or os.path.join(os.path.expanduser("~"), ".vibeos")
    base = Path(cwd) if cwd is not None else Path.cwd()
    return [Path(home) / "plugins", base / ".vibeos" / "plugins"]


def _entry_points() -> list:
    from importlib import metadata

    eps = metadata.entry_points()
    if hasattr(eps, "select"):
        return list(eps.select(group=ENTRY_POINT_GROUP))
    return list(eps.get(ENTRY_POINT_GROUP, []))  # Python < 3.10


def _source_of(name: str) -> str:
    """The registry source of the plugin ``name``: its name, unless that is the host's own
    source name, which would make its tools the host's."""
    return name if name != registry._HOST_SOURCE else f"{name} (plugin)"


class _ImportTimeout(TimeoutError):
    """A plugin still importing at its bound (a plugin's own ``TimeoutError`` is not one)."""


class _Load:
    """One plugin's import run on a worker thread under a bound (see :func:`_track`): whether
    it finished, and whether the loader gave up on it first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.abandoned = False
        self.error: Optional[BaseException] = None


def _run_bounded(name: str, load: Callable[[], None], timeout: float,
                 previous: Dict[str, object]) -> None:
    """Runs ``load`` on a daemon thread and waits ``timeout`` seconds for it; raises what it
    raised, or :class:`_ImportTimeout` if it is still running then.

    A stuck import cannot be stopped, so its thread is left running, marked abandoned: a
    registration it attempts from that thread is refused (``RuntimeError``, so a module body
    that wakes up fails there), and if it ever finishes, what it registered before the bound
    is undone, as for a plugin that raised. Another plugin can be imported meanwhile: a module
    body being executed holds no import lock other modules need (Python 3 locks per module).
    """
    state = _Load()

    def run() -> None:
        try:
            load()
        except BaseException as exc:  # noqa: BLE001 - handed to the loader, or logged if late
            state.error = exc
        with state.lock:
            state.done.set()
            abandoned = state.abandoned
        if abandoned:
            registry._abandoned.discard(threading.current_thread())
            _undo_registrations(f"plugin `{name}`", previous)
            log.warning("plugin `%s` finished importing after it was reported failed (%s); "
                        "its tools are not loaded", name,
                        "ok" if state.error is None else
                        f"{type(state.error).__name__}: {state.error}")

    worker = threading.Thread(target=run, name=f"vibeos-plugin-import-{name}", daemon=True)
    worker.start()
    state.done.wait(timeout)
    with state.lock:
        if not state.done.is_set():
            state.abandoned = True
            registry._abandoned.add(worker)
            raise _ImportTimeout(f"did not finish importing within {timeout:g} s (the import "
                               "is left running in the background; its tools are not loaded)")
    if state.error is not None:
        raise state.error


def _track(report: PluginReport, name: str, load: Callable[[], None], tracebacks: bool,
           import_timeout: Optional[float] = None) -> None:
    # Record every registration the plugin makes (a replaced tool included, which a before /
    # after comparison of the names would miss), as the plugin's: the operator's override
    # policy then applies to it as it does in the CLI, so a plugin cannot swap a built-in.
    # Record what each name held before too, so a plugin that fails is undone whole (a
    # directory plugin's module is undone by import_module_file already; an entry point's
    # callable that raises after registering is undone here).
    # What an enclosing load (a plugin that loads plugins) had set is put back afterwards.
    outer = (registry._recorder, registry._previous, registry._plugin_source)
    recorded: List[str] = []
    previous: Dict[str, object] = {}
    registry._recorder = recorded
    registry._previous = previous  # type: ignore[assignment]
    registry._plugin_source = _source_of(name)
    try:
        if import_timeout is None:
            load()
        else:
            _run_bounded(name, load, import_timeout, previous)
    # SystemExit too (a plugin calling sys.exit() while importing), as discover_tools does;
    # KeyboardInterrupt still propagates.
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - one broken plugin must not stop the rest
        timed_out = isinstance(exc, _ImportTimeout)
        reason = f"{'TimeoutError' if timed_out else type(exc).__name__}: {exc}"
        log.warning("plugin `%s` skipped: %s", name, reason, exc_info=tracebacks and not timed_out)
        report.failed[name] = reason
        if not timed_out:
            # A timed-out import is still running: its thread undoes it if it ever finishes.
            _undo_registrations(f"plugin `{name}`", previous)  # type: ignore[arg-type]
        return
    except BaseException:
        _undo_registrations(f"plugin `{name}`", previous)  # type: ignore[arg-type]
        raise
    finally:
        registry._recorder, registry._previous, registry._plugin_source = outer
    added = list(dict.fromkeys(recorded))
    report.loaded[name] = added
    log.info("plugin `%s` loaded: %s", name, ", ".join(added) or "no tools")


def _check_dirs(dirs: object) -> List[Path]:
    """``dirs`` as a list of paths. A single path is refused rather than iterated: a str would
    be scanned character by character (``/`` and one-letter directories)."""
    if isinstance(dirs, (str, bytes, os.PathLike)):
        raise TypeError(
            f"dirs must be a list of directories, got a single {type(dirs).__name__}; "
            f"pass a list: load_plugins([{dirs!r}])"
        )
    if not isinstance(dirs, Iterable):
        raise TypeError(
            f"dirs must be a list of str, bytes or os.PathLike, got {type(dirs).__name__}")
    paths = []
    for i, d in enumerate(dirs):
        d = registry.path_str(f"dirs[{i}]", d)
        if not d:
            raise ValueError(f"dirs[{i}] is empty; pass a directory (\".\" for the current one)")
        paths.append(Path(d))
    return paths


def load_plugins(
    dirs: Optional[Sequence[Union[str, "os.PathLike[str]"]]] = None,
    *,
    entry_points: Optional[bool] = None,
    tracebacks: bool = True,
    import_timeout: Optional[float] = None,
) -> PluginReport:
    """Loads the plugins of ``dirs`` (missing directories are skipped) and, if
    ``entry_points``, of the ``vibeos.plugins`` entry points, into this process's registry.

    Without ``dirs``, config.yaml's ``plugins:`` applies as in the CLI: ``enabled: false``
    loads nothing, the dirs are :func:`default_plugin_dirs` (without the project's in strict
    mode, whose projects nobody vouched for) followed by ``plugins.dirs``, and
    ``entry_points`` defaults to ``plugins.entry_points`` (else true). A plugin name already loaded (by an earlier directory) is skipped with a
    warning. Never raises for a broken plugin; see the returned :class:`PluginReport`. Failures
    are logged at WARNING, with their traceback when ``tracebacks``.

    Reported failed, besides plugins that raise: a file of a plugin directory that cannot be
    parsed (a syntax error, bytes its encoding cannot decode), and one whose name is a
    standard-library module or a module already imported from elsewhere (``json.py``; rename
    it). A plugin that fails is undone whole: tools it registered are removed, tools it
    replaced get their earlier registration back (entry points as directory plugins).

    With ``import_timeout`` (seconds), each plugin is imported on a daemon thread and one still
    importing after that long is reported failed (``TimeoutError: did not finish importing
    within N s``) while the others load; its thread cannot be stopped and is left running, and
    registrations it attempts later are refused. The plugin host uses this so that one hung
    plugin does not take all the others down with it. Without it, plugins are imported on the
    calling thread.

    Raises:
        TypeError: ``dirs`` is a single str, bytes or path rather than a list of them (pass
            ``[path]``), or holds something that is not a str, bytes or os.PathLike.
        ValueError: ``dirs`` holds an empty str (``Path("")`` would be the current directory),
            or ``import_timeout`` is not positive.
    """
    if dirs is None:
        from . import _native

        try:
            enabled, configured_eps, extra, strict = _native.plugin_settings()
        except ValueError as exc:
            raise RuntimeError(f"vibeos config: {exc}") from None
        if enabled is False:
            log.info("plugins: not loaded (plugins.enabled is false in config.yaml)")
            return PluginReport()
        user, project = default_plugin_dirs()
        paths = [user] + ([] if strict else [project]) + [Path(d) for d in extra]
        if entry_points is None:
            entry_points = True if configured_eps is None else configured_eps
    else:
        paths = _check_dirs(dirs)
    if entry_points is None:
        entry_points = True
    if import_timeout is not None:
        if isinstance(import_timeout, bool) or not isinstance(import_timeout, (int, float)):
            raise TypeError(f"import_timeout must be a number of seconds or None, got "
                            f"{type(import_timeout).__name__}")
        if not 0 < import_timeout < float("inf"):
            raise ValueError(f"import_timeout must be a positive number of seconds, got "
                             f"{import_timeout!r}")
    report = PluginReport()
    for directory in paths:
        if not directory.is_dir():
            continue
        with importable_from(directory):
            unparsable: Dict[Path, str] = {}
            files = tool_module_files(directory, unparsable)
            for file in sorted(files + list(unparsable)):
                name = file.stem
                if name in report.loaded or name in report.failed:
                    log.warning("plugin `%s` in %s skipped: a plugin of that name is loaded",
                                name, directory)
                    continue
                if file in unparsable:
                    reason = unparsable[file]
                    log.warning("plugin `%s` skipped: cannot parse %s: %s", name, file, reason)
                    report.failed[name] = reason
                    continue
                _track(report, name, lambda f=file: import_module_file(f), tracebacks,
                       import_timeout)
    if entry_points:
        try:
            eps = _entry_points()
        except Exception as exc:  # noqa: BLE001 - broken metadata must not stop directories
            log.warning("plugins: cannot read the %s entry points: %s", ENTRY_POINT_GROUP, exc)
            eps = []
        for ep in eps:
            if ep.name in report.loaded or ep.name in report.failed:
                log.warning("plugin `%s` (entry point) skipped: a plugin of that name is loaded",
                            ep.name)
                continue

            def load(ep=ep) -> None:
                obj = ep.load()
                if callable(obj):
                    obj()

            _track(report, ep.name, load, tracebacks, import_timeout)
    return report
