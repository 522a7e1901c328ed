"""A protocol-faithful stand-in for the Daytona service, for tests (the real one cannot be
reached from the test machines).

Control plane under /api (what the official `daytona` SDK and vibeos-exec's daytona backend
call): POST /sandbox, GET /sandbox[/{idOrName}], DELETE /sandbox/{id}, POST /sandbox/{id}/start
and /stop, GET /sandbox/{id}/toolbox-proxy-url. Toolbox under /toolbox/{sandboxId}:
POST /process/execute, the session endpoints (create, exec with runAsync, command status, logs
with ?follow=true over a websocket in the SDK's stdout/stderr framing, input, delete),
POST /files/bulk-upload (multipart) and /files/bulk-download (multipart answer), GET
/files/download?path= and /user-home-dir. Every sandbox
is a real container of a private dockerd (DOCKER_HOST), started with --network none; every
request needs `Authorization: Bearer <key>`.

Usage: python daytona_standin.py --api-key KEY [--port 0]; prints its base URL on the first stdout line.
"""

import argparse
import asyncio
import datetime
import json
import os
import secrets
import shlex
import sys

import aiohttp
from aiohttp import web

STDOUT_PREFIX = b"\x01\x01\x01"
STDERR_PREFIX = b"\x02\x02\x02"
REAPER = (
    "import os,time\n"
    "while True:\n"
    "    try:\n"
    "        os.waitpid(-1, 0)\n"
    "    except ChildProcessError:\n"
    "        time.sleep(1)\n"
)


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def error(status, message):
    reason = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 408: "Request Timeout",
              409: "Conflict", 500: "Internal Server Error"}.get(status, "Error")
    return web.json_response({"statusCode": status, "message": message, "error": reason},
                             status=status)


