"""Length-prefixed frames over raw pipe fds, with deadlines.

Used on both links: judge <-> worker and worker <-> program child. Frames are a
4-byte big-endian length followed by the payload. Readers never trust the peer:
an oversized or truncated frame is an error, and every wait has a deadline.
"""

from __future__ import annotations

import errno
import os
import select
import struct
import time

from ..errors import AppsBenchError

_LEN = struct.Struct(">I")
MAX_FRAME = 1 << 30


class ChannelClosed(AppsBenchError):
    """The peer closed its end (or died)."""


class ChannelTimeout(AppsBenchError):
    """No complete frame before the deadline."""


class ChannelCorrupt(AppsBenchError):
    """The peer sent something that is not a well-formed frame."""


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except BrokenPipeError as e:
            raise ChannelClosed(str(e)) from e
        except OSError as e:
            if e.errno in (errno.EPIPE, errno.EBADF):
                raise ChannelClosed(str(e)) from e
            raise
        view = view[n:]


def send_frame(fd: int, payload: bytes) -> None:
    write_all(fd, _LEN.pack(len(payload)) + payload)


class FrameReader:
    """Buffered reader of frames from one fd; `read(deadline)` returns one payload."""

    def __init__(self, fd: int, max_frame: int = MAX_FRAME) -> None:
        self.fd = fd
        self.max_frame = max_frame
        self._buf = bytearray()

    def _fill(self, need: int, deadline: float | None, readable: bool = False) -> None:
        while len(self._buf) < need:
            if deadline is not None and not readable:
                left = deadline - time.monotonic()
                try:  # data already waiting is read even past the deadline
                    ready, _, _ = select.select([self.fd], [], [], max(0.0, left))
                except InterruptedError:
                    continue
                if not ready:
                    raise ChannelTimeout()
            readable = False
            try:
                chunk = os.read(self.fd, max(65536, min(need - len(self._buf), 1 << 22)))
            except InterruptedError:
                continue
            except OSError as e:
                raise ChannelClosed(str(e)) from e
            if not chunk:
                raise ChannelClosed("end of stream")
            self._buf += chunk

    def frame_ready(self) -> bool:
        """A complete frame is already buffered (select() on the fd would not say so)."""
        if len(self._buf) < 4:
            return False
        (n,) = _LEN.unpack_from(self._buf, 0)
        return len(self._buf) >= 4 + n or n > self.max_frame

    def read(self, deadline: float | None = None, readable: bool = False) -> bytes:
        """One frame's payload; `readable`: the caller's select() just saw data on the fd (no second wait)."""
        self._fill(4, deadline, readable)
        (n,) = _LEN.unpack_from(self._buf, 0)
        if n > self.max_frame:
            raise ChannelCorrupt(f"frame of {n} bytes exceeds the {self.max_frame}-byte cap")
        self._fill(4 + n, deadline)
        payload = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        return payload
