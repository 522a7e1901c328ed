# The modal backend's sidecar: the official Modal SDK, driven by the supervisor.
#
# No Rust SDK for Modal exists and its gRPC API ships no .proto sources, so the supervisor runs
# this program once (with the interpreter of terminal.modal_python, which has `modal`) and asks
# it for sandbox operations over a private UNIX socket (argv[1], inside a 0700 dir). Only this
# process reads MODAL_TOKEN_ID / MODAL_TOKEN_SECRET / MODAL_SERVER_URL (the SDK does, from its
# environment); nothing it starts in a sandbox receives them.
#
# One connection per operation. The client sends one JSON line; the reply is one JSON line,
# {"ok": ...} or {"err": {"kind", "message"}}. After an ok reply to `exec` both sides exchange
# frames (1 tag byte, 4-byte big-endian length, payload): client `i` stdin data, `e` stdin EOF;
# sidecar `o` stdout, `r` stderr, `x` exit code (ASCII), then it closes. The sidecar prints
# `ready` on stdout once it listens and exits when its stdin closes (the supervisor's lifeline).
import asyncio
import json
import os
import struct
import sys

try:
    import modal
    import modal.exception
except ImportError as e:
    # Told apart from any other start-up failure: the supervisor names the missing package
    # and the interpreter instead of a bare exit status.
    print("no-modal %s: %s" % (type(e).__name__, e), flush=True)
    sys.exit(3)

SOCKET = sys.argv[1]
APP = os.environ.get("VIBEOS_MODAL_APP", "vibeos-exec")
sandboxes = {}
_app = None


def kind_of(e):
    if isinstance(e, modal.exception.AuthError):
        return "auth"
    if isinstance(e, (ConnectionError, OSError, modal.exception.ConnectionError)):
        return "unreachable"
    if isinstance(e, (modal.exception.NotFoundError, FileNotFoundError)) or "NotFound" in type(e).__name__:
        return "not_found"
    return "other"


async def app():
    global _app
    if _app is None:
        _app = await modal.App.lookup.aio(APP, create_if_missing=True)
    return _app


async def sandbox(req):
    sid = req["sandbox_id"]
    sb = sandboxes.get(sid)
    if sb is None:
        sb = await modal.Sandbox.from_id.aio(sid)
        sandboxes[sid] = sb
    return sb


async def op_hello(req):
    # The SDK retries an unreachable server for a long time: bound it, so a wrong
    # MODAL_SERVER_URL is an error within seconds.
    async def hello():
        client = await modal.Client.from_env.aio()
        await client.hello.aio()

    try:
        await asyncio.wait_for(hello(), float(req.get("timeout") or 15))
    except asyncio.TimeoutError:
        raise ConnectionError("no answer from the Modal API") from None
    return {"sdk": modal.__version__}


async def op_create(req):
    ref = req["image"]
    image = modal.Image.from_id(ref) if ref.startswith("im-") else modal.Image.from_registry(ref)
    kwargs = {"app": await app(), "image": image, "timeout": int(req.get("timeout") or 86400)}
    if req.get("workdir"):
        kwargs["workdir"] = req["workdir"]
    if req.get("cpu"):
        kwargs["cpu"] = float(req["cpu"])
    if req.get("memory"):
        kwargs["memory"] = int(req["memory"])
    if req.get("tags"):
        kwargs["tags"] = {str(k): str(v) for k, v in req["tags"].items()}
    sb = await modal.Sandbox.create.aio(**kwargs)
    sandboxes[sb.object_id] = sb
    return {"sandbox_id": sb.object_id}


async def op_alive(req):
    sb = await sandbox(req)
    return {"alive": (await sb.poll.aio()) is None}


async def op_list(req):
    # The running sandboxes of this app that carry every tag of `tags`, with all their tags
    # (for `backends gc`).
    found = []
    app_id = (await app()).app_id
    async for sb in modal.Sandbox.list.aio(app_id=app_id, tags=req.get("tags") or None):
        found.append({"sandbox_id": sb.object_id, "tags": await sb.get_tags.aio()})
    return {"sandboxes": found}


async def op_terminate(req):
    sb = await sandbox(req)
    await sb.terminate.aio()
    sandboxes.pop(req["sandbox_id"], None)
    return {}


async def op_write(req, reader):
    sb = await sandbox(req)
    data = await reader.readexactly(int(req["size"]))
    await sb.filesystem.write_bytes.aio(data, req["path"])
    return {}


async def op_read(req):
    sb = await sandbox(req)
    return await sb.filesystem.read_bytes.aio(req["path"])


def frame(tag, data):
    return tag + struct.pack(">I", len(data)) + data


async def op_exec(req, reader, writer):
    sb = await sandbox(req)
    kwargs = {}
    if req.get("cwd"):
        kwargs["workdir"] = req["cwd"]
    if req.get("env"):
        kwargs["env"] = dict(req["env"])
    proc = await sb.exec.aio(*req["argv"], text=False, **kwargs)
    writer.write(json.dumps({"ok": {}}).encode() + b"\n")
    await writer.drain()
    lock = asyncio.Lock()

    async def send(tag, data):
        async with lock:
            writer.write(frame(tag, data))
            await writer.drain()

    async def pump(stream, tag):
        async for chunk in stream:
            if chunk:
                await send(tag, chunk)

    async def stdin():
        try:
            while True:
                head = await reader.readexactly(5)
                tag, n = head[:1], struct.unpack(">I", head[1:])[0]
                data = await reader.readexactly(n) if n else b""
                if tag == b"i":
                    proc.stdin.write(data)
                    await proc.stdin.drain.aio()
                elif tag == b"e":
                    proc.stdin.write_eof()
                    await proc.stdin.drain.aio()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    feeder = asyncio.ensure_future(stdin())
    await asyncio.gather(pump(proc.stdout, b"o"), pump(proc.stderr, b"r"))
    code = await proc.wait.aio()
    feeder.cancel()
    await send(b"x", str(code).encode())


async def handle(reader, writer):
    try:
        line = await reader.readline()
        if not line:
            return
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "exec":
                await op_exec(req, reader, writer)
                return
            if op == "read":
                data = await op_read(req)
                writer.write(json.dumps({"ok": {"size": len(data)}}).encode() + b"\n" + data)
            else:
                fn = {"hello": op_hello, "create": op_create, "alive": op_alive, "list": op_list, "terminate": op_terminate}.get(op)
                if op == "write":
                    result = await op_write(req, reader)
                elif fn is None:
                    raise ValueError(f"unknown operation {op!r}")
                else:
                    result = await fn(req)
                writer.write(json.dumps({"ok": result}).encode() + b"\n")
        except Exception as e:  # every failure becomes a reply naming it
            msg = f"{type(e).__name__}: {e}"
            writer.write(json.dumps({"err": {"kind": kind_of(e), "message": msg}}).encode() + b"\n")
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main():
    server = await asyncio.start_unix_server(handle, path=SOCKET, limit=1 << 20)
    os.chmod(SOCKET, 0o600)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    # The supervisor holds our stdin: when it goes, so do we (and the sandboxes it stops).
    await loop.run_in_executor(None, sys.stdin.buffer.read)
    server.close()


asyncio.run(main())
