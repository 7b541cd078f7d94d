"""Every framework's model calls counted exactly once at the HTTP transport, retried alike.

Real clients (openai AsyncOpenAI, LangChain ChatOpenAI in a LangGraph ReAct loop,
AutoGen, CrewAI) against the gold server over real loopback HTTP. "Exactly once"
means: our per-problem Usage equals the usage the server reported, call for call.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from conftest import model_preset
from omegaconf import OmegaConf

from apps_bench.config.schema import ModelConfig, typed
from apps_bench.models import Endpoint, ModelClients, open_endpoint
from apps_bench.models.clients import MissingFrameworkError
from apps_bench.models.gold import GoldServer, load_rows
from apps_bench.models.gold_policy import GoldProblem
from apps_bench.types import Usage

HEADERS = {"X-Apps-Bench-Run": "run-7"}


@pytest.fixture(scope="module")
def rows(apps_data_dir: Path) -> list[GoldProblem]:
    return load_rows(str(apps_data_dir / "train_mini150.jsonl"), "train")


@pytest.fixture()
def gold(rows):
    cfg = model_preset(extra_body={"repetition_penalty": 1.05, "chat_template_kwargs": {"enable_thinking": False}})
    with open_endpoint(cfg, rows) as ep:
        yield ep, cfg


def stdin_problem(rows) -> GoldProblem:
    return next(r for r in rows if r.stdin and r.solution and r.solution.count("\n") > 3)


def prompt(p: GoldProblem) -> str:
    return f"QUESTION:\n{p.question}\nUse Standard Input format.\nANSWER:\n"


def assert_counted_once(usage: Usage, server: GoldServer, calls: int) -> None:
    st = server.stats
    assert st.replies == calls
    assert (usage.model_calls, usage.prompt_tokens, usage.completion_tokens, usage.failed_calls) == (
        calls,
        st.prompt_tokens,
        st.completion_tokens,
        0,
    )


# ------------------------------------------------------------------ request parameters


def test_request_params_carry_sampling_seed_and_extra_body(gold):
    ep, cfg = gold
    params = ModelClients(ep, cfg, Usage()).request_params(seed=11)
    assert params == {
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 4096,
        "seed": 11,
        "extra_body": {"repetition_penalty": 1.05, "chat_template_kwargs": {"enable_thinking": False}},
    }
    assert type(params["extra_body"]) is dict  # plain, not an OmegaConf node


# ------------------------------------------------------------------ OpenAI SDK


def test_a_client_built_for_a_role_records_it_on_each_call_and_only_then(gold, rows):
    """Streamed or not, sync or async: each call entry names the role its client was built for;
    a client built for no role (e.g. an optimizer's) writes the entries as before, without one."""
    ep, cfg = gold
    usage = Usage()
    mc = ModelClients(ep, cfg, usage)
    msgs = [{"role": "user", "content": prompt(rows[0])}]

    async def run() -> None:
        coder, plain = mc.async_openai(role="coder"), mc.async_openai()
        await coder.chat.completions.create(model=mc.model_id, messages=msgs, **mc.request_params(1))
        stream = await coder.chat.completions.create(model=mc.model_id, messages=msgs, stream=True, **mc.request_params(2))
        async for _ in stream:
            pass
        await plain.chat.completions.create(model=mc.model_id, messages=msgs, **mc.request_params(3))
        await coder.close()
        await plain.close()

    asyncio.run(run())
    mc.openai(role="tester").chat.completions.create(model=mc.model_id, messages=msgs, **mc.request_params(4))
    assert [c.get("role") for c in usage.calls] == ["coder", "coder", None, "tester"]
    assert set(usage.calls[2]) == {"prompt_tokens", "completion_tokens", "finish_reason", "retries", "tools"}
    assert_counted_once(usage, ep.server, 4)


@pytest.mark.parametrize("flavour", ["httpx2", "httpx"])
def test_async_openai_streaming_and_not_counted_once(gold, rows, flavour):
    ep, cfg = gold
    usage = Usage()
    mc = ModelClients(ep, cfg, usage, headers=HEADERS, flavour=flavour)
    p = rows[0]

    async def run() -> tuple[str, str]:
        client = mc.async_openai()
        r = await client.chat.completions.create(
            model=mc.model_id, messages=[{"role": "user", "content": prompt(p)}], **mc.request_params(5)
        )
        stream = await client.chat.completions.create(
            model=mc.model_id, messages=[{"role": "user", "content": prompt(p)}], stream=True, **mc.request_params(6)
        )
        text = ""
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        await client.close()
        return r.choices[0].message.content, text

    plain, streamed = asyncio.run(run())
    assert plain == streamed and p.solution.strip() in plain
    assert_counted_once(usage, ep.server, 2)
    st = ep.server.stats
    assert st.seeds == [5, 6]
    assert all(h == {"x-apps-bench-run": "run-7"} for h in st.headers)
    last = st.last_requests[-1]
    assert last["repetition_penalty"] == 1.05 and last["chat_template_kwargs"] == {"enable_thinking": False}
    assert last["temperature"] == 0.2 and last["top_p"] == 0.9 and last["max_tokens"] == 4096
    assert last["stream_options"] == {"include_usage": True}  # the transport asks for the usage chunk


# ------------------------------------------------------------------ LangChain / LangGraph


def test_langgraph_react_tool_round_trip_counted_once(gold, rows):
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    ep, cfg = gold
    usage = Usage()
    mc = ModelClients(ep, cfg, usage, headers=HEADERS)
    p = stdin_problem(rows)
    ran: list[tuple[str, str]] = []

    @tool
    def python_exec(code: str, stdin: str = "") -> str:
        """Run Python code with the given standard input and return its output."""
        ran.append((code, stdin))
        return "exit code 0\nstdout:\n(ok)"

    agent = create_react_agent(mc.langchain_chat(seed=3), [python_exec])
    out = agent.invoke({"messages": [("user", prompt(p))]}, config={"recursion_limit": 8})
    assert ran == [(p.solution, p.stdin)]
    assert p.solution.strip() in out["messages"][-1].content
    assert_counted_once(usage, ep.server, 2)

    async def arun():  # the async side has its own HTTP client: it must be metered too
        return await agent.ainvoke({"messages": [("user", prompt(p))]}, config={"recursion_limit": 8})

    asyncio.run(arun())
    assert len(ran) == 2
    assert_counted_once(usage, ep.server, 4)
    st = ep.server.stats
    assert st.seeds == [3, 3, 3, 3] and st.headers[-1] == {"x-apps-bench-run": "run-7"}
    assert st.last_requests[-1]["chat_template_kwargs"] == {"enable_thinking": False}


def test_langchain_streaming_counted_once(gold, rows):
    ep, cfg = gold
    usage = Usage()
    llm = ModelClients(ep, cfg, usage).langchain_chat(seed=1)
    text = "".join(chunk.content for chunk in llm.stream(prompt(rows[1])))
    assert rows[1].solution.strip() in text
    assert_counted_once(usage, ep.server, 1)


# ------------------------------------------------------------------ AutoGen


def test_autogen_client_and_selector_counted_once(gold, rows):
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.conditions import MaxMessageTermination
    from autogen_agentchat.teams import SelectorGroupChat
    from autogen_core.models import UserMessage

    ep, cfg = gold
    usage = Usage()
    mc = ModelClients(ep, cfg, usage, headers=HEADERS)
    p = rows[2]

    async def run():
        client = mc.autogen_client(seed=4)
        r = await client.create([UserMessage(content=prompt(p), source="user")])
        last = None
        async for last in client.create_stream([UserMessage(content=prompt(p), source="user")]):  # noqa: B007 - the stream's last item is its result
            pass
        coder = AssistantAgent("coder", model_client=mc.autogen_client(seed=8), description="writes code")
        tester = AssistantAgent("tester", model_client=mc.autogen_client(seed=9), description="tests code")
        team = SelectorGroupChat(
            [coder, tester], model_client=mc.autogen_client(seed=0), termination_condition=MaxMessageTermination(3)
        )
        res = await team.run(task=prompt(p))
        return r, last, res

    r, last, res = asyncio.run(run())
    assert p.solution.strip() in r.content and r.content == last.content
    assert r.usage.prompt_tokens > 0
    assert [m.source for m in res.messages] == ["user", "coder", "tester"]  # the selector picked the first listed name
    st = ep.server.stats
    assert st.kinds["select"] == 1
    assert_counted_once(usage, ep.server, 2 + 3)  # create, create_stream, selector, coder, tester
    assert st.seeds[:2] == [4, 4] and st.headers[0] == {"x-apps-bench-run": "run-7"}


# ------------------------------------------------------------------ CrewAI


def test_crewai_llm_and_sequential_crew_counted_once(gold, rows):
    from crewai import Agent, Crew, Process, Task
    from crewai.llms.base_llm import BaseLLM
    from crewai.tools import BaseTool

    ep, cfg = gold
    usage = Usage()
    mc = ModelClients(ep, cfg, usage, headers=HEADERS)
    p = stdin_problem(rows)
    ran: list[str] = []

    class PythonExec(BaseTool):
        name: str = "python_exec"
        description: str = "Run Python code (argument code) with standard input (argument stdin)."

        def _run(self, code: str, stdin: str = "") -> str:
            ran.append(code)
            return "exit code 0"

    llm = mc.crewai_llm(seed=2)
    assert isinstance(llm, BaseLLM) and type(llm).__module__.startswith("crewai.llms.providers.openai")  # native, no litellm
    assert p.solution.strip() in llm.call(prompt(p))
    coder = Agent(
        role="coder",
        goal="solve",
        backstory="writes programs",
        llm=mc.crewai_llm(seed=3),
        tools=[PythonExec()],
        allow_delegation=False,
        verbose=False,
        max_iter=4,
    )
    debugger = Agent(
        role="debugger", goal="fix", backstory="fixes programs", llm=mc.crewai_llm(seed=4), allow_delegation=False, verbose=False
    )
    t1 = Task(description=prompt(p), expected_output="a python program", agent=coder)
    t2 = Task(
        description=prompt(p) + "\nFix the program if needed.", expected_output="a python program", agent=debugger, context=[t1]
    )
    out = Crew(agents=[coder, debugger], tasks=[t1, t2], process=Process.sequential, memory=False, verbose=False).kickoff()
    assert ran == [p.solution]
    assert p.solution.strip() in str(out)
    st = ep.server.stats
    assert st.kinds["crewai_action"] == 1 and st.kinds["crewai_final"] == 2
    assert_counted_once(usage, ep.server, 1 + 3)
    assert st.seeds == [2, 3, 3, 4] and st.headers[-1] == {"x-apps-bench-run": "run-7"}


def test_crewai_requests_carry_the_stop_words_crewai_cuts_replies_at(gold, rows):
    """CrewAI's executor cuts a ReAct reply at its stop words after it arrives; sent as `stop`, the
    server ends the reply there instead of writing on (tokens and time CrewAI then throws away)."""
    from crewai import Agent, Crew, Process, Task
    from crewai.tools import BaseTool

    class PythonExec(BaseTool):
        name: str = "python_exec"
        description: str = "Run Python code (argument code) with standard input (argument stdin)."

        def _run(self, code: str, stdin: str = "") -> str:
            return "exit code 0"

    ep, cfg = gold
    p = stdin_problem(rows)
    coder = Agent(
        role="coder",
        goal="solve",
        backstory="writes programs",
        llm=ModelClients(ep, cfg, Usage()).crewai_llm(seed=3),
        tools=[PythonExec()],
        allow_delegation=False,
        verbose=False,
        max_iter=4,
    )
    task = Task(description=prompt(p), expected_output="a python program", agent=coder)
    Crew(agents=[coder], tasks=[task], process=Process.sequential, memory=False, verbose=False).kickoff()
    st = ep.server.stats
    assert st.kinds["crewai_action"] == 1 and st.replies == 2  # an Action reply, then the final answer
    applied = coder.llm.stop  # what CrewAI's executor cut the replies at (it adds its own during kickoff)
    assert "\nObservation:" in applied
    for request in st.last_requests:
        assert request["stop"] == applied, request.get("stop")
        assert request["chat_template_kwargs"] == {"enable_thinking": False}  # the model's extra_body is kept


# ------------------------------------------------------------------ retries and failures


def faulty(rows, *, kinds, fraction, timeout_s=5.0, retries=4, stall_s=2.0):
    server = GoldServer(rows, fault_fraction=fraction, fault_kinds=kinds, stall_s=stall_s).start()
    cfg = model_preset(max_retries=retries, retry_backoff_s=0.01, request_timeout_s=timeout_s)
    return server, Endpoint(server.base_url, "gold", "x", "gold", ("gold",), server), cfg


def test_faults_are_retried_until_success_async_and_sync(rows):
    server, ep, cfg = faulty(rows, kinds=("http_500", "http_503", "http_429", "malformed"), fraction=0.5, retries=8)
    try:
        usage = Usage()
        mc = ModelClients(ep, cfg, usage)

        async def run():
            client = mc.async_openai()
            outs = []
            for i in range(6):
                r = await client.chat.completions.create(
                    model="gold",
                    messages=[{"role": "user", "content": prompt(rows[i])}],
                    stream=bool(i % 2),
                    **mc.request_params(i),
                )
                if i % 2:
                    outs.append("".join([c.choices[0].delta.content or "" async for c in r if c.choices]))
                else:
                    outs.append(r.choices[0].message.content)
            return outs

        outs = asyncio.run(run())
        assert all(rows[i].solution.strip() in o for i, o in enumerate(outs))
        sync = mc.openai()
        for i in range(6, 10):
            r = sync.chat.completions.create(
                model="gold", messages=[{"role": "user", "content": prompt(rows[i])}], **mc.request_params(i)
            )
            assert rows[i].solution.strip() in r.choices[0].message.content
        st = server.stats
        assert sum(st.faults.values()) >= 3 and set(st.faults) >= {"malformed"} | (set(st.faults) - {"malformed"})
        assert_counted_once(usage, server, 10)  # retried attempts are not extra model calls
        assert st.requests == 10 + sum(st.faults.values())
    finally:
        server.stop()


def test_exhausted_retries_fail_clearly_and_count_failed_calls(rows):
    import openai

    server, ep, cfg = faulty(rows, kinds=("http_503",), fraction=1.0, retries=2)
    try:
        usage = Usage()
        client = ModelClients(ep, cfg, usage).openai()
        with pytest.raises(openai.APIStatusError, match="injected fault"):
            client.chat.completions.create(model="gold", messages=[{"role": "user", "content": prompt(rows[0])}])
        assert (usage.model_calls, usage.failed_calls) == (0, 1)
        assert server.stats.requests == 3  # first attempt + 2 retries
    finally:
        server.stop()


def test_malformed_reply_without_retries_is_a_failed_call(rows):
    server, ep, cfg = faulty(rows, kinds=("malformed",), fraction=1.0, retries=0)
    try:
        usage = Usage()
        mc = ModelClients(ep, cfg, usage)

        async def run():
            await mc.async_openai().chat.completions.create(model="gold", messages=[{"role": "user", "content": prompt(rows[0])}])

        with pytest.raises(Exception):  # noqa: B017 - whichever error the SDK raises for a failed call
            asyncio.run(run())
        assert (usage.model_calls, usage.failed_calls) == (0, 1)
    finally:
        server.stop()


def test_timeouts_are_retried_then_fail_as_timeouts(rows):
    import openai

    server, ep, cfg = faulty(rows, kinds=("timeout",), fraction=1.0, timeout_s=0.3, retries=1, stall_s=1.0)
    try:
        usage = Usage()
        llm = ModelClients(ep, cfg, usage).langchain_chat(seed=0)
        with pytest.raises(openai.APITimeoutError):
            llm.invoke(prompt(rows[0]))
        assert (usage.model_calls, usage.failed_calls) == (0, 1)
        assert server.stats.faults["timeout"] == 2
    finally:
        server.stop()


# ------------------------------------------------------------------ missing frameworks


@pytest.mark.parametrize(
    "method, module, extra",
    [("crewai_llm", "crewai", "crewai"), ("autogen_client", "autogen_ext.models.openai", "autogen")],
)
def test_missing_framework_names_the_pip_extra(gold, monkeypatch, method, module, extra):
    ep, cfg = gold
    monkeypatch.setitem(sys.modules, module, None)  # import now raises ImportError
    with pytest.raises(MissingFrameworkError, match=rf"pip install 'apps-bench\[{extra}\]'"):
        getattr(ModelClients(ep, cfg, Usage()), method)(0)


def test_metering_parses_json_sse_and_rejects_malformed():
    from apps_bench.models.metering import ensure_stream_usage, parse_usage

    assert parse_usage(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4}}') == (True, 3, 4)
    assert parse_usage(b'{"choices": []}') == (True, 0, 0)
    sse = b'data: {"choices": [{"delta": {"content": "a"}}]}\n\ndata: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}\n\ndata: [DONE]\n\n'
    assert parse_usage(sse, "text/event-stream") == (True, 7, 2)
    assert parse_usage(b'data: {"choices": [ {', "text/event-stream")[0] is False
    assert parse_usage(b"{oops")[0] is False
    body = json.loads(ensure_stream_usage(b'{"stream": true, "messages": []}'))
    assert body["stream_options"] == {"include_usage": True}
    assert ensure_stream_usage(b'{"messages": []}') is None


