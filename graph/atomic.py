"""Write files so that an error never leaves a partial file behind."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["write_atomically", "write_text_atomically"]


def write_atomically(target: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary file beside ``target``, then rename it into place.

    Raises
    ------
    FileNotFoundError
        If the directory of ``target`` does not exist.
    """
    target = Path(target)
    if not target.parent.is_dir():
        raise FileNotFoundError(f"the directory of {str(target)!r} does not exist")
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomically(target: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``target`` atomically."""
    write_atomically(target, lambda handle: handle.write(text.encode()))
