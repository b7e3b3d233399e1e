"""Write files so that an error never leaves a partial file behind; the file gets the mode of an
ordinary ``open(target, "w")``, ``0666`` less the umask."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["check_output_path", "current_umask", "write_atomically", "write_text_atomically"]

_umask_lock = threading.Lock()


def current_umask() -> int:
    """The process umask (read by setting it and restoring it at once, under a lock)."""
    with _umask_lock:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def check_output_path(target: str | os.PathLike) -> Path:
    """Return ``target`` as a path once it is known that a file can be written there.

    Raises
    ------
    FileNotFoundError
        If the directory of ``target`` does not exist.
    IsADirectoryError
        If ``target`` is a directory.
    """
    target = Path(target)
    if target.is_dir():
        raise IsADirectoryError(f"{str(target)!r} is a directory; give a file name")
    if not target.parent.is_dir():
        raise FileNotFoundError(f"the directory of {str(target)!r} does not exist")
    return target


def write_atomically(target: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary file beside ``target``, then rename it into place (mode
    ``0666`` less the umask).

    Raises
    ------
    FileNotFoundError
        If the directory of ``target`` does not exist.
    IsADirectoryError
        If ``target`` is a directory.
    """
    target = check_output_path(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomically(target: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``target`` atomically."""
    write_atomically(target, lambda handle: handle.write(text.encode()))
