"""Headless Chromium driven over the Chrome DevTools Protocol, with the standard library only (a socket
speaking just enough WebSocket, RFC 6455): open a page, read its console, run JavaScript, take a
screenshot. For tests/test_report_browser.py.

    with Chromium() as page:             # Chromium.find() is None when no browser is installed
        page.open(path)                   # waits for the load event
        page.js("document.title")         # the value of an expression
        page.errors                       # console errors, uncaught exceptions, failed loads
        page.screenshot(png_path, height=1400)
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--window-size=1200,1400", "--remote-debugging-port=0"]


class Chromium:
    """A fresh headless Chromium (own profile, own process group) and one page of it."""

    def __init__(self, timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        self.errors: list[str] = []
        self._next_id = 0

    @staticmethod
    def find() -> str | None:
        return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

    def __enter__(self) -> "Chromium":
        self._profile = tempfile.mkdtemp(prefix="chromium-profile-")
        self.proc = subprocess.Popen([self.find(), *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port = self._port()
        deadline = time.monotonic() + self.timeout_s
        while True:   # the page target of about:blank
            targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
            pages = [t for t in targets if t.get("type") == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.ws = _WebSocket(pages[0]["webSocketDebuggerUrl"], self.timeout_s)
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.ws.close()
        except (OSError, AttributeError):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)   # the browser's own group: its helpers too
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        shutil.rmtree(self._profile, ignore_errors=True)

    def open(self, path: Path) -> None:
        self.call("Page.navigate", url=Path(path).resolve().as_uri())
        self._wait_for("Page.loadEventFired")

    def js(self, expression: str):
        """The value of a JavaScript expression (JSON-serialisable), evaluated in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"JavaScript failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, height: int = 1400, width: int = 1200) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def call(self, method: str, **params) -> dict:
        self._next_id += 1
        n = self._next_id
        self.ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            message = self._receive()
            if message.get("id") == n:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result", {})

    # -- helpers ------------------------------------------------------------------------------

    def _port(self) -> int:
        """The debugging port Chromium chose: it writes it to DevToolsActivePort in the profile."""
        marker = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Chromium exited at start (code {self.proc.returncode})")
            try:
                return int(marker.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                time.sleep(0.05)
        raise RuntimeError(f"Chromium did not open its debugging port within {self.timeout_s:g} s")

    def _wait_for(self, event: str) -> dict:
        while True:
            message = self._receive()
            if message.get("method") == event:
                return message.get("params", {})

    def _receive(self) -> dict:
        message = json.loads(self.ws.recv())
        method, params = message.get("method"), message.get("params") or {}
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append("console." + params["type"] + ": " + " ".join(
                str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            self.errors.append(f"uncaught: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            e = params["entry"]
            self.errors.append(f"{e.get('source')}: {e.get('text')} {e.get('url', '')}".strip())
        return message


class _WebSocket:
    """A client WebSocket: text frames out (masked), text frames in; pings answered."""

    def __init__(self, url: str, timeout_s: float):
        assert url.startswith("ws://"), url
        host_port, _, path = url[len("ws://"):].partition("/")
        host, _, port = host_port.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           ).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the browser closed the connection during the handshake")
            head += chunk
        head, self.buffer = head.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(f"no WebSocket upgrade: {head[:200]!r}")

    def send(self, text: str, opcode: int = 1) -> None:
        data = text.encode() if isinstance(text, str) else text
        n = len(data)
        header = bytes([0x80 | opcode]) + (bytes([0x80 | n]) if n < 126 else
                                           bytes([0x80 | 126]) + struct.pack(">H", n) if n < 1 << 16 else
                                           bytes([0x80 | 127]) + struct.pack(">Q", n))
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[k % 4] for k, b in enumerate(data)))

    def recv(self) -> str:
        parts = []
        while True:
            first, second = self._read(2)
            opcode, n = first & 0x0F, second & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if second & 0x80 else None
            data = self._read(n)
            if mask:
                data = bytes(b ^ mask[k % 4] for k, b in enumerate(data))
            if opcode == 8:
                raise ConnectionError("the browser closed the WebSocket")
            if opcode == 9:
                self.send(data, opcode=10)
                continue
            parts.append(data)
            if first & 0x80:
                return b"".join(parts).decode("utf-8", errors="replace")

    def close(self) -> None:
        self.sock.close()

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buffer)))
            if not chunk:
                raise ConnectionError("the browser closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data
