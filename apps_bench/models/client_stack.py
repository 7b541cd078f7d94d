"""The HTTP client stack every model client sends through, assembled in one place:

    SDK -> httpx2 Client -> MeteredTransport (metering.py: counts usage, rewrites requests)
        -> RetryingTransport (retrying.py: retries 429/5xx/timeouts) -> a connection pool

metering.py and retrying.py each do one job and know nothing of each other's module;
this one puts them together, with the connection pools (shared per event loop) and the
proxy the environment sets for an endpoint.
"""

from __future__ import annotations

import ssl
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

from apps_bench.models.metering import AsyncMeteredTransport, MeteredTransport
from apps_bench.models.retrying import AsyncRetryingTransport, RetryingTransport, RetryPolicy

if TYPE_CHECKING:
    from apps_bench.types import Usage

_SSL: dict[str, ssl.SSLContext] = {}
_SSL_LOCK = threading.Lock()


def _ssl_context(mod: ModuleType) -> ssl.SSLContext:
    """One verified SSL context per process: building one per client costs ~40 ms of CPU,
    which with a client per agent per problem ate most of the concurrency gain."""
    with _SSL_LOCK:
        ctx = _SSL.get(mod.__name__)
        if ctx is None:
            ctx = _SSL[mod.__name__] = mod.create_ssl_context()
        return ctx


def proxy_for(url: str) -> str | None:
    """The proxy the environment sets for `url` (HTTP(S)_PROXY, ALL_PROXY, NO_PROXY), or None."""
    import urllib.request
    from urllib.parse import urlparse

    parts = urlparse(url)
    host = parts.hostname or ""
    if host in ("127.0.0.1", "localhost", "::1") or urllib.request.proxy_bypass(host):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all") or None


def _module(flavour: str) -> ModuleType:
    if flavour == "httpx2":
        import httpx2

        return httpx2
    if flavour == "httpx":
        import httpx

        return httpx
    raise ValueError(f"unknown httpx flavour {flavour!r}; use 'httpx2' (openai 3.x native) or 'httpx'")


class SharedConnections:
    """Connection pools shared by every client built with it (one event loop's worth).

    A client per agent per problem is what keeps each problem's usage apart, but a
    connection pool per client means a new TCP (and, on HTTPS endpoints, TLS) handshake
    for every problem. Clients given the same `SharedConnections` meter and retry on
    their own and send through one pool per (flavour, sync/async, proxy); closing a
    client leaves the pool open. `aclose()` it when the event loop that used it ends.
    """

    def __init__(self, max_connections: int = 1024) -> None:
        self.max_connections = max_connections
        self._pools: dict[tuple[str, bool, str | None], Any] = {}
        self._lock = threading.Lock()

    def transport(self, mod: ModuleType, asynchronous: bool, proxy: str | None) -> Borrowed | AsyncBorrowed:
        """A non-closing view of the shared pool for these settings (created on first use)."""
        key = (mod.__name__, asynchronous, proxy)
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                limits = mod.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
                cls = mod.AsyncHTTPTransport if asynchronous else mod.HTTPTransport
                pool = self._pools[key] = cls(limits=limits, verify=_ssl_context(mod), proxy=proxy)
        return AsyncBorrowed(pool) if asynchronous else Borrowed(pool)

    async def aclose(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.items()), {}
        for (_, asynchronous, _), pool in pools:
            try:
                await pool.aclose() if asynchronous else pool.close()
            except Exception:  # noqa: BLE001 - closing idle connections is best effort
                pass


class Borrowed:
    """A sync transport that sends through a shared pool and leaves it open when its client closes."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def __enter__(self) -> Borrowed:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def handle_request(self, request: Any) -> Any:
        return self.pool.handle_request(request)

    def close(self) -> None:
        pass


class AsyncBorrowed:
    """Async twin of Borrowed."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    async def __aenter__(self) -> AsyncBorrowed:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def handle_async_request(self, request: Any) -> Any:
        return await self.pool.handle_async_request(request)

    async def aclose(self) -> None:
        pass


def metered_client(
    usage: Usage,
    policy: RetryPolicy | None = None,
    *,
    asynchronous: bool = False,
    flavour: str = "httpx2",
    timeout_s: float | None = None,
    headers: dict[str, str] | None = None,
    max_connections: int = 64,
    base_url: str | None = None,
    shared: SharedConnections | None = None,
    role: str = "",
) -> Any:
    """An httpx2 (or httpx) Client/AsyncClient whose model calls are retried and counted into `usage`
    (each `calls` entry naming `role`, the agent role the client serves, when given).

    Give each SDK object its own client: closing an SDK client closes the one it was given
    (but never a `shared` pool). `base_url` picks the environment's proxy for that endpoint
    (HTTP(S)_PROXY / NO_PROXY), as the SDKs' own clients would; loopback is never proxied.
    """
    mod = _module(flavour)
    policy = policy or RetryPolicy()
    timeout = mod.Timeout(timeout_s) if timeout_s else mod.Timeout(600.0, connect=10.0)
    proxy = proxy_for(base_url) if base_url else None
    if shared is not None:
        pool = shared.transport(mod, asynchronous, proxy)
    else:
        limits = mod.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        cls = mod.AsyncHTTPTransport if asynchronous else mod.HTTPTransport
        pool = cls(limits=limits, verify=_ssl_context(mod), proxy=proxy)
    if asynchronous:
        transport = AsyncMeteredTransport(mod, AsyncRetryingTransport(mod, pool, policy, usage), usage, role)
        return mod.AsyncClient(transport=transport, timeout=timeout, headers=headers)
    return mod.Client(
        transport=MeteredTransport(mod, RetryingTransport(mod, pool, policy, usage), usage, role),
        timeout=timeout,
        headers=headers,
    )
