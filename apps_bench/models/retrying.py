"""Retries with backoff for model calls, at the transport, so every framework retries alike.

The SDKs' own retry loops differ (and none retries a 200 with a broken body), so the
clients we build pass `max_retries=0` to the SDK and retry here instead: on 429, any
5xx, timeouts and other transport errors (connection refused, connection dropped),
and on a 2xx model response whose body is not well-formed JSON / SSE or holds no answer (no
`choices`, a choice without its message: wire.missing_answer); out of retries, that one is
handed up as a 502, so every SDK raises its own API error.
A model response is read whole before it is handed up (so a broken body can still
be retried); the caller still sees a normal (streamed) response. Every re-send and
what the discarded reply cost go into the problem's Usage (`retries`,
`failed_attempts`, `retried_*_tokens`); a timed-out request is not re-sent when
`retry_timeouts` is off, and with `slots` each attempt holds a request slot
(slots.py) while it is on the wire, so its timeout never runs in a server's queue.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from apps_bench.models.metering import RETRIES_KEY, is_model_call, parse_usage, record_retry
from apps_bench.models.wire import missing_answer, normalize_reply

if TYPE_CHECKING:
    from apps_bench.models.slots import EndpointSlots
    from apps_bench.types import Usage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 2  # retries after the first attempt
    backoff_s: float = 1.0  # first delay; doubles per retry
    max_backoff_s: float = 30.0
    # False for a server that keeps running a request its client gave up on (llama-cpp-python):
    # re-sending a timed-out request there doubles the work; it fails instead.
    retry_timeouts: bool = True
    slots: EndpointSlots | None = None  # at most its capacity of requests on the wire at once

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        base = min(self.backoff_s * (2**attempt), self.max_backoff_s)
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), self.max_backoff_s)
            except ValueError:
                pass
        return base * (0.5 + random.random() / 2)  # jitter: 16 problems in flight must not retry in lockstep


MALFORMED = "malformed response body"


def _retryable_status(status: int) -> bool:
    return status == 429 or status >= 500


def _rebuild(mod: ModuleType, response: Any, body: bytes, attempt: int) -> Any:
    """The response handed up, its body read whole (and in the one wire form when it is a success)."""
    body = normalize_reply(body, response.headers.get("content-type", "")) if response.status_code < 300 else body
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() != "content-length"]
    return mod.Response(
        response.status_code, headers=headers, content=body, extensions={**response.extensions, RETRIES_KEY: attempt}
    )


def _broken(mod: ModuleType, response: Any, attempt: int) -> Any:
    """A 2xx whose body does not parse, out of retries: a 502, so every SDK raises its API error
    (each would otherwise fail in its own JSON parser, outside its error types)."""
    body = json.dumps(
        {
            "error": {
                "message": "malformed response body from the model server (after retries)",
                "type": "bad_gateway",
                "code": 502,
            }
        }
    ).encode()
    return mod.Response(
        502,
        headers=[("content-type", "application/json")],
        content=body,
        extensions={**response.extensions, RETRIES_KEY: attempt},
    )


def _reason(response: Any, body: bytes, path: str) -> str | None:
    """Why this response should be retried, or None to hand it up."""
    if _retryable_status(response.status_code):
        return f"HTTP {response.status_code}"
    if 200 <= response.status_code < 300:
        ok, _, _ = parse_usage(body, response.headers.get("content-type", ""))
        if not ok or missing_answer(body, path, response.headers.get("content-type", "")):
            return MALFORMED
    return None


class _Retrying:
    """What the sync and async transports share: the decisions of one attempt. `mod` is the httpx
    flavour (httpx2 or httpx) whose responses and errors the transport handles."""

    def __init__(self, mod: ModuleType, inner: Any, policy: RetryPolicy, usage: Usage | None = None) -> None:
        self.mod, self.inner, self.policy, self.usage = mod, inner, policy, usage

    def _gives_up(self, attempt: int, exc: BaseException) -> bool:
        return attempt >= self.policy.max_retries or (
            isinstance(exc, self.mod.TimeoutException) and not self.policy.retry_timeouts
        )

    def _answer(self, response: Any, body: bytes, attempt: int, reason: str | None) -> Any:
        """The response to hand up (a re-send is needed when it is None)."""
        if reason is None or attempt >= self.policy.max_retries:
            return _broken(self.mod, response, attempt) if reason == MALFORMED else _rebuild(self.mod, response, body, attempt)
        return None

    def _next_delay(self, response: Any, body: bytes, attempt: int, reason: str, retry_after: str | None) -> float:
        """Count the discarded attempt and say how long to wait before the next one."""
        _, p, c = parse_usage(body, response.headers.get("content-type", "")) if response is not None else (0, 0, 0)
        record_retry(self.usage, prompt_tokens=p, completion_tokens=c)
        delay = self.policy.delay(attempt, retry_after)
        log.warning("model call failed (%s); retry %d/%d in %.2fs", reason, attempt + 1, self.policy.max_retries, delay)
        return delay


class RetryingTransport(_Retrying):
    """A sync httpx transport that retries model calls (module docstring); other requests pass untouched."""

    def __enter__(self) -> RetryingTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, request: Any) -> tuple[Any, bytes]:
        with self.policy.slots.hold() if self.policy.slots is not None else contextlib.nullcontext():
            response = self.inner.handle_request(request)
            try:
                return response, b"".join(response.stream)
            finally:
                response.stream.close()

    def handle_request(self, request: Any) -> Any:
        if not is_model_call(request.method, request.url.path):
            return self.inner.handle_request(request)
        attempt = 0
        while True:
            retry_after: str | None = None
            reason: str | None = None
            response, body = None, b""
            try:
                response, body = self.send(request)
            except self.mod.TransportError as exc:  # timeouts, connect errors, dropped connections
                if self._gives_up(attempt, exc):
                    raise
                reason = f"{type(exc).__name__}: {exc}"
            else:
                reason = _reason(response, body, request.url.path)
                answer = self._answer(response, body, attempt, reason)
                if answer is not None:
                    return answer
                retry_after = response.headers.get("retry-after")
            time.sleep(self._next_delay(response, body, attempt, str(reason), retry_after))
            attempt += 1

    def close(self) -> None:
        self.inner.close()


class AsyncRetryingTransport(_Retrying):
    """Async twin of RetryingTransport."""

    async def __aenter__(self) -> AsyncRetryingTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def send(self, request: Any) -> tuple[Any, bytes]:
        async with self.policy.slots.ahold() if self.policy.slots is not None else contextlib.nullcontext():
            response = await self.inner.handle_async_request(request)
            try:
                return response, b"".join([chunk async for chunk in response.stream])
            finally:
                await response.stream.aclose()

    async def handle_async_request(self, request: Any) -> Any:
        if not is_model_call(request.method, request.url.path):
            return await self.inner.handle_async_request(request)
        attempt = 0
        while True:
            retry_after: str | None = None
            reason: str | None = None
            response, body = None, b""
            try:
                response, body = await self.send(request)
            except self.mod.TransportError as exc:
                if self._gives_up(attempt, exc):
                    raise
                reason = f"{type(exc).__name__}: {exc}"
            else:
                reason = _reason(response, body, request.url.path)
                answer = self._answer(response, body, attempt, reason)
                if answer is not None:
                    return answer
                retry_after = response.headers.get("retry-after")
            delay = self._next_delay(response, body, attempt, str(reason), retry_after)
            import asyncio  # lazily: keeps `import apps_bench.models` light

            await asyncio.sleep(delay)
            attempt += 1

    async def aclose(self) -> None:
        await self.inner.aclose()
