"""The optimizer model as a plain callable `(messages, seed) -> ChatReply`, on the project's
own metered client layer (so its tokens are counted like the task model's, and apart).

MASPO's proposals and text judge and GEPA's reflection all call this through
`proposals.CachedChat`, which adds the cache and the budget.
"""

from __future__ import annotations

import threading

from apps_bench.config.schema import ModelConfig
from apps_bench.models import Endpoint, ModelClients
from apps_bench.optimizers.proposals import ChatReply, Message
from apps_bench.types import Usage


class EndpointChat:
    """Synchronous chat completions on an open endpoint (`models.open_endpoint`)."""

    def __init__(self, endpoint: Endpoint, model_cfg: ModelConfig) -> None:
        self.usage = Usage()
        self._clients = ModelClients(endpoint, model_cfg, self.usage)
        self._client = self._clients.openai()
        self._lock = threading.Lock()  # the usage delta of one call must be that call's

    def __call__(self, messages: list[Message], seed: int) -> ChatReply:
        with self._lock:
            before = self.usage.total_tokens
            resp = self._client.chat.completions.create(
                model=self._clients.model_id, messages=messages, **self._clients.request_params(int(seed))
            )
            counted = self.usage.total_tokens - before
        text = (resp.choices[0].message.content or "") if resp.choices else ""
        reported = getattr(getattr(resp, "usage", None), "total_tokens", None)
        return ChatReply(text, int(counted or reported or 0))

    def close(self) -> None:
        self._clients.close()
