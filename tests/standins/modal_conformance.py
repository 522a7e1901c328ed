"""Drives a Modal endpoint with the official, unmodified `modal` SDK through the sandbox life
cycle the vibeos-exec modal backend relies on: create, exec (exit code, stdout, stderr, stdin,
workdir, env, timeout), file upload and download, tags and listing by tags, terminate. Prints one JSON object of what it
observed; the Rust conformance test asserts on it. Endpoint and token come from the standard
MODAL_SERVER_URL / MODAL_TOKEN_ID / MODAL_TOKEN_SECRET; argv[1] is the image tag.
"""

import json
import sys
import time

import modal

image_tag = sys.argv[1]
seen = {}
app = modal.App.lookup("vibeos-conformance", create_if_missing=True)
t = time.monotonic()
sb = modal.Sandbox.create(
    app=app, image=modal.Image.from_registry(image_tag), timeout=600, tags={"conformance": "1"}
)
seen["create_s"] = round(time.monotonic() - t, 3)
seen["sandbox_id"] = sb.object_id

p = sb.exec("sh", "-c", "echo out; echo err >&2; exit 3")
seen["exit"] = p.wait()
seen["stdout"] = p.stdout.read()
seen["stderr"] = p.stderr.read()

p = sb.exec("sh", "-c", "pwd; echo $GREETING", workdir="/tmp", env={"GREETING": "hello"})
p.wait()
seen["cwd_env"] = p.stdout.read().split()

p = sb.exec("cat")
p.stdin.write(b"through stdin")
p.stdin.write_eof()
p.stdin.drain()
p.wait()
seen["stdin"] = p.stdout.read()

t = time.monotonic()
p = sb.exec("sleep", "30", timeout=1)
seen["timeout_exit"] = p.wait()
seen["timeout_s"] = round(time.monotonic() - t, 3)
# No procps in a minimal image: count the processes whose command line is `sleep 30`.
p = sb.exec("sh", "-c", "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -cx 'sleep 30 ' || true")
p.wait()
seen["sleep_left"] = p.stdout.read().strip()

payload = bytes(range(256)) * 64
sb.filesystem.write_bytes(payload, "/srv/up/payload.bin")
p = sb.exec("sh", "-c", "wc -c < /srv/up/payload.bin")
p.wait()
seen["uploaded_size"] = p.stdout.read().strip()
p = sb.exec("sh", "-c", "printf 'made inside' > /srv/made.txt")
p.wait()
seen["downloaded"] = sb.filesystem.read_bytes("/srv/made.txt").decode()
seen["roundtrip_equal"] = sb.filesystem.read_bytes("/srv/up/payload.bin") == payload
try:
    sb.filesystem.read_bytes("/srv/missing.txt")
    seen["missing"] = "no error"
except Exception as e:  # the SDK's typed error for a missing file
    seen["missing"] = type(e).__name__

n = 20
t = time.monotonic()
for _ in range(n):
    sb.exec("true").wait()
seen["exec_roundtrip_ms"] = round((time.monotonic() - t) / n * 1000, 2)

# Tags and listing by tags (what `backends gc` finds leftovers by).
seen["tags"] = sb.get_tags()
seen["listed"] = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, tags={"conformance": "1"})]
seen["listed_other_tag"] = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, tags={"conformance": "2"})]

sb.terminate()
sb.wait(raise_on_termination=False)
seen["terminated_poll"] = sb.poll() is not None
seen["listed_after_terminate"] = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, tags={"conformance": "1"})]
print(json.dumps(seen))
