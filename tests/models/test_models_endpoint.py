"""Endpoint resolution: model configs compose, gold starts and stops, bad endpoints fail fast and say what to set."""

from __future__ import annotations

import logging
import re
import socket
from pathlib import Path

import httpx
import pytest
from conftest import model_preset
from omegaconf import OmegaConf

from apps_bench.models import ModelEndpointError, open_endpoint
from apps_bench.models.gold import GoldServer
from apps_bench.models.gold_policy import GoldProblem

CONF = Path(__file__).resolve().parents[2] / "apps_bench" / "conf" / "model"
PROBLEM = GoldProblem(
    "test/1", "Print the sum of two integers a and b.", "a, b = map(int, input().split())\nprint(a + b)\n", "1 2\n"
)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket closes


@pytest.mark.parametrize("name", ["gold", "qwen", "qwen_122b", "qwen_thinking", "openai"])
def test_model_configs_match_the_schema(name, monkeypatch):
    for var in ("MODEL_ID", "VLLM_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    cfg = model_preset(name)
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves, every type checks
    assert 0 <= cfg.temperature <= 2 and 0 < cfg.top_p <= 1
    assert cfg.max_retries >= 1 and cfg.request_timeout_s > 0
    assert [k for k in cfg if "key" in k] == ["api_key_env"]  # the key itself never enters config
    assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", cfg.api_key_env)  # the name of an env var


def test_every_model_yaml_sets_what_the_endpoint_and_clients_read():
    """No code default behind a model setting: every conf/model/*.yaml sets each key the endpoint,
    the clients and the tool warnings read (a YAML without one fails to type, naming it)."""
    read = (
        "name",
        "provider",
        "model_id",
        "base_url",
        "api_key_env",
        "check_endpoint",
        "request_timeout_s",
        "max_concurrency",
        "retry_timeouts",
        "tools_supported",
        "max_retries",
        "retry_backoff_s",
        "temperature",
        "top_p",
        "max_tokens",
        "extra_body",
    )
    own = {
        "gold": ("latency_ms", "wrong_fraction", "fault_fraction"),
        "local": (
            "gguf_package",
            "gguf_file",
            "gguf_path",
            "gguf_requantize",
            "chat_format",
            "n_ctx",
            "n_threads",
            "start_timeout_s",
            "prompt_cache_mb",
        ),
    }
    for path in sorted(CONF.glob("*.yaml")):  # each preset as composed (a key may come from conf/model/shared/)
        cfg = model_preset(path.stem)
        assert sorted(k for k in read if k not in cfg or OmegaConf.is_missing(cfg, k)) == [], path.name
        for provider, keys in own.items():  # a provider's own settings: all of them in its preset, none elsewhere
            section = cfg[provider]
            if cfg.provider == provider:
                assert sorted(k for k in keys if OmegaConf.is_missing(section, k)) == [], path.name
            else:
                assert section is None, path.name


def test_qwen_configs_read_endpoint_and_model_from_env(monkeypatch):
    monkeypatch.delenv("MODEL_ID", raising=False)
    monkeypatch.delenv("VLLM_BASE_URL", raising=False)
    q = model_preset("qwen")
    assert (q.model_id, q.base_url) == ("Qwen/Qwen3.5-9B", "http://127.0.0.1:8000/v1")
    assert q.extra_body.chat_template_kwargs.enable_thinking is False
    assert model_preset("qwen_122b").model_id == "Qwen/Qwen3.5-122B-A10B"
    assert model_preset("qwen_thinking").extra_body.chat_template_kwargs.enable_thinking is True
    monkeypatch.setenv("MODEL_ID", "my-model")
    monkeypatch.setenv("VLLM_BASE_URL", "http://gpu7:8000/v1")
    q = model_preset("qwen")
    assert (q.model_id, q.base_url) == ("my-model", "http://gpu7:8000/v1")
    assert model_preset("qwen_122b").model_id == "my-model" and model_preset("qwen_thinking").model_id == "my-model"


def test_gold_endpoint_starts_on_loopback_and_stops():
    with open_endpoint(model_preset("gold"), [PROBLEM]) as ep:
        assert ep.provider == "gold" and ep.model_id == "gold" and ep.base_url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{ep.base_url}/models", trust_env=False).json()["data"][0]["id"] == "gold"
        assert "api_key" not in repr(ep)
        url = ep.base_url
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models", trust_env=False, timeout=2)


def test_unreachable_endpoint_fails_fast_naming_what_to_set():
    cfg = model_preset("qwen", base_url=f"http://127.0.0.1:{closed_port()}/v1")
    with pytest.raises(ModelEndpointError) as err:
        with open_endpoint(cfg, []):
            pass
    msg = str(err.value)
    for needle in ("cannot reach", "VLLM_BASE_URL", "MODEL_ID", "model.base_url=", "OPENAI_API_KEY"):
        assert needle in msg


def test_missing_base_url_says_what_to_set(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ModelEndpointError, match="OPENAI_BASE_URL"):
        with open_endpoint(model_preset("openai", model_id="m"), []):
            pass


def test_unknown_model_id_lists_the_served_ids():
    with GoldServer([PROBLEM]) as srv:
        cfg = model_preset("openai", base_url=srv.base_url, model_id="Qwen/Qwen3.5-9B")
        with pytest.raises(ModelEndpointError) as err:
            with open_endpoint(cfg, []):
                pass
        assert "'Qwen/Qwen3.5-9B' is not served" in str(err.value) and "it serves: gold" in str(err.value)
        assert "MODEL_ID" in str(err.value)


def test_openai_provider_against_a_running_gold_server(monkeypatch, caplog):
    with GoldServer([PROBLEM]) as srv:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
        cfg = model_preset("openai", base_url=srv.base_url.removesuffix("/v1"), model_id="gold")  # no /v1: found anyway
        with open_endpoint(cfg, []) as ep:
            assert (ep.base_url, ep.model_id, ep.api_key, ep.served_models) == (srv.base_url, "gold", "sk-test-123", ("gold",))
            assert "sk-test-123" not in repr(ep)
        monkeypatch.delenv("OPENAI_API_KEY")
        with caplog.at_level(logging.WARNING):
            with open_endpoint(cfg, []) as ep:
                assert ep.api_key == "EMPTY"  # loopback: placeholder key, and it says so
        assert "OPENAI_API_KEY is not set" in caplog.text


def test_missing_key_for_a_remote_endpoint_is_an_error(monkeypatch):
    monkeypatch.delenv("MY_KEY", raising=False)
    cfg = model_preset(
        "openai", base_url="http://models.example.org/v1", model_id="m", api_key_env="MY_KEY", check_endpoint=False
    )
    with pytest.raises(ModelEndpointError, match="MY_KEY"):
        with open_endpoint(cfg, []):
            pass


def test_gold_options_reach_the_server():
    cfg = model_preset(
        "gold", **{"gold.latency_ms": 5, "gold.wrong_fraction": 0.25, "gold.fault_fraction": 0.1}, request_timeout_s=2
    )
    with open_endpoint(cfg, [PROBLEM]) as ep:
        srv = ep.server
        assert (srv.latency_s, srv.wrong_fraction, srv.fault_fraction) == (0.005, 0.25, 0.1)
        assert srv.stall_s > 2  # an injected timeout outlasts the client's request timeout


def test_gold_with_base_url_uses_a_running_gold_server():
    with GoldServer([PROBLEM]) as srv:
        with open_endpoint(model_preset("gold", base_url=srv.base_url), []) as ep:
            assert ep.base_url == srv.base_url and ep.model_id == "gold" and ep.server is None


def test_the_thinking_preset_is_outside_the_study_grid_until_asked_for():
    """qwen_thinking needs run settings of its own (fewer problems at once, longer time caps):
    a sweep of the study grid never picks it up by default."""
    from conftest import compose_cell

    from apps_bench.cell.key import CellRefused, guard

    with pytest.raises(CellRefused, match="qwen_thinking"):
        guard(compose_cell("model=qwen_thinking", "dataset=apps"))
    cell = guard(compose_cell("model=qwen_thinking", "dataset=apps", "allow_any_cell=true", "concurrency=16"))
    assert cell.axes()["model"] == "qwen_thinking"