async def docker(*args, stdin=None, timeout=120):
    proc = await asyncio.create_subprocess_exec(
        "docker", *args, stdin=asyncio.subprocess.PIPE if stdin is not None else None,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    return proc.returncode, out, err


class Command:
    def __init__(self, cid, command, proc):
        self.id, self.command, self.proc = cid, command, proc
        self.log = bytearray()  # prefixed chunks, as the follow stream sends them
        self.exit_code = None
        self.changed = asyncio.Event()


class Sandbox:
    def __init__(self, sid, body, image, base):
        self.id = sid
        self.name = body.get("name") or sid
        self.image = image
        self.user = body.get("user") or "root"
        self.env = body.get("env") or {}
        self.labels = body.get("labels") or {}
        self.cpu = int(body.get("cpu") or 1)
        self.memory = int(body.get("memory") or 1)
        self.disk = int(body.get("disk") or 3)
        self.state = "creating"
        self.created = now()
        self.base = base
        self.sessions = {}

    @property
    def container(self):
        return "daytona-" + self.id

    def json(self):
        return {
            "id": self.id, "organizationId": "standin-org", "name": self.name,
            "snapshot": self.image, "user": self.user, "env": self.env, "labels": self.labels,
            "public": False, "networkBlockAll": True, "kvm": False, "target": "us",
            "cpu": self.cpu, "gpu": 0, "memory": self.memory, "disk": self.disk,
            "state": self.state, "desiredState": "destroyed" if self.state == "destroyed"
            else ("stopped" if self.state == "stopped" else "started"),
            "createdAt": self.created, "updatedAt": now(),
            "toolboxProxyUrl": self.base + "/toolbox", "daemonVersion": "standin",
            "autoStopInterval": 0, "autoArchiveInterval": 0, "autoDeleteInterval": -1,
        }


class Service:
    def __init__(self, key, default_image):
        self.key = key
        self.default_image = default_image
        self.sandboxes = {}
        self.base = ""

    def find(self, ref):
        if ref in self.sandboxes:
            return self.sandboxes[ref]
        for sb in self.sandboxes.values():
            if sb.name == ref:
                return sb
        return None

    # -- control plane --------------------------------------------------------------------
    async def create(self, request):
        body = await request.json()
        image = body.get("snapshot")
        build = body.get("buildInfo") or {}
        for line in (build.get("dockerfileContent") or "").splitlines():
            if line.strip().upper().startswith("FROM "):
                image = line.split(None, 1)[1].strip()
        image = image or self.default_image
        if body.get("name") and self.find(body["name"]):
            return error(409, "Sandbox with name %s already exists" % body["name"])
        sb = Sandbox(secrets.token_hex(8), body, image, self.base)
        args = ["run", "-d", "--name", sb.container, "--network", "none",
                "--label", "daytona-standin=1", "--label", "daytona-standin.id=" + sb.id,
                "--cpus", str(sb.cpu), "--memory", "%dg" % sb.memory]
        for k, v in sb.env.items():
            args += ["-e", "%s=%s" % (k, v)]
        code, _, err = await docker(*args, image, "python3", "-c", REAPER)
        if code != 0:
            return error(400, "cannot create the sandbox from %s: %s" % (image, err.decode().strip()))
        sb.state = "started"
        self.sandboxes[sb.id] = sb
        return web.json_response(sb.json())

    async def get(self, request):
        sb = self.find(request.match_info["ref"])
        if sb is None:
            return error(404, "Sandbox with ID or name %s not found" % request.match_info["ref"])
        return web.json_response(sb.json())

    async def list(self, request):
        # As the pinned SDK's API lists them (ListSandboxesResponse): a page of `items` and the
        # `nextCursor` of the next page (here the offset of its first item), null on the last.
        want = json.loads(request.query.get("labels") or "{}")
        found = [sb.json() for sb in self.sandboxes.values()
                 if all(sb.labels.get(k) == v for k, v in want.items())]
        start = int(request.query.get("cursor") or 0)
        end = start + int(request.query.get("limit") or 100)
        return web.json_response({
            "items": found[start:end],
            "nextCursor": str(end) if end < len(found) else None,
        })

    async def delete(self, request):
        sb = self.find(request.match_info["ref"])
        if sb is None:
            return error(404, "Sandbox with ID or name %s not found" % request.match_info["ref"])
        await docker("rm", "-f", sb.container)
        del self.sandboxes[sb.id]
        sb.state = "destroyed"
        return web.json_response(sb.json())

    async def start(self, request):
        sb = self.find(request.match_info["ref"])
        if sb is None:
            return error(404, "Sandbox with ID or name %s not found" % request.match_info["ref"])
        code, _, err = await docker("start", sb.container)
        if code != 0:
            return error(500, err.decode().strip())
        sb.state = "started"
        return web.json_response(sb.json())

    async def stop(self, request):
        sb = self.find(request.match_info["ref"])
        if sb is None:
            return error(404, "Sandbox with ID or name %s not found" % request.match_info["ref"])
        await docker("stop", "-t", "1", sb.container)
        sb.state = "stopped"
        sb.sessions.clear()
        return web.json_response(sb.json())

    async def proxy_url(self, request):
        sb = self.find(request.match_info["ref"])
        if sb is None:
            return error(404, "Sandbox with ID or name %s not found" % request.match_info["ref"])
        return web.json_response({"url": self.base + "/toolbox"})

    # -- toolbox --------------------------------------------------------------------------
    def sandbox(self, request):
        sb = self.sandboxes.get(request.match_info["sid"])
        if sb is None:
            raise web.HTTPNotFound(text=json.dumps({"statusCode": 404, "message": "sandbox not found",
                                                    "error": "Not Found"}),
                                   content_type="application/json")
        if sb.state != "started":
            raise web.HTTPBadRequest(text=json.dumps({"statusCode": 400, "error": "Bad Request",
                                                      "message": "Sandbox is not started"}),
                                     content_type="application/json")
        return sb

    def exec_args(self, sb, command, cwd=None, envs=None, interactive=False):
        args = ["exec"] + (["-i"] if interactive else [])
        if cwd:
            args += ["-w", cwd]
        for k, v in (envs or {}).items():
            args += ["-e", "%s=%s" % (k, v)]
        return args + [sb.container, "sh", "-c", command]

    async def execute(self, request):
        sb = self.sandbox(request)
        body = await request.json()
        if not isinstance(body.get("command"), str):
            return error(400, "command is required")
        proc = await asyncio.create_subprocess_exec(
            "docker", *self.exec_args(sb, body["command"], body.get("cwd"), body.get("envs")),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        timeout = body.get("timeout") or None
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return error(408, "command execution timeout")
        return web.json_response({"exitCode": proc.returncode, "result": out.decode("utf-8", "replace")})

    async def session_create(self, request):
        sb = self.sandbox(request)
        body = await request.json()
        sid = body.get("sessionId")
        if not sid:
            return error(400, "sessionId is required")
        if sid in sb.sessions:
            return error(409, "session already exists")
        sb.sessions[sid] = {}
        return web.Response(status=201)

    async def session_delete(self, request):
        sb = self.sandbox(request)
        cmds = sb.sessions.pop(request.match_info["session"], None)
        if cmds is None:
            return error(404, "session not found")
        for c in cmds.values():
            if c.proc.returncode is None:
                c.proc.kill()
        return web.Response(status=204)

    def session(self, sb, request):
        cmds = sb.sessions.get(request.match_info["session"])
        if cmds is None:
            raise web.HTTPNotFound(text='{"statusCode":404,"message":"session not found","error":"Not Found"}',
                                   content_type="application/json")
        return cmds

    async def session_exec(self, request):
        sb = self.sandbox(request)
        cmds = self.session(sb, request)
        body = await request.json()
        if not isinstance(body.get("command"), str):
            return error(400, "command is required")
        proc = await asyncio.create_subprocess_exec(
            "docker", *self.exec_args(sb, body["command"], interactive=True),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        cmd = Command(secrets.token_hex(8), body["command"], proc)
        cmds[cmd.id] = cmd

        async def pump(stream, prefix):
            while True:
                data = await stream.read(65536)
                if not data:
                    return
                cmd.log += prefix + data
                cmd.changed.set()

        async def wait():
            await asyncio.gather(pump(proc.stdout, STDOUT_PREFIX), pump(proc.stderr, STDERR_PREFIX))
            cmd.exit_code = await proc.wait()
            cmd.changed.set()

        task = asyncio.ensure_future(wait())
        if body.get("runAsync") or body.get("async"):
            return web.json_response({"cmdId": cmd.id})
        await task
        out = bytes(cmd.log)
        return web.json_response({"cmdId": cmd.id, "exitCode": cmd.exit_code,
                                  "output": out.replace(STDOUT_PREFIX, b"").replace(STDERR_PREFIX, b"").decode("utf-8", "replace")})

    def command(self, request):
        sb = self.sandbox(request)
        cmd = self.session(sb, request).get(request.match_info["cmd"])
        if cmd is None:
            raise web.HTTPNotFound(text='{"statusCode":404,"message":"command not found","error":"Not Found"}',
                                   content_type="application/json")
        return cmd

    async def command_get(self, request):
        cmd = self.command(request)
        return web.json_response({"id": cmd.id, "command": cmd.command, "exitCode": cmd.exit_code})

    async def command_input(self, request):
        cmd = self.command(request)
        body = await request.json()
        if not isinstance(body.get("data"), str):
            return error(400, "data is required")
        if cmd.exit_code is not None or cmd.proc.stdin is None:
            return error(400, "command is not running")
        cmd.proc.stdin.write(body["data"].encode())
        await cmd.proc.stdin.drain()
        return web.Response(status=200)

    async def command_logs(self, request):
        cmd = self.command(request)
        if request.query.get("follow") != "true":
            return web.Response(body=bytes(cmd.log).replace(STDOUT_PREFIX, b"").replace(STDERR_PREFIX, b""))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        sent = 0
        while True:
            cmd.changed.clear()
            if sent < len(cmd.log):
                chunk = bytes(cmd.log[sent:])
                sent += len(chunk)
                await ws.send_bytes(chunk)
                continue
            if cmd.exit_code is not None:
                break
            await cmd.changed.wait()
        await ws.close()
        return ws

    async def upload(self, request):
        sb = self.sandbox(request)
        reader = await request.multipart()
        paths, blobs = {}, {}
        while True:
            part = await reader.next()
            if part is None:
                break
            name = part.name or ""
            if name.endswith(".path"):
                paths[name[:-5]] = (await part.read()).decode()
            elif name.endswith(".file"):
                blobs[name[:-5]] = await part.read()
        for key, path in paths.items():
            if key not in blobs:
                return error(400, "no file for %s" % path)
            code, _, err = await docker(
                "exec", "-i", sb.container, "sh", "-c",
                'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path, stdin=blobs[key])
            if code != 0:
                return error(400, "cannot write %s: %s" % (path, err.decode().strip()))
        return web.Response(status=200)

    async def download_one(self, request):
        sb = self.sandbox(request)
        path = request.query.get("path")
        if not path:
            return error(400, "path is required")
        code, out, err = await docker("exec", sb.container, "cat", "--", path)
        if code != 0:
            return error(404, "file not found: %s" % err.decode().strip())
        return web.Response(body=out, content_type="application/octet-stream")

    async def home(self, request):
        sb = self.sandbox(request)
        code, out, _ = await docker("exec", sb.container, "sh", "-c", 'echo "$HOME"')
        return web.json_response({"dir": out.decode().strip() or "/"})

    async def download(self, request):
        sb = self.sandbox(request)
        body = await request.json()
        writer = aiohttp.MultipartWriter("form-data")
        for path in body.get("paths") or []:
            code, out, err = await docker("exec", sb.container, "cat", "--", path)
            if code == 0:
                part = writer.append(out, {"Content-Type": "application/octet-stream"})
                part.set_content_disposition("form-data", name="file", filename=path, quote_fields=False)
            else:
                msg = json.dumps({"message": err.decode().strip(), "statusCode": 404, "code": "FILE_NOT_FOUND"})
                part = writer.append(msg, {"Content-Type": "application/json"})
                part.set_content_disposition("form-data", name="error", filename=path, quote_fields=False)
        resp = web.Response(body=writer)
        resp.content_type = "multipart/form-data"
        resp.headers["Content-Type"] = "multipart/form-data; boundary=" + writer.boundary
        return resp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--default-image", default="python:3")
    a = ap.parse_args()
    svc = Service(a.api_key, a.default_image)

    @web.middleware
    async def auth(request, handler):
        if request.headers.get("Authorization") != "Bearer " + svc.key:
            return error(401, "Invalid credentials")
        return await handler(request)

    app = web.Application(middlewares=[auth], client_max_size=1 << 30)
    r = app.router
    r.add_post("/api/sandbox", svc.create)
    r.add_get("/api/sandbox", svc.list)
    r.add_get("/api/sandbox/{ref}", svc.get)
    r.add_delete("/api/sandbox/{ref}", svc.delete)
    r.add_post("/api/sandbox/{ref}/start", svc.start)
    r.add_post("/api/sandbox/{ref}/stop", svc.stop)
    r.add_get("/api/sandbox/{ref}/toolbox-proxy-url", svc.proxy_url)
    t = "/toolbox/{sid}"
    r.add_post(t + "/process/execute", svc.execute)
    r.add_post(t + "/process/session", svc.session_create)
    r.add_delete(t + "/process/session/{session}", svc.session_delete)
    r.add_post(t + "/process/session/{session}/exec", svc.session_exec)
    r.add_get(t + "/process/session/{session}/command/{cmd}", svc.command_get)
    r.add_get(t + "/process/session/{session}/command/{cmd}/logs", svc.command_logs)
    r.add_post(t + "/process/session/{session}/command/{cmd}/input", svc.command_input)
    r.add_post(t + "/files/bulk-upload", svc.upload)
    r.add_post(t + "/files/bulk-download", svc.download)
    r.add_get(t + "/files/download", svc.download_one)
    r.add_get(t + "/user-home-dir", svc.home)

    async def run():
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", a.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        svc.base = "http://127.0.0.1:%d" % port
        print(svc.base, flush=True)
        # Ends when the test closes our stdin (or kills us), removing our containers.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)
        for sb in list(svc.sandboxes.values()):
            await docker("rm", "-f", sb.container)

    asyncio.run(run())


if __name__ == "__main__":
    main()
