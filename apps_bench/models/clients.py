"""One place that turns (endpoint, model config) into a client for each framework.

Every client built here talks through a metered, retrying HTTP client
(`client_stack.metered_client`), so a problem's tokens and calls land in its `Usage`
the same way whichever framework made the call, and every framework retries
alike. The SDKs are therefore built with `max_retries=0`: retries happen once, at
the transport, with `model.max_retries` and `model.retry_backoff_s`.

Each method builds a fresh client (closing an SDK client closes its HTTP client),
and imports its framework lazily; a missing framework names the pip extra. A runner
builds one client per agent and names the agent's `role` (the role its transcript
events carry): every call the client makes is recorded as that role's, so the cost
per role is counted at the transport, like the totals.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from apps_bench.config.schema import ModelConfig, as_plain
from apps_bench.errors import AppsBenchError
from apps_bench.models.client_stack import SharedConnections, metered_client
from apps_bench.models.retrying import RetryPolicy
from apps_bench.models.slots import EndpointSlots

if TYPE_CHECKING:  # pragma: no cover
    from apps_bench.models.endpoint import Endpoint
    from apps_bench.types import JsonObject, Usage


class MissingFrameworkError(ImportError, AppsBenchError):
    """A runner's framework is not installed; the message has the install command."""


def _require(module: str, extra: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingFrameworkError(
            f"{package} is not installed ({exc}). Install it with: pip install 'apps-bench[{extra}]'"
        ) from exc


# AutoGen needs these for a model name it does not know (any non-OpenAI name).
AUTOGEN_MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
    "multiple_system_messages": True,
}


class ModelClients:
    """Per problem: builds metered clients for every framework; all count into `usage`."""

    def __init__(
        self,
        endpoint: Endpoint,
        model_cfg: ModelConfig,
        usage: Usage,
        *,
        headers: dict[str, str] | None = None,
        flavour: str = "httpx2",
        shared: SharedConnections | None = None,
    ) -> None:
        """`shared`: a `client_stack.SharedConnections` whose pools the clients send through."""
        self.endpoint = endpoint
        self.shared = shared
        self.cfg = model_cfg
        self.usage = usage
        self.headers = dict(headers or {})
        self.flavour = flavour
        capacity = int(model_cfg.max_concurrency)
        self.policy = RetryPolicy(
            max_retries=int(model_cfg.max_retries),
            backoff_s=float(model_cfg.retry_backoff_s),
            retry_timeouts=bool(model_cfg.retry_timeouts),
            slots=EndpointSlots(endpoint.base_url, capacity) if capacity > 0 else None,
        )
        self.timeout_s = float(model_cfg.request_timeout_s)
        self.temperature = float(model_cfg.temperature)
        self.top_p = float(model_cfg.top_p)
        self.max_tokens = int(model_cfg.max_tokens)
        self._opened: list[Any] = []  # HTTP clients handed out, closed by aclose()/close()

    # ------------------------------------------------------------ building blocks

    def http_client(self, asynchronous: bool = False, flavour: str | None = None, *, role: str = "") -> Any:
        """A fresh metered + retrying httpx2 (default) client; openai 3.x accepts httpx2 and httpx.
        `role`: the agent role whose calls these are (recorded in each `usage.calls` entry)."""
        client = metered_client(
            self.usage,
            self.policy,
            asynchronous=asynchronous,
            flavour=flavour or self.flavour,
            timeout_s=self.timeout_s,
            headers=self.headers or None,
            base_url=self.endpoint.base_url,
            shared=self.shared,
            role=role,
        )
        self._opened.append(client)
        return client

    async def aclose(self) -> None:
        """Close every HTTP client this object built (their connection pools), sync and async."""
        opened, self._opened = self._opened, []
        for client in opened:
            try:
                if hasattr(client, "aclose"):
                    await client.aclose()
                else:
                    client.close()
            except Exception:  # noqa: BLE001 - closing is best effort; usage is already counted
                pass

    def close(self) -> None:
        """Synchronous close; async clients are left to aclose() (or the garbage collector)."""
        keep = []
        for client in self._opened:
            if hasattr(client, "aclose"):
                keep.append(client)
                continue
            try:
                client.close()
            except Exception:  # noqa: BLE001 - best effort while closing: one client's failure must not keep the others open
                pass
        self._opened = keep

    @property
    def model_id(self) -> str:
        return self.endpoint.model_id

    def extra_body(self) -> JsonObject:
        return as_plain(self.cfg.extra_body) or {}

    def request_params(self, seed: int) -> JsonObject:
        """Sampling for one chat.completions call: temperature, top_p, max_tokens, seed, extra_body."""
        params: JsonObject = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": int(seed),
        }
        extra = self.extra_body()
        if extra:
            params["extra_body"] = extra
        return params

    # ------------------------------------------------------------ OpenAI SDK

    def async_openai(self, *, role: str = "") -> Any:
        """AsyncOpenAI on the endpoint; pass `**request_params(seed)` to each create() call."""
        openai = _require("openai", "all", "openai")
        return openai.AsyncOpenAI(
            base_url=self.endpoint.base_url,
            api_key=self.endpoint.api_key,
            http_client=self.http_client(asynchronous=True, role=role),
            max_retries=0,
            timeout=self.timeout_s,
            default_headers=self.headers or None,
        )

    def openai(self, *, role: str = "") -> Any:
        """Synchronous OpenAI client (e.g. for an optimizer's reflection model)."""
        openai = _require("openai", "all", "openai")
        return openai.OpenAI(
            base_url=self.endpoint.base_url,
            api_key=self.endpoint.api_key,
            http_client=self.http_client(role=role),
            max_retries=0,
            timeout=self.timeout_s,
            default_headers=self.headers or None,
        )

    # ------------------------------------------------------------ LangChain / LangGraph

    def langchain_chat(self, seed: int, *, role: str = "") -> Any:
        """ChatOpenAI with both sync and async HTTP clients metered (else one side goes uncounted)."""
        mod = _require("langchain_openai", "all", "langchain-openai")
        kwargs: dict[str, object] = dict(
            model=self.model_id,
            base_url=self.endpoint.base_url,
            api_key=self.endpoint.api_key,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
            seed=int(seed),
            timeout=self.timeout_s,
            max_retries=0,  # retried at the transport (model.max_retries)
            http_client=self.http_client(role=role),
            http_async_client=self.http_client(asynchronous=True, role=role),
            use_responses_api=False,
            stream_usage=True,
            # our clients choose the proxy (proxy_for); without this, langchain-openai warns on
            # every run with a proxy variable set (NO_PROXY too) about a transport it never builds
            http_socket_options=(),
        )
        self._add_extras(kwargs)
        return mod.ChatOpenAI(**kwargs)

    def _add_extras(self, kwargs: dict[str, object]) -> None:
        """The extra body (sampling knobs outside the OpenAI schema) and headers, when set."""
        extra = self.extra_body()
        if extra:
            kwargs["extra_body"] = extra
        if self.headers:
            kwargs["default_headers"] = self.headers

    # ------------------------------------------------------------ AutoGen

    def autogen_client(self, seed: int, *, role: str = "") -> Any:
        """OpenAIChatCompletionClient with a full model_info (AutoGen rejects unknown names without it)."""
        mod = _require("autogen_ext.models.openai", "autogen", "autogen-ext[openai]")
        kwargs: dict[str, object] = dict(
            model=self.model_id,
            base_url=self.endpoint.base_url,
            api_key=self.endpoint.api_key,
            model_info=dict(AUTOGEN_MODEL_INFO),
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
            seed=int(seed),
            timeout=self.timeout_s,
            max_retries=0,
            http_client=self.http_client(asynchronous=True, role=role),
        )
        self._add_extras(kwargs)
        return mod.OpenAIChatCompletionClient(**kwargs)

    # ------------------------------------------------------------ CrewAI

    def crewai_llm(self, seed: int, *, role: str = "") -> Any:
        """crewai.LLM on the native OpenAI provider (no litellm), metered through client_params.

        CrewAI's ReAct executor stops each reply at its stop word (`\\nObservation:`), but its OpenAI
        provider only cuts the text after it arrives: the server would write on to EOS or the token
        cap, and that discarded tail would count in CrewAI's tokens and time. So the stop word is
        sent with every request (`stop`) and the server stops there."""
        crewai = _require("crewai", "crewai", "crewai")
        kwargs: dict[str, object] = dict(
            model=self.model_id,  # no provider prefix: "openai/..." would route through litellm
            provider="openai",  # a "/" in the id (Qwen/...) must not be read as a provider
            base_url=self.endpoint.base_url,
            api_key=self.endpoint.api_key,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
            seed=int(seed),
            timeout=self.timeout_s,
            max_retries=0,
            client_params={"http_client": self.http_client(role=role)},
        )
        self._add_extras(kwargs)
        extra = self.extra_body()
        own = extra.get("stop") or []
        extra["stop"] = list(dict.fromkeys([*([own] if isinstance(own, str) else own), *crewai_stop_words()]))
        kwargs["extra_body"] = extra
        return crewai.LLM(**kwargs)


def crewai_stop_words() -> list[str]:
    """The stop words CrewAI's agent executor registers for every agent (crewai/agent/core.py:
    the i18n slice "observation"), read from CrewAI so they follow its version."""
    from crewai.utilities.i18n import I18N

    return [I18N().slice("observation")]
