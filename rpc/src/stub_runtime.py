"""The fixed part of `vibeos_tools`: the tool channel and the helpers.

Every execution's generated `vibeos_tools.py` imports from this module, which is the same text
for every execution: a fork server imports it once, before it forks, so a forked script that
imports its tools compiles only the generated wrappers. Each tool wrapper sends one call over
the execution's private channel to the supervisor and returns the tool's parsed result. A tool
that fails returns a dict with an "error" key; only a broken or refused channel raises
ToolChannelError.

The channel is safe to use from several threads at once (calls are multiplexed by id over one
connection) and from forked children and subprocesses (each process opens its own connection).
Nothing here reads the environment before the first call, so importing it ahead of an
execution binds it to none.
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
    """Makes the codec from `_json`, the C half of `json`, which is what json.JSONEncoder and
    json.JSONDecoder run on anyway: importing `json` itself imports `re`, `enum` and
    `functools`, about 5 ms of a cold script's first tool call."""
    global _ENCODE, _DECODE
    try:
        from _json import encode_basestring, make_encoder, make_scanner
    except ImportError:  # an interpreter built without the accelerator
        import json

        _DECODE = json.JSONDecoder().decode
        _ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode
        return

    def default(value):
        raise TypeError(
            "Object of type %s is not JSON serializable" % value.__class__.__name__
        )

    # The same arguments json.JSONEncoder(ensure_ascii=False, allow_nan=False) gives it:
    # circular references checked (`markers`), json's default separators, and NaN and the
    # infinities refused with json's ValueError at the call: the supervisor parses strict JSON,
    # so sent they would only come back as a broken channel.
    markers = {}
    encoder = make_encoder(
        markers, default, encode_basestring, None, ": ", ", ", False, False, False
    )

    def encode(value):
        if type(value) is str:
            return encode_basestring(value)
        try:
            return "".join(encoder(value, 0))
        except BaseException:
            # A failed encoding can leave the containers it was inside marked.
            markers.clear()
            raise

    class Context(object):
        # What json.JSONDecoder() gives the scanner.
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = {
            "-Infinity": float("-inf"),
            "Infinity": float("inf"),
            "NaN": float("nan"),
        }.__getitem__
        memo = {}

    scan = make_scanner(Context())
    whitespace = " \t\n\r"

    def decode(text):
        start = len(text) - len(text.lstrip(whitespace))
        try:
            value, end = scan(text, start)
        except StopIteration as stop:
            raise ValueError("Expecting value at character %d" % stop.value)
        if text[end:].strip(whitespace):
            raise ValueError("Extra data at character %d" % end)
        return value

    _ENCODE = encode
    _DECODE = decode


class ToolChannelError(RuntimeError):
    """The channel to the supervisor is broken, or it refused the request."""


class _Pending(object):
    """A call that waits while another thread reads: its gate is held until the reader either
    delivers its reply or hands it the reader role (then `reply` is still None)."""

    __slots__ = ("reply", "gate")

    def __init__(self):
        self.reply = None
        self.gate = _thread.allocate_lock()
        self.gate.acquire()


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
            waiter.gate.release()
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

    def _pass_reader_role(self):
        # Caller holds self._lock and has stopped reading.
        for other in self._pending.values():
            other.gate.release()
            return
        self._reading = False

    def _read_until(self, call_id, mine):
        """Reads replies until the one for `call_id` arrives, delivering the others to their
        waiting calls, then passes the reader role on. `mine` is this call's entry in
        `_pending` when it waited for the role, None when it took it at once."""
        readline = self._readline
        while True:
            try:
                line = readline()
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
                    return {"error": {"code": "channel_closed", "message": reason}}
                if type(msg) is not dict:
                    continue
                msg_id = msg.get("id")
                if msg_id == call_id:
                    if mine is not None:
                        self._pending.pop(call_id, None)
                    self._pass_reader_role()
                    return msg
                waiter = self._pending.pop(msg_id, None)
                if waiter is not None:
                    waiter.reply = msg
                    waiter.gate.release()
                elif msg_id is None and "error" in msg:
                    # A reply to a frame the supervisor could not attribute: fail every call in
                    # flight with it rather than leave them waiting.
                    for other in self._pending.values():
                        other.reply = msg
                        other.gate.release()
                    self._pending.clear()
                    self._reading = False
                    return msg

    def call(self, tool, args):
        # Serialise before registering the call so an unserialisable argument is a plain
        # TypeError (or ValueError for unencodable text) that leaves the channel untouched. Only
        # the arguments are encoded per call: the frame's fixed parts (the tool's name, then
        # the token) are spliced in as text kept from earlier calls.
        if _ENCODE is None:
            _load_codec()
        head = _HEADS.get(tool)
        if head is None:
            head = _HEADS[tool] = ',"tool":' + _ENCODE(tool) + ',"args":'
        try:
            body = (head + _ENCODE(args)).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                "arguments of %s contain text that is not valid Unicode (%s); "
                "decode bytes or fix surrogates before calling" % (tool, exc.reason)
            )
        if len(body) > _MAX_ARGS_BYTES:
            # The supervisor closes a channel that sends a frame over its limit, and every
            # later call would fail with a broken pipe that says nothing of why.
            raise ValueError(
                "arguments of %s are %.1f MiB encoded; a tool call carries at most %d MiB: "
                "pass large data in parts (several calls) or write it from the script"
                % (tool, len(body) / 1048576.0, _MAX_FRAME_BYTES >> 20)
            )
        with self._lock:
            # With at-fork hooks the child resets the channel as it forks; the pid check covers
            # interpreters without them.
            if not _AT_FORK and self._pid != _os.getpid():
                self._init_state()
            if self._broken is not None:
                raise ToolChannelError(self._broken)
            sock = self._sock
            if sock is None:
                sock = self._sock = self._open()
                token = _os.environ.get("VIBEOS_RPC_TOKEN", "")
                self._tail = (',"token":' + _ENCODE(token) + "}\n").encode("utf-8")
            call_id = self._next_id + 1
            self._next_id = call_id
            if self._reading:
                # Another thread reads: wait for it to deliver our reply or hand us its role.
                mine = self._pending[call_id] = _Pending()
            else:
                # The common case, a lone caller: it reads its own reply, with nothing to
                # register.
                self._reading = True
                mine = None
            tail = self._tail
        try:
            with self._send_lock:
                sock.sendall(b'{"id":' + str(call_id).encode("ascii") + body + tail)
        except OSError as exc:
            with self._lock:
                if mine is None:
                    self._pass_reader_role()
                else:
                    self._pending.pop(call_id, None)
                    # Handed the reader role while sending: pass it on, or no one reads.
                    if mine.gate.acquire(False) and mine.reply is None:
                        self._pass_reader_role()
            raise ToolChannelError("sending the call to %s failed: %s" % (tool, exc))
        if mine is None:
            reply = self._read_until(call_id, None)
        else:
            mine.gate.acquire()
            reply = mine.reply
            if reply is None:
                reply = self._read_until(call_id, mine)
        if "result" in reply:
            return reply["result"]
        error = reply.get("error")
        if isinstance(error, dict):
            error = error.get("message", error)
        raise ToolChannelError("the call to %s was refused: %s" % (tool, error))


# The encoded `,"tool":NAME,"args":` of each tool called so far.
_HEADS = {}
# The supervisor's limit on one frame (vibeos_rpc::MAX_FRAME_BYTES), and what is left of it
# for the tool's name and arguments after the id and the token (a token is 64 hex digits).
_MAX_FRAME_BYTES = 16777216
_MAX_ARGS_BYTES = _MAX_FRAME_BYTES - 256


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


def _wire_names(pairs):
    """Decorates a tool function whose schema names are not all Python identifiers: besides its
    own parameters (``class_``, ``a_b``) it accepts the schema's names (``**{"class": 1}``),
    so code written against the tool's schema works; both send the schema's name."""

    def decorate(fn):
        def tool(*args, **kwargs):
            for wire, ident in pairs:
                if wire in kwargs:
                    if ident in kwargs:
                        raise TypeError(
                            "%s() got multiple values for argument %r (also passed as %r)"
                            % (fn.__name__, ident, wire)
                        )
                    kwargs[ident] = kwargs.pop(wire)
            return fn(*args, **kwargs)

        # What functools.wraps would copy, without importing functools into every script:
        # help() and inspect.signature() then show the real parameters.
        tool.__name__ = fn.__name__
        tool.__qualname__ = fn.__qualname__
        tool.__doc__ = fn.__doc__
        tool.__module__ = fn.__module__
        tool.__wrapped__ = fn
        return tool

    return decorate


