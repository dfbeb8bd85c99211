"""Where a command's outputs go, checked before the work: a run of minutes must not end in a
traceback because its figure or table cannot be written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import refuse

# the formats matplotlib writes, by suffix (savefig picks the format from it)
IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")


def _nearest_existing(path: Path) -> Path:
    """The path itself or its closest ancestor that exists."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _probe_folder(folder: Path, flag: str, path) -> None:
    """Refuse a folder no file can be created in (tried, not guessed: root passes every
    permission check, yet cannot write under /proc)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".jaxprice-probe-"):
            pass
    except OSError as e:
        refuse(f"cannot write there ({e.strerror or e})", field=flag, value=str(path))


# text formats a command writes, by suffix: a name with another of these (or an image's) suffix
# is a slip (``sweep --out grid.png`` wrote a CSV under an image's name); other suffixes pass
TEXT_SUFFIXES = {".csv": "CSV", ".json": "JSON", ".md": "Markdown", ".yaml": "YAML", ".yml": "YAML"}


def check_output_file(path, *, flag: str, suffixes=None, what: str = "file", writes: str | None = None) -> Path:
    """Refuse, in one line naming ``flag`` and the path, an output file that cannot be written:
    an empty name, an existing folder, a suffix outside ``suffixes`` (e.g. IMAGE_SUFFIXES), a
    suffix of another format than ``writes`` (one of TEXT_SUFFIXES' values: 'x.png' for a CSV), a
    parent that is a file, or a place nothing can be created in. Missing parent folders are
    allowed (the writer creates them). Returns the path."""
    if path is None or str(path).strip() == "":
        refuse(f"an empty name for the {what}", field=flag, value=path, has_value=True)
    _refuse_dash(path, flag, what)
    p = Path(path)
    if p.is_dir():
        refuse(f"is a folder; name the {what} file to write", field=flag, value=str(path))
    if suffixes is not None and p.suffix.lower() not in suffixes:
        refuse(f"unsupported {what} format {p.suffix or '(no suffix)'}; name it with one of "
               + ", ".join(suffixes), field=flag, value=str(path))
    if writes is not None:
        _check_text_suffix(p, flag, writes)
    if p.exists():
        if not os.access(p, os.W_OK):
            refuse(f"the {what} exists and is not writable", field=flag, value=str(path))
        return p
    anc = _nearest_existing(p.parent)
    if not anc.is_dir():
        refuse(f"{anc} is a file, not a folder", field=flag, value=str(path))
    _probe_folder(anc, flag, path)
    return p


def _check_text_suffix(p: Path, flag: str, writes: str) -> None:
    """Refuse a name whose suffix is an image's or another text format's than ``writes``."""
    suffix = p.suffix.lower()
    other = "an image" if suffix in IMAGE_SUFFIXES else TEXT_SUFFIXES.get(suffix)
    if other is not None and other != writes:
        ours = sorted(k for k, v in TEXT_SUFFIXES.items() if v == writes)
        refuse(f"{flag} writes {writes}, not {other} (suffix {p.suffix}); "
               f"name it with {' or '.join(ours)} (or a suffix of your own)", field=flag, value=str(p))


def _refuse_dash(path, flag: str, what: str) -> None:
    """'-' is standard output where a command takes it (sweep --out, size --json, import-model --out,
    each handled before this check); elsewhere it wrote a file named '-' (serve --csv -)."""
    if str(path).strip() == "-":
        refuse(f"'-' (standard output) is not taken here; name the {what} to write", field=flag, value=str(path))


def check_output_folder(path, *, flag: str) -> Path:
    """Refuse, in one line, an output folder that cannot be made or written: an empty name, an
    existing file, an ancestor that is a file, or a place nothing can be created in."""
    if path is None or str(path).strip() == "":
        refuse("an empty folder name", field=flag, value=path, has_value=True)
    _refuse_dash(path, flag, "folder")
    p = Path(path)
    if p.exists() and not p.is_dir():
        refuse("is a file, not a folder", field=flag, value=str(path))
    anc = _nearest_existing(p)
    if not anc.is_dir():
        refuse(f"{anc} is a file, not a folder", field=flag, value=str(path))
    _probe_folder(anc, flag, path)
    return p


def check_image(path, flag: str):
    """An image output path checked before the work (None: no image asked for); returns it."""
    if path is None:
        return None
    return check_output_file(path, flag=flag, suffixes=IMAGE_SUFFIXES, what="image")
