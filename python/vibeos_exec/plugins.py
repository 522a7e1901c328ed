"""Plugins (SPEC §7): Python modules that register tools, found in plugin directories and in
installed packages' ``vibeos.plugins`` entry points.

The directories are ``$VIBEOS_HOME/plugins`` (user) and ``<cwd>/.vibeos/plugins`` (project);
a plugin there is a tool module as :func:`vibeos_exec.discover_tools` understands it (a
top-level ``registry.register(...)`` call). An entry point names a module, or a callable that
is called once after loading. Each plugin is loaded on its own: one that raises is logged with
its name and skipped, the others still load. :func:`load_plugins` records which tools each
plugin registered, so the plugin host (:mod:`vibeos_exec.plugin_host`) can serve them as
``plugin-<module>`` toolsets.

A plugin's registrations are recorded as the plugin's (``source`` = its name, its own
``override`` ignored), so the operator's plugin override policy applies in-process as it does in
the CLI: a plugin registering ``read_file`` or ``terminal`` is refused (``ValueError``) and
reported as failed, and the built-in stays.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

from . import registry
from .discovery import import_module_file, importable_from, tool_module_files

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


def _track(report: PluginReport, name: str, load: Callable[[], None], tracebacks: bool) -> None:
    # Record every registration the plugin makes (a replaced tool included, which a before /
    # after comparison of the names would miss), as the plugin's: the operator's override
    # policy then applies to it as it does in the CLI, so a plugin cannot swap a built-in.
    recorded: List[str] = []
    registry._recorder = recorded
    registry._plugin_source = _source_of(name)
    try:
        load()
    # SystemExit too (a plugin calling sys.exit() while importing), as discover_tools does;
    # KeyboardInterrupt still propagates.
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - one broken plugin must not stop the rest
        reason = f"{type(exc).__name__}: {exc}"
        log.warning("plugin `%s` skipped: %s", name, reason, exc_info=tracebacks)
        report.failed[name] = reason
        return
    finally:
        registry._recorder = None
        registry._plugin_source = None
    added = list(dict.fromkeys(recorded))
    report.loaded[name] = added
    log.info("plugin `%s` loaded: %s", name, ", ".join(added) or "no tools")


def load_plugins(
    dirs: Optional[Sequence[Union[str, "os.PathLike[str]"]]] = None,
    *,
    entry_points: bool = True,
    tracebacks: bool = True,
) -> PluginReport:
    """Loads the plugins of ``dirs`` (default :func:`default_plugin_dirs`; missing directories
    are skipped) and, if ``entry_points``, of the ``vibeos.plugins`` entry points, into this
    process's registry. A plugin name already loaded (by an earlier directory) is skipped with a
    warning. Never raises for a broken plugin; see the returned :class:`PluginReport`. Failures
    are logged at WARNING, with their traceback when ``tracebacks``.
    """
    report = PluginReport()
    paths = [Path(d) for d in (default_plugin_dirs() if dirs is None else dirs)]
    for directory in paths:
        if not directory.is_dir():
            continue
        with importable_from(directory):
            for file in tool_module_files(directory):
                name = file.stem
                if name in report.loaded or name in report.failed:
                    log.warning("plugin `%s` in %s skipped: a plugin of that name is loaded",
                                name, directory)
                    continue
                _track(report, name, lambda f=file: import_module_file(f), tracebacks)
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

            _track(report, ep.name, load, tracebacks)
    return report
