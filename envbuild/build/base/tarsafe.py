"""The rules every member of a base obeys, in one place, so no reader can write outside its target.

A base comes from outside (a rootfs tarball, the layers of an OCI layout or of a pulled image).
Every reader of it in :mod:`envbuild.build.base.tarread` — ``tar_entries`` (a rootfs, re-packed),
``scan`` (an image layer, kept as it is) and ``safe_extract`` (unpacking) — passes each member
through :meth:`Tree.admit`, the one definition of the rules:

* a name that is absolute or holds ``..`` is refused, and so is a path longer than Linux takes
  (4096 bytes, 255 a component);
* a member below a symlink or a non-directory (``evil -> /etc`` then ``evil/passwd``) is refused,
  also when the symlink came from a lower layer of the same image;
* a member that is not a directory may not replace a directory that holds members;
* a symlink whose relative target climbs out of the root (following the symlinks known so far,
  and checked again against the whole tree at the end) is refused; an absolute target names a
  path of the image, and is never followed here;
* a hardlink must name a regular file that came earlier (in the archive or a lower layer), and a
  file a hardlink names may not be replaced afterwards;
* device files and fifos are allowed under ``dev/`` only (a re-packed rootfs drops them: the
  engine provides /dev); sparse members are refused (a 10 KB tarball can declare a 4 GiB file);
  owners are 0 … 2^32-1;
* PAX and GNU long-name headers are at most 1 MiB; a base holds at most :class:`Limits` members
  and uncompressed bytes, counted as the bytes are read (so a bomb stops at the limit);
* a truncated or corrupt compressed stream, a corrupt tar header or a member cut short is a
  :class:`CorruptArchive` naming the file and what is wrong.

Every refusal is a user error (exit 2). Whiteouts (``.wh.<name>``, ``.wh..wh..opq``) hide what
lower layers made, as the OCI image spec says (not what the same layer made).
"""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Callable
from dataclasses import dataclass

from envbuild.build.entries import OPAQUE, WHITEOUT
from envbuild.errors import InputFileError

GIB = 1 << 30
PATH_MAX, NAME_MAX = 4096, 255
MAX_ID = (1 << 32) - 1


class UnsafeArchive(InputFileError):
    """A base tarball tries to write outside its target, or holds what a layer cannot."""


class CorruptArchive(UnsafeArchive):
    """A base tarball or layer is truncated or corrupt (its compression or its tar headers)."""


@dataclass(frozen=True)
class Limits:
    """How much one base may expand to (all its layers together).

    ``max_bytes``: uncompressed tar bytes; ``max_ratio``: uncompressed bytes per compressed byte
    of each stream once past ``ratio_free`` bytes (None: no ratio limit); ``max_members``.
    The defaults are documented in docs/image.md; a spec's ``base.max_unpacked_gib`` replaces
    the byte and ratio limits with its own figure."""

    max_bytes: int = 64 * GIB
    max_ratio: int | None = 100
    ratio_free: int = GIB
    max_members: int = 2_000_000

    @classmethod
    def of(cls, max_unpacked_gib: float | None) -> Limits:
        if max_unpacked_gib is None:
            return cls()
        return cls(max_bytes=int(max_unpacked_gib * GIB), max_ratio=None)


def _gib(n: int) -> str:
    return f"{n / GIB:.4g} GiB"


SPARSE_HINT = "sparse members are refused (re-create the archive without --sparse)"


# --- the rules --------------------------------------------------------------------------------


class _Node:
    __slots__ = ("children", "kind", "layer", "link")

    def __init__(self, kind: str, layer: int, link: str = "") -> None:
        self.kind = kind  # "dir", "file", "symlink" or "device"
        self.layer = layer
        self.link = link
        self.children: dict[str, _Node] = {}


