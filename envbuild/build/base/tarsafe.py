"""The rules every member of a base obeys, in one place, so no reader can write outside its target.

A base comes from outside (a rootfs tarball, the layers of an OCI layout or of a pulled image).
Every reader of it in :mod:`envbuild.build.base.tarread` — ``tar_entries`` (a rootfs, re-packed),
``scan`` (an image layer, kept as it is) and ``safe_extract`` (unpacking) — passes each member
through :meth:`Tree.admit`, the one definition of the rules:

* a name (or link) the layer writer cannot write as it was read is refused before any other
  rule: a NUL (a PAX ``path`` may hold one; the written header ends the name there), or a
  character no bytes stand for;
* a name that is absolute or holds ``..`` is refused, and so is a path longer than Linux takes
  (4095 bytes, 255 a component), and a symlink target over 4095 bytes (refused before any walk);
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
* a whiteout naming no file (``.wh.``, ``.wh..``, ``.wh...``), AUFS metadata (``.wh..wh.*``
  but the opaque ``.wh..wh..opq``) and a member below a ``.wh.*`` folder are refused;
* PAX and GNU long-name headers are at most 1 MiB each and :class:`Limits` in all; a base holds
  at most :class:`Limits` members and uncompressed bytes, counted as the bytes are read (so a
  bomb stops at the limit); resolving symlinks takes one step a path part, from a budget that
  grows with the members (so every rule is linear in what is read);
* a truncated or corrupt compressed stream, a corrupt tar header or a member cut short is a
  :class:`CorruptArchive` naming the file and what is wrong.

The setuid and setgid files are kept and listed (:meth:`Tree.setid`) for the build manifest.
Every refusal is a user error (exit 2). Whiteouts (``.wh.<name>``, ``.wh..wh..opq``) hide what
lower layers made, as the OCI image spec says (not what the same layer made).
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

from envbuild.build.entries import OPAQUE, WHITEOUT
from envbuild.errors import UnsafeArchive

GIB = 1 << 30
PATH_MAX, NAME_MAX = 4096, 255
MAX_ID = (1 << 32) - 1


class CorruptArchive(UnsafeArchive):
    """A base tarball or layer is truncated or corrupt (its compression or its tar headers)."""


@dataclass(frozen=True)
class Limits:
    """How much one base may expand to (all its layers together).

    ``max_bytes``: uncompressed tar bytes; ``max_ratio``: uncompressed bytes per compressed byte
    of each stream once past ``ratio_free`` bytes (None: no ratio limit); ``max_members``;
    ``max_header_bytes``: PAX and long-name headers in all; symlink resolution steps:
    ``free_steps`` plus ``steps_per_member`` for each member read.
    The defaults are documented in docs/image.md; a spec's ``base.max_unpacked_gib`` replaces
    the byte and ratio limits with its own figure."""

    max_bytes: int = 64 * GIB
    max_ratio: int | None = 100
    ratio_free: int = GIB
    max_members: int = 1_000_000
    max_header_bytes: int = 256 << 20
    steps_per_member: int = 64
    free_steps: int = 1_000_000

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
    __slots__ = ("children", "kind", "layer", "link", "mode", "opaque", "pin_layer", "pins")

    def __init__(self, kind: str, layer: int, link: str = "", mode: int = 0) -> None:
        self.kind = kind  # "dir", "file", "symlink" or "device"
        self.layer = layer
        self.link = link
        self.mode = mode  # a file's setuid/setgid bits (the rest is not needed here)
        self.children: dict[str, _Node] = {}
        self.opaque = -1  # the layer whose opaque whiteout last emptied this folder
        self.pins = 0  # hardlinks of layer ``pin_layer`` naming this node or a path below it
        self.pin_layer = -1


def _encoded(text: str, what: str, *, where: str) -> bytes:
    """``text`` as the bytes the layer writer writes for it (UTF-8, undecodable bytes kept as
    they were read), refusing what it cannot write as read: a NUL (a PAX ``path`` or
    ``linkpath`` may hold one; a tar header ends the name there, so the rules would check one
    name and the layer carry another) or a character no bytes stand for."""
    if "\0" in text:
        raise UnsafeArchive(
            where,
            f"{what} {text[:80]!r} holds a NUL byte (a name ends there); refusing the archive",
        )
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise UnsafeArchive(
            where,
            f"{what} {text[:80]!r} is not a name a file system can hold; refusing the archive",
        ) from None


def member_path(name: str, *, where: str) -> str:
    """A member's name as a relative path (``./a/b/`` -> ``a/b``), or :class:`UnsafeArchive`."""
    raw = _encoded(name, "member", where=where)
    if len(raw) >= PATH_MAX:  # checked first: every rule below is linear in the name
        raise UnsafeArchive(where, f"member {name[:80]!r}… has a name longer than Linux takes")
    if name.startswith("/"):
        raise UnsafeArchive(where, f"member {name!r} has an absolute path; refusing the archive")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(where, f"member {name!r} climbs out with '..'; refusing the archive")
    if any(len(p.encode("utf-8", "surrogateescape")) > NAME_MAX for p in parts):
        raise UnsafeArchive(where, f"member {name[:80]!r}… has a name longer than Linux takes")
    return "/".join(parts)


