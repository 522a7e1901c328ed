"""A protocol-faithful stand-in for Modal's sandbox service, for tests.

Modal cannot be reached from the test machines. This server speaks the same gRPC API the
official `modal` SDK speaks — it is built on the grpclib server bases and message classes that
ship inside the pinned `modal` wheel (`modal_proto`), so the wire format is Modal's own — and
runs every sandbox as a real container of a private dockerd (through the docker CLI and
`DOCKER_HOST`). It implements the sandbox flow V1 (`MODAL_SANDBOX_V2=0`):

  control plane  ClientHello, EnvironmentGetOrCreate, AppGetOrCreate, ImageFromId, ImageGetOrCreate +
                 ImageJoinStreaming (a registry tag is looked up in the private dockerd),
                 SandboxCreate (with tags), SandboxGetTaskId, SandboxWait, SandboxList (by
                 app and tags, paged by creation time), SandboxTagsGet, SandboxTerminate,
                 TaskGetCommandRouterAccess
  command router TaskExecStart, TaskExecStdioRead (server streaming, resumable by offset),
                 TaskExecStdinWrite, TaskExecStdinWriteStream, TaskExecStdinStatus,
                 TaskExecWait, TaskExecPoll

Both services listen on one plain-http port on 127.0.0.1 (the SDK accepts an http router on
localhost). Every call must carry the token pair the server was started with, as Modal's does;
anything else is answered UNAUTHENTICATED. An exec runs through `docker exec -i` under a
wrapper that records its process id, so a timeout (`timeout_secs`) kills the command inside the
container the way Modal does, while the sandbox keeps running. Like Modal's runtime, each
sandbox gets `/__modal/.bin/modal-sandbox-fs-tools` (the helper `sandbox.filesystem.*` execs;
this one is a Python implementation of the JSON commands the SDK sends).

Test hook (not part of Modal's API): the file named by `--control` may receive
`expire SANDBOX_ID` or `expire-all` lines; each removes that container, as Modal ends a
sandbox whose own lifetime (`timeout`) is over.

Usage: python modal_server.py --docker-host unix:///…/docker.sock --token-id ID
       --token-secret SECRET [--port 0]; prints `listening PORT` when ready.
"""

import argparse
import asyncio
import base64
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time

from grpclib import GRPCError, Status
from grpclib.server import Server
from google.protobuf import empty_pb2

from modal_proto import api_grpc, api_pb2
from modal_proto import task_command_router_grpc as router_grpc
from modal_proto import task_command_router_pb2 as router_pb2

FS_TOOLS = r'''#!/usr/bin/env python3
# The stand-in's modal-sandbox-fs-tools: one JSON command in argv[1], data on stdin/stdout,
# errors as a JSON payload on stderr (what the SDK parses).
import json, os, shutil, stat, sys

def fail(kind, message, code=1):
    sys.stderr.write(json.dumps({"error_kind": kind, "message": message}))
    sys.exit(code)

def kind_of(e):
    if isinstance(e, FileNotFoundError): return "NotFound"
    if isinstance(e, IsADirectoryError): return "IsDirectory"
    if isinstance(e, NotADirectoryError): return "NotADirectory"
    if isinstance(e, PermissionError): return "PermissionDenied"
    if isinstance(e, FileExistsError): return "AlreadyExists"
    return "Other"

cmd = json.loads(sys.argv[1])
(op, args), = cmd.items()
path = args.get("path", "")
try:
    if op == "ReadFile":
        with open(path, "rb") as f:
            shutil.copyfileobj(f, sys.stdout.buffer)
    elif op == "WriteFile":
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f)
    elif op == "MakeDirectory":
        if args.get("create_parents", True):
            os.makedirs(path, exist_ok=True)
        else:
            os.mkdir(path)
    elif op == "Remove":
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path) if args.get("recursive") else os.rmdir(path)
        else:
            os.unlink(path)
    else:
        fail("Unsupported", "the stand-in's fs tools do not implement " + op)
except OSError as e:
    fail(kind_of(e), e.strerror or str(e))
'''