def member_path(name: str, *, where: str) -> str:
    """A member's name as a relative path (``./a/b/`` -> ``a/b``), or :class:`UnsafeArchive`."""
    if name.startswith("/"):
        raise UnsafeArchive(where, f"member {name!r} has an absolute path; refusing the archive")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(where, f"member {name!r} climbs out with '..'; refusing the archive")
    path = "/".join(parts)
    if len(path.encode(errors="surrogateescape")) > PATH_MAX or any(
        len(p.encode(errors="surrogateescape")) > NAME_MAX for p in parts
    ):
        raise UnsafeArchive(where, f"member {name[:80]!r}… has a name longer than Linux takes")
    return path


def check_symlink(
    path: str, target: str, *, where: str, readlink: Callable[[str], str | None] | None = None
) -> None:
    """Refuse a relative symlink target that climbs out of the root, following the symlinks
    ``readlink`` knows of on the way (``d/up -> ..`` then ``x -> d/up/../..`` climbs out).
    An absolute target names a path of the image and is allowed (never followed here)."""
    if not target:
        raise UnsafeArchive(where, f"symlink {path!r} has an empty target")
    if target.startswith("/"):
        return
    if _climbs_out(posixpath.dirname(path), target, readlink or (lambda _p: None)):
        raise UnsafeArchive(
            where, f"symlink {path!r} -> {target!r} points outside the root (or loops)"
        )


def _climbs_out(start: str, target: str, readlink: Callable[[str], str | None]) -> bool:
    resolved = [p for p in start.split("/") if p]
    queue = [p for p in target.split("/") if p not in ("", ".")]
    hops = 0
    while queue:
        part = queue.pop(0)
        if part == "..":
            if not resolved:
                return True
            resolved.pop()
            continue
        resolved.append(part)
        link = readlink("/".join(resolved))
        if link is None:
            continue
        hops += 1
        if hops > 40:
            return True  # a loop; refuse rather than guess
        resolved.pop()
        if link.startswith("/"):
            resolved = []
        queue = [p for p in link.split("/") if p not in ("", ".")] + queue
    return False


def is_device(m: tarfile.TarInfo) -> bool:
    return m.ischr() or m.isblk() or m.isfifo()