def link_target(target: str, path: str, *, where: str) -> str:
    """A symlink's target, refused when the writer cannot write it as read or when Linux could
    not hold it (``symlink(2)``: at most PATH_MAX - 1 bytes)."""
    if len(_encoded(target, f"the target of symlink {path!r}:", where=where)) >= PATH_MAX:
        raise UnsafeArchive(
            where,
            f"symlink {path!r} has a {len(target)}-character target; Linux takes at most "
            f"{PATH_MAX - 1} bytes",
        )
    if not target:
        raise UnsafeArchive(where, f"symlink {path!r} has an empty target")
    return target


def hidden_name(name: str, path: str, *, where: str) -> str | None:
    """The name a whiteout ``name`` hides (None: ``name`` is not a whiteout), refusing the
    whiteouts no engine reads the same way: ``.wh.``, ``.wh..`` and ``.wh...`` name no file
    (an engine joining them to the folder removes the folder itself, or its parent), and
    ``.wh..wh.*`` other than the opaque ``.wh..wh..opq`` is AUFS metadata the OCI image spec
    does not define."""
    if not name.startswith(WHITEOUT):
        return None
    hidden = name[len(WHITEOUT) :]
    if hidden in ("", ".", ".."):
        raise UnsafeArchive(
            where,
            f"whiteout {path!r} names no file ({name!r} would hide '{hidden or '.'}' "
            "itself); refusing the archive",
        )
    if name != OPAQUE and hidden.startswith(WHITEOUT):
        raise UnsafeArchive(
            where, f"whiteout {path!r} is AUFS metadata, not an OCI whiteout; refusing the archive"
        )
    return hidden


#: Links followed while resolving one symlink, as Linux's path walk (``ELOOP`` past 40).
MAX_HOPS = 40


