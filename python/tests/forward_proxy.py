"""A forward proxy for plain HTTP that the tests run in a thread: it counts
every answer by method and status and can hold the first PUT of each path
to one port (a URL expiring on the way)."""

from __future__ import annotations

import collections
import http.client
import http.server
import threading
import time
import urllib.parse


class ForwardProxy(http.server.ThreadingHTTPServer):
    """Serves on 127.0.0.1 from construction; :attr:`url` is its address.
    ``hold_port``/``hold``: the first PUT of each path to that port waits
    ``hold`` seconds before it is sent on."""

    daemon_threads = True

    def __init__(self, hold_port: int | None = None, hold: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.hold_port, self.hold = hold_port, hold
        self.held: set[str] = set()
        self.lock = threading.Lock()
        self.answers: collections.Counter[tuple[str, int]] = collections.Counter()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def statuses(self, method: str, status: int) -> int:
        """How many ``method`` requests were answered ``status``."""
        with self.lock:
            return self.answers[(method, status)]


class _Forward(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ForwardProxy

    def log_message(self, *args: object) -> None:
        pass

    def forward(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.command == "PUT" and url.port == self.server.hold_port:
            with self.server.lock:
                first = url.path not in self.server.held
                self.server.held.add(url.path)
            if first:
                time.sleep(self.server.hold)
        skip = {"proxy-connection", "connection", "keep-alive", "host"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        target = url.path + (f"?{url.query}" if url.query else "")
        conn.request(self.command, target, body=body if body else None, headers=headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        with self.server.lock:
            self.server.answers[(self.command, response.status)] += 1
        self.send_response(response.status)
        for k, v in response.getheaders():
            if k.lower() not in {"transfer-encoding", "connection", "content-length"}:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = forward
