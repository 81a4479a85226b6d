"""One event loop that relays every pumped stream (docs/operations.md, "Where relay time goes").

Under waitress each streamed answer has a worker thread, and relaying one event costs that
thread a wake-up, the interpreter lock and waitress's write path (its buffers, its lock and a
``send``): at many streams the threads mostly hand the lock to each other. A relayed body whose
response carries its upstream socket (``source``, :class:`werk_host.seam.Pumpable`; the
``/v1`` relay, werk_host/http/openai.py) is instead driven by one :class:`Pump` thread per
server: ``epoll`` on every pumped upstream socket, and for each that is readable one step of
its body (the whole generator chain: the relay's read and de-chunking, the prompt-cache tail,
the model renaming, the usage tail), whose output goes straight to the client's socket in one
``send``, framed as waitress would frame it. The worker thread waits until the body is done.

Contract (:meth:`Pump.run`, called in the worker thread with its waitress task):

* **Order.** The status and headers are sent first (by the worker, through waitress); the loop
  takes a stream only while waitress holds none of its bytes, and writes with the connection's
  output lock held, so that a close by waitress's main loop cannot race a write.
* **No added latency.** A read is written as soon as it is made: nothing waits to fill a buffer.
* **A slow client** (a ``send`` that does not take everything) is handed back: what is left is
  given to waitress's buffers, the source blocks again, and the worker goes on as before
  (``False``). So is every stream when the pump stops.
* **The client gone** (a failed ``send``, or waitress closed the connection): the loop stops
  reading; ``True`` is returned and the caller's close cancels the upstream, as a failed write of
  the worker would have.
* **Upstream silence**: a pumped stream whose socket stays silent ``idle_s`` seconds is expired
  (checked every :data:`SWEEP_S`), so its body ends as a cut answer.
* **Errors** of the body are raised in the worker thread, which ends the answer in words
  (werk_host/http/openai.py). Closing the response (saving the prompt cache, accounting) also
  happens in the worker thread, never in the loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Iterator
from typing import Any

from werk_host.seam import Pumpable

log = logging.getLogger(__name__)

#: Seconds between two looks for pumped streams whose upstream has been silent too long.
SWEEP_S = 0.25

_GONE, _DONE, _BACK = "gone", "done", "back"


class _Stream:
    __slots__ = ("body", "source", "channel", "chunked", "fd", "seen", "outcome", "error", "left", "finished")

    def __init__(self, body: Iterator[bytes], source: Pumpable, channel: Any, chunked: bool) -> None:
        self.body, self.source, self.channel, self.chunked = body, source, channel, chunked
        self.fd = source.fileno()
        self.seen = time.monotonic()
        self.outcome = ""
        self.error: BaseException | None = None
        self.left = b""  # bytes a slow client did not take, for waitress's buffers
        self.finished = threading.Event()


class Pump:
    """The event loop of the module docstring; its thread starts with the first stream."""

    def __init__(self) -> None:
        self._streams: dict[int, _Stream] = {}
        self._lock = threading.Lock()
        self._epoll: select.epoll | None = None
        self._wake_r, self._wake_w = -1, -1
        self._closed = False

    def run(self, task: Any, body: Iterator[bytes], source: Pumpable) -> bool:
        """Relay ``body`` from the loop (module docstring); ``True`` when nothing is left to
        send, ``False`` when the caller's thread must go on with ``body`` (``source`` blocks)."""
        if not task.wrote_header:
            task.write(b"")  # the status and headers, through waitress
        channel = task.channel
        if channel.total_outbufs_len or not channel.connected or not self._start():
            return False
        stream = _Stream(body, source, channel, bool(task.chunked_response))
        source.pumped(True)
        self._step(stream)  # what arrived with the headers, before waiting for the socket
        if not stream.outcome:
            epoll = self._epoll
            assert epoll is not None
            with self._lock:
                if self._closed:
                    stream.outcome = _BACK
                else:
                    self._streams[stream.fd] = stream
                    epoll.register(stream.fd, select.EPOLLIN)
            if not stream.outcome:
                stream.finished.wait()
        return self._outcome(stream)

    def _outcome(self, stream: _Stream) -> bool:
        if stream.outcome == _BACK:
            stream.source.pumped(False)
            if stream.left:
                stream.channel.write_soon(stream.left)  # framed already
            return False
        if stream.error is not None:
            raise stream.error
        return True  # done, or the client gone: the caller's close cancels the upstream

    def _start(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            if self._epoll is None:
                self._epoll = select.epoll()
                self._wake_r, self._wake_w = os.pipe()
                self._epoll.register(self._wake_r, select.EPOLLIN)
                threading.Thread(target=self._loop, name="werk-pump", daemon=True).start()
        return True

    def close(self) -> None:
        """Stop the loop: every pumped stream is handed back to its thread."""
        with self._lock:
            self._closed = True
            started = self._epoll is not None
        if started:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    def _loop(self) -> None:
        epoll = self._epoll
        assert epoll is not None
        streams = self._streams
        swept = time.monotonic()
        while True:
            try:
                ready = epoll.poll(SWEEP_S)
            except InterruptedError:
                continue
            for fd, _ in ready:
                stream = streams.get(fd)
                if stream is not None:
                    self._step(stream)
                    if stream.outcome:
                        self._finish(stream)
                elif fd == self._wake_r:
                    self._shut()
                    return
            now = time.monotonic()
            if now - swept >= SWEEP_S:
                swept = now
                self._sweep(now)

    def _sweep(self, now: float) -> None:
        for stream in list(self._streams.values()):
            if now - stream.seen >= stream.source.idle_s:
                stream.source.expire()  # the body's next read fails as a cut answer
                self._step(stream)
                if stream.outcome:
                    self._finish(stream)

    def _step(self, stream: _Stream) -> None:
        """One read of ``stream``'s body and its write; sets ``outcome`` when it is over."""
        stream.seen = time.monotonic()
        try:
            chunk = next(stream.body)
        except StopIteration:
            stream.outcome = _DONE
            return
        except BaseException as err:  # for the worker thread, which ends the answer in words
            stream.outcome, stream.error = _DONE, err
            return
        if chunk:
            self._send(stream, chunk)

    @staticmethod
    def _send(stream: _Stream, chunk: bytes) -> None:
        data = b"%X\r\n%b\r\n" % (len(chunk), chunk) if stream.chunked else chunk
        channel = stream.channel
        with channel.outbuf_lock:
            if not channel.connected:
                stream.outcome = _GONE
                return
            try:
                sent = channel.socket.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                stream.outcome = _GONE
                return
        if sent < len(data):
            stream.outcome, stream.left = _BACK, data[sent:]

    def _finish(self, stream: _Stream) -> None:
        self._streams.pop(stream.fd, None)
        epoll = self._epoll
        assert epoll is not None
        with contextlib.suppress(OSError, ValueError):
            epoll.unregister(stream.fd)
        stream.finished.set()

    def _shut(self) -> None:
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            stream.outcome = _BACK
            self._finish(stream)
        epoll = self._epoll
        assert epoll is not None
        epoll.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        log.debug("the pump stopped")


__all__ = ["SWEEP_S", "Pump"]
