"""A forward HTTP proxy on 127.0.0.1 that records what it relays: proof that a client (uv in a
builder container) used the proxy variables it was given."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_PASS = ("Content-Type", "ETag", "Last-Modified", "Location")


@dataclass
class Proxy:
    url: str = ""
    requests: list[str] = field(default_factory=list)  # "GET http://…" relayed


def _handler(state: Proxy) -> type[BaseHTTPRequestHandler]:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            state.requests.append(f"{self.command} {self.path}")
            request = urllib.request.Request(self.path, method=self.command)
            if accept := self.headers.get("Accept"):
                request.add_header("Accept", accept)
            try:
                with direct.open(request, timeout=30) as up:
                    status, headers, body = up.status, up.headers, up.read()
            except urllib.error.HTTPError as exc:
                status, headers, body = exc.code, exc.headers, exc.read()
            self.send_response(status)
            for name in _PASS:
                if value := headers.get(name):
                    self.send_header(name, value)
            length = headers.get("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler


@contextmanager
def serve() -> Iterator[Proxy]:
    state = Proxy()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
