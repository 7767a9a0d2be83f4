"""A tiny Hugging Face hub on 127.0.0.1, speaking what ``snapshot_download`` uses.

Endpoints: ``GET /api/models/<repo>/tree/<rev>`` (the recursive file listing, with LFS
metadata), ``HEAD``/``GET /<repo>/resolve/<rev>/<path>`` (``X-Repo-Commit``, ``ETag`` — the git
blob id — and for LFS files ``X-Linked-Etag``/``X-Linked-Size`` with the sha256; ``Range`` for
resuming). Every request is counted, so a test can prove a second apply fetched nothing.
``cut_once`` names files whose first download is cut off half way, to test resuming.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_FROM = 1024  # files at least this big (or *.safetensors) are stored as LFS, as on the hub


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


@dataclass
class Repo:
    commit: str
    files: dict[str, bytes]

    def is_lfs(self, path: str) -> bool:
        return len(self.files[path]) >= LFS_FROM or path.endswith(".safetensors")

    def etag(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if self.is_lfs(path) else git_blob_id(data)


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    cut_once: set[str] = field(default_factory=set)
    url: str = ""

    def add(self, repo_id: str, commit: str, files: dict[str, bytes]) -> Repo:
        self.repos[repo_id] = Repo(commit, files)
        return self.repos[repo_id]

    def downloads(self) -> list[str]:
        """Paths of file bodies sent (GET on resolve)."""
        return [p for m, p in self.requests if m == "GET" and "/resolve/" in p]


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _find(self, path: str) -> tuple[str, Repo, str, str] | None:
            """(kind, repo, rev, rest) for /api/models/<org>/<name>/tree/<rev>[/...] and
            /<org>/<name>/resolve/<rev>/<path>."""
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
                repo_id, rev, rest = f"{parts[2]}/{parts[3]}", parts[5], "/".join(parts[6:])
                kind = "tree"
            elif len(parts) >= 5 and parts[2] == "resolve":
                repo_id, rev, rest = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
                kind = "resolve"
            else:
                return None
            repo = hub.repos.get(repo_id)
            if repo is None or rev not in (repo.commit, "main"):
                return None
            return kind, repo, rev, rest

        def _not_found(self, code: str = "RepoNotFound") -> None:
            body = json.dumps({"error": "not found"}).encode()
            self.send_response(404)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:
            self._serve()

        def do_GET(self) -> None:
            self._serve()

        def _serve(self) -> None:
            path = unquote(urlsplit(self.path).path)
            with lock:
                hub.requests.append((self.command, path))
            found = self._find(path)
            if found is None:
                self._not_found()
                return
            kind, repo, _rev, rest = found
            if kind == "tree":
                self._tree(repo, rest)
            elif rest not in repo.files:
                self._not_found("EntryNotFound")
            else:
                self._file(repo, rest)

        def _tree(self, repo: Repo, prefix: str) -> None:
            entries = []
            for name in sorted(repo.files):
                if prefix and not name.startswith(prefix.rstrip("/") + "/"):
                    continue
                data = repo.files[name]
                entry: dict[str, object] = {
                    "type": "file",
                    "path": name,
                    "size": len(data),
                    "oid": git_blob_id(data),
                }
                if repo.is_lfs(name):
                    entry["lfs"] = {
                        "oid": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "pointerSize": 134,
                    }
                entries.append(entry)
            body = json.dumps(entries).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _file(self, repo: Repo, name: str) -> None:
            data = repo.files[name]
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes=") and self.command == "GET":
                start = int(rng.removeprefix("bytes=").split("-")[0] or 0)
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", f'"{repo.etag(name)}"')
            if repo.is_lfs(name):
                self.send_header("X-Linked-Etag", f'"{repo.etag(name)}"')
                self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            if self.command == "HEAD":
                return
            body = data[start:]
            with lock:
                cut = name in hub.cut_once and not start
                if cut:
                    hub.cut_once.discard(name)
            if cut:
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(body)

    return Handler


@contextmanager
def serve(hub: Hub | None = None) -> Iterator[Hub]:
    """Run the hub on a free port of 127.0.0.1 for the block; ``hub.url`` is its endpoint."""
    hub = hub or Hub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