def test_aclose_closes_every_http_client_it_built(gold):
    ep, cfg = gold
    mc = ModelClients(ep, cfg, Usage())
    mc.langchain_chat(0)
    mc.async_openai()
    built = list(mc._opened)
    assert len(built) == 3 and not any(c.is_closed for c in built)
    asyncio.run(mc.aclose())
    assert all(c.is_closed for c in built) and mc._opened == []


def test_proxy_from_environment_except_loopback_and_no_proxy(monkeypatch):
    from apps_bench.models.client_stack import proxy_for

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("https_proxy", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost,gpu7")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost,gpu7")
    assert proxy_for("https://api.example.org/v1") == "http://proxy.internal:3128"
    assert proxy_for("https://gpu7:8000/v1") is None
    assert proxy_for("http://127.0.0.1:8000/v1") is None


def test_plain_dict_model_config_works_once_typed_and_gaps_are_named(gold):
    """Plain data becomes a ModelConfig once (config.typed); a key it lacks is named there, not
    filled in by a default in code."""
    from omegaconf.errors import MissingMandatoryValue

    ep, cfg = gold
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert ModelClients(ep, typed(ModelConfig, plain), Usage()).request_params(2)["seed"] == 2
    for key in ("top_p", "max_concurrency", "retry_timeouts"):  # the last two had code defaults once
        gap = {k: v for k, v in plain.items() if k != key}
        with pytest.raises(MissingMandatoryValue, match=key):
            typed(ModelConfig, gap)