def _climbs_out(root: _Node, start: list[str], target: str, budget: list[int]) -> bool:
    """Whether the relative ``target`` of a symlink in folder ``start`` leaves the root (or
    loops), following the symlinks of the tree below ``root``. One step per component: the
    components still to walk are a stack (last first) and the folders walked so far a stack of
    nodes, so no step copies or joins a path. Every step is charged to ``budget`` (a list of
    one count, shared by the whole tree)."""
    nodes: list[_Node | None] = []
    node: _Node | None = root
    for part in start:
        node = node.children.get(part) if node is not None and node.kind == "dir" else None
        nodes.append(node)
    todo = [p for p in reversed(target.split("/")) if p not in ("", ".")]
    hops = 0
    while todo:
        budget[0] -= 1
        part = todo.pop()
        if part == "..":
            if not nodes:
                return True
            nodes.pop()
            continue
        parent = nodes[-1] if nodes else root
        child = parent.children.get(part) if parent is not None and parent.kind == "dir" else None
        if child is None or child.kind != "symlink":
            nodes.append(child)
            continue
        hops += 1
        if hops > MAX_HOPS:
            return True  # a loop; refuse rather than guess
        if child.link.startswith("/"):
            nodes = []
        todo.extend(p for p in reversed(child.link.split("/")) if p not in ("", "."))
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
        self.header_bytes = 0
        #: resolution steps symlinks may still take: each member adds its share
        self.steps = [self.limits.free_steps]

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

    def extended_header(self, size: int) -> None:
        """Count one PAX or GNU long-name header of ``size`` bytes against the limits."""
        self.header_bytes += size
        if self.header_bytes > self.limits.max_header_bytes:
            raise self.refuse(
                f"holds more than {self.limits.max_header_bytes} bytes of extended (PAX and "
                "long-name) headers"
            )

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

    def _check_symlink(self, path: str, target: str) -> None:
        """Refuse a relative symlink target that climbs out of the root, following the symlinks
        known so far on the way (``d/up -> ..`` then ``x -> d/up/../..`` climbs out). An
        absolute target names a path of the image and is allowed (never followed here)."""
        if target.startswith("/"):
            return
        out = _climbs_out(self.root, path.split("/")[:-1], target, self.steps)
        if self.steps[0] < 0:
            raise self.refuse(
                f"its symlinks take more than {self.limits.steps_per_member} steps a member to "
                "resolve (chains of long links); refusing the archive"
            )
        if out:
            raise self.refuse(f"symlink {path!r} -> {target!r} points outside the root (or loops)")

    def admit(self, m: tarfile.TarInfo) -> str | None:
        """Check one member against the rules and record it; its path, or None for the root
        directory's own entry. Raises :class:`UnsafeArchive`."""
        self.members += 1
        if self.members > self.limits.max_members:
            raise self.refuse(
                f"holds more than {self.limits.max_members} members (the limit on members of "
                "one base)"
            )
        self.steps[0] += self.limits.steps_per_member
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
        if any(p.startswith(WHITEOUT) for p in parts[:-1]):
            raise self.refuse(f"member {m.name!r} lies below a whiteout; refusing the archive")
        name = parts[-1]
        hidden = hidden_name(name, path, where=self.where)
        if hidden is not None and not (m.isreg() and not m.islnk()):
            raise self.refuse(f"whiteout {m.name!r} is not a plain file")
        parent = self._parent(parts, path)
        if name == OPAQUE:
            if parent.opaque != self.layer:  # a second one in the same layer hides nothing more
                for key in [k for k, c in parent.children.items() if c.layer < self.layer]:
                    self._drop(parent, key, path)
                parent.opaque = self.layer
            return path
        if hidden is not None:
            found = parent.children.get(hidden)
            if found is not None and found.layer < self.layer:
                self._drop(parent, hidden, path)
            return path
        existing = parent.children.get(name)
        if m.isdir():
            if existing is not None and existing.kind == "dir":
                existing.layer = self.layer
                return path
            node = _Node("dir", self.layer)
        elif m.issym():
            target = link_target(m.linkname, path, where=self.where)
            self._check_symlink(path, target)
            node = _Node("symlink", self.layer, target)
        elif m.islnk():
            target = member_path(m.linkname, where=self.where)
            found = self._lookup(target) if target else None
            if target == path or found is None or found.kind != "file":
                raise self.refuse(
                    f"hardlink {m.name!r} -> {m.linkname!r} names no earlier regular file"
                )
            self._pin(target)
            node = _Node("file", self.layer, mode=_setid(m.mode))
        elif m.isreg():
            node = _Node("file", self.layer, mode=_setid(m.mode))
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

    def _pin(self, target: str) -> None:
        """Record that a hardlink of this layer names ``target``: it and the folders above it
        may not be replaced or whited out in this layer (counted on each node, so a whiteout
        checks its node alone)."""
        self.hardlinked.add(target)
        node = self.root
        for part in target.split("/"):
            node = node.children[part]
            if node.pin_layer != self.layer:
                node.pins, node.pin_layer = 0, self.layer
            node.pins += 1

    def _drop(self, parent: _Node, name: str, whiteout: str) -> None:
        node = parent.children[name]
        if node.pin_layer == self.layer and node.pins:
            raise self.refuse(f"whiteout {whiteout!r} removes a file that a hardlink names")
        del parent.children[name]

    def _walk(self) -> Iterator[tuple[str, _Node]]:
        stack: list[tuple[str, _Node]] = [("", self.root)]
        while stack:
            prefix, node = stack.pop()
            for name, child in node.children.items():
                path = f"{prefix}/{name}" if prefix else name
                yield path, child
                if child.kind == "dir":
                    stack.append((path, child))

    def finish(self) -> None:
        """Check every relative symlink again against the whole tree (a later member can move
        where an earlier link leads)."""
        for path, node in self._walk():
            if node.kind == "symlink":
                self._check_symlink(path, node.link)

    def setid(self) -> dict[str, str]:
        """The setuid and setgid files of the tree (path -> octal mode), sorted: kept, since a
        base needs them (``su``, ``passwd``, ``mount``), and recorded in the build manifest. A
        path that is not UTF-8 is named with ``\\xNN`` for its odd bytes (the manifest is JSON
        text: what it names must be text any reader can read)."""
        found = {_text(path): f"{node.mode:04o}" for path, node in self._walk() if node.mode}
        return dict(sorted(found.items()))


def _text(path: str) -> str:
    """``path`` as text: bytes that are not UTF-8 (kept as surrogates) shown as ``\\xNN``."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _setid(mode: int) -> int:
    """A file's mode when it is setuid or setgid, else 0."""
    return mode & 0o7777 if mode & 0o6000 else 0
