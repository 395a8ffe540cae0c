"""A scripted HTTP server on 127.0.0.1 for testing llm.py without the network.

Each POST takes the next scripted response (status, headers, body bytes, optional behaviour) and is recorded
(path, query, lower-cased headers, JSON body), so tests can check what was sent and how many times.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client that hung up mid-reply is expected here
        pass


@dataclass
class Scripted:
    status: int = 200
    body: bytes = b""
    headers: dict = field(default_factory=dict)
    behaviour: str = ""   # "" | "close" (drop the connection, no reply) | "trickle" (newlines for 5 s)
    delay_s: float = 0.0  # wait this long before answering (read-timeout tests)


@dataclass
class Recorded:
    path: str
    query: str
    headers: dict
    json: object


class ScriptedServer:
    """`add(...)` responses, point a client at `url`, then read `requests`."""

    def __init__(self):
        self.script: list[Scripted] = []
        self.requests: list[Recorded] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.httpd = _QuietServer(("127.0.0.1", 0), self._handler_class())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True).start()

    def add(self, status: int = 200, body: bytes | str | dict | list = b"", headers: dict | None = None,
            behaviour: str = "", delay_s: float = 0.0) -> None:
        headers = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            headers.setdefault("Content-Type", "application/json")
        if isinstance(body, str):
            body = body.encode()
        self.script.append(Scripted(status, body, headers, behaviour, delay_s))

    def close(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _next(self, recorded: Recorded) -> Scripted:
        with self._lock:
            self.requests.append(recorded)
            return self.script.pop(0) if self.script else Scripted(599, b'{"error": "script exhausted"}')

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            wbufsize = 1 << 16  # headers and body leave in one send, avoiding delayed-ACK stalls

            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw
                path, _, query = self.path.partition("?")
                reply = server._next(Recorded(path, query, {k.lower(): v for k, v in self.headers.items()}, body))
                time.sleep(reply.delay_s)
                if reply.behaviour == "close":
                    self.close_connection = True
                    return
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                if reply.behaviour == "trickle":  # no length: the body lasts until the connection closes
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    stop_at = time.monotonic() + 5.0  # long enough to fail a test, short enough not to hang it
                    try:
                        while not server.stopping.is_set() and time.monotonic() < stop_at:
                            self.wfile.write(b"\n")
                            self.wfile.flush()
                            time.sleep(0.02)
                    except OSError:  # the client hung up: that is the point of the test
                        pass
                    return
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

        return Handler
