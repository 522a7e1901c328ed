"""Drives the Daytona stand-in with the official, unmodified `daytona` SDK (pinned in
scripts/test-all's venv): create, exec with exit code and output, cwd/env/timeout, file
upload/download, a session command with streamed logs and input, listing by labels, delete.
Prints one JSON line of observations; the Rust test asserts on them. Usage: daytona_conformance.py IMAGE
(DAYTONA_API_URL and DAYTONA_API_KEY point at the stand-in)."""

import asyncio
import json
import sys

from daytona import (
    AsyncDaytona,
    CreateSandboxFromSnapshotParams,
    Daytona,
    ListSandboxesQuery,
    SessionExecuteRequest,
)

image = sys.argv[1]
seen = {}
client = Daytona()
sb = client.create(CreateSandboxFromSnapshotParams(snapshot=image, labels={"conformance": "1"}),
                   timeout=120)
seen["state"] = str(sb.state.value if hasattr(sb.state, "value") else sb.state)
seen["labels"] = sb.labels
# Listing by labels, one item a page (what `backends gc` finds leftovers by).
other = client.create(CreateSandboxFromSnapshotParams(snapshot=image, labels={"conformance": "2"}), timeout=120)
seen["listed"] = [s.id for s in client.list(ListSandboxesQuery(labels={"conformance": "1"}))]
seen["listed_paged"] = sorted(s.id for s in client.list(ListSandboxesQuery(limit=1)))
seen["listed_expected"] = sorted([sb.id, other.id])
seen["listed_is_sb"] = seen["listed"] == [sb.id]
client.delete(other)
r = sb.process.exec("echo out; echo err >&2; exit 7")
seen["exec"] = [r.exit_code, r.result]
r = sb.process.exec("pwd; echo $GREETING", cwd="/tmp", env={"GREETING": "hi there"})
seen["exec_cwd_env"] = [r.exit_code, r.result]
try:
    sb.process.exec("sleep 30", timeout=1)
    seen["exec_timeout"] = "no error"
except Exception as e:  # the SDK raises on the service's 408
    seen["exec_timeout"] = type(e).__name__ + ": " + str(e)[:200]
sb.fs.upload_file(b"\x00binary\xffpayload\n", "/tmp/conf/up.bin")
r = sb.process.exec("od -An -c /tmp/conf/up.bin | tr -s ' '")
seen["uploaded_in_sandbox"] = r.result.strip()
seen["download"] = list(sb.fs.download_file("/tmp/conf/up.bin"))
try:
    sb.fs.download_file("/tmp/conf/missing")
    seen["download_missing"] = "no error"
except Exception as e:
    seen["download_missing"] = type(e).__name__
sb.process.create_session("s1")
cmd = sb.process.execute_session_command(
    "s1", SessionExecuteRequest(command="read line; echo got:$line; echo e >&2; exit 3", run_async=True))
sb.process.send_session_command_input("s1", cmd.cmd_id, "hello\n")
out, err = [], []


async def stream():
    async with AsyncDaytona() as a:
        asb = await a.get(sb.id)
        await asb.process.get_session_command_logs_async("s1", cmd.cmd_id, out.append, err.append)
        return await asb.process.get_session_command("s1", cmd.cmd_id)


final = asyncio.run(stream())
seen["session"] = ["".join(out), "".join(err), final.exit_code]
same = client.get(sb.id)
seen["get_same"] = same.id == sb.id
client.delete(sb)
try:
    client.get(sb.id)
    seen["after_delete"] = "still there"
except Exception as e:
    seen["after_delete"] = type(e).__name__
print(json.dumps(seen))
