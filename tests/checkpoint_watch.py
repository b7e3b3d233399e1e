"""A thread that acts once a ``fit`` call's checkpoint directory holds a given checkpoint."""

from __future__ import annotations

import threading

from polling import poll


def when_checkpoint(directory, batches: int, action) -> threading.Thread:
    """Run ``action()`` in a thread once ``directory`` holds a checkpoint of ``batches`` or more
    batches (training then is in full swing), polling for at most a minute."""

    def saved() -> bool:
        names = [p.name for p in directory.iterdir()] if directory.exists() else []
        return any(name >= f"checkpoint-{batches:09d}" for name in names)

    def watch():
        if poll(saved, 60, interval=0.005):
            action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread
