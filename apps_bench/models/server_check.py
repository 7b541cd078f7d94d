"""The server check: what a model server does with the requests each framework really sends.

A topology comparison means something only if every runner's agents get their tools, their
token cap and their stop words. Servers differ in ways that fail silently (a chat template that
leaves `tools` out of the prompt; llama-cpp-python doing so when a request names no `tool_choice`,
which is why the wire always names one, wire.py; vLLM with the wrong
`--tool-call-parser` returns a tool call as plain text), so this module sends each framework's
own requests, through the project's client stack (`ModelClients`: the same SDK objects, the same
metered transport), and reports one `Finding` per framework and item, each failure with the fix.

The *quick* part (`quick_findings`: a request offering a tool as the framework's runners send
it, and one without tools to see whether the tools reached the prompt) is what a cell runs at
its start (`cell_check`), cached per
endpoint, model and server identity. The full check (`full_findings`) adds the token cap, `stop`,
usage (streamed and not), thinking, a context overflow and the concurrency sweep.
`python -m apps_bench.check` prints it (apps_bench/check.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from apps_bench.config.schema import ModelConfig, ServerCheckConfig, as_plain, typed
from apps_bench.data.demo import DEMO_PROBLEMS
from apps_bench.models.client_stack import proxy_for
from apps_bench.models.clients import ModelClients, crewai_stop_words
from apps_bench.models.local import LocalServer
from apps_bench.types import JsonObject, Usage

if TYPE_CHECKING:
    from apps_bench.models.endpoint import Endpoint

OK, FAIL, WARN, NA = "ok", "FAIL", "warn", "n/a"

# what a cell's framework did with offered tools (the provenance value `server.tools`)
CALLED, DROPPED, AS_TEXT, NO_CALL, IN_PROMPT, NOT_CHECKED = (
    "called",
    "dropped",
    "as_text",
    "no_call",
    "prompt_text",
    "not_checked",
)

TOOL: JsonObject = {
    "type": "function",
    "function": {
        "name": "python_exec",
        "description": "Run a Python 3 program and return its output.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}
ASK_TOOL = "Use the python_exec tool to run print(2+2). Call the tool now."
LONG = "Count from 1 to 500, one number per line, and say nothing else."
REACT_STEP = (
    "Copy this text exactly, then stop:\nThought: I should run the code.\nAction: python_exec\n"
    'Action Input: {"code": "print(1)"}\nObservation: 1\nThought: I now know the final answer.\nFinal Answer: print(1)'
)
TOOLS_ITEM = 'tools, tool_choice "auto"'  # every framework's tool request, as the wire sends it (wire.prepare_request)
TEXT_CALL_MARKS = ("<tool_call>", "<function=", '"name": "python_exec"', "<|tool_call|>", "[TOOL_CALLS]")


@dataclass
class Finding:
    """One line of the check's table."""

    framework: str  # a framework, or "server" for what does not depend on the request's shape
    item: str
    status: str  # ok | FAIL | warn | n/a
    detail: str
    fix: str = ""


@dataclass
class Sent:
    """What came back for one request: the tool calls, the text, the call's metered usage, or the error."""

    tools: list[str] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = ""
    error: str = ""


# ----------------------------------------------------------------------------- the server


@dataclass(frozen=True)
class Server:
    """Which server this is (its kind decides the fixes a failure names) and its identity for the cache."""

    kind: str  # gold | llama.cpp | vllm | openai-compatible
    identity: JsonObject
    context_len: int = 0  # tokens, when the server says (vLLM's max_model_len) or the config does (local n_ctx)

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def describe_server(endpoint: Endpoint, model_cfg: ModelConfig) -> Server:
    """The server behind `endpoint`: its kind and an identity that changes when it is restarted
    differently (a local server: the GGUF, chat format and llama-cpp-python; a remote one: its
    model listing and version, under its URL)."""
    provider = endpoint.provider
    if provider == "gold":
        return Server(
            "gold", {"provider": "gold", "model_id": endpoint.model_id, "code": _digest_of("gold.py", "gold_policy.py")}
        )
    if provider == "local" and isinstance(endpoint.server, LocalServer):  # one this project started
        return local_server_identity(endpoint.server, endpoint.model_id)
    listing, version = _remote_listing(endpoint)
    entry = next((m for m in listing if m.get("id") == endpoint.model_id), {})
    owners = {str(m.get("owned_by", "")).lower() for m in listing}
    kind = (
        "gold"
        if "apps-bench-gold" in owners
        else "vllm"
        if "vllm" in owners or version
        else "llama.cpp"
        if "llamacpp" in owners
        else "openai-compatible"
    )
    stable = {k: v for k, v in entry.items() if k not in ("created", "permission")}
    return Server(
        kind,
        {"provider": "openai", "base_url": endpoint.base_url, "model": stable, "version": version},
        context_len=int(entry.get("max_model_len") or 0),
    )