# ---------------------------------------------------------------------------- shared connections


class _CountingServer:
    """A loopback OpenAI-style endpoint that remembers every TCP connection it accepted."""

    def __init__(self) -> None:
        import http.server
        import threading

        peers: list[int] = []
        self.peers = peers

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real servers

            def setup(self) -> None:
                super().setup()
                peers.append(self.client_address[1])

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0)))
                body = json.dumps(
                    {
                        "id": "c",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "m",
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "```python\nprint(1)\n```"},
                            }
                        ],
                        "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("shared", [True, False])
def test_shared_connections_keep_usage_apart_and_reuse_one_connection(shared: bool):
    from apps_bench.models.client_stack import SharedConnections

    server = _CountingServer()
    ep = Endpoint(base_url=server.url, model_id="m", api_key="k", provider="openai")

    async def problems() -> list[Usage]:
        conns = SharedConnections() if shared else None
        usages = []
        for i in range(5):  # one problem after another, each with its own clients, closed at its end
            usage = Usage()
            mc = ModelClients(ep, model_preset("openai"), usage, shared=conns)
            client = mc.async_openai()
            for _ in range(i + 1):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            await mc.aclose()
            usages.append(usage)
        if conns is not None:
            await conns.aclose()
        return usages

    try:
        usages = asyncio.run(problems())
    finally:
        server.close()
    assert [u.model_calls for u in usages] == [1, 2, 3, 4, 5]  # each problem counts only its own calls
    assert [u.total_tokens for u in usages] == [12, 24, 36, 48, 60]
    assert len(server.peers) == (1 if shared else 5)  # one kept-alive connection, instead of one per problem


