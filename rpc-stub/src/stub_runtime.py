"""Tools of this execute_code run, callable from the script.

Generated for one execution. Each tool function sends one call over the execution's private
channel to the supervisor and returns the tool's parsed result. A tool that fails returns a dict
with an "error" key; only a broken or refused channel raises ToolChannelError.

The module is safe to use from several threads at once (calls are multiplexed by id over one
connection) and from subprocesses that import it (each process opens its own connection).
"""

import json as _json
import os as _os
import socket as _socket
import threading as _threading
import time as _time


class ToolChannelError(RuntimeError):
    """The channel to the supervisor is broken, or it refused the request."""


class _Pending(object):
    __slots__ = ("event", "reply")

    def __init__(self):
        self.event = _threading.Event()
        self.reply = None


class _Channel(object):
    """One connection per process; replies are matched to waiting calls by request id."""

    def __init__(self):
        self._init_state()

    def _init_state(self):
        self._lock = _threading.Lock()
        self._send_lock = _threading.Lock()
        self._sock = None
        self._pid = _os.getpid()
        self._pending = {}
        self._next_id = 0
        self._broken = None

    def after_fork_in_child(self):
        # The parent's connection and its waiters belong to the parent: drop our copy of the
        # descriptor without touching the shared socket, and start afresh on first use.
        sock = self._sock
        self._init_state()
        if sock is not None:
            # close() drops only this process's descriptor; shutdown() would cut the parent off.
            try:
                sock.close()
            except OSError:
                pass

    def _open(self):
        fd = _os.environ.get("VIBEOS_RPC_FD")
        if fd:
            # Strict mode hands the child a connected socket instead of a path to dial.
            try:
                sock = _socket.socket(fileno=int(fd))
            except (OSError, ValueError) as exc:
                raise ToolChannelError("the inherited tool channel (fd %s) is unusable: %s" % (fd, exc))
            # Only the first process may adopt the inherited descriptor; programs it starts
            # must not inherit the channel.
            _os.environ.pop("VIBEOS_RPC_FD", None)
            try:
                sock.set_inheritable(False)
            except OSError:
                pass
            return sock
        path = _os.environ.get("VIBEOS_RPC_SOCKET")
        if not path and _os.environ.get("VIBEOS_RPC_STRICT"):
            raise ToolChannelError(
                "tools cannot be called from this process: in strict mode the tool channel is one "
                "pre-connected descriptor owned by the script's main process (a subprocess or "
                "forked child cannot open a new one, since strict mode forbids creating sockets); "
                "call tools from the main script and pass the results to subprocesses"
            )
        if not path:
            raise ToolChannelError(
                "VIBEOS_RPC_SOCKET is not set: vibeos_tools only works inside an execute_code run"
            )
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise ToolChannelError("cannot reach the tool channel at %s: %s" % (path, exc))
        return sock

    def _reader(self, sock):
        reason = "the supervisor closed the tool channel"
        try:
            stream = sock.makefile("rb")
            for line in stream:
                try:
                    msg = _json.loads(line)
                except ValueError:
                    reason = "the supervisor sent a malformed reply"
                    break
                if not isinstance(msg, dict):
                    continue
                waiter = None
                with self._lock:
                    waiter = self._pending.pop(msg.get("id"), None)
                if waiter is not None:
                    waiter.reply = msg
                    waiter.event.set()
                elif msg.get("id") is None and "error" in msg:
                    reason = "the tool channel refused this process: %s" % (
                        msg["error"].get("message", msg["error"])
                        if isinstance(msg["error"], dict)
                        else msg["error"]
                    )
                    break
        except (OSError, ValueError) as exc:
            reason = "reading from the tool channel failed: %s" % exc
        with self._lock:
            if self._sock is not sock:
                return
            self._broken = reason
            waiters = list(self._pending.values())
            self._pending.clear()
        for waiter in waiters:
            waiter.reply = {"error": {"code": "channel_closed", "message": reason}}
            waiter.event.set()

    def call(self, tool, args):
        token = _os.environ.get("VIBEOS_RPC_TOKEN", "")
        with self._lock:
            if self._pid != _os.getpid():
                self._init_state()
            if self._broken is not None:
                raise ToolChannelError(self._broken)
            if self._sock is None:
                self._sock = self._open()
                reader = _threading.Thread(
                    target=self._reader, args=(self._sock,), name="vibeos-tools-reader"
                )
                reader.daemon = True
                reader.start()
            self._next_id += 1
            call_id = self._next_id
            sock = self._sock
        # Serialise before registering the call so an unserialisable argument is a plain
        # TypeError that leaves the channel untouched.
        line = (
            _json.dumps(
                {"id": call_id, "tool": tool, "args": args, "token": token},
                ensure_ascii=False,
            ).encode("utf-8", "surrogatepass")
            + b"\n"
        )
        waiter = _Pending()
        with self._lock:
            self._pending[call_id] = waiter
        try:
            with self._send_lock:
                sock.sendall(line)
        except OSError as exc:
            with self._lock:
                self._pending.pop(call_id, None)
            raise ToolChannelError("sending the call to %s failed: %s" % (tool, exc))
        waiter.event.wait()
        reply = waiter.reply
        if "result" in reply:
            return reply["result"]
        error = reply.get("error")
        if isinstance(error, dict):
            error = error.get("message", error)
        raise ToolChannelError("the call to %s was refused: %s" % (tool, error))


_CHANNEL = _Channel()
if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_CHANNEL.after_fork_in_child)


def _call(tool, args):
    return _CHANNEL.call(tool, args)


def _drop_unset(args, optional):
    for name in optional:
        if args.get(name) is None:
            args.pop(name, None)
    return args


def json_parse(text):
    """Parse JSON leniently: accepts bytes, surrounding whitespace, a ```json fence and control
    characters inside strings; a value that is already parsed (dict/list) is returned as is."""
    if isinstance(text, (dict, list)):
        return text
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped[3:]
        if stripped[:4].lower() == "json":
            stripped = stripped[4:]
        if stripped.rstrip().endswith("```"):
            stripped = stripped.rstrip()[:-3]
        stripped = stripped.strip()
    return _json.loads(stripped, strict=False)


def shell_quote(s):
    """Quote a string so a POSIX shell (and terminal()) reads it as one word."""
    s = str(s)
    if not s:
        return "''"
    safe = "@%+=:,./-_"
    if all(c.isalnum() and c.isascii() or c in safe for c in s):
        return s
    return "'" + s.replace("'", "'\"'\"'") + "'"


def retry(fn, max_attempts=3, delay=2):
    """Call fn() up to max_attempts times, sleeping delay, 2*delay, 4*delay... between tries.

    A try fails when fn raises or returns a dict with an "error" key. Returns the first good
    result; after the last try, re-raises its exception or returns its error dict."""
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    for attempt in range(max_attempts):
        last = attempt == max_attempts - 1
        try:
            result = fn()
        except Exception:
            if last:
                raise
        else:
            if not (isinstance(result, dict) and "error" in result) or last:
                return result
        _time.sleep(delay * (2 ** attempt))