class Tree:
    """What the members read so far make of the root, and the budget they have used. One tree
    reads a whole base (every layer of an image, in order: call :meth:`next_layer` between)."""

    def __init__(self, where: str, limits: Limits | None = None) -> None:
        self.where = where
        self.limits = limits or Limits()
        self.root = _Node("dir", 0)
        self.layer = 0
        self.members = 0
        self.bytes = 0
        self.hardlinked: set[str] = set()

    def charge(self, n: int, stream_bytes: int = 0, compressed: int | None = None) -> None:
        """Count ``n`` more uncompressed bytes against the limits (``stream_bytes`` of the
        current stream so far, from ``compressed`` bytes when it is compressed)."""
        self.bytes += n
        limits = self.limits
        hint = "if the base really is that big, set base.max_unpacked_gib in the spec"
        if self.bytes > limits.max_bytes:
            raise UnsafeArchive(
                self.where, f"expands to more than {_gib(limits.max_bytes)}", hint=hint
            )
        if (
            limits.max_ratio is not None
            and compressed is not None
            and stream_bytes > limits.ratio_free
            and stream_bytes > limits.max_ratio * compressed
        ):
            raise UnsafeArchive(
                self.where,
                f"expands more than {limits.max_ratio} times ({compressed} bytes to over "
                f"{stream_bytes}): a decompression bomb?",
                hint=hint,
            )

    def next_layer(self) -> None:
        self.layer += 1
        self.hardlinked = set()  # what a lower layer's hardlinks name may be replaced

    def refuse(self, message: str) -> UnsafeArchive:
        return UnsafeArchive(self.where, message)

    def _parent(self, parts: list[str], name: str) -> _Node:
        node = self.root
        for i, part in enumerate(parts[:-1]):
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = _Node("dir", self.layer)
            elif child.kind != "dir":
                below = "/".join(parts[: i + 1])
                raise self.refuse(
                    f"member {name!r} lies below {below!r}, which is a {child.kind}, not a "
                    "directory (a symlink can point anywhere); refusing the archive"
                )
            node = child
        return node

    def _lookup(self, path: str) -> _Node | None:
        node: _Node | None = self.root
        for part in path.split("/"):
            if node is None or node.kind != "dir":
                return None
            node = node.children.get(part)
        return node

    def readlink(self, path: str) -> str | None:
        node = self._lookup(path)
        return node.link if node is not None and node.kind == "symlink" else None

    def admit(self, m: tarfile.TarInfo) -> str | None:
        """Check one member against the rules and record it; its path, or None for the root
        directory's own entry. Raises :class:`UnsafeArchive`."""
        self.members += 1
        if self.members > self.limits.max_members:
            raise self.refuse(f"holds more than {self.limits.max_members} members")
        path = member_path(m.name, where=self.where)
        if m.issparse():
            raise self.refuse(f"member {m.name!r} is sparse; {SPARSE_HINT}")
        if m.size < 0 or not (0 <= m.uid <= MAX_ID and 0 <= m.gid <= MAX_ID):
            raise self.refuse(f"member {m.name!r} has a negative size or an impossible owner")
        if not path:
            if not m.isdir():
                raise self.refuse(f"member {m.name!r} would replace the root with a non-directory")
            return None
        parts = path.split("/")
        parent = self._parent(parts, path)
        name = parts[-1]
        if name.startswith(WHITEOUT) and not (m.isreg() and not m.islnk()):
            raise self.refuse(f"whiteout {m.name!r} is not a plain file")
        if name == OPAQUE:
            for key in [k for k, c in parent.children.items() if c.layer < self.layer]:
                self._drop(parent, key, path)
            return path
        if name.startswith(WHITEOUT):
            hidden = parent.children.get(name[len(WHITEOUT) :])
            if hidden is not None and hidden.layer < self.layer:
                self._drop(parent, name[len(WHITEOUT) :], path)
            return path
        existing = parent.children.get(name)
        if m.isdir():
            if existing is not None and existing.kind == "dir":
                existing.layer = self.layer
                return path
            node = _Node("dir", self.layer)
        elif m.issym():
            check_symlink(path, m.linkname, where=self.where, readlink=self.readlink)
            node = _Node("symlink", self.layer, m.linkname)
        elif m.islnk():
            target = member_path(m.linkname, where=self.where)
            found = self._lookup(target) if target else None
            if target == path or found is None or found.kind != "file":
                raise self.refuse(
                    f"hardlink {m.name!r} -> {m.linkname!r} names no earlier regular file"
                )
            self.hardlinked.add(target)
            node = _Node("file", self.layer)
        elif m.isreg():
            node = _Node("file", self.layer)
        elif is_device(m):
            if parts[0] != "dev":
                raise self.refuse(f"member {m.name!r} is a device file or fifo outside dev/")
            node = _Node("device", self.layer)
        else:
            raise self.refuse(f"member {m.name!r} has an unsupported type {m.type!r}")
        if existing is not None:
            if existing.kind == "dir" and existing.children:
                raise self.refuse(
                    f"member {m.name!r} replaces the directory {path!r}, which holds members"
                )
            if path in self.hardlinked:
                raise self.refuse(f"member {m.name!r} replaces a file that a hardlink names")
        parent.children[name] = node
        return path

    def _drop(self, parent: _Node, name: str, whiteout: str) -> None:
        prefix = posixpath.join(posixpath.dirname(whiteout), name)
        if any(p == prefix or p.startswith(prefix + "/") for p in self.hardlinked):
            raise self.refuse(f"whiteout {whiteout!r} removes a file that a hardlink names")
        del parent.children[name]

    def finish(self) -> None:
        """Check every relative symlink again against the whole tree (a later member can move
        where an earlier link leads)."""
        stack: list[tuple[str, _Node]] = [("", self.root)]
        while stack:
            prefix, node = stack.pop()
            for name, child in node.children.items():
                path = f"{prefix}/{name}" if prefix else name
                if child.kind == "symlink":
                    check_symlink(path, child.link, where=self.where, readlink=self.readlink)
                elif child.kind == "dir":
                    stack.append((path, child))