@pytest.mark.parametrize("flavour", ["httpx2", "httpx"])
def test_clients_closed_by_with_count_their_calls_and_leave_the_shared_pool_open(flavour: str):
    """A client used as a context manager enters and exits its transports: each counts its own call,
    and the shared pool stays open for the next client (one connection, sync and async alike)."""
    from apps_bench.models.client_stack import SharedConnections, metered_client

    server = _CountingServer()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    conns = SharedConnections()
    usages = [Usage() for _ in range(4)]

    async def run() -> None:
        for usage in usages[:2]:
            with metered_client(usage, flavour=flavour, shared=conns, base_url=server.url) as client:
                client.post(f"{server.url}/chat/completions", json=body).raise_for_status()
        for usage in usages[2:]:
            async with metered_client(usage, asynchronous=True, flavour=flavour, shared=conns, base_url=server.url) as aclient:
                (await aclient.post(f"{server.url}/chat/completions", json=body)).raise_for_status()
        await conns.aclose()

    try:
        asyncio.run(run())
    finally:
        server.close()
    assert [(u.model_calls, u.total_tokens, u.in_flight) for u in usages] == [(1, 12, 0)] * 4
    assert len(server.peers) == 2  # one kept-alive connection for the sync clients, one for the async ones


# ---------------------------------------------------------------------------- client-side queueing