# The wrapper every exec runs under: records its pid (for a kill on timeout), then becomes
# the command. `sh` is in every image the SDK can run commands in.
EXEC_WRAP = 'echo $$ > "/__modal/run/$0.pid"; exec "$@"'


BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def log(*a):
    print("modal-standin:", *a, file=sys.stderr, flush=True)


def _jwt(task_id: str) -> str:
    def b64(d):
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()

    return f"{b64({'alg': 'none'})}.{b64({'task_id': task_id, 'exp': int(time.time()) + 3600})}.sig"


class Docker:
    def __init__(self, host: str):
        self.env = dict(os.environ, DOCKER_HOST=host)

    async def run(self, *args, stdin=None):
        p = await asyncio.create_subprocess_exec(
            "docker",
            *args,
            env=self.env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await p.communicate(stdin)
        return p.returncode, out.decode(errors="replace").strip(), err.decode(errors="replace").strip()


class Exec:
    """One command in a sandbox: its output kept whole so reads can resume at any offset."""

    def __init__(self, proc):
        self.proc = proc
        self.out = [bytearray(), bytearray()]
        self.eof = [False, False]
        self.changed = asyncio.Condition()
        self.code = None
        self.signal = 0
        self.stdin_written = 0
        self.stdin_closed = False
        self.stdin_lock = asyncio.Lock()
        self.done = asyncio.Event()

    async def pump(self, fd: int, stream):
        while True:
            chunk = await stream.read(65536)
            async with self.changed:
                if chunk:
                    self.out[fd] += chunk
                else:
                    self.eof[fd] = True
                self.changed.notify_all()
            if not chunk:
                return

    async def write_stdin(self, offset: int, data: bytes, eof: bool):
        async with self.stdin_lock:
            if self.stdin_closed:
                return
            # Writes are idempotent by offset, as Modal's are: a retried chunk is skipped.
            skip = self.stdin_written - offset
            if skip < 0:
                raise GRPCError(Status.INVALID_ARGUMENT, f"stdin offset {offset} is past {self.stdin_written}")
            data = data[skip:]
            stdin = self.proc.stdin
            try:
                if data:
                    stdin.write(data)
                    await stdin.drain()
                self.stdin_written += len(data)
                if eof:
                    stdin.close()
                    self.stdin_closed = True
            except (BrokenPipeError, ConnectionResetError):
                self.stdin_closed = True


class Sandbox:
    def __init__(self, sandbox_id, container, app_id="", tags=None):
        self.id = sandbox_id
        self.task_id = "ta-" + sandbox_id[3:]
        self.container = container
        self.app_id = app_id
        self.tags = dict(tags or {})
        self.created_at = time.time()
        self.execs = {}
        self.terminated = False


class State:
    def __init__(self, docker: Docker, token_id: str, token_secret: str, fs_dir: str):
        self.docker = docker
        self.token = (token_id, token_secret)
        self.fs_dir = fs_dir
        self.apps = {}
        self.images = {}
        self.sandboxes = {}
        self.port = 0
        self.calls = []

    def check(self, stream, name):
        md = stream.metadata or {}
        self.calls.append(name)
        if (md.get("x-modal-token-id"), md.get("x-modal-token-secret")) != self.token:
            # The router authenticates by the jwt it handed out instead.
            if name.startswith("router.") and str(md.get("authorization", "")).startswith("Bearer "):
                return
            raise GRPCError(Status.UNAUTHENTICATED, "Token missing or invalid")

    def sandbox(self, sandbox_id) -> Sandbox:
        sb = self.sandboxes.get(sandbox_id)
        if sb is None:
            raise GRPCError(Status.NOT_FOUND, f"Sandbox {sandbox_id} not found")
        return sb

    def by_task(self, task_id) -> Sandbox:
        for sb in self.sandboxes.values():
            if sb.task_id == task_id:
                if sb.terminated:
                    raise GRPCError(Status.NOT_FOUND, f"Task {task_id} has finished")
                return sb
        raise GRPCError(Status.NOT_FOUND, f"Task {task_id} not found")

    async def running(self, sb: Sandbox) -> bool:
        code, out, _ = await self.docker.run("inspect", "-f", "{{.State.Running}}", sb.container)
        return code == 0 and out == "true"


def _unimplemented(name):
    async def method(self, stream):
        self.state.calls.append(name)
        raise GRPCError(Status.UNIMPLEMENTED, f"the Modal stand-in does not implement {name}")

    return method


def _fill(cls, base):
    """grpclib bases declare every RPC abstract; the ones not written here answer UNIMPLEMENTED."""
    for name in getattr(base, "__abstractmethods__", ()):
        if name not in cls.__dict__:
            setattr(cls, name, _unimplemented(name))
    cls.__abstractmethods__ = frozenset()
    return cls


class Control(api_grpc.ModalClientBase):
    def __init__(self, state: State):
        self.state = state

    async def ClientHello(self, stream):
        self.state.check(stream, "ClientHello")
        await stream.recv_message()
        await stream.send_message(api_pb2.ClientHelloResponse())

    async def EnvironmentGetOrCreate(self, stream):
        self.state.check(stream, "EnvironmentGetOrCreate")
        req = await stream.recv_message()
        name = req.deployment_name or "main"
        await stream.send_message(
            api_pb2.EnvironmentGetOrCreateResponse(
                environment_id="en-" + base64.b32encode(name.encode()).decode().rstrip("=").lower(),
                metadata=api_pb2.EnvironmentMetadata(
                    name=name, settings=api_pb2.EnvironmentSettings(image_builder_version="2026.10")
                ),
            )
        )

    async def AppGetOrCreate(self, stream):
        self.state.check(stream, "AppGetOrCreate")
        req = await stream.recv_message()
        key = (req.environment_name, req.app_name)
        app_id = self.state.apps.setdefault(key, "ap-" + secrets.token_hex(8))
        await stream.send_message(api_pb2.AppGetOrCreateResponse(app_id=app_id))

    async def _image(self, ref: str) -> str:
        code, _, err = await self.state.docker.run("image", "inspect", ref)
        if code != 0:
            raise GRPCError(Status.NOT_FOUND, f"Image {ref} not found: {err}")
        image_id = "im-" + base64.b32encode(ref.encode()).decode().rstrip("=").lower()
        self.state.images[image_id] = ref
        return image_id

    async def ImageGetOrCreate(self, stream):
        self.state.check(stream, "ImageGetOrCreate")
        req = await stream.recv_message()
        # `Image.from_registry(TAG)` is a Dockerfile `FROM TAG`; the stand-in has no builder
        # and no registry, so the tag must name an image of its dockerd.
        lines = list(req.image.dockerfile_commands)
        froms = [l.split(None, 1)[1].strip() for l in lines if l.upper().startswith("FROM ")]
        if len(froms) != 1 or len(lines) != 1:
            raise GRPCError(Status.UNIMPLEMENTED, f"the stand-in only runs `FROM tag` images, got {lines}")
        image_id = await self._image(froms[0])
        await stream.send_message(
            api_pb2.ImageGetOrCreateResponse(
                image_id=image_id,
                result=api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_SUCCESS),
            )
        )

    async def ImageJoinStreaming(self, stream):
        self.state.check(stream, "ImageJoinStreaming")
        req = await stream.recv_message()
        if req.image_id not in self.state.images:
            raise GRPCError(Status.NOT_FOUND, f"Image {req.image_id} not found")
        await stream.send_message(
            api_pb2.ImageJoinStreamingResponse(
                result=api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_SUCCESS), eof=True
            )
        )

    async def ImageFromId(self, stream):
        self.state.check(stream, "ImageFromId")
        req = await stream.recv_message()
        if req.image_id not in self.state.images:
            raise GRPCError(Status.NOT_FOUND, f"Image {req.image_id} not found")
        await stream.send_message(api_pb2.ImageFromIdResponse(image_id=req.image_id))

    async def SandboxCreate(self, stream):
        self.state.check(stream, "SandboxCreate")
        req = await stream.recv_message()
        d = req.definition
        ref = self.state.images.get(d.image_id)
        if ref is None:
            raise GRPCError(Status.NOT_FOUND, f"Image {d.image_id} not found")
        # Modal's V1 sandbox ids: `sb-` and 22 base62 characters (the SDK routes by this shape).
        sandbox_id = "sb-" + "".join(secrets.choice(BASE62) for _ in range(22))
        args = ["run", "-d", "--network", "none", "--label", f"modal-standin={sandbox_id}"]
        args += ["--name", "modal-" + sandbox_id, "--tmpfs", "/__modal/run:mode=0700"]
        args += ["-v", f"{self.state.fs_dir}:/__modal/.bin:ro"]
        if d.workdir:
            args += ["-w", d.workdir]
        entry = list(d.entrypoint_args) or ["sleep", "infinity"]
        code, out, err = await self.state.docker.run(*args, ref, *entry)
        if code != 0:
            raise GRPCError(Status.INTERNAL, f"cannot start the sandbox container: {err}")
        tags = {t.tag_name: t.tag_value for t in req.tags}
        self.state.sandboxes[sandbox_id] = Sandbox(sandbox_id, out, req.app_id, tags)
        log("created", sandbox_id, "from", ref)
        await stream.send_message(api_pb2.SandboxCreateResponse(sandbox_id=sandbox_id))

    async def SandboxGetTaskId(self, stream):
        self.state.check(stream, "SandboxGetTaskId")
        req = await stream.recv_message()
        sb = self.state.sandbox(req.sandbox_id)
        resp = api_pb2.SandboxGetTaskIdResponse(task_id=sb.task_id)
        if sb.terminated or not await self.state.running(sb):
            resp.task_result.CopyFrom(
                api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_TERMINATED)
            )
        await stream.send_message(resp)

    async def SandboxWait(self, stream):
        self.state.check(stream, "SandboxWait")
        req = await stream.recv_message()
        sb = self.state.sandbox(req.sandbox_id)
        deadline = time.monotonic() + max(req.timeout, 0)
        while True:
            if sb.terminated or not await self.state.running(sb):
                st = api_pb2.GenericResult.GENERIC_STATUS_TERMINATED
                await stream.send_message(
                    api_pb2.SandboxWaitResponse(result=api_pb2.GenericResult(status=st))
                )
                return
            if time.monotonic() >= deadline:
                await stream.send_message(api_pb2.SandboxWaitResponse())
                return
            await asyncio.sleep(0.2)

    async def SandboxList(self, stream):
        # Newest first, one page per call: `before_timestamp` (the last one's `created_at`)
        # asks for the next, as the SDK pages; `include_finished` is False in the SDK's list.
        self.state.check(stream, "SandboxList")
        req = await stream.recv_message()
        want = {t.tag_name: t.tag_value for t in req.tags}
        found = []
        for sb in self.state.sandboxes.values():
            if req.app_id and sb.app_id != req.app_id:
                continue
            if any(sb.tags.get(k) != v for k, v in want.items()):
                continue
            if req.before_timestamp and sb.created_at >= req.before_timestamp:
                continue
            if not req.include_finished and (sb.terminated or not await self.state.running(sb)):
                continue
            found.append(sb)
        found.sort(key=lambda sb: sb.created_at, reverse=True)
        infos = [
            api_pb2.SandboxInfo(
                id=sb.id,
                created_at=sb.created_at,
                app_id=sb.app_id,
                tags=[api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in sb.tags.items()],
                task_info=api_pb2.TaskInfo(id=sb.task_id, sandbox_id=sb.id),
            )
            for sb in found
        ]
        await stream.send_message(api_pb2.SandboxListResponse(sandboxes=infos))

    async def SandboxTagsGet(self, stream):
        self.state.check(stream, "SandboxTagsGet")
        req = await stream.recv_message()
        sb = self.state.sandbox(req.sandbox_id)
        tags = [api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in sb.tags.items()]
        await stream.send_message(api_pb2.SandboxTagsGetResponse(tags=tags))

    async def SandboxTerminate(self, stream):
        self.state.check(stream, "SandboxTerminate")
        req = await stream.recv_message()
        sb = self.state.sandbox(req.sandbox_id)
        sb.terminated = True
        await self.state.docker.run("rm", "-f", sb.container)
        log("terminated", sb.id)
        await stream.send_message(api_pb2.SandboxTerminateResponse())

    async def TaskGetCommandRouterAccess(self, stream):
        self.state.check(stream, "TaskGetCommandRouterAccess")
        req = await stream.recv_message()
        self.state.by_task(req.task_id)
        await stream.send_message(
            api_pb2.TaskGetCommandRouterAccessResponse(
                url=f"http://127.0.0.1:{self.state.port}", jwt=_jwt(req.task_id)
            )
        )


