"""A loopback HTTP proxy that dies at an event of the traffic it forwards: a tracking store (or any server) that
goes away at a chosen request, however loaded the machine is; or that alters a reply it forwards (a fault
injected into a model endpoint's answer)."""

from __future__ import annotations

import http.client
import http.server
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes
    user_agent: str


@dataclass(frozen=True)
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


class DyingProxy:
    """Forwards every request to `upstream` until `dies(request)` is true for one: that request and every later
    one get no answer, and the port stops listening, as when the server is killed. A request `holds(request)`
    is true for waits unanswered (`held` is set) until `release` is set. Each reply forwarded is what
    `alter(request, reply)` returns: None closes the connection without any reply (a reset)."""

    def __init__(
        self,
        upstream: str,
        dies: Callable[[Request], bool] = lambda _: False,
        holds: Callable[[Request], bool] = lambda _: False,
        alter: Callable[[Request, Reply], Reply | None] = lambda _, reply: reply,
    ) -> None:
        self.upstream, self.dies, self.holds, self.alter = upstream.rstrip("/").split("//", 1)[1], dies, holds, alter
        self.requests = 0
        self.dead = threading.Event()
        self.held = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                request = Request(self.command, self.path, body, self.headers.get("user-agent", ""))
                if proxy.holds(request):
                    proxy.held.set()
                    proxy.release.wait()
                with proxy.lock:
                    if not proxy.dead.is_set() and proxy.dies(request):
                        proxy.dead.set()
                        threading.Thread(target=proxy._die, daemon=True).start()
                    proxy.requests += 1
                if proxy.dead.is_set():
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                conn = http.client.HTTPConnection(proxy.upstream, timeout=120)
                try:
                    conn.request(
                        self.command,
                        self.path,
                        body=body if body or self.command in ("POST", "PUT", "PATCH") else None,
                        headers={k: v for k, v in self.headers.items() if k.lower() not in HOP},
                    )
                    r = conn.getresponse()
                    reply = proxy.alter(request, Reply(r.status, r.getheaders(), r.read()))
                finally:
                    conn.close()
                if reply is None:
                    self.close_connection = True
                    self.connection.shutdown(2)  # the socket closes with no reply at all
                    return
                self.send_response(reply.status)
                for k, v in reply.headers:
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _die(self) -> None:
        self.server.shutdown()
        self.server.server_close()  # the port stops listening: new connections are refused

    @contextmanager
    def running(self) -> Iterator[DyingProxy]:
        t = threading.Thread(target=self.server.serve_forever, daemon=True)
        t.start()
        try:
            yield self
        finally:
            self.release.set()
            if not self.dead.is_set():
                self.dead.set()
                self._die()
