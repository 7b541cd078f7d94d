"""Request-level replay in front of the task model: partial re-runs for free.

MASPO scores a child prompt by re-running "only that agent and what follows it" from the
parent's cached upstream outputs. Instead of teaching every runner to start mid-flow,
the optimizer's runner talks to the model through this loopback proxy: a chat request
whose body is byte-identical to one answered before (same messages, tools, seed and
sampling) is answered from the cache, any other is forwarded and recorded. In a chain,
the stages before the changed role send identical requests (same prompt, same input,
same paired seed), so they are replayed and only the changed stage and what follows
reach the model; in cyclic or hub flows whatever diverges is re-run, which is the
whole-re-run fallback. A rerun after a kill replays the same way.

The recorded responses live in the run's RolloutCache (kind "model_call"), so they
survive a kill -9 like everything else.

Tokens: a replayed answer was not paid for again, so the proxy serves it with its usage
zeroed (the metered clients then count only what reached the model) and books its tokens
apart, per rollout (`pop_replayed`). Which rollout asks is told by the runner's
`ROLLOUT_HEADER` (stripped before forwarding); an answer the *same* rollout recorded
earlier (a rerun after a kill caught it in flight, or a retry after an infrastructure
error) keeps its usage: that rollout was never charged, so charging it now gives the
same charged tokens as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from apps_bench.models.metering import parse_usage
from apps_bench.optimizers.cache import RolloutCache

_USAGE_FIELD = re.compile(r'("(?:prompt|completion|total|input|output)_tokens"\s*:\s*)\d+')
ROLLOUT_HEADER = "X-Apps-Bench-Rollout"
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host", ROLLOUT_HEADER.lower()}


def zero_usage(body: str) -> str:
    """The body with every token count of its usage set to 0 (JSON or SSE)."""
    return _USAGE_FIELD.sub(r"\g<1>0", body)


def _well_formed(data: bytes, content_type: str) -> bool:
    return parse_usage(data, content_type)[0]


def body_tokens(body: str, content_type: str) -> int:
    ok, prompt, completion = parse_usage(body.encode("latin-1"), content_type)
    return prompt + completion if ok else 0


class ReplayProxy:
    """`with ReplayProxy(upstream_base_url, cache) as base_url:` -> an OpenAI-compatible base URL."""

    def __init__(self, upstream_base_url: str, cache: RolloutCache, *, timeout_s: float = 600.0) -> None:
        self.upstream = upstream_base_url.rstrip("/")
        self.cache = cache
        self.timeout_s = timeout_s
        self.hits = 0
        self.misses = 0
        self.replayed_tokens = 0  # usage of replayed answers: served zeroed, not spent again
        self._replayed_by: dict[str, int] = {}  # rollout tag -> replayed tokens not yet collected
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._client: Any = None

    # -- lifecycle

    def start(self) -> str:
        import httpx  # noqa: PLC0415

        self._client = httpx.Client(timeout=self.timeout_s, trust_env=False)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                proxy._forward(self, b"", cacheable=False)

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                proxy._forward(self, body, cacheable=self.path.rstrip("/").endswith("/chat/completions"))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="replay-proxy", daemon=True
        )  # the default 0.5 s poll delays every shutdown
        self._thread.start()
        return f"http://127.0.0.1:{self._server.server_port}/v1"  # the address bound above

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "replayed_tokens": self.replayed_tokens}

    def pop_replayed(self, rollout: str) -> int:
        """Tokens replayed (not spent) for one rollout since the last call; the runner books them apart."""
        with self._lock:
            return self._replayed_by.pop(rollout, 0)

    # -- forwarding

    def _url(self, path: str) -> str:
        # the proxy's base URL ends with /v1, like the upstream's
        rest = path[len("/v1") :] if path.startswith("/v1") else path
        return self.upstream + rest

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes, *, cacheable: bool) -> None:
        key = hashlib.sha256(h.path.encode() + b"\n" + body).hexdigest() if cacheable else None
        hit = self.cache.get(key, kind="model_call") if key else None
        rollout = h.headers.get(ROLLOUT_HEADER, "")
        if hit is not None:
            status, ctype, text = int(hit["status"]), str(hit["content_type"]), str(hit["body"])
            own = bool(rollout) and hit.get("rollout") == rollout  # this rollout's own earlier call: not charged yet
            tokens = 0 if own else body_tokens(text, ctype)
            data = (text if own else zero_usage(text)).encode("latin-1")
            with self._lock:
                self.hits += 1
                self.replayed_tokens += tokens
                if rollout and tokens:
                    self._replayed_by[rollout] = self._replayed_by.get(rollout, 0) + tokens
        else:
            headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
            try:
                resp = self._client.request(h.command, self._url(h.path), content=body, headers=headers)
                status, ctype, data = resp.status_code, resp.headers.get("content-type", "application/json"), resp.content
            except Exception as exc:  # noqa: BLE001 - the client's retry layer sees a 502 and retries
                status, ctype, data = 502, "application/json", f'{{"error": "replay proxy: {type(exc).__name__}"}}'.encode()
            if key:
                with self._lock:
                    self.misses += 1
                if status == 200 and _well_formed(data, ctype):  # a malformed answer is a fault to retry, not to replay
                    entry = {"status": status, "content_type": ctype, "body": data.decode("latin-1"), "rollout": rollout}
                    self.cache.put(key, entry, kind="model_call")
        try:
            h.send_response(status)
            h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout): nobody to answer
            h.close_connection = True
