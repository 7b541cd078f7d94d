"""The optimizer model on the project's metered client: a real loopback gold server."""

from __future__ import annotations

from pathlib import Path

from conftest import compose_cell

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_endpoint_chat_counts_tokens_per_call_and_feeds_the_cache(tmp_path):
    from apps_bench.data import DEMO_PROBLEMS
    from apps_bench.models import open_endpoint
    from apps_bench.optimizers.cache import RolloutCache
    from apps_bench.optimizers.chat import EndpointChat
    from apps_bench.optimizers.proposals import CachedChat
    from apps_bench.optimizers.protocol import Budget

    cfg = compose_cell("allow_any_cell=true", "model=gold")
    with open_endpoint(cfg.model, DEMO_PROBLEMS) as ep:
        chat = EndpointChat(ep, cfg.model)
        msgs = [{"role": "user", "content": "Rewrite <current_prompt>\nbe brief\n</current_prompt>"}]
        r1 = chat(msgs, 1)
        assert r1.text.startswith("gold:") and r1.tokens > 0
        assert chat.usage.model_calls == 1 and chat.usage.total_tokens == r1.tokens
        budget = Budget(max_optimizer_tokens=10_000)
        cached = CachedChat(chat, RolloutCache(tmp_path / "c.sqlite"), {"id": "gold"}, budget)
        a = cached(msgs, 2)
        b = cached(msgs, 2)
        assert a == b and chat.usage.model_calls == 2  # the repeat came from the cache
        assert budget.optimizer_tokens == a.tokens and budget.optimizer_calls == 1
        chat.close()
