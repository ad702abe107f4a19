"""Where an export goes: the output folder checked before any work, and written all at once.

:func:`check_output_dir` refuses (:class:`~gdn_deploy.errors.UsageError`, exit code 2, one line) an output path that
is a file, a non-empty folder that is not an export folder (its content would be replaced), or a place this process
cannot write. :func:`staged_output` yields a temporary sibling folder ``.<name>.partial-XXXX``; when the block ends
normally the folder is moved into place (an older export there is replaced only then), and on an error or Ctrl-C the
temporary folder is removed and an older export stays as it was.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from ..errors import UsageError
from .metadata import SIDECAR_NAME

__all__ = ["check_output_dir", "staged_output"]


def _probe_writable(d: Path, flag: str, out: Path) -> None:
    try:
        os.rmdir(tempfile.mkdtemp(dir=d, prefix=".gdn-write-test-"))
    except OSError as e:
        raise UsageError(f"{flag} {out}: cannot write in {d} ({e.strerror or type(e).__name__}); choose another "
                         "output folder") from None


def check_output_dir(path: str | Path, flag: str = "-o", *, container: bool = False) -> Path:
    """Validate an export output folder before any work; returns it as a Path.

    It may be new (its nearest existing parent must be a writable folder), empty, or an earlier export (replaced
    when the new one is complete). ``container``: the folder holds one export per sub-folder (``--blocks``): a
    non-empty folder is fine, it must only be writable."""
    out = Path(path)
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise UsageError(f"{flag} {out}: exists and is not a folder; give a new folder, an empty one or an "
                             "earlier export folder")
        try:
            entries = [p.name for p in out.iterdir()]
        except OSError as e:
            raise UsageError(f"{flag} {out}: cannot read this folder ({e.strerror}); choose another output "
                             "folder") from None
        if entries and not container and SIDECAR_NAME not in entries:
            raise UsageError(f"{flag} {out}: exists and is neither empty nor an export folder (no {SIDECAR_NAME}); "
                             "its content would be replaced: give a new or empty folder")
        _probe_writable(out, flag, out)
        if not container:
            _probe_writable(out.resolve().parent, flag, out)
        return out
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {out}: {parent} is not a folder")
    _probe_writable(parent, flag, out)
    return out


@contextlib.contextmanager
def staged_output(out: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``out``; move it to ``out`` when the block succeeds, remove it otherwise."""
    out = Path(os.path.abspath(out))         # "." and ".." resolved: the folder is moved by name
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        yield work
        os.chmod(work, 0o777 & ~_umask())
        if out.exists() or out.is_symlink():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.rmdir(old)
            os.rename(out, old)
            try:
                os.rename(work, out)
            except BaseException:
                os.rename(old, out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