class _OneAtATimeServer:
    """A loopback OpenAI-style endpoint that works on one request at a time, as llama-cpp-python's
    server does: every request it has received waits its turn, and each takes `hold_s` to answer.
    It counts the requests it received and the most it held at once (waiting or worked on)."""

    def __init__(self, hold_s: float) -> None:
        import http.server
        import threading
        import time

        work, count = threading.Lock(), threading.Lock()
        self.received: list[str] = []
        self.held = self.most_held = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                with count:
                    outer.received.append(body["messages"][-1]["content"])
                    outer.held += 1
                    outer.most_held = max(outer.most_held, outer.held)
                with work:  # one at a time: the server's queue
                    time.sleep(hold_s)
                with count:
                    outer.held -= 1
                reply = json.dumps(
                    {
                        "id": "c",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "m",
                        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
                        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
                    }
                ).encode()
                try:
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                except OSError:  # the client gave up on it
                    pass

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _queue_six(max_concurrency: int) -> tuple[_OneAtATimeServer, Usage]:
    """Six concurrent requests, model=local's policy (no retries of a timeout), each with a timeout of
    3 answers of the server: the last would wait 6 answers in the server's queue."""
    hold_s, n = 1.0, 6
    server = _OneAtATimeServer(hold_s)
    usage = Usage()
    cfg = model_preset("local", max_concurrency=max_concurrency, request_timeout_s=3 * hold_s, max_retries=0)
    assert cfg.retry_timeouts is False  # conf/model/local.yaml: a timed-out request is not sent again
    mc = ModelClients(Endpoint(server.url, "m", "k", "local"), cfg, usage)

    async def go() -> None:
        c = mc.async_openai()
        await asyncio.gather(
            *(
                c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}], **mc.request_params(i))
                for i in range(n)
            ),
            return_exceptions=True,
        )
        await c.close()
        await mc.aclose()

    try:
        asyncio.run(go())
    finally:
        server.close()
    return server, usage


def test_requests_queue_on_the_client_not_past_their_timeout():
    """With model=local's one client-side slot, six concurrent requests reach a one-at-a-time server one
    after another (it never holds two), and none times out though the six take twice a request's timeout:
    a request's timeout runs only while it is on the wire, never while it waits for its slot."""
    server, usage = _queue_six(max_concurrency=1)
    assert server.most_held == 1  # never two requests in the server's queue at once
    assert sorted(server.received) == [f"q{i}" for i in range(6)]  # each sent once: none timed out and re-sent
    assert (usage.model_calls, usage.failed_calls, usage.retries, usage.failed_attempts) == (6, 0, 0, 0)


def test_without_client_slots_requests_time_out_in_the_servers_queue():
    """The same six requests without slots (max_concurrency=0): all reach the server at once and those
    queued behind three answers time out there -- what the slots prevent (the test above would fail so)."""
    server, usage = _queue_six(max_concurrency=0)
    assert server.most_held == 6
    assert usage.failed_calls >= 2 and usage.model_calls + usage.failed_calls == 6
