import sys
# Names a fresh `__main__` starts with on this Python (3.14 has no __annotations__ any more).
_fresh_names = set(globals())
# argv: -c SCRIPT CONTROL_FD READY_FD. The script's directory goes first on sys.path before any
# import, exactly where `python script.py` puts it, so nothing is imported from the cwd.
_script, _control, _ready = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.path[0] = _script.rsplit("/", 1)[0]

# What the stub imports at the top; its generated part depends on the call and is not loaded.
import json, os, socket, threading, time  # noqa: E401,F401
import atexit, gc, types  # noqa: E401  (used below; builtin or already loaded at startup)
import importlib.machinery

# Everything alive now belongs to the bootstrap and the preloaded modules: keep it out of the
# final collection, which then costs what the script's own objects cost.
_warm_up_compiler()
gc.freeze()

os.write(_ready, b"R")
os.close(_ready)

# One JSON line: {"set": {name: value}, "unset": [name]}. EOF means the pool discarded us.
_buf = b""
while not _buf.endswith(b"\n"):
    _chunk = os.read(_control, 65536)
    if not _chunk:
        os._exit(0)
    _buf += _chunk
os.close(_control)
_msg = json.loads(_buf.decode("utf-8", "surrogateescape"))
for _k in _msg.get("unset", ()):
    os.environ.pop(_k, None)
for _k, _v in _msg.get("set", {}).items():
    os.environ[_k] = _v

del _buf, _chunk, _msg, _control, _ready
_finish(*_run(_script))