def json_parse(text):
    """Parse JSON leniently: accepts bytes, a byte-order mark, surrounding whitespace, a fenced
    block (```json, ```js or bare, also with prose around it), control characters inside
    strings, trailing commas before a closing bracket or brace, // and /* */ comments, and a
    Python literal of a dict or list (single quotes, True/False/None); a value that is already
    parsed (dict/list) is returned as is. What is still not JSON raises json's ValueError with
    positions in the text as given."""
    if isinstance(text, (dict, list)):
        return text
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    if not isinstance(text, str):
        raise TypeError("json_parse() takes str, bytes, a dict or a list, not %s"
                        % type(text).__name__)
    stripped = _unfenced(text.lstrip("\ufeff").strip())
    try:
        return _json.loads(stripped, strict=False)
    except ValueError:
        pass
    relaxed = _relaxed(stripped)
    if relaxed != stripped:
        try:
            return _json.loads(relaxed, strict=False)
        except ValueError:
            pass
    value = _python_literal(stripped)
    if value is not _NOT_A_LITERAL:
        return value
    # The error of the text as given: its positions are the ones the caller can look up.
    return _json.loads(stripped, strict=False)


def _unfenced(text):
    """The inside of a Markdown code fence: the whole text's, or the first one in it when prose
    surrounds it; the fence's language word (json, js, ...) dropped."""
    if not text.startswith("```"):
        at = text.find("```")
        if at < 0 or text[:1] in "{[\"":
            return text
        text = text[at:]
    body = text[3:]
    first, sep, rest = body.partition("\n")
    if sep and (not first.strip() or first.strip().isalnum()):
        body = rest
    end = body.find("```")
    if end >= 0:
        body = body[:end]
    return body.strip()


_NOT_A_LITERAL = object()


def _python_literal(text):
    """``text`` read as a Python literal of a dict or a list (what ``print(a_dict)`` shows) with
    tuples as lists, or ``_NOT_A_LITERAL`` when it is not one of JSON's shapes."""
    if not text[:1] in "{[":
        return _NOT_A_LITERAL
    import ast
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _NOT_A_LITERAL

    def plain(v):
        if v is None or isinstance(v, (str, bool, int, float)):
            return v
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return {k: plain(x) for k, x in v.items()}
        raise TypeError

    try:
        return plain(value)
    except (TypeError, RecursionError):
        return _NOT_A_LITERAL


def _relaxed(text):
    """``text`` without the commas that stand right before a ``]`` or ``}`` (whitespace
    between) and without ``//`` and ``/* */`` comments, outside strings: what a model or a
    hand-written config often leaves."""
    out = []
    i, n, in_string = 0, len(text), False
    while i < n:
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                in_string = False
        elif c == '"':
            in_string = True
            out.append(c)
        elif c == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(" ")
            continue
        elif c == ",":
            j = i + 1
            while j < n and (text[j] in " \t\r\n" or text.startswith("//", j)
                             or text.startswith("/*", j)):
                if text.startswith("//", j):
                    end = text.find("\n", j)
                    j = n if end < 0 else end
                elif text.startswith("/*", j):
                    end = text.find("*/", j + 2)
                    j = n if end < 0 else end + 2
                else:
                    j += 1
            if j == n or text[j] not in "]}":
                out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def shell_quote(s):
    """Quote a string so a POSIX shell (and terminal()) reads it as one word. Takes str, a
    number, a path (os.PathLike) or bytes (decoded as file names are)."""
    if isinstance(s, (bytes, bytearray)) or hasattr(s, "__fspath__"):
        s = _os.fsdecode(_os.fspath(s) if not isinstance(s, bytearray) else bytes(s))
    elif isinstance(s, (int, float)):
        s = str(s)
    elif not isinstance(s, str):
        raise TypeError("shell_quote() takes str, a number, a path or bytes, not %s"
                        % type(s).__name__)
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
    if not callable(fn):
        raise TypeError("retry() needs a function to call, got %s" % type(fn).__name__)
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not delay >= 0:
        raise ValueError("delay must be a number of seconds, 0 or more, got %r" % (delay,))
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


# The helpers are part of vibeos_tools' interface: they say so in reprs, tracebacks and pickles.
for _public in (ToolChannelError, json_parse, shell_quote, retry):
    _public.__module__ = "vibeos_tools"
del _public
