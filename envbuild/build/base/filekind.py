"""What a file is by its first bytes: the compression of a base tarball (:func:`sniff`), and,
for a file that turns out not to be a tar archive, what it is instead (:func:`describe`: a zip,
a tarball compressed twice, a web page …), so a refusal says more than "truncated".
"""

from __future__ import annotations

from pathlib import Path

#: Magic numbers of the compressions a rootfs tarball may have.
MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}


def sniff(path: Path) -> str:
    """The compression of the file at ``path`` by its magic number ("none" when it has none)."""
    with path.open("rb") as f:
        return sniff_bytes(f.read(10))


def sniff_bytes(head: bytes) -> str:
    """The compression ``head`` (a file's first bytes) begins with ("none" when none)."""
    if head.startswith(b"BZh") and head[3:4].isdigit() and head[4:10] == b"1AY&SY":
        return "bzip2"  # "BZh" alone could begin a tar member's name
    return next((name for magic, name in MAGIC.items() if head.startswith(magic)), "none")


NOT_TAR_HINT = "a base is a tar archive, plain or compressed once (gzip, xz, zstd or bzip2)"

#: What a file is by its first bytes, for a file that is not a tar archive.
_KINDS = (
    (b"PK\x03\x04", "a zip archive"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"\x04\x22\x4d\x18", "lz4 data"),
    (b"\x7fELF", "an ELF executable"),
    (b"!<arch>\n", "an ar archive (a .deb?)"),
    (b"hsqs", "a squashfs image"),
    (b"\x89PNG", "a PNG image"),
    (b"%PDF", "a PDF document"),
)


def describe(head: bytes) -> str | None:
    """What ``head`` (a file's first bytes) shows the file to be, when it is not a tar
    archive; None when it says nothing (then the tar error stands)."""
    for magic, what in _KINDS:
        if head.startswith(magic):
            return what
    compression = sniff_bytes(head)
    if compression != "none":
        suffix = {"gzip": "gz", "bzip2": "bz2", "zstd": "zst"}.get(compression, compression)
        return f"{compression} data (compressed twice, or a .{suffix} of something else?)"
    if not head.strip(b"\0"):
        return None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not only a character cut at the end
            return None
        text = head[: exc.start].decode("utf-8")
    if "\0" in text or not all(c.isprintable() or c in "\t\r\n\f" for c in text):
        return None
    start = text.lstrip().lower()
    if start.startswith(("<!doctype html", "<html", "<head", "<body")):
        return "an HTML page (a download that returned a web page?)"
    if start.startswith("<?xml"):
        return "XML text"
    if start.startswith(("{", "[")):
        return "JSON or other text"
    return "plain text"
