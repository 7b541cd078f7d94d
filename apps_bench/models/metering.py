"""Token and call accounting at the HTTP transport, the one layer every framework shares.

LangChain, AutoGen, CrewAI and the OpenAI SDK all end in an `openai` client whose
`http_client=` we supply. Counting there (not in framework callbacks, which miss
streamed calls or double-count shared LLMs) gives the same numbers for all four.

The stack of one metered client (assembled by client_stack.py), outermost first:

    MeteredTransport   puts the request in the one wire form (wire.py); counts once per
                       logical model call: model_calls, tokens, finish_reason on success,
                       failed_calls when the call still fails, cancelled_calls when it
                       was abandoned unanswered; `in_flight` while it is out
    RetryingTransport  (retrying.py) retries 429 / 5xx / timeouts / malformed bodies,
                       counting each re-send; holds a request slot (slots.py) per attempt
    HTTPTransport      the real network

openai 3.x accepts either an `httpx2` or a legacy `httpx` client (it checks both
types); LangChain, AutoGen and CrewAI pass the object through untouched. We build
`httpx2` clients by default (the SDK's native one) and can build `httpx` ones too.

`Usage.model_calls` counts successful model responses, `failed_calls` model calls
that failed after all retries (an HTTP error status, a transport error, or a body
that does not parse). Tool calls are counted by the tool, not here.

A client built for one agent role (`metered_client(role=...)`) writes that role into
each of its `usage.calls` entries: a client per agent is how the transport knows who
sent a request, so the report's cost per role is counted, not estimated.
"""

from __future__ import annotations

import json
import logging
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator

from apps_bench.models.wire import (
    RequestInfo,
    ensure_stream_usage,  # noqa: F401 - part of this module's API
    finish_reason,
    prepare_request,
)
from apps_bench.tracking.capture import ModelCall, current_turn

if TYPE_CHECKING:  # pragma: no cover
    from apps_bench.types import JsonObject, Usage

log = logging.getLogger(__name__)

# One lock for all Usage objects: several transports (a framework's sync and async
# clients, a selector's client) may feed the same per-problem Usage from many threads.
_USAGE_LOCK = threading.Lock()

MODEL_PATHS = ("/chat/completions", "/completions", "/responses", "/embeddings")


def is_model_call(method: str, path: str) -> bool:
    """POSTs to the model endpoints are model calls; GET /models (the probe) is not."""
    return method.upper() == "POST" and path.rstrip("/").endswith(MODEL_PATHS)


def parse_usage(body: bytes, content_type: str = "") -> tuple[bool, int, int]:
    """(well_formed, prompt_tokens, completion_tokens) of a JSON body or an SSE stream.

    For SSE the last event carrying a `usage` object wins (the server's final usage
    chunk); a stream whose events do not parse as JSON is malformed.
    """
    text = body.decode("utf-8", errors="replace")
    if "text/event-stream" in content_type or text.lstrip().startswith("data:"):
        usage: JsonObject | None = None
        seen = False
        for line in text.splitlines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if not data or data == "[DONE]":
                continue
            try:
                event = json.loads(data)
            except ValueError:
                return False, 0, 0
            seen = True
            if isinstance(event, dict) and isinstance(event.get("usage"), dict):
                usage = event["usage"]
        if not seen:
            return False, 0, 0
        return True, *_tokens(usage)
    try:
        obj = json.loads(text)
    except ValueError:
        return False, 0, 0
    if not isinstance(obj, dict):
        return False, 0, 0
    return True, *_tokens(obj.get("usage"))


def _tokens(usage: object) -> tuple[int, int]:
    if not isinstance(usage, dict):
        return 0, 0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0
    return int(prompt), int(completion)


def record(
    usage: Usage,
    *,
    ok: bool,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    finish_reason: str = "",
    retries: int = 0,
    has_tools: bool = False,
    cancelled: bool = False,
    role: str = "",
) -> None:
    """Count one logical model call (after its retries); ends its `in_flight` count.
    `role`: the agent role whose client made the call (kept in its `calls` entry)."""
    with _USAGE_LOCK:
        usage.in_flight = max(0, usage.in_flight - 1)
        if has_tools:
            usage.requests_with_tools += 1
        if cancelled:
            usage.cancelled_calls += 1
        elif ok:
            usage.model_calls += 1
            usage.prompt_tokens += prompt_tokens
            usage.completion_tokens += completion_tokens
            reason = finish_reason or "unknown"
            usage.finish_reasons[reason] = usage.finish_reasons.get(reason, 0) + 1
            call = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "finish_reason": reason,
                "retries": retries,
                "tools": has_tools,
            }
            if role:
                call["role"] = role
            usage.calls.append(call)
        else:
            usage.failed_calls += 1
            usage.failed_attempts += 1  # the last attempt; retried ones are counted by record_retry