def local_server_identity(server: LocalServer, model_id: str) -> Server:
    """A `local.LocalServer`'s identity, known before it starts (what it serves, and how)."""
    path = Path(str(server.model_path))
    stat = path.stat()
    return Server(
        "llama.cpp",
        {
            "provider": "local",
            "model_id": model_id,
            "gguf": str(path),
            "size": stat.st_size,
            "mtime": int(stat.st_mtime),
            "chat_format": server.chat_format,
            "n_ctx": server.n_ctx,
            "llama_cpp": _version("llama_cpp_python"),
            "code": _digest_of("local_server.py"),
        },
        context_len=int(server.n_ctx),
    )


def _digest_of(*names: str) -> str:
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in names:
        h.update((here / name).read_bytes())
    return h.hexdigest()[:12]


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return ""


def _remote_listing(endpoint: Endpoint) -> tuple[list[JsonObject], str]:
    """GET /v1/models (the entries) and vLLM's GET /version ("" elsewhere)."""
    import httpx

    headers = {"Authorization": f"Bearer {endpoint.api_key}"}
    root = endpoint.base_url[: -len("/v1")] if endpoint.base_url.endswith("/v1") else endpoint.base_url
    with httpx.Client(timeout=5.0, trust_env=False, proxy=proxy_for(endpoint.base_url)) as client:
        try:
            data = client.get(f"{endpoint.base_url}/models", headers=headers).json().get("data") or []
        except (httpx.HTTPError, ValueError, AttributeError):
            data = []
        try:
            r = client.get(f"{root}/version", headers=headers)
            version = str(r.json().get("version") or "") if r.status_code == 200 else ""
        except (httpx.HTTPError, ValueError, AttributeError):
            version = ""
    return [m for m in data if isinstance(m, dict)], version


# ----------------------------------------------------------------------------- one request per framework


def _clients(
    endpoint: Endpoint, model_cfg: ModelConfig, usage: Usage, *, max_tokens: int, temperature: float | None
) -> ModelClients:
    """ModelClients for the check: the model's own settings (its retries of 429/5xx too), with the token cap
    (and the temperature, when given) overridden, and no client-side slots (the sweep measures what the
    server runs at once)."""
    cfg = replace(typed(ModelConfig, model_cfg), max_concurrency=0, retry_timeouts=False, max_tokens=max_tokens)
    return ModelClients(endpoint, cfg if temperature is None else replace(cfg, temperature=temperature), usage)


async def send(
    framework: str,
    endpoint: Endpoint,
    model_cfg: ModelConfig,
    text: str,
    *,
    max_tokens: int,
    tools: bool = False,
    tool_choice: str | None = None,
    stream: bool = False,
    temperature: float | None = None,
) -> Sent:
    """One request as `framework`'s runners send it (their client, their defaults), `tool_choice`
    added only when given; what came back, with the usage the metered transport counted."""
    usage = Usage()
    mc = _clients(endpoint, model_cfg, usage, max_tokens=max_tokens, temperature=temperature)
    out = Sent()
    try:
        out.tools, out.text = await _ask(framework, mc, text, tools, tool_choice, stream)
    except ImportError:
        raise  # a framework not installed (MissingFrameworkError names the pip extra): not the server's answer
    except Exception as exc:  # noqa: BLE001 - what the server answered is the finding
        out.error = f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        await mc.aclose()
    if usage.calls:
        call = usage.calls[-1]
        out.prompt_tokens, out.completion_tokens = int(call["prompt_tokens"]), int(call["completion_tokens"])
        out.finish_reason = str(call["finish_reason"])
    return out


