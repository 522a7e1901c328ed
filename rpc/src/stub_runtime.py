"""Tools of this execute_code run, callable from the script.

Generated for one execution. Each tool function sends one call over the execution's private
channel to the supervisor and returns the tool's parsed result. A tool that fails returns a dict
with an "error" key; only a broken or refused channel raises ToolChannelError.

The module is safe to use from several threads at once (calls are multiplexed by id over one
connection) and from forked children and subprocesses (each process opens its own connection).
"""

import _thread
import os as _os
import time as _time


class _Lazy(object):
    """A module imported on first use. `json` and `socket` were most of this module's import
    cost (10.3 ms of CPU over `python -c pass` on CPython 3.11, 4.1 ms without them; measured
    by benches/src/bin/core.rs), which a script that never calls a tool should not pay; `os`, `time` and `_thread` are loaded by
    every interpreter anyway. Each name is looked up once and then kept on the proxy."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        # Only reached for names not yet kept (and never for _name, set in __init__).
        module = __import__(self._name)
        value = getattr(module, attr)
        setattr(self, attr, value)
        return value


_json = _Lazy("json")
_socket = _Lazy("socket")

# One encoder and one decoder for every call, made on the first call: json.dumps with
# non-default options builds a new encoder per call, and json.loads(bytes) sniffs the encoding
# and checks its arguments every time. The supervisor always sends UTF-8, so a reply is decoded
# as text and parsed directly (2.4 against 3.4 us of CPU for a small read_file reply).
_ENCODE = None
_DECODE = None


def _load_codec():
    global _ENCODE, _DECODE
    import json

    _DECODE = json.JSONDecoder().decode
    _ENCODE = json.JSONEncoder(ensure_ascii=False).encode


class ToolChannelError(RuntimeError):
    """The channel to the supervisor is broken, or it refused the request."""


class _Pending(object):
    __slots__ = ("reply", "gate")

    def __init__(self, waits):
        self.reply = None
        # For a call that waits (another thread is reading): held until it may go on, released
        # by the reader that delivered its reply or that hands it the reader role.
        self.gate = None
        if waits:
            self.gate = _thread.allocate_lock()
            self.gate.acquire()

    def wake(self):
        if self.gate is not None:
            self.gate.release()


class _Channel(object):
    """One connection per process; replies are matched to waiting calls by request id.

    There is no reader thread: a waiting caller becomes the reader itself (leader/follower).
    The reader delivers every reply it reads to the call it belongs to and, when its own reply
    arrives, hands the reader role to another waiting call. A lone caller therefore pays no
    thread switch, and many threads can still have calls in flight on the one connection.
    """

    def __init__(self):
        self._init_state()

    def _init_state(self):
        self._lock = _thread.allocate_lock()
        self._send_lock = _thread.allocate_lock()
        self._sock = None
        # Bytes received, and where the first reply not yet read starts in them.
        self._rbuf = b""
        self._rpos = 0
        self._pid = _os.getpid()
        self._pending = {}
        self._next_id = 0
        self._broken = None
        self._reading = False
        self._tail = b""

    def after_fork_in_child(self):
        # The parent's connection and its waiters belong to the parent: drop our copy of the
        # descriptor and start afresh on first use. close() drops only this process's
        # descriptor; shutdown() would cut the parent off.
        sock = self._sock
        self._init_state()
        if sock is not None:
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
            if _os.environ.get("VIBEOS_RPC_HELLO") == "1":
                # A socket shared by the environment's executions: the token line routes this
                # connection to ours.
                sock.sendall(_os.environ.get("VIBEOS_RPC_TOKEN", "").encode() + b"\n")
        except OSError as exc:
            sock.close()
            raise ToolChannelError("cannot reach the tool channel at %s: %s" % (path, exc))
        return sock

    def _fail_all(self, reason):
        # Caller holds self._lock.
        self._broken = reason
        self._reading = False
        for waiter in self._pending.values():
            waiter.reply = {"error": {"code": "channel_closed", "message": reason}}
            waiter.wake()
        self._pending.clear()

    def _readline(self):
        """One reply line (with its newline), or b"" at end of stream. Straight recv() calls
        into a private buffer: socket.makefile() would add a Python-level layer (SocketIO) to
        every read, a measurable share of a call's cost. Only the reader calls this."""
        buf = self._rbuf
        pos = self._rpos
        i = buf.find(b"\n", pos)
        if i >= 0:
            self._rpos = i + 1
            return buf[pos : i + 1]
        # A large reply arrives in many chunks: collect them and join once.
        parts = [buf[pos:]]
        recv = self._sock.recv
        while True:
            chunk = recv(65536)
            if not chunk:
                self._rbuf = b""
                self._rpos = 0
                return b""
            i = chunk.find(b"\n")
            if i >= 0:
                self._rbuf = chunk
                self._rpos = i + 1
                parts.append(chunk[: i + 1])
                return b"".join(parts)
            parts.append(chunk)

    def _read_until(self, mine):
        """Reads replies until `mine` has one, then passes the reader role on."""
        while True:
            try:
                line = self._readline()
                reason = "the supervisor closed the tool channel"
            except (OSError, ValueError) as exc:
                line = None
                reason = "reading from the tool channel failed: %s" % exc
            msg = None
            if line:
                try:
                    # UnicodeDecodeError is a ValueError: a reply that is not UTF-8 is malformed.
                    msg = _DECODE(line.decode("utf-8"))
                except ValueError:
                    reason = "the supervisor sent a malformed reply"
                    line = None
            with self._lock:
                if not line:
                    self._fail_all(reason)
                    return
                if isinstance(msg, dict):
                    waiter = self._pending.pop(msg.get("id"), None)
                    if waiter is mine:
                        mine.reply = msg
                    elif waiter is not None:
                        waiter.reply = msg
                        waiter.wake()
                    elif msg.get("id") is None and "error" in msg:
                        # A reply to a frame the supervisor could not attribute: fail every
                        # call in flight with it rather than leave them waiting.
                        mine.reply = msg
                        for other in self._pending.values():
                            if other is not mine:
                                other.reply = msg
                                other.wake()
                        self._pending.clear()
                if mine.reply is not None:
                    # Hand the reader role to a call still waiting, if any.
                    for other in self._pending.values():
                        other.wake()
                        break
                    else:
                        self._reading = False
                    return

    def call(self, tool, args):
        # Serialise before registering the call so an unserialisable argument is a plain
        # TypeError (or ValueError for unencodable text) that leaves the channel untouched. Only
        # the arguments are encoded per call: the frame's fixed parts are spliced in as text.
        if _ENCODE is None:
            _load_codec()
        try:
            head = (',"tool":' + _ENCODE(tool) + ',"args":' + _ENCODE(args)).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                "arguments of %s contain text that is not valid Unicode (%s); "
                "decode bytes or fix surrogates before calling" % (tool, exc.reason)
            )
        with self._lock:
            # With at-fork hooks the child resets the channel as it forks; the pid check covers
            # interpreters without them.
            if not _AT_FORK and self._pid != _os.getpid():
                self._init_state()
            if self._broken is not None:
                raise ToolChannelError(self._broken)
            if self._sock is None:
                self._sock = self._open()
                token = _os.environ.get("VIBEOS_RPC_TOKEN", "")
                self._tail = (',"token":' + _ENCODE(token) + "}\n").encode("utf-8")
            call_id = self._next_id + 1
            self._next_id = call_id
            line = b'{"id":' + str(call_id).encode("ascii") + head + self._tail
            lead = not self._reading
            waiter = _Pending(not lead)
            self._pending[call_id] = waiter
            if lead:
                self._reading = True
            sock = self._sock
        try:
            with self._send_lock:
                sock.sendall(line)
        except OSError as exc:
            with self._lock:
                self._pending.pop(call_id, None)
                if lead:
                    for other in self._pending.values():
                        other.wake()
                        break
                    else:
                        self._reading = False
            raise ToolChannelError("sending the call to %s failed: %s" % (tool, exc))
        if not lead:
            waiter.gate.acquire()
            # Woken either with our reply or with the reader role.
            if waiter.reply is None:
                lead = True
        if lead:
            self._read_until(waiter)
        reply = waiter.reply
        if "result" in reply:
            return reply["result"]
        error = reply.get("error")
        if isinstance(error, dict):
            error = error.get("message", error)
        raise ToolChannelError("the call to %s was refused: %s" % (tool, error))


_AT_FORK = hasattr(_os, "register_at_fork")
_CHANNEL = _Channel()
if _AT_FORK:
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