def record_retry(usage: Usage | None, *, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
    """A failed attempt that is being re-sent (and what the discarded reply cost, if it said)."""
    if usage is None:
        return
    with _USAGE_LOCK:
        usage.retries += 1
        usage.failed_attempts += 1
        usage.retried_prompt_tokens += prompt_tokens
        usage.retried_completion_tokens += completion_tokens


def _sent(usage: Usage) -> None:
    with _USAGE_LOCK:
        usage.in_flight += 1


RETRIES_KEY = "apps_bench_retries"  # response extension: how many re-sends the call needed


class _Counter:
    """Collects a response's bytes and records it exactly once, when the stream closes."""

    def __init__(
        self, usage: Usage, response: Any, info: RequestInfo, role: str = "", sent: tuple[int, int, bytes] | None = None
    ) -> None:
        self.usage, self.role = usage, role
        self.status = response.status_code
        self.content_type = response.headers.get("content-type", "")
        self.retries = int(response.extensions.get(RETRIES_KEY, 0) or 0)
        self.info = info
        self.sent = sent  # (start time, turn, request body) when the problem is traced
        self.chunks: list[bytes] = []
        self.done = False

    def feed(self, chunk: bytes) -> None:
        if not self.done:
            self.chunks.append(chunk)

    def close(self) -> None:
        if self.done:
            return
        self.done = True
        body = b"".join(self.chunks)
        if self.status >= 400:
            record(self.usage, ok=False, retries=self.retries, has_tools=self.info.has_tools, role=self.role)
            self._trace(body, ok=False)
            return
        ok, p, c = parse_usage(body, self.content_type)
        reason = finish_reason(body, self.content_type) if ok else ""
        record(
            self.usage,
            ok=ok,
            prompt_tokens=p,
            completion_tokens=c,
            finish_reason=reason,
            retries=self.retries,
            has_tools=self.info.has_tools,
            role=self.role,
        )
        self._trace(body, ok=ok, prompt_tokens=p, completion_tokens=c, finish_reason=reason or "unknown")
        self.chunks = []

    def _trace(self, body: bytes, **fields: Any) -> None:
        if self.sent is not None:
            trace_call(
                self.usage,
                self.role,
                self.sent,
                reply=body,
                content_type=self.content_type,
                status=self.status,
                retries=self.retries,
                **fields,
            )


def _sent_at(usage: Usage, request: Any) -> tuple[int, int, bytes] | None:
    """(start time, agent turn, request body) of a call of a traced problem; None when it is not traced."""
    if getattr(usage, "trace", None) is None:
        return None
    import time

    try:
        body = bytes(request.content)
    except Exception:  # noqa: BLE001 - a streamed request body: traced without it
        body = b""
    return time.time_ns(), current_turn(), body


def trace_call(usage: Usage, role: str, sent: tuple[int, int, bytes], **fields: Any) -> None:
    """Add one model call (its bodies and times, never its headers) to the problem's TraceLog."""
    import time

    start_ns, turn, body = sent
    usage.trace.add_call(ModelCall(role=role, start_ns=start_ns, end_ns=time.time_ns(), turn=turn, request=body, **fields))


def _rewrite(mod: ModuleType, request: Any) -> tuple[Any, RequestInfo]:
    """The model request as sent: uncompressed replies (so bodies can be read for usage),
    and the one wire form of its body (wire.prepare_request)."""
    try:
        content = request.content
    except Exception:  # noqa: BLE001 - a streamed request body (no SDK sends one): leave it alone
        return request, RequestInfo()
    new, info = prepare_request(content) if content else (None, RequestInfo())
    if new is None and request.headers.get("accept-encoding", "identity") == "identity":
        return request, info
    drop = {"content-length", "accept-encoding"} if new is not None else {"accept-encoding"}
    headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in drop]
    headers.append(("Accept-Encoding", "identity"))
    return mod.Request(
        request.method,
        request.url,
        headers=headers,
        content=new if new is not None else content,
        extensions=request.extensions,
    ), info