async def _ask(
    framework: str, mc: ModelClients, text: str, tools: bool, choice: str | None, stream: bool
) -> tuple[list[str], str]:
    messages = [{"role": "user", "content": text}]
    if framework == "langgraph":
        chat = mc.langchain_chat(0)
        if tools:
            chat = chat.bind_tools([TOOL], tool_choice=choice) if choice else chat.bind_tools([TOOL])
        if stream:
            chunks = [c async for c in chat.astream(messages)]
            ai = chunks[0]
            for c in chunks[1:]:
                ai = ai + c
        else:
            ai = await chat.ainvoke(messages)
        names = [c["name"] for c in [*ai.tool_calls, *getattr(ai, "invalid_tool_calls", [])]]
        return names, str(ai.content or "")
    if framework == "autogen":
        from autogen_core.models import UserMessage
        from autogen_core.tools import ToolSchema

        client = mc.autogen_client(0)
        try:
            schema = (
                [
                    ToolSchema(
                        name="python_exec", description=TOOL["function"]["description"], parameters=TOOL["function"]["parameters"]
                    )
                ]
                if tools
                else []
            )
            create_args = {"tool_choice": choice} if (tools and choice) else {}
            with warnings.catch_warnings():  # a call cut by the check's small cap: AutoGen warns, the finding says it
                warnings.filterwarnings("ignore", message="Finish reason mismatch")
                res = await client.create([UserMessage(content=text, source="user")], tools=schema, extra_create_args=create_args)
        finally:
            await client.close()
        if isinstance(res.content, list):
            return [f.name for f in res.content], ""
        return [], str(res.content)
    if framework == "crewai":
        reply = await asyncio.to_thread(mc.crewai_llm(0).call, messages)
        return [], str(reply or "")
    client = mc.async_openai()
    try:
        extra: JsonObject = {"tools": [TOOL]} if tools else {}
        if tools and choice:
            extra["tool_choice"] = choice
        if stream:
            parts: list[str] = []
            called: list[str] = []
            async for chunk in await client.chat.completions.create(
                model=mc.model_id, messages=messages, stream=True, **extra, **mc.request_params(0)
            ):
                for choice_ in chunk.choices or ():
                    parts.append(choice_.delta.content or "")
                    called += [t.function.name for t in choice_.delta.tool_calls or [] if t.function and t.function.name]
            return called, "".join(parts)
        r = await client.chat.completions.create(model=mc.model_id, messages=messages, **extra, **mc.request_params(0))
    finally:
        await client.close()
    msg = r.choices[0].message
    return [t.function.name for t in msg.tool_calls or []], msg.content or ""


# ----------------------------------------------------------------------------- what to change


def tool_fix(server: Server, verdict: str) -> str:
    """What to change when offered tools do not come back as a structured call."""
    if server.kind == "vllm":
        if verdict == AS_TEXT:
            return (
                "tool calls come back as text: start vLLM with `--enable-auto-tool-choice --tool-call-parser "
                "qwen3_coder` for Qwen3.5 (launchers/serve_vllm.sh does), the parser matching the model's call format"
            )
        return "start vLLM with `--enable-auto-tool-choice --tool-call-parser <the model's parser>` (launchers/serve_vllm.sh)"
    if server.kind == "llama.cpp":
        return (
            "the server's chat template drops `tools`: start llama-cpp-python with a tool-calling chat format "
            "(model.local.chat_format=chatml-function-calling)"
        )
    if verdict == AS_TEXT:
        return "tool calls come back as text: the server needs a tool-call parser for this model"
    return (
        "the server or its chat template ignores `tools`: enable tool calling on the server (e.g. vLLM --enable-auto-tool-choice)"
    )


# ----------------------------------------------------------------------------- the quick part


def _tool_verdict(sent: Sent, plain: Sent | None) -> tuple[str, str]:
    """(verdict, detail) of one tool-offering request; `plain`: the same request without tools."""
    if sent.error:
        return "error", sent.error
    if sent.tools:
        return CALLED, f"structured call {sent.tools[0]} ({sent.completion_tokens} tokens)"
    if any(mark in sent.text for mark in TEXT_CALL_MARKS):
        return AS_TEXT, f"the call came back as text: {sent.text[:80]!r}"
    if plain is not None and not plain.error and plain.prompt_tokens and plain.prompt_tokens >= sent.prompt_tokens:
        return DROPPED, (
            f"no call, and the tools never reached the prompt ({sent.prompt_tokens} prompt tokens with "
            f"tools, {plain.prompt_tokens} without)"
        )
    return (
        NO_CALL,
        f"the model answered in text ({sent.prompt_tokens} prompt tokens; the tools reached the prompt): {sent.text[:60]!r}",
    )


