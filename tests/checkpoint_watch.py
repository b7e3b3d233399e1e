"""A thread that acts once a ``fit`` call's checkpoint directory holds a given checkpoint."""

from __future__ import annotations

import threading
import time


def when_checkpoint(directory, batches: int, action) -> threading.Thread:
    """Run ``action()`` in a thread once ``directory`` holds a checkpoint of ``batches`` or more
    batches (training then is in full swing), polling for at most a minute."""

    def watch():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            names = [p.name for p in directory.iterdir()] if directory.exists() else []
            if any(name >= f"checkpoint-{batches:09d}" for name in names):
                action()
                return
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread
