"""What goes on the wire: one form of each model request and reply, whatever the framework.

The frameworks build chat-completions bodies their own way, and real servers differ
in what they accept. Every metered client sends through here (metering.py), so
siblings that differ only in framework also send the same request for the same intent
and read the same reply:

- the token cap goes as `max_tokens` (LangChain sends `max_completion_tokens`, which
  llama-cpp-python ignores; vLLM and OpenAI accept `max_tokens`);
- an assistant message that only calls tools carries `content: ""`, not `null`
  (llama-cpp-python answers `null` with HTTP 500);
- a request that offers tools says `tool_choice: "auto"` when it names no choice (AutoGen
  sends it, LangChain and the OpenAI SDK do not): the OpenAI API and vLLM read a missing
  choice as "auto", but llama-cpp-python then leaves the tools out of the prompt;
- a streamed request asks for its usage chunk (vLLM sends it only when asked);
- a reply's tool-call arguments are strict JSON: raw control characters inside JSON
  strings (a model writing code with real newlines) are escaped, so a runner whose
  parser is strict (the OpenAI SDK loop, AutoGen) reads what LangChain's lenient one does;
- a reply's tool calls are in `tool_calls` only: the deprecated `function_call` field
  (llama-cpp-python sends both) is dropped, since AutoGen refuses any reply carrying it;
- a chat reply without an answer (no `choices`, or a choice without its `message`) is a failed
  attempt, retried like a 5xx (`missing_answer`): each framework would fail on it its own way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class RequestInfo:
    """What the metering needs to know about a request it sent."""

    has_tools: bool = False


def prepare_request(content: bytes) -> tuple[bytes | None, RequestInfo]:
    """(the rewritten body, or None when it is already in the one form; facts about it)."""
    try:
        body = json.loads(content)
    except ValueError:
        return None, RequestInfo()
    if not isinstance(body, dict):
        return None, RequestInfo()
    changed = False
    if "max_completion_tokens" in body:
        cap = body.pop("max_completion_tokens")
        if body.get("max_tokens") is None:
            body["max_tokens"] = cap
        changed = True
    for msg in body.get("messages") or ():
        if isinstance(msg, dict) and msg.get("role") == "assistant" and msg.get("content") is None:
            msg["content"] = ""
            changed = True
    if body.get("tools") and "tool_choice" not in body:
        body["tool_choice"] = "auto"
        changed = True
    if body.get("stream"):
        opts = body.get("stream_options") or {}
        if not opts.get("include_usage"):
            body["stream_options"] = {**opts, "include_usage": True}
            changed = True
    info = RequestInfo(has_tools=bool(body.get("tools") or body.get("functions")))
    return (json.dumps(body).encode() if changed else None), info


def ensure_stream_usage(content: bytes) -> bytes | None:
    """The body with `stream_options.include_usage` set when it streams without it (else None)."""
    try:
        body = json.loads(content)
    except ValueError:
        return None
    if not isinstance(body, dict) or not body.get("stream"):
        return None
    new, _ = prepare_request(content)
    return new


def strict_arguments(arguments: object) -> object:
    """Tool-call arguments as strict JSON text; text that is no JSON object at all stays as it is."""
    if not isinstance(arguments, str):
        return arguments
    try:
        json.loads(arguments)
        return arguments
    except ValueError:
        pass
    try:
        value = json.loads(arguments, strict=False)  # control characters inside strings allowed
    except ValueError:
        return arguments
    return json.dumps(value)


def normalize_reply(body: bytes, content_type: str = "") -> bytes:
    """A non-streamed chat reply with strict tool-call arguments (other bodies unchanged)."""
    if "text/event-stream" in content_type:
        return body
    try:
        obj = json.loads(body)
    except ValueError:
        return body
    changed = False
    for choice in (obj.get("choices") or ()) if isinstance(obj, dict) else ():
        msg = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(msg, dict) and msg.get("function_call") is not None:
            # the deprecated single-call field (llama-cpp-python sends it beside tool_calls): AutoGen
            # refuses any reply carrying it, the others ignore it; keep the call as a tool call only
            call = msg.pop("function_call")
            if not msg.get("tool_calls") and isinstance(call, dict):
                msg["tool_calls"] = [{"id": "call_0", "type": "function", "function": call}]
            if choice.get("finish_reason") == "function_call":
                choice["finish_reason"] = "tool_calls"
            changed = True
        for call in (msg or {}).get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and "arguments" in fn:
                fixed = strict_arguments(fn["arguments"])
                if fixed is not fn["arguments"]:
                    fn["arguments"] = fixed
                    changed = True
    return json.dumps(obj).encode() if changed else body


def is_stream(text: str, content_type: str = "") -> bool:
    return "text/event-stream" in content_type or text.lstrip().startswith("data:")


def stream_events(text: str) -> Iterator[object]:
    """The JSON events of an SSE stream, in order (lines that do not parse are skipped)."""
    for line in text.splitlines():
        data = line[5:].strip() if line.startswith("data:") else ""
        if not data or data == "[DONE]":
            continue
        try:
            yield json.loads(data)
        except ValueError:
            continue


def finish_reason(body: bytes, content_type: str = "") -> str:
    """The first choice's finish_reason of a JSON reply or an SSE stream ("" when none)."""
    text = body.decode("utf-8", errors="replace")
    if is_stream(text, content_type):
        reason = ""
        for event in stream_events(text):
            reason = _first_reason(event) or reason
        return reason
    try:
        return _first_reason(json.loads(text))
    except ValueError:
        return ""


def _first_reason(obj: object) -> str:
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if choices and isinstance(choices[0], dict):
        return str(choices[0].get("finish_reason") or "")
    return ""


def missing_answer(body: bytes, path: str, content_type: str = "") -> str | None:
    """What a well-formed JSON chat or text completion lacks to be an answer (no choices, a choice
    without its message or text), or None. Streams and other endpoints are not judged here."""
    if is_stream(body[:64].decode("utf-8", errors="replace"), content_type):
        return None
    chat = path.rstrip("/").endswith("/chat/completions")
    if not chat and not path.rstrip("/").endswith("/completions"):
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list) or not choices:
        return "a reply without choices"
    field = "message" if chat else "text"
    if any(not isinstance(c, dict) or c.get(field) is None for c in choices):
        return f"a choice without its {field}"
    if chat and any(not isinstance(c["message"], dict) for c in choices):
        return "a choice whose message is not an object"
    return None