def tool_prompt(server: Server) -> str:
    """The request that asks for a tool call. Gold answers only problems it knows (calling
    python_exec first when it is offered), so its prompt carries the first demo problem, which
    the check starts gold with."""
    if server.kind != "gold":
        return ASK_TOOL

    return f"{DEMO_PROBLEMS[0].question}\n\n{ASK_TOOL}"


async def quick_findings(
    endpoint: Endpoint, model_cfg: ModelConfig, server: Server, frameworks: Sequence[str], *, max_tokens: int
) -> list[Finding]:
    """Per framework: offered tools, in the request its runners send (CrewAI: no `tools` field,
    its tools are prompt text). `server.tools` verdicts are read off these findings
    (`tools_verdict`). One request without tools is shared by all frameworks."""
    ask = tool_prompt(server)
    out: list[Finding] = []
    plain: Sent | None = None
    for fw in frameworks:
        if fw == "crewai":
            out.append(Finding(fw, "tools", NA, "CrewAI describes its tools in the prompt text and sends no `tools` field"))
            continue
        if plain is None:
            plain = await send("openai", endpoint, model_cfg, ask, max_tokens=1)
        # the request as the runners send it: the framework's own body, which the wire gives
        # `tool_choice: "auto"` where the framework names none (LangChain, the OpenAI SDK)
        sent = await send(fw, endpoint, model_cfg, ask, max_tokens=max_tokens, tools=True)
        verdict, detail = _tool_verdict(sent, plain)
        status = OK if verdict == CALLED else WARN if verdict == NO_CALL else FAIL
        if status == OK:
            fix = ""
        elif verdict == NO_CALL:
            fix = (
                "the tools reached the model but it answered in text: a model too small to call tools, or a prompt that needs one"
            )
        else:
            fix = tool_fix(server, verdict)
        out.append(Finding(fw, TOOLS_ITEM, status, f"[{verdict}] {detail}", fix))
    return out


def tools_verdict(findings: Sequence[Finding], framework: str) -> str:
    """What the server did with `framework`'s tools as its runners send them."""
    if framework == "crewai":
        return IN_PROMPT
    for f in findings:
        if f.framework == framework and f.item == TOOLS_ITEM:
            return f.detail[1:].split("]", 1)[0]
    return NOT_CHECKED


# ----------------------------------------------------------------------------- the full check


async def full_findings(
    endpoint: Endpoint,
    model_cfg: ModelConfig,
    server: Server,
    frameworks: Sequence[str],
    settings: ServerCheckConfig,
    *,
    in_flight: int,
    team_size: int,
    concurrency: int,
) -> list[Finding]:
    """The quick part, then per framework the token cap, `stop` and usage, then server-level items:
    usage streamed, thinking, a context overflow, and the concurrency sweep."""
    max_tokens = int(settings.max_tokens)
    out = await quick_findings(endpoint, model_cfg, server, frameworks, max_tokens=max_tokens)
    gold = server.kind == "gold"
    for fw in frameworks:
        sent = await send(fw, endpoint, model_cfg, LONG, max_tokens=8, temperature=0.0)
        out.append(_cap_finding(fw, sent, gold))
        if not sent.error:
            reported = sent.prompt_tokens > 0 and sent.completion_tokens > 0
            out.append(
                Finding(
                    fw,
                    "usage",
                    OK if reported else FAIL,
                    f"{sent.prompt_tokens} prompt + {sent.completion_tokens} completion tokens",
                    "" if reported else "the server reports no usage: tokens per cell would read 0",
                )
            )
        if fw == "crewai":
            out.append(await _stop_finding(endpoint, model_cfg, gold))
        else:
            out.append(Finding(fw, "stop", NA, "this framework's runners send no `stop`"))
    out.append(await _stream_usage(endpoint, model_cfg))
    out.append(await _thinking(endpoint, model_cfg, gold))
    out.append(await _overflow(endpoint, model_cfg, server))
    out.append(
        await _sweep(endpoint, model_cfg, settings, gold=gold, in_flight=in_flight, team_size=team_size, concurrency=concurrency)
    )
    return out


