"""The built-in `gold` model: a real OpenAI-compatible HTTP server on loopback.

It is a harness self-check, not an LLM: it answers each problem with its reference
solution (rules in `gold_policy.py`), so runners, tool loops, telemetry and the judge
can be tested offline through the same HTTP path a real model uses.

Endpoints: `GET /v1/models`, `POST /v1/chat/completions` (JSON or SSE when `stream`
is true; SSE always ends with a usage chunk, asked for or not). `/v1/responses`,
`/v1/embeddings` and anything else get a visible 404. Unknown request fields and
message `name`s are ignored; an unknown model id gets a 404 listing the served id.

Options (ModelConfig names): `latency_ms` per call; `wrong_fraction` of deliberately
wrong answers (decided by hash(problem, request seed)); `fault_fraction` of injected
faults (HTTP 500/503/429, a stalled request that the client times out on, a
malformed body), decided by hash(request body, how many times that exact body has
been seen), so a retry of a faulted request can succeed and a rerun repeats the
same sequence.

Standalone: `python -m apps_bench.models.gold --rows FILE.jsonl --port 8001`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import socket
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Iterable, Sequence

from apps_bench.data import DEMO_PROBLEMS
from apps_bench.models.gold_policy import (
    SELF_CHECK,
    GoldProblem,
    ProblemIndex,
    Reply,
    estimate_tokens,
    message_text,
    respond,
    unit_hash,
)
from apps_bench.types import JsonObject

if TYPE_CHECKING:
    from apps_bench.types import Problem

log = logging.getLogger(__name__)

GOLD_MODEL_ID = "gold"
FAULT_KINDS = ("http_500", "http_503", "http_429", "timeout", "malformed")


@dataclass
class GoldStats:
    """What the server did, for tests: successful replies and the usage it reported."""

    requests: int = 0
    replies: int = 0
    in_flight: int = 0
    max_in_flight: int = 0  # most chat requests being served at once (concurrency check)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    faults: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    seeds: list = field(default_factory=list)  # the `seed` of every answered request
    headers: list = field(default_factory=list)  # X-Apps-* headers of every answered request
    last_requests: deque = field(default_factory=lambda: deque(maxlen=64))  # recent request bodies
    last_replies: deque = field(default_factory=lambda: deque(maxlen=64))  # their reply kind and usage, same order


def usage_for(request: JsonObject, reply: Reply) -> dict[str, int]:
    prompt = 0
    for m in request.get("messages") or []:
        if not isinstance(m, dict):
            continue
        prompt += 3 + estimate_tokens(str(m.get("role", ""))) + estimate_tokens(message_text(m))
        if m.get("tool_calls"):
            prompt += estimate_tokens(json.dumps(m["tool_calls"], sort_keys=True))
    if request.get("tools"):
        prompt += estimate_tokens(json.dumps(request["tools"], sort_keys=True))
    completion = estimate_tokens(reply.content or "")
    for call in reply.tool_calls:
        completion += estimate_tokens(call.name) + estimate_tokens(json.dumps(call.arguments))
    completion = max(completion, 1)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class GoldServer:
    """Serves the gold model for `problems` on host:port (port 0 = a free port)."""

    def __init__(
        self,
        problems: Iterable[Problem | GoldProblem] = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_id: str = GOLD_MODEL_ID,
        latency_ms: int = 0,
        wrong_fraction: float = 0.0,
        fault_fraction: float = 0.0,
        fault_kinds: Sequence[str] = FAULT_KINDS,
        stall_s: float = 5.0,
        fault_seed: int = 0,
    ) -> None:
        for name, value in (("wrong_fraction", wrong_fraction), ("fault_fraction", fault_fraction)):
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"model.{name} must be between 0 and 1, got {value}")
        unknown = set(fault_kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; choose from {list(FAULT_KINDS)}")
        gold = [p if isinstance(p, GoldProblem) else GoldProblem.from_problem(p) for p in problems]
        self.index = ProblemIndex(gold)
        self.host, self.port = host, port
        self.model_id = model_id
        self.latency_s = max(0, int(latency_ms)) / 1000.0
        self.wrong_fraction = float(wrong_fraction)
        self.fault_fraction = float(fault_fraction)
        self.fault_kinds = tuple(fault_kinds)
        self.stall_s = float(stall_s)
        self.fault_seed = fault_seed
        self.stats = GoldStats()
        self._lock = threading.Lock()
        self._seen: Counter = Counter()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> GoldServer:
        handler = type("GoldHandler", (_Handler,), {"gold": self})
        httpd = _Server((self.host, self.port), handler)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        # serve_forever checks for shutdown every poll_interval (0.5 s by default): every cell's end waited on it
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"gold:{self.port}", daemon=True
        )
        self._thread.start()
        log.info("gold model (%s) serving %d problems at %s", SELF_CHECK, len(self.index), self.base_url)
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> GoldServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ decisions

    def fault_for(self, raw_body: bytes) -> str | None:
        """The injected fault for this arrival of this exact body, or None."""
        if self.fault_fraction <= 0:
            return None
        digest = hashlib.sha256(raw_body).hexdigest()
        with self._lock:
            self._seen[digest] += 1
            arrival = self._seen[digest]
        if unit_hash("fault", self.fault_seed, digest, arrival) >= self.fault_fraction:
            return None
        kinds = self.fault_kinds
        return kinds[int(unit_hash("kind", self.fault_seed, digest, arrival) * len(kinds))]

    def pause(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # bursts of many problems in flight

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: object) -> None:
        """A client that hangs up mid-request (a cut cell, a timed-out call) is no server error."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def _chunks(text: str, n: int = 3) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 300  # an idle keep-alive connection (a client nobody closed) frees its thread after this
    gold: GoldServer  # set on the subclass made by GoldServer.start
    server_version = "apps-bench-gold/1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("gold: " + format, *args)

    # ------------------------------------------------------------ plumbing

    def _send(self, status: int, body: bytes, content_type: str = "application/json", extra: dict | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _json(self, status: int, obj: object, extra: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), extra=extra)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error", extra: dict | None = None) -> None:
        self._json(status, {"error": {"message": message, "type": kind, "code": status}}, extra)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    # ------------------------------------------------------------ routes

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?")[0].rstrip("/")
        if path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [{"id": self.gold.model_id, "object": "model", "created": 0, "owned_by": "apps-bench-gold"}],
                },
            )
        elif path in ("/health", "/v1/health", ""):
            self._json(200, {"status": "ok", "model": self.gold.model_id, "note": SELF_CHECK})
        else:
            self._error(404, f"gold serves GET /v1/models only; no route for GET {self.path}")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        raw = self._read_body()
        path = self.path.split("?")[0].rstrip("/")
        if not path.endswith("/chat/completions"):
            self._error(
                404,
                f"gold serves POST /v1/chat/completions only; this request went to {self.path} "
                "(a misrouted call: e.g. LangChain needs use_responses_api=False; nothing here serves embeddings)",
            )
            return
        gold = self.gold
        with gold._lock:
            gold.stats.requests += 1
            gold.stats.in_flight += 1
            gold.stats.max_in_flight = max(gold.stats.max_in_flight, gold.stats.in_flight)
        try:
            self._chat(raw)
        finally:
            with gold._lock:
                gold.stats.in_flight -= 1

    def _chat(self, raw: bytes) -> None:
        gold = self.gold
        try:
            request = json.loads(raw or b"null")
        except ValueError:
            self._error(400, "request body is not JSON")
            return
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
            self._error(400, "request body must be a JSON object with a `messages` list")
            return
        model = request.get("model")
        if model != gold.model_id:
            self._error(404, f"The model `{model}` does not exist. Served models: {gold.model_id}", "model_not_found")
            return

        fault = gold.fault_for(raw)
        gold.pause(gold.latency_s)
        if fault:
            with gold._lock:
                gold.stats.faults[fault] += 1
            self._fault(fault, bool(request.get("stream")))
            return

        reply = respond(request, gold.index, wrong_fraction=gold.wrong_fraction)
        usage = usage_for(request, reply)
        with gold._lock:
            st = gold.stats
            st.replies += 1
            st.prompt_tokens += usage["prompt_tokens"]
            st.completion_tokens += usage["completion_tokens"]
            st.kinds[reply.kind] += 1
            st.seeds.append(request.get("seed"))
            st.last_requests.append(request)
            st.last_replies.append({"kind": reply.kind, **usage})
            st.headers.append({k.lower(): v for k, v in self.headers.items() if k.lower().startswith("x-apps")})
        if request.get("stream"):
            self._send(200, self._sse(request, reply, usage), "text/event-stream")
        else:
            self._json(200, self._completion(request, reply, usage))

    def _fault(self, fault: str, stream: bool) -> None:
        if fault.startswith("http_"):
            status = int(fault[5:])
            extra = {"Retry-After": "0"} if status == 429 else None
            self._error(status, f"gold: injected fault {fault} (fault_fraction)", "server_error", extra)
        elif fault == "timeout":
            self.gold.pause(self.gold.stall_s)  # the client's timeout fires first
            self.close_connection = True
        else:  # malformed
            body = (
                b'data: {"choices": [{"delta": {"content": "gold: injected malformed'
                if stream
                else b'{"id": "gold-malformed", "choices": [ {'
            )
            self._send(200, body, "text/event-stream" if stream else "application/json")

    # ------------------------------------------------------------ bodies

    def _ids(self, request: JsonObject) -> tuple[str, int]:
        digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:24]
        return f"chatcmpl-gold-{digest}", int(time.time())

    @staticmethod
    def _tool_calls(reply: Reply, request: JsonObject) -> list[JsonObject]:
        n = sum(len(m.get("tool_calls") or []) for m in request.get("messages") or [] if isinstance(m, dict))
        return [
            {"id": f"call_gold_{n + i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for i, c in enumerate(reply.tool_calls)
        ]

    def _completion(self, request: JsonObject, reply: Reply, usage: dict[str, int]) -> JsonObject:
        cid, created = self._ids(request)
        message: JsonObject = {"role": "assistant", "content": reply.content}
        calls = self._tool_calls(reply, request)
        if calls:
            message["tool_calls"] = calls
        return {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": self.gold.model_id,
            "system_fingerprint": "gold-self-check",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop", "logprobs": None}],
            "usage": usage,
        }

    def _sse(self, request: JsonObject, reply: Reply, usage: dict[str, int]) -> bytes:
        cid, created = self._ids(request)
        base = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": self.gold.model_id,
            "system_fingerprint": "gold-self-check",
        }

        def chunk(delta: JsonObject, finish: str | None = None) -> JsonObject:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": piece}) for piece in _chunks(reply.content or "")]
        calls = self._tool_calls(reply, request)
        for i, call in enumerate(calls):
            head = {
                "index": i,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            events.append(chunk({"tool_calls": [head]}))
            for piece in _chunks(call["function"]["arguments"], 2):
                events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
        events.append(chunk({}, "tool_calls" if calls else "stop"))
        events.append({**base, "choices": [], "usage": usage})  # always, asked for or not
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return body.encode()


def load_rows(path: str, split: str = "test") -> list[GoldProblem]:
    """Gold problems from a codeparrot-schema JSONL file (for standalone use)."""
    problems = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                problems.append(GoldProblem.from_row(json.loads(line), split))
            except (ValueError, KeyError) as exc:
                raise SystemExit(f"{path}:{n}: not a codeparrot/apps row ({exc})") from exc
    return problems


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m apps_bench.models.gold", description=f"Serve the gold model ({SELF_CHECK}).")
    ap.add_argument("--rows", action="append", default=[], help="codeparrot/apps JSONL file (repeatable)")
    ap.add_argument("--split", default="test", help="split name for the problem keys (test|train)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--latency-ms", type=int, default=0)
    ap.add_argument("--wrong-fraction", type=float, default=0.0)
    ap.add_argument("--fault-fraction", type=float, default=0.0)
    ap.add_argument("--stall-s", type=float, default=30.0, help="how long an injected timeout stalls")
    args = ap.parse_args(argv)
    problems = [p for f in args.rows for p in load_rows(f, args.split)]
    if not problems:
        problems = [GoldProblem.from_problem(p) for p in DEMO_PROBLEMS]
    server = GoldServer(
        problems,
        host=args.host,
        port=args.port,
        latency_ms=args.latency_ms,
        wrong_fraction=args.wrong_fraction,
        fault_fraction=args.fault_fraction,
        stall_s=args.stall_s,
    ).start()
    print(f"gold ({SELF_CHECK}): {len(server.index)} problems at {server.base_url}  model id: {server.model_id}", flush=True)
    print(f"use: python -m apps_bench model=gold model.base_url={server.base_url}   (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