def _failed(usage: Usage, exc: BaseException, info: RequestInfo) -> None:
    """A call that raised: failed after its retries, or (cancellation) abandoned unanswered."""
    import asyncio

    record(usage, ok=False, has_tools=info.has_tools, cancelled=isinstance(exc, asyncio.CancelledError))


def _stream_class(cls: type, mod: ModuleType, base_name: str) -> type:
    """`cls` as a subclass of the flavour's `base_name` stream class too: httpx checks a response's
    stream with isinstance before reading it, and its flavours (httpx2, httpx) have a class each."""
    key = (cls, mod.__name__)
    bound = _STREAMS.get(key)
    if bound is None:
        bound = _STREAMS[key] = type(cls.__name__, (cls, getattr(mod, base_name)), {})
    return bound


_STREAMS: dict[tuple[type, str], type] = {}


class MeteredStream:
    """A response's byte stream that feeds its counter, which records the call when it is read or closed."""

    def __init__(self, inner: Any, counter: _Counter) -> None:
        self._inner, self._counter = inner, counter

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._counter.feed(chunk)
            yield chunk
        self._counter.close()  # fully read: count now, even if nobody closes us

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._counter.close()


class AsyncMeteredStream:
    """Async twin of MeteredStream."""

    def __init__(self, inner: Any, counter: _Counter) -> None:
        self._inner, self._counter = inner, counter

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._counter.feed(chunk)
            yield chunk
        self._counter.close()  # fully read: count now, even if nobody closes us

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._counter.close()


class _Metered:
    """What the sync and async transports share. `mod` is the httpx flavour (httpx2 or httpx) whose
    requests and responses the transport handles."""

    def __init__(self, mod: ModuleType, inner: Any, usage: Usage, role: str = "") -> None:
        self.mod, self.inner, self.usage, self.role = mod, inner, usage, role

    def _start(self, request: Any) -> tuple[Any, RequestInfo, tuple[int, int, bytes] | None]:
        """The request as sent, what it asks for, and (for a traced problem) when it was sent."""
        request, info = _rewrite(self.mod, request)
        _sent(self.usage)
        return request, info, _sent_at(self.usage, request)

    def _failed(self, exc: BaseException, info: RequestInfo, sent: tuple[int, int, bytes] | None) -> None:
        _failed(self.usage, exc, info)
        if sent is not None:
            trace_call(self.usage, self.role, sent, reply=b"", ok=False, status=0)

    def _metered(self, response: Any, stream: Any) -> Any:
        return self.mod.Response(response.status_code, headers=response.headers, stream=stream, extensions=response.extensions)


class MeteredTransport(_Metered):
    """Counts each model call once into `usage` (as `role`'s, when given); other requests pass untouched."""

    def __enter__(self) -> MeteredTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def handle_request(self, request: Any) -> Any:
        if not is_model_call(request.method, request.url.path):
            return self.inner.handle_request(request)
        request, info, sent = self._start(request)
        try:
            response = self.inner.handle_request(request)
        except BaseException as exc:
            self._failed(exc, info, sent)
            raise
        counter = _Counter(self.usage, response, info, self.role, sent)
        return self._metered(response, _stream_class(MeteredStream, self.mod, "SyncByteStream")(response.stream, counter))

    def close(self) -> None:
        self.inner.close()


class AsyncMeteredTransport(_Metered):
    """Async twin of MeteredTransport."""

    async def __aenter__(self) -> AsyncMeteredTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def handle_async_request(self, request: Any) -> Any:
        if not is_model_call(request.method, request.url.path):
            return await self.inner.handle_async_request(request)
        request, info, sent = self._start(request)
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException as exc:
            self._failed(exc, info, sent)
            raise
        counter = _Counter(self.usage, response, info, self.role, sent)
        stream = _stream_class(AsyncMeteredStream, self.mod, "AsyncByteStream")(response.stream, counter)
        return self._metered(response, stream)

    async def aclose(self) -> None:
        await self.inner.aclose()
