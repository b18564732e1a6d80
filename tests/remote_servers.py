"""Servers on localhost for the remote-shard tests: moto's S3 server, and an
HTTP server with range reads and injected faults.

``FaultyHTTPServer`` serves objects held in memory (``server.objects[path]
= bytes``) with HEAD, GET and single ``Range: bytes=a-b`` requests, an ETag
(the content's MD5) and Last-Modified.  ``server.faults`` is a list of
``Fault``s, each applied to the next ``times`` GETs of its path (a range
read each): ``"503"`` answers 503 SlowDown, ``"cut"`` sends the headers and
half the body then closes the connection, ``"slow"`` waits ``delay_s``
before answering.  With ``server.ranges = False`` it answers every GET
with the whole object, as a server without range support does.  Every
request is counted per (method, path).
"""

import collections
import contextlib
import dataclasses
import email.utils
import hashlib
import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


@dataclasses.dataclass
class Fault:
    path: str
    kind: str  # "503", "cut", "slow", "500"
    times: int = 1
    delay_s: float = 30.0


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _object(self):
        path = self.path.split("?", 1)[0].lstrip("/")
        return path, self.server.objects.get(path)

    def _fault(self, path):
        with self.server.lock:
            for fault in self.server.faults:
                if fault.path == path and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    def _headers(self, status, length, data, extra=()):
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", '"%s"' % hashlib.md5(data).hexdigest())
        self.send_header("Last-Modified", email.utils.formatdate(self.server.started, usegmt=True))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()

    def do_HEAD(self):
        path, data = self._object()
        with self.server.lock:
            self.server.requests[("HEAD", path)] += 1
        if data is None:
            self.send_error(404)
            return
        self._headers(200, len(data), data)

    def do_GET(self):
        path, data = self._object()
        with self.server.lock:
            self.server.requests[("GET", path)] += 1
        if data is None:
            self.send_error(404)
            return
        fault = self._fault(path)
        if fault is not None and fault.kind in ("503", "500"):
            body = b"<Error><Code>SlowDown</Code></Error>" if fault.kind == "503" else b"oops"
            self.send_response(int(fault.kind))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if fault is not None and fault.kind == "slow":
            self.server.slow_started.set()
            self.server.release.wait(fault.delay_s)
        start, end, status, extra = 0, len(data), 200, []
        header = self.headers.get("Range") if self.server.ranges else None
        if header:
            match = _RANGE.match(header.strip())
            if match is None:
                self.send_error(416)
                return
            start = int(match.group(1))
            end = min(len(data), int(match.group(2)) + 1) if match.group(2) else len(data)
            status = 206
            extra = [("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")]
        body = data[start:end]
        self._headers(status, len(body), data, extra)
        if fault is not None and fault.kind == "cut":
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class FaultyHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects = {}
        self.faults = []
        self.requests = collections.Counter()
        self.lock = threading.Lock()
        self.started = time.time()
        self.slow_started = threading.Event()
        self.release = threading.Event()  # ends the "slow" faults' waits
        self.ranges = True  # False: Range headers ignored, the whole object sent
        self._thread = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_port}"

    def __enter__(self):
        self._thread = threading.Thread(target=self.serve_forever, daemon=True,
                                        name="faulty-http")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.shutdown()
        self.server_close()
        self._thread.join()


class S3Server:
    """moto's S3 server on localhost, in a process of its own (its warnings
    and its share of the GIL stay there), with the environment obstore reads
    its endpoint and credentials from."""

    ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
           "AWS_ALLOW_HTTP": "true"}

    def __init__(self):
        self._process = None
        self.endpoint = None

    def start(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint = f"http://127.0.0.1:{port}"
        for _ in range(1200):  # up to 2 minutes on a busy machine
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=5).close()
                return self
            except OSError:
                if self._process.poll() is not None:
                    raise RuntimeError("moto's server exited") from None
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto's server did not answer")

    def env(self):
        return {**self.ENV, "AWS_ENDPOINT_URL": self.endpoint}

    def create_bucket(self, bucket):
        request = urllib.request.Request(f"{self.endpoint}/{bucket}", method="PUT")
        urllib.request.urlopen(request, timeout=60).close()

    def put(self, bucket, key, data):
        import obstore
        import obstore.store

        store = obstore.store.from_url(f"s3://{bucket}", endpoint=self.endpoint,
                                       client_options={"allow_http": True},
                                       access_key_id="testing", secret_access_key="testing",
                                       region="us-east-1")
        obstore.put(store, key, data)

    def stop(self):
        if self._process is not None:
            self._process.terminate()
            self._process.wait(60)
            self._process = None


@contextlib.contextmanager
def s3_environment(bucket):
    """A started ``S3Server`` with ``bucket`` made, its endpoint and
    credentials in the environment until the block ends."""
    server = S3Server().start()
    saved = {k: os.environ.get(k) for k in server.env()}
    try:
        os.environ.update(server.env())
        server.create_bucket(bucket)
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def upload_folder(server, bucket, folder, prefix=""):
    """Puts every file of ``folder`` into ``bucket`` under ``prefix``."""
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            server.put(bucket, prefix + name, f.read())