def _cap_finding(fw: str, sent: Sent, gold: bool, cap: int = 8) -> Finding:
    if sent.error:
        return Finding(fw, "token cap", FAIL, sent.error, "the server refused a plain request: see its log")
    if sent.completion_tokens <= cap + 3 and sent.finish_reason == "length":  # +3: a UTF-8 character finished
        return Finding(fw, "token cap", OK, f"cap {cap}: {sent.completion_tokens} tokens, finish_reason length")
    if gold:
        return Finding(fw, "token cap", NA, f"gold answers with fixed text ({sent.completion_tokens} tokens): not an LLM")
    if sent.completion_tokens <= cap:
        return Finding(
            fw, "token cap", WARN, f"not tested: the reply ended on its own at {sent.completion_tokens} tokens (cap {cap})"
        )
    return Finding(
        fw,
        "token cap",
        FAIL,
        f"cap {cap}: {sent.completion_tokens} tokens, finish_reason {sent.finish_reason}",
        "the server ignores the request's token cap: check how it reads max_tokens (wire.py sends it)",
    )


async def _stop_finding(endpoint: Endpoint, model_cfg: ModelConfig, gold: bool) -> Finding:
    words = crewai_stop_words()
    sent = await send("crewai", endpoint, model_cfg, REACT_STEP, max_tokens=64, temperature=0.0)
    if sent.error:
        return Finding("crewai", "stop", FAIL, sent.error, "the server refused a request with `stop`")
    if gold:
        return Finding("crewai", "stop", NA, "gold answers with fixed text: not an LLM")
    # CrewAI cuts the text at its stop word itself; the server honoured `stop` if it ended there
    if sent.finish_reason == "stop" and "Observation" not in sent.text:
        return Finding("crewai", "stop", OK, f"{words!r} sent; the reply ended there ({sent.completion_tokens} tokens)")
    if sent.finish_reason == "length":
        return Finding("crewai", "stop", WARN, f"the reply hit the cap before the stop word ({sent.completion_tokens} tokens)")
    return Finding(
        "crewai",
        "stop",
        FAIL,
        f"{sent.completion_tokens} tokens, finish_reason {sent.finish_reason}",
        "the server writes past `stop`: CrewAI's tokens and time would be inflated against its siblings",
    )


async def _stream_usage(endpoint: Endpoint, model_cfg: ModelConfig) -> Finding:
    sent = await send("openai", endpoint, model_cfg, LONG, max_tokens=8, stream=True)
    if sent.error:
        return Finding("server", "usage, streamed", FAIL, sent.error, "the server refused a streamed request")
    if sent.completion_tokens > 0:
        return Finding(
            "server", "usage, streamed", OK, f"{sent.prompt_tokens} prompt + {sent.completion_tokens} completion tokens"
        )
    # no runner streams its model calls today (AutoGen's run_stream streams messages, not tokens)
    return Finding(
        "server",
        "usage, streamed",
        WARN,
        "no usage in the stream (stream_options.include_usage ignored)",
        "no runner streams its model calls today; one that did would count 0 tokens on this server",
    )


async def _thinking(endpoint: Endpoint, model_cfg: ModelConfig, gold: bool) -> Finding:
    extra = as_plain(model_cfg.extra_body) or {}
    on = bool((extra.get("chat_template_kwargs") or {}).get("enable_thinking"))
    if not on:
        return Finding("server", "thinking", NA, "thinking is off in this model's settings")
    sent = await send("openai", endpoint, model_cfg, "What is 17 * 23? Answer with the number.", max_tokens=256)
    if sent.error:
        return Finding("server", "thinking", FAIL, sent.error, "")
    if "<think>" in sent.text or "</think>" in sent.text or sent.text.lstrip().startswith("Thinking Process"):
        return Finding(
            "server",
            "thinking",
            FAIL,
            f"thinking text in content: {sent.text[:60]!r}",
            "start vLLM with `--reasoning-parser qwen3` (launchers/serve_vllm.sh qwen_thinking does)",
        )
    return Finding("server", "thinking", OK, "no thinking text in content")


