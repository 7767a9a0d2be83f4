"""Every answer envbuild reads from a registry itself is read as a stream with a limit
(:data:`envbuild.registry.api.MAX_ANSWER`): a body that never ends, or one larger than the
limit, is refused (exit 2, the URL named) after at most the limit is read, never read whole.
A real HTTP server on the loopback sends them."""

from __future__ import annotations

import http.server
import io
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from envbuild.errors import AnswerTooLarge, ExitCode
from envbuild.registry import referrers
from envbuild.registry.api import MAX_ANSWER, Endpoint, RegistryApi, read_bounded

DIGEST = "sha256:" + "ab" * 32
CHUNK = b"x" * 65536


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    mode = "endless"
    #: bytes sent of the last body (the client stopped reading past the limit)
    sent = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        mode = self.server.mode
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.oci.image.index.v1+json")
        self.server.sent = 0
        try:
            if mode == "endless":  # chunked, no end in sight (it ends at 4x the limit, so a
                # client that reads it whole fails the test rather than hang it)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while self.server.sent < 4 * MAX_ANSWER:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
                    self.server.sent += len(CHUNK)
                self.wfile.write(b"0\r\n\r\n")
            elif mode == "lying-length":  # a small Content-Length, then much more
                self.send_header("Content-Length", str(MAX_ANSWER + 1))
                self.end_headers()
                while self.server.sent <= MAX_ANSWER:
                    self.wfile.write(CHUNK)
                    self.server.sent += len(CHUNK)
            else:  # "no-length": no Content-Length, the connection closes at the end
                self.send_header("Connection", "close")
                self.end_headers()
                for _ in range(4 * MAX_ANSWER // len(CHUNK)):
                    self.wfile.write(CHUNK)
                    self.server.sent += len(CHUNK)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading: what is wanted

    def do_HEAD(self) -> None:  # a blob larger than any document: its length, and no body
        self.send_response(200)
        self.send_header("Content-Length", str(50 * MAX_ANSWER))
        self.send_header("Docker-Content-Digest", DIGEST)
        self.end_headers()


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _api(srv: _Server) -> RegistryApi:
    host, port = srv.server_address[:2]
    api = RegistryApi(
        f"{host}:{port}", "some/repo", Endpoint(insecure=True), lookup_credentials=False
    )
    api._scheme = "http"  # a loopback registry speaks plain HTTP
    return api


@pytest.mark.parametrize("mode", ["endless", "lying-length", "no-length"])
def test_an_oversize_manifest_is_refused_at_the_limit(server, mode):
    server.mode = mode
    with pytest.raises(AnswerTooLarge) as exc:
        _api(server).manifest_bytes(DIGEST)
    assert exc.value.exit_code == ExitCode.USER_ERROR
    url = f"http://{_api(server).registry}/v2/some/repo/manifests/{DIGEST}"
    assert url in exc.value.message
    assert f"more than {MAX_ANSWER} bytes" in exc.value.message


def test_an_endless_referrers_list_is_refused(server, tmp_path):
    server.mode = "endless"
    with pytest.raises(AnswerTooLarge) as exc:
        referrers.pull_referrers(_api(server), DIGEST, tmp_path / "layout", ["x"])
    assert f"/v2/some/repo/referrers/{DIGEST}" in exc.value.message
    assert not (tmp_path / "layout").exists()


def test_a_length_over_the_limit_is_refused_before_reading(server):
    server.mode = "lying-length"
    with pytest.raises(AnswerTooLarge):
        _api(server).manifest_bytes(DIGEST)
    # refused on the header: the server got no further than what the socket buffers take
    assert server.sent < MAX_ANSWER


def test_a_head_of_a_blob_larger_than_the_limit_is_not_refused(server):
    """A HEAD answer has no body: its Content-Length is the blob's (the CI's second machine
    asked whether a 70 MB layer was there and was told it was 'too large')."""
    assert _api(server).blob_exists(DIGEST)


class _Answer(io.BytesIO):
    headers: ClassVar[dict[str, str]] = {}


def test_an_answer_at_the_limit_is_read():
    assert read_bounded(_Answer(b"y" * 10), "u", limit=10) == b"y" * 10
    with pytest.raises(AnswerTooLarge):
        read_bounded(_Answer(b"y" * 11), "u", limit=10)
