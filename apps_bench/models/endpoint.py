"""Resolve a model config to a live endpoint, or fail the cell at start with what to set.

`open_endpoint(model_cfg, problems)` (the typed `ModelConfig`) is a context manager. For the `gold` provider it
starts the built-in server on 127.0.0.1 (a free port) for the cell's problems and stops
it afterwards; for `local`, llama-cpp-python's server with a small real model (local.py),
the same way. For `openai` providers (vLLM, any OpenAI-compatible server) it reads the
API key from the env var named by `api_key_env` and probes `GET /models` with a short
timeout, so an unreachable endpoint or an unknown model id fails now, with a message
naming the setting to change, instead of fifty timeouts later.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Iterator
from urllib.parse import urlparse

from apps_bench.config.schema import ModelConfig
from apps_bench.errors import AppsBenchError
from apps_bench.models.client_stack import proxy_for
from apps_bench.models.local import LocalModelError, LocalServer, server_for

if TYPE_CHECKING:
    from apps_bench.models.gold import GoldServer
    from apps_bench.models.gold_policy import GoldProblem
    from apps_bench.types import Problem

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}
PLACEHOLDER_KEY = "EMPTY"  # vLLM accepts any key unless started with --api-key
PROBE_TIMEOUT_S = 5.0

_WHAT_TO_SET = (
    "Set VLLM_BASE_URL (model=qwen / qwen_122b) or OPENAI_BASE_URL (model=openai), or pass "
    "model.base_url=http://HOST:PORT/v1; MODEL_ID or model.model_id=... names the model; the API key "
    "comes from the env var named by model.api_key_env (default OPENAI_API_KEY)."
)


class ModelEndpointError(RuntimeError, AppsBenchError):
    """The model endpoint cannot serve this cell; the message says what to set."""


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # ends with /v1
    model_id: str
    api_key: str = field(repr=False)  # never logged
    provider: str = "openai"  # gold | local | openai
    served_models: tuple[str, ...] = ()
    server: GoldServer | LocalServer | None = field(default=None, repr=False, compare=False)  # gold's or local's, started here

    @property
    def is_gold(self) -> bool:
        return self.provider == "gold"


def is_loopback(base_url: str) -> bool:
    return (urlparse(base_url).hostname or "") in LOOPBACK_HOSTS


@contextmanager
def open_endpoint(model_cfg: ModelConfig, problems: Iterable[Problem | GoldProblem] = ()) -> Iterator[Endpoint]:
    provider = model_cfg.provider
    if provider == "gold" and not model_cfg.base_url:
        from apps_bench.models.gold import GoldServer  # runs as `python -m`: its package must not import it

        if model_cfg.gold is None:
            raise ModelEndpointError("model.provider=gold without gold's settings (model.gold): start from model=gold")
        server = GoldServer(
            problems,
            model_id=model_cfg.model_id,
            latency_ms=int(model_cfg.gold.latency_ms),
            wrong_fraction=float(model_cfg.gold.wrong_fraction),
            fault_fraction=float(model_cfg.gold.fault_fraction),
            stall_s=float(model_cfg.request_timeout_s) + 1.0,
        ).start()
        try:
            yield Endpoint(server.base_url, server.model_id, "gold-needs-no-key", "gold", (server.model_id,), server)
        finally:
            server.stop()
        return
    if provider == "local" and not model_cfg.base_url:
        try:
            local = server_for(model_cfg).start()
        except LocalModelError as exc:
            raise ModelEndpointError(str(exc)) from None
        try:
            yield Endpoint(local.base_url, local.model_id, PLACEHOLDER_KEY, "local", (local.model_id,), local)
        finally:
            local.stop()
        return
    if provider not in ("gold", "openai", "local"):
        raise ModelEndpointError(
            f"unknown model.provider {provider!r}: use 'gold' (built-in), 'local' (a small real LLM started "
            "here) or 'openai' (any OpenAI-compatible endpoint)"
        )
    yield resolve_remote(model_cfg)


def resolve_remote(model_cfg: ModelConfig) -> Endpoint:
    """An OpenAI-compatible endpoint from config + environment, probed unless check_endpoint=false."""
    name = model_cfg.name
    base_url = (model_cfg.base_url or "").strip().rstrip("/")
    model_id = model_cfg.model_id.strip()
    if not base_url:
        raise ModelEndpointError(f"model {name!r} has no base URL. {_WHAT_TO_SET}")
    if not urlparse(base_url).scheme or not urlparse(base_url).hostname:
        raise ModelEndpointError(f"model.base_url={base_url!r} is not a URL like http://HOST:PORT/v1. {_WHAT_TO_SET}")
    if not model_id:
        raise ModelEndpointError(f"model {name!r} has no model id. Set MODEL_ID or model.model_id=...")
    key_env = model_cfg.api_key_env
    key = os.environ.get(key_env) or ""

    served: tuple[str, ...] = ()
    owners: set[str] = set()
    if model_cfg.check_endpoint:
        timeout = min(PROBE_TIMEOUT_S, float(model_cfg.request_timeout_s))
        base_url, served, owners = probe(base_url, key or PLACEHOLDER_KEY, key_env, timeout)
        if model_id not in served:
            listing = ", ".join(served) or "(none)"
            raise ModelEndpointError(
                f"model id {model_id!r} is not served by {base_url}; it serves: {listing}. "
                f"Set MODEL_ID=<one of those> or model.model_id=<one of those>."
            )
    if not key:
        if is_loopback(base_url) or "vllm" in owners:
            log.warning(
                "%s is not set: using the placeholder key %r, which vLLM and loopback servers accept. "
                "Set %s if this endpoint checks keys.",
                key_env,
                PLACEHOLDER_KEY,
                key_env,
            )
            key = PLACEHOLDER_KEY
        else:
            raise ModelEndpointError(
                f"no API key: the env var {key_env} is not set (model.api_key_env names it). "
                f"Export {key_env}=<your key> (any value works for a vLLM server without --api-key)."
            )
    return Endpoint(base_url, model_id, key, "openai", served)


def probe(base_url: str, key: str, key_env: str, timeout_s: float) -> tuple[str, tuple[str, ...], set[str]]:
    """GET <base>/models (and <base>/v1/models if the base lacks /v1): (base_url, served ids, owners)."""
    import httpx

    candidates = [base_url]
    if not base_url.endswith("/v1"):
        candidates.append(base_url + "/v1")
    headers = {"Authorization": f"Bearer {key}"}
    last = ""

    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 3.0))
    with httpx.Client(timeout=timeout, trust_env=False, proxy=proxy_for(base_url)) as client:  # as the model clients do
        for base in candidates:
            try:
                resp = client.get(f"{base}/models", headers=headers)
            except httpx.HTTPError as exc:
                raise ModelEndpointError(
                    f"cannot reach the model endpoint {base}/models ({type(exc).__name__}: {exc}). "
                    f"Is the server running (see launchers/ for vLLM)? {_WHAT_TO_SET} "
                    f"(model.check_endpoint=false skips this probe.)"
                ) from None
            if resp.status_code in (401, 403):
                raise ModelEndpointError(
                    f"{base}/models rejected the API key (HTTP {resp.status_code}). Export {key_env}=<a valid key> "
                    f"(model.api_key_env names the variable)."
                )
            if resp.status_code == 404:
                last = f"HTTP 404 at {base}/models"
                continue
            if resp.status_code >= 400:
                raise ModelEndpointError(f"{base}/models answered HTTP {resp.status_code}: {resp.text[:200]!r}. {_WHAT_TO_SET}")
            try:
                data = resp.json().get("data") or []
                served = tuple(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m)
                owners = {str(m.get("owned_by", "")).lower() for m in data if isinstance(m, dict)}
            except (ValueError, AttributeError, KeyError):
                raise ModelEndpointError(f"{base}/models did not return an OpenAI model list. {_WHAT_TO_SET}") from None
            if base != base_url:
                log.warning("model.base_url %s has no /v1; using %s", base_url, base)
            return base, served, owners
    raise ModelEndpointError(f"{last}: not an OpenAI-compatible base URL (it should end with /v1). {_WHAT_TO_SET}")