async def _overflow(endpoint: Endpoint, model_cfg: ModelConfig, server: Server) -> Finding:
    if server.kind == "gold":
        return Finding("server", "context overflow", NA, "gold has no context limit")
    if not server.context_len:
        return Finding("server", "context overflow", NA, "the server does not say its context length")
    text = "hello " * (server.context_len + 64)
    sent = await send("openai", endpoint, model_cfg, text, max_tokens=1)
    if sent.error:
        return Finding(
            "server", "context overflow", OK, f"a clear error (the cell records an error, not a wrong answer): {sent.error[:120]}"
        )
    return Finding(
        "server",
        "context overflow",
        WARN,
        f"answered ({sent.prompt_tokens} prompt tokens): the prompt was cut silently",
        "a team past the context reads a truncated conversation: lower max_tokens or the topology's turns",
    )


async def _sweep(
    endpoint: Endpoint,
    model_cfg: ModelConfig,
    settings: ServerCheckConfig,
    *,
    gold: bool,
    in_flight: int,
    team_size: int,
    concurrency: int,
) -> Finding:
    """Throughput at 1, 2, 4, ... requests at once until it stops rising, against what the cell puts in flight."""
    if gold:
        return Finding("server", "concurrency", NA, "gold answers at once, whatever the load: no throughput to measure")
    levels = [int(n) for n in settings.concurrency_levels]
    min_gain = float(settings.min_gain)
    tokens = int(settings.max_tokens)
    seen: list[tuple[int, float]] = []
    for n in levels:
        t0 = time.perf_counter()
        sents = await asyncio.gather(*(send("openai", endpoint, model_cfg, LONG, max_tokens=tokens) for _ in range(n)))
        wall = time.perf_counter() - t0
        errors = [s.error for s in sents if s.error]
        if errors:
            return Finding(
                "server",
                "concurrency",
                FAIL,
                f"{len(errors)} of {n} requests at once failed: {errors[0][:120]}",
                "the server fails under load: lower concurrency or model.max_concurrency",
            )
        rate = sum(s.completion_tokens for s in sents) / wall if wall > 0 else 0.0
        seen.append((n, rate))
        if len(seen) > 1 and rate < seen[-2][1] * (1 + min_gain):
            break
    rising = len(seen) == 1 or seen[-1][1] >= seen[-2][1] * (1 + min_gain)  # out of levels, still rising
    best_n = seen[-1][0] if rising else seen[-2][0]
    curve = ", ".join(f"{n}: {r:.1f}" for n, r in seen)
    cap = int(model_cfg.max_concurrency)
    asked = concurrency * team_size
    limit = f"still rising at {best_n}" if rising else f"stops rising after {best_n}"
    detail = (
        f"tokens/s at N requests at once: {curve} ({limit}). The cell: concurrency {concurrency} x team {team_size} "
        f"= {asked} requests, {in_flight} problems in flight, model.max_concurrency {cap or 'unset'}"
    )
    if asked <= best_n or rising or (0 < cap <= max(best_n, 1) * 2):
        return Finding("server", "concurrency", OK, detail)
    return Finding(
        "server",
        "concurrency",
        WARN,
        detail,
        f"requests beyond ~{best_n} wait in the server's queue, and queue time counts against request_timeout_s "
        f"and the problem's time cap: set model.max_concurrency={best_n} (the rest wait client-side) or lower concurrency",
    )


# ----------------------------------------------------------------------------- the cache


def cache_key(provider: str, model_id: str, server: Server, framework: str) -> str:
    """A cell check's cache key: the server's identity, and the code that shapes the requests and
    reads the replies (a verdict is about the requests one version sent: a wire that now names
    `tool_choice` must not read back a "dropped" found without it)."""
    return f"{provider}|{model_id}|{server.key}|{_digest_of('wire.py', 'server_check.py')}|{framework}"


def cache_read(path: Path, key: str, max_age_s: float, provider: str) -> JsonObject | None:
    """A cached cell check, unless older than `max_age_s` (a remote server may have been restarted
    with other flags under the same identity; a server this project starts is its identity)."""
    try:
        entry = json.loads(path.read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(entry, dict):
        return None
    if provider == "openai" and time.time() - float(entry.get("checked_at", 0)) > max_age_s:
        return None
    return entry


def cache_write(path: Path, key: str, entry: JsonObject) -> None:
    """Add `entry` to the cache file (written whole, replaced atomically)."""
    import os
    import tempfile

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        data = data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        data = {}
    data[key] = dict(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".server-checks-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def as_json(findings: Sequence[Finding]) -> list[JsonObject]:
    return [asdict(f) for f in findings]
