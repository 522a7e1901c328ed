"""Type stubs of the Rust extension ``vibeos_exec._native``.

Use the typed wrappers in :mod:`vibeos_exec` and :mod:`vibeos_exec.registry`; these functions
take pre-checked arguments and JSON text.
"""

from typing import Callable, List, Optional, Tuple

__version__: str

def execute_code(
    code: str,
    mode: Optional[str],
    timeout: Optional[float],
    max_tool_calls: Optional[int],
    cwd: Optional[str],
    enabled_tools: Optional[List[str]],
    task_id: Optional[str],
    python: Optional[str],
    env_passthrough: List[str],
    stdout_limit: Optional[int] = None,
    stderr_limit: Optional[int] = None,
    cancellation: Optional["Cancellation"] = None,
    called_from: Optional["ScriptCall"] = None,
) -> str:
    """Runs a script with the GIL released; returns the result object as JSON text.
    ``called_from``: the script call a tool handler answers when it calls this (it then runs
    one level deeper, at most three, and ends with the calling execution)."""

class Cancellation:
    """One execute_code call's own interrupt, made before the call: cancelled before the
    script starts, it never runs; cancelled while it runs, the script is interrupted."""

    def __init__(self) -> None: ...
    def cancel(self) -> None:
        """Interrupts the call: now if it runs, at its start otherwise."""
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""

class ScriptCall:
    """A script's tool call as the host's handler runs it (handed to the tool invoker only)."""

    @property
    def nesting(self) -> int:
        """How many executions the calling execution runs inside (0: an agent started it)."""
    def ended(self) -> bool:
        """Whether the calling execution has ended."""

def interrupt(task_id: str) -> int:
    """Interrupts the running executions of ``task_id``; returns how many."""

def interrupt_all() -> int:
    """Interrupts every running execution; returns how many."""

def running_count() -> int:
    """How many executions are running."""

def shutdown_backends() -> None:
    """Stops the environments of the active backend (containers, ssh masters); at exit."""

def quiesce_native_callers(timeout_seconds: float) -> bool:
    """Lets no call from the extension's threads into Python start any more and waits up to
    ``timeout_seconds`` for those running; ``True`` when none is left. At exit only."""

def register_tool(
    name: str,
    toolset: str,
    parameters_json: str,
    invoker: Callable[[str, Optional[str]], Tuple[bool, str, Optional[str]]],
    description: str,
    emoji: str,
    requires_env: List[str],
    max_result_size_chars: Optional[int],
    check_fn: Optional[Callable[[], object]],
    source: str,
    replace_builtin: bool,
    parallel_safe: bool,
    script_callable: bool,
) -> PreviousTool:
    """Registers a Python tool (source ``Plugin(source)``) in the process-wide registry;
    returns what the name held before, for :func:`restore_tool`."""

class PreviousTool:
    """What a registration replaced (the entry, or nothing for a new name, and its opening to
    scripts)."""

    @property
    def name(self) -> str: ...
    @property
    def replaced(self) -> bool: ...

def restore_tool(previous: PreviousTool) -> None:
    """Undoes a registration: the name gets back what ``previous`` says it held (or is removed)."""

def unregister_tool(name: str) -> bool:
    """Removes a tool; returns whether it was registered."""

def allow_in_scripts(name: str) -> None:
    """Opens a tool to scripts; ValueError for tools that can never be opened."""

def disallow_in_scripts(name: str) -> bool:
    """Closes a tool opened with allow_in_scripts."""

def script_tools() -> List[str]:
    """Tools a script would get now."""

def tool_names() -> List[str]:
    """Every registered tool."""

def handle_function_call(
    name: str,
    args_json: str,
    task_id: Optional[str],
    cwd: Optional[str],
    enabled: Optional[List[str]] = None,
    disabled: Optional[List[str]] = None,
) -> str:
    """A direct tool call through the registry; returns JSON text. ``enabled``/``disabled``
    select the toolsets an execute_code script gets (both None: those of the last
    definitions)."""

def get_tool_definitions(enabled: Optional[List[str]], disabled: List[str]) -> str:
    """Function-calling definitions as JSON text (``enabled`` None: every toolset; ``[]``: none);
    remembers the selection for execute_code."""

def provider_credentials(names: List[str]) -> List[str]:
    """The names among ``names`` that are provider credentials."""

def statuses() -> List[str]:
    """The result statuses."""

def plugin_settings() -> Tuple[Optional[bool], Optional[bool], List[str], bool]:
    """config.yaml's ``plugins:``: (enabled, entry_points, extra dirs, strict mode)."""

def load_mcp_servers() -> bool:
    """Starts config.yaml's MCP servers into the registry; False if already loaded."""

def mcp_server_status(stop: bool = False) -> List[Tuple[str, str, List[str]]]:
    """(name, state, toolsets) of the loaded MCP servers; stops them first when ``stop``."""

def set_approval_callback(
    adapter: Optional[Callable[[Optional[str], str, List[str], bool, float], str]] = None,
) -> None:
    """Installs the approval adapter of :mod:`vibeos_exec.approval` (None removes it)."""

def redact(text: str) -> str:
    """``text`` with secret values and credential formats replaced by markers (as output is)."""

def set_smart_approver(
    adapter: Optional[Callable[[Optional[str], str, List[str], bool, float], str]] = None,
) -> None:
    """Installs the smart-approver adapter of :mod:`vibeos_exec.approval` (None removes it)."""

def handle_function_calls(
    calls_json: str,
    task_id: Optional[str],
    cwd: Optional[str],
    enabled: Optional[List[str]] = None,
    disabled: Optional[List[str]] = None,
) -> str:
    """Runs one turn's calls through the planner; returns a JSON array of result texts."""
