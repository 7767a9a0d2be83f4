"""A local Python package index for offline tests: tiny projects built with ``uv build``, laid
out as a static PEP 691 JSON simple index (with PEP 700 sizes and upload times, which uv needs
for ``--exclude-newer``), served on 127.0.0.1 by a thread.

Layout under ``root``: ``files/<filename>`` and ``<index>/<project>/index.json`` for each index
name (``simple`` by default; a second one such as ``torch`` serves a project only there).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import threading
import tomllib
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

from envbuild.proc import core as proc

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def build_projects(projects: Path, dist: Path, cache: Path) -> dict[str, list[Path]]:
    """``uv build`` every folder under ``projects`` (offline); returns folder name -> files.

    A project whose pyproject has ``[tool.envbuild-test] sdist-only = true`` is built as an
    sdist only."""
    env = proc.child_env(
        {
            "UV_OFFLINE": "1",
            "UV_NO_CONFIG": "1",
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_CACHE_DIR": str(cache),
            "SOURCE_DATE_EPOCH": "1700000000",
        }
    )
    out: dict[str, list[Path]] = {}
    for project in sorted(p for p in projects.iterdir() if (p / "pyproject.toml").is_file()):
        meta = tomllib.loads((project / "pyproject.toml").read_text())
        only_sdist = meta.get("tool", {}).get("envbuild-test", {}).get("sdist-only", False)
        target = dist / project.name
        work = dist / "src" / project.name
        shutil.copytree(project, work)
        argv = [proc.find_uv(), "build", "--out-dir", str(target), "--no-progress"]
        if only_sdist:
            argv.append("--sdist")
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"uv build {project.name} failed:\n{done.stderr}")
        out[project.name] = sorted(
            p for p in target.iterdir() if p.name.endswith((".whl", ".tar.gz", ".zip"))
        )
    return out


def retag_wheel(wheel: Path, tag: str) -> Path:
    """A copy of a pure wheel re-tagged as ``tag`` (e.g. ``py3-none-manylinux_2_39_x86_64``):
    file name, ``WHEEL`` and ``RECORD`` changed consistently, as auditwheel would."""
    name, version, _build, _tags = parse_wheel_filename(wheel.name)
    stem = f"{str(name).replace('-', '_')}-{version}"
    new = wheel.with_name(f"{stem}-{tag}.whl")
    with zipfile.ZipFile(wheel) as src:
        members = {i.filename: src.read(i) for i in src.infolist()}
    info = f"{stem}.dist-info"
    members[f"{info}/WHEEL"] = b"".join(
        (f"Tag: {tag}\n".encode() if line.startswith(b"Tag:") else line + b"\n")
        for line in members[f"{info}/WHEEL"].splitlines()
    ).replace(b"Root-Is-Purelib: true", b"Root-Is-Purelib: false")
    rows = []
    for member, data in members.items():
        if member == f"{info}/RECORD":
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{member},sha256={digest},{len(data)}\n")
    members[f"{info}/RECORD"] = ("".join(rows) + f"{info}/RECORD,,\n").encode()
    with zipfile.ZipFile(new, "w", zipfile.ZIP_DEFLATED) as dst:
        for member, data in members.items():
            dst.writestr(zipfile.ZipInfo(member, date_time=(2020, 1, 1, 0, 0, 0)), data)
    wheel.unlink()
    return new


def write_index(root: Path, files: list[tuple[Path, str, datetime]]) -> None:
    """Lay out ``root`` as a PEP 691 index: each ``(file, index name, upload time)``."""
    by_project: dict[tuple[str, str], list[dict[str, Any]]] = {}
    (root / "files").mkdir(parents=True, exist_ok=True)
    for path, index, uploaded in files:
        if path.name.endswith(".whl"):
            project, version = parse_wheel_filename(path.name)[:2]
        else:
            project, version = parse_sdist_filename(path.name)
        shutil.copy2(path, root / "files" / path.name)
        data = path.read_bytes()
        entry = {
            "filename": path.name,
            "url": f"../../files/{path.name}",
            "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
            "size": len(data),
            "upload-time": uploaded.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
            "version": str(version),
        }
        by_project.setdefault((index, canonicalize_name(str(project))), []).append(entry)
    for (index, project), entries in by_project.items():
        folder = root / index / project
        folder.mkdir(parents=True, exist_ok=True)
        versions = sorted({e.pop("version") for e in entries})
        page = {
            "meta": {"api-version": "1.1"},
            "name": project,
            "versions": versions,
            "files": sorted(entries, key=lambda e: e["filename"]),
        }
        (folder / "index.json").write_text(json.dumps(page, indent=1))


class _Handler(http.server.SimpleHTTPRequestHandler):
    def translate_path(self, path: str) -> str:
        local = super().translate_path(path)
        if os.path.isdir(local) and os.path.isfile(os.path.join(local, "index.json")):
            return os.path.join(local, "index.json")
        return local

    def guess_type(self, path: str | os.PathLike[str]) -> str:
        if str(path).endswith("index.json"):
            return JSON_TYPE
        return super().guess_type(path)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serve(root: Path) -> Iterator[str]:
    """Serve ``root`` on 127.0.0.1 (a free port); yields the base URL."""
    handler = functools.partial(_Handler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
