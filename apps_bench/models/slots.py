"""Client-side request slots: never more model requests in flight than the server can run.

A server that runs one request at a time (llama-cpp-python) queues the rest; a queued
request's client timeout runs while it waits, so under load requests time out in the
queue and are sent again while the server still works on them. Holding a slot while a
request is on the wire keeps the queue on our side, where it costs nothing, and makes
the request timeout measure the server's work on that request alone.

The slots are lock files (`flock`), so every process of a cell (the forked solver
helpers too) shares the same `capacity`; a process that dies frees its slots.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import tempfile
import time
from contextlib import asynccontextmanager, contextmanager
from typing import AsyncIterator, Iterator

POLL_S = 0.02


class EndpointSlots:
    """`capacity` slots for the endpoint at `base_url`, shared by all processes on this machine."""

    def __init__(self, base_url: str, capacity: int, directory: str | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"model.max_concurrency must be >= 1 (or 0 for no limit), got {capacity}")
        self.capacity = capacity
        tag = hashlib.sha256(base_url.encode()).hexdigest()[:16]
        self.paths = [
            os.path.join(directory or tempfile.gettempdir(), f"apps-bench-slot-{tag}-{i}.lock") for i in range(capacity)
        ]

    def _try(self) -> int | None:
        """A held slot's file descriptor, or None when all are busy."""
        for path in self.paths:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                os.close(fd)
        return None

    @staticmethod
    def _release(fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @contextmanager
    def hold(self) -> Iterator[None]:
        while (fd := self._try()) is None:
            time.sleep(POLL_S)
        try:
            yield
        finally:
            self._release(fd)

    @asynccontextmanager
    async def ahold(self) -> AsyncIterator[None]:
        while (fd := self._try()) is None:
            await asyncio.sleep(POLL_S)
        try:
            yield
        finally:
            self._release(fd)
