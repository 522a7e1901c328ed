"""How should Rust talk to Modal? One exec round trip (`true`, stdout and stderr read, exit
code), three ways, against the same Modal endpoint and sandbox in one run:

  direct   the gRPC calls themselves (TaskExecStart, two TaskExecStdioRead streams,
           TaskExecWait) from a bare grpclib client on the wheel's stubs: what a Rust client
           speaking the protocol (tonic + prost on descriptors extracted from the wheel) would do
  sdk      the official SDK in-process (`sandbox.exec(...)`, read both streams, `wait()`)
  sidecar  the modal backend's path: a request over the sidecar's UNIX socket, the SDK there

Run by `cargo run --release -p vibeos-benches --bin modal` (which starts the stand-in), or by
hand with MODAL_SERVER_URL / MODAL_TOKEN_ID / MODAL_TOKEN_SECRET set: argv[1] image, argv[2]
runs, argv[3] the sidecar source. Prints one JSON object of median milliseconds.
"""

import asyncio
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid

import modal
from grpclib.client import Channel
from modal_proto import api_grpc, api_pb2
from modal_proto import task_command_router_grpc as rgrpc
from modal_proto import task_command_router_pb2 as rpb

image, runs, sidecar_src = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def med(xs):
    return round(statistics.median(xs) * 1000, 2)


async def direct(sandbox_id):
    url = os.environ["MODAL_SERVER_URL"].split("://", 1)[1]
    host, port = url.rsplit(":", 1)
    md = {"x-modal-token-id": os.environ["MODAL_TOKEN_ID"], "x-modal-token-secret": os.environ["MODAL_TOKEN_SECRET"]}
    ch = Channel(host, int(port))
    stub = api_grpc.ModalClientStub(ch)
    task = (await stub.SandboxGetTaskId(api_pb2.SandboxGetTaskIdRequest(sandbox_id=sandbox_id), metadata=md)).task_id
    acc = await stub.TaskGetCommandRouterAccess(api_pb2.TaskGetCommandRouterAccessRequest(task_id=task), metadata=md)
    rhost, rport = acc.url.split("://", 1)[1].rsplit(":", 1)
    rch = Channel(rhost, int(rport))
    router = rgrpc.TaskCommandRouterStub(rch)
    rmd = {"authorization": f"Bearer {acc.jwt}"}
    times = []
    for _ in range(runs):
        t = time.monotonic()
        eid = str(uuid.uuid4())
        await router.TaskExecStart(
            rpb.TaskExecStartRequest(
                task_id=task,
                exec_id=eid,
                command_args=["true"],
                stdout_config=rpb.TASK_EXEC_STDOUT_CONFIG_PIPE,
                stderr_config=rpb.TASK_EXEC_STDERR_CONFIG_PIPE,
            ),
            metadata=rmd,
        )

        async def read(fd):
            async with router.TaskExecStdioRead.open(metadata=rmd) as s:
                await s.send_message(rpb.TaskExecStdioReadRequest(task_id=task, exec_id=eid, file_descriptor=fd), end=True)
                async for _ in s:
                    pass

        await asyncio.gather(
            read(rpb.TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDOUT),
            read(rpb.TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDERR),
            router.TaskExecWait(rpb.TaskExecWaitRequest(task_id=task, exec_id=eid), metadata=rmd),
        )
        times.append(time.monotonic() - t)
    ch.close()
    rch.close()
    return med(times)


def sdk(sb):
    times = []
    for _ in range(runs):
        t = time.monotonic()
        p = sb.exec("true", text=False)
        p.stdout.read()
        p.stderr.read()
        p.wait()
        times.append(time.monotonic() - t)
    return med(times)


def sidecar(sandbox_id):
    d = tempfile.mkdtemp()
    sock = os.path.join(d, "s.sock")
    proc = subprocess.Popen([sys.executable, "-u", "-c", sidecar_src, sock], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    times = []
    for _ in range(runs):
        t = time.monotonic()
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        s.sendall(json.dumps({"op": "exec", "sandbox_id": sandbox_id, "argv": ["true"]}).encode() + b"\n")
        s.sendall(b"e\0\0\0\0")
        f = s.makefile("rb")
        reply = json.loads(f.readline())
        assert "ok" in reply, reply
        while True:
            h = f.read(5)
            if len(h) < 5:
                break
            f.read(struct.unpack(">I", h[1:])[0])
            if h[:1] == b"x":
                break
        s.close()
        times.append(time.monotonic() - t)
    proc.stdin.close()
    proc.wait()
    return med(times)


app = modal.App.lookup("vibeos-bench", create_if_missing=True)
sb = modal.Sandbox.create(app=app, image=modal.Image.from_registry(image))
sb.exec("true").wait()
result = {
    "runs": runs,
    "direct_ms": asyncio.run(direct(sb.object_id)),
    "sdk_ms": sdk(sb),
    "sidecar_ms": sidecar(sb.object_id),
}
sb.terminate()
print(json.dumps(result))
