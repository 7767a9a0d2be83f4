"""An HTTP proxy in front of a test index that can hold wheel downloads: while ``hold`` is set,
a request for a ``.whl`` sets ``arrived`` and waits for ``release``. A test can then act (kill an
apply, start a second one) at a moment it knows: in the middle of uv installing the venv."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Held:
    upstream: str
    url: str = ""
    hold: bool = False
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    wheel_requests: int = 0


_PASS = ("Content-Type", "Content-Range", "Accept-Ranges", "ETag", "Last-Modified", "Location")


def _handler(state: Held) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._forward()

        def do_GET(self) -> None:
            if self.path.split("?")[0].endswith(".whl"):
                state.wheel_requests += 1
                if state.hold:
                    state.arrived.set()
                    state.release.wait(timeout=120)
            self._forward()

        def _forward(self) -> None:
            request = urllib.request.Request(state.upstream + self.path, method=self.command)
            for name in ("Range", "Accept"):
                if value := self.headers.get(name):
                    request.add_header(name, value)
            try:
                with urllib.request.urlopen(request, timeout=30) as up:
                    status, headers, body = up.status, up.headers, up.read()
            except urllib.error.HTTPError as exc:
                status, headers, body = exc.code, exc.headers, exc.read()
            try:
                self.send_response(status)
                for name in _PASS:
                    if value := headers.get(name):
                        self.send_header(name, value)
                length = headers.get("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
            except OSError:
                pass  # the client was killed while we held it

    return Handler


@contextmanager
def serve(upstream: str) -> Iterator[Held]:
    state = Held(upstream)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join()