class Router(router_grpc.TaskCommandRouterBase):
    def __init__(self, state: State):
        self.state = state

    def _exec(self, task_id, exec_id) -> Exec:
        sb = self.state.by_task(task_id)
        ex = sb.execs.get(exec_id)
        if ex is None:
            raise GRPCError(Status.NOT_FOUND, f"Exec {exec_id} not found")
        return ex

    async def TaskExecStart(self, stream):
        self.state.check(stream, "router.TaskExecStart")
        req = await stream.recv_message()
        sb = self.state.by_task(req.task_id)
        if req.exec_id in sb.execs:
            # Idempotent by exec id, as Modal's is: a retried start does not run twice.
            await stream.send_message(router_pb2.TaskExecStartResponse())
            return
        if not await self.state.running(sb):
            raise GRPCError(Status.NOT_FOUND, f"Task {req.task_id} has finished")
        args = ["exec", "-i"]
        if req.workdir:
            args += ["-w", req.workdir]
        env = dict(req.env)
        # `exec(env=…)` travels as inline secret sources; stored secrets are not modelled.
        for src in req.secret_sources:
            if src.secret_id:
                raise GRPCError(Status.UNIMPLEMENTED, "the stand-in has no stored secrets")
            env.update(src.env.contents)
        for k, v in env.items():
            args += ["-e", f"{k}={v}"]
        args += [sb.container, "sh", "-c", EXEC_WRAP, req.exec_id, *req.command_args]
        proc = await asyncio.create_subprocess_exec(
            "docker",
            *args,
            env=self.state.docker.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        ex = Exec(proc)
        sb.execs[req.exec_id] = ex
        pumps = [asyncio.ensure_future(ex.pump(0, proc.stdout)), asyncio.ensure_future(ex.pump(1, proc.stderr))]

        async def reap():
            try:
                if req.timeout_secs:
                    await asyncio.wait_for(asyncio.shield(proc.wait()), req.timeout_secs)
                else:
                    await proc.wait()
            except asyncio.TimeoutError:
                await self.kill(sb, req.exec_id)
            code = await proc.wait()
            await asyncio.gather(*pumps)
            # `docker exec` reports a signal death as 128+N.
            if code > 128:
                ex.signal = code - 128
                ex.code = 0
            else:
                ex.code = code
            ex.done.set()

        asyncio.ensure_future(reap())
        await stream.send_message(router_pb2.TaskExecStartResponse())

    async def kill(self, sb: Sandbox, exec_id: str):
        script = f'p=$(cat /__modal/run/{exec_id}.pid 2>/dev/null) && kill -KILL "$p"; pkill -KILL -s "$p" 2>/dev/null; true'
        await self.state.docker.run("exec", sb.container, "sh", "-c", script)

    async def TaskExecStdioRead(self, stream):
        self.state.check(stream, "router.TaskExecStdioRead")
        req = await stream.recv_message()
        ex = self._exec(req.task_id, req.exec_id)
        fd = 1 if req.file_descriptor == router_pb2.TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDERR else 0
        offset = req.offset
        while True:
            async with ex.changed:
                await ex.changed.wait_for(lambda: len(ex.out[fd]) > offset or ex.eof[fd])
                data = bytes(ex.out[fd][offset:])
                eof = ex.eof[fd]
            if data:
                offset += len(data)
                await stream.send_message(router_pb2.TaskExecStdioReadResponse(data=data))
            elif eof:
                return

    async def TaskExecStdinWrite(self, stream):
        self.state.check(stream, "router.TaskExecStdinWrite")
        req = await stream.recv_message()
        ex = self._exec(req.task_id, req.exec_id)
        await ex.write_stdin(req.offset, req.data, req.eof)
        await stream.send_message(router_pb2.TaskExecStdinWriteResponse())

    async def TaskExecStdinWriteStream(self, stream):
        self.state.check(stream, "router.TaskExecStdinWriteStream")
        ex = None
        offset = 0
        async for msg in stream:
            if msg.HasField("start"):
                ex = self._exec(msg.start.task_id, msg.start.exec_id)
                offset = msg.start.offset
            elif ex is None:
                raise GRPCError(Status.INVALID_ARGUMENT, "the stream must begin with start")
            elif msg.HasField("end"):
                await ex.write_stdin(offset, b"", True)
            else:
                await ex.write_stdin(offset, msg.data, False)
                offset += len(msg.data)
        await stream.send_message(router_pb2.TaskExecStdinWriteStreamResponse())

    async def TaskExecStdinStatus(self, stream):
        self.state.check(stream, "router.TaskExecStdinStatus")
        req = await stream.recv_message()
        ex = self._exec(req.task_id, req.exec_id)
        await stream.send_message(
            router_pb2.TaskExecStdinStatusResponse(num_bytes_written=ex.stdin_written, closed=ex.stdin_closed)
        )

    def _exit(self, ex: Exec, cls):
        if ex.signal:
            return cls(signal=ex.signal)
        return cls(code=ex.code)

    async def TaskExecWait(self, stream):
        self.state.check(stream, "router.TaskExecWait")
        req = await stream.recv_message()
        ex = self._exec(req.task_id, req.exec_id)
        await ex.done.wait()
        await stream.send_message(self._exit(ex, router_pb2.TaskExecWaitResponse))

    async def TaskExecPoll(self, stream):
        self.state.check(stream, "router.TaskExecPoll")
        req = await stream.recv_message()
        ex = self._exec(req.task_id, req.exec_id)
        if not ex.done.is_set():
            await stream.send_message(router_pb2.TaskExecPollResponse())
            return
        await stream.send_message(self._exit(ex, router_pb2.TaskExecPollResponse))


_fill(Control, api_grpc.ModalClientBase)
_fill(Router, router_grpc.TaskCommandRouterBase)


async def control_loop(state: State, path: str):
    """Test hook: `expire SANDBOX_ID` lines in the control file end that sandbox's container."""
    seen = 0
    while True:
        await asyncio.sleep(0.1)
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines[seen:]:
            parts = line.split()
            if len(parts) == 2 and parts[0] == "expire":
                sb = state.sandboxes.get(parts[1])
                if sb is not None:
                    await state.docker.run("rm", "-f", sb.container)
                    log("expired", sb.id)
            elif parts == ["expire-all"]:
                for sb in list(state.sandboxes.values()):
                    await state.docker.run("rm", "-f", sb.container)
                    log("expired", sb.id)
        seen = len(lines)


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docker-host", required=True)
    ap.add_argument("--token-id", required=True)
    ap.add_argument("--token-secret", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--control", help="file of test-hook lines (expire SANDBOX_ID)")
    a = ap.parse_args()
    fs_dir = tempfile.mkdtemp(prefix="modal-standin-bin-")
    os.chmod(fs_dir, 0o755)
    tool = os.path.join(fs_dir, "modal-sandbox-fs-tools")
    with open(tool, "w") as f:
        f.write(FS_TOOLS)
    os.chmod(tool, 0o755)

    def stopped():
        # The harness stops the stand-in with SIGTERM and waits: leave no dir behind, and exit
        # at once as before (the containers go with the test's dockerd).
        shutil.rmtree(fs_dir, ignore_errors=True)
        os._exit(0)

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped)
    state = State(Docker(a.docker_host), a.token_id, a.token_secret, fs_dir)
    server = Server([Control(state), Router(state)])
    await server.start("127.0.0.1", a.port)
    state.port = server._server.sockets[0].getsockname()[1]
    if a.control:
        asyncio.ensure_future(control_loop(state, a.control))
    print(f"listening {state.port}", flush=True)
    try:
        await server.wait_closed()
    finally:
        for sb in state.sandboxes.values():
            await state.docker.run("rm", "-f", sb.container)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
