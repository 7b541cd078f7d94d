"""llama-cpp-python's server, with its `chatml-function-calling` handler bounded and corrected.

    python -m apps_bench.models.local_server <llama_cpp.server arguments>

`model=local` starts this instead of `python -m llama_cpp.server` (local.py). The handler of
llama-cpp-python 0.3.36 (pinned in the `local` extra) mishandles the requests our runners send:

- `tool_choice: "auto"` (AutoGen sends it): each of the handler's internal completions (the
  choice between a message and a call, the call's arguments, the check for a further call, the
  message) runs with `max_tokens=None`, i.e. until the context is full: a centralized AutoGen
  tester's `python_exec` arguments, generated under the JSON-schema grammar, kept one request
  running for 17 minutes (past the 900 s request timeout) without closing the JSON. Here every completion gets what is left of
  the request's `max_tokens`: the server generates at most `max_tokens` tokens per request,
  whatever the path, as it does for a plain request.
- the text reply of `"auto"` is generated under the grammar meant for the check for a further
  call (only `<|im_end|>` or a tool name), so every text reply was `""`. Here it is free text.
- a reply cut by the cap is reported `finish_reason: "length"` (the handler says
  `"tool_calls"` even when the arguments were cut off).
- its prompt template is rendered with HTML autoescaping on, so the model read `a &lt; b` for
  `a < b` and `&#39;` for every apostrophe of a problem statement, and copied them into its
  replies (each turn escaped again: `&amp;amp;#39;`). Here message text is rendered verbatim.
- the template has no case for `role: "tool"`, so every tool result (a `python_exec` run, the
  error of a malformed call) was left out of the prompt, and an agent repeated the same call
  without ever seeing its outcome. Here a tool result is shown as a user turn
  (`Result of functions.<name>:` and the result).
- its RAM prompt cache (`--cache_type ram`) counts only each state's KV bytes against
  `--cache_size`, not the logits the state also copies (192 KiB per token with the server's
  default `logits_all`): a centralized AutoGen cell with a 1 GiB cache grew the server to 12.4 GB.
  Here every byte a state holds counts, so the cache stays within its size, and a state keeps one
  row of logits (after a load the server replays a token before sampling, so the saved logits are
  never read; local.py also starts the server with `--logits_all false`).

With `--requantize TYPE --requantize_to PATH` (local.py passes them for `model.local.gguf_requantize`)
it first writes `--model` converted to TYPE at PATH and serves that (`requantize`).

Not changed: without `tool_choice` (LangChain and the OpenAI SDK send none) the handler leaves
`tools` out of the prompt (its "no tool choice" path, which honours max_tokens), so on this
server only AutoGen's tools reach the model; the summary's tool warning says so (docs/models.md,
"model=local"). Other chat formats are served unchanged.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from apps_bench.types import JsonObject

if TYPE_CHECKING:
    import llama_cpp

CHAT_FORMAT = "chatml-function-calling"
_MESSAGE_PREFIX = "message:\n"  # how the handler starts the text reply it chose under "auto"


class _Capped:
    """The `llama` handed to the handler: its completions share the request's token budget."""

    def __init__(self, llama: Any, max_tokens: int | None) -> None:
        self._llama = llama
        self.left = max_tokens if max_tokens is not None and max_tokens > 0 else None
        self.cut = False  # a completion stopped at the budget

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llama, name)

    def create_completion(self, **kwargs: Any) -> Any:
        if self.left is not None:
            if self.left <= 0:
                self.cut = True
                return _empty_completion(kwargs.get("model") or "")
            asked = kwargs.get("max_tokens")
            kwargs["max_tokens"] = min(asked, self.left) if asked and asked > 0 else self.left
        if str(kwargs.get("prompt", "")).endswith(_MESSAGE_PREFIX):
            kwargs["grammar"] = None  # the text reply is text, not a tool name
        out = self._llama.create_completion(**kwargs)
        if isinstance(out, dict):
            if self.left is not None:
                self.left -= int((out.get("usage") or {}).get("completion_tokens") or 0)
            if any(c.get("finish_reason") == "length" for c in out.get("choices") or ()):
                self.cut = True
        return out


def _empty_completion(model: str) -> JsonObject:
    """What a completion with no tokens left returns: nothing, stopped at the cap."""
    return {
        "id": "cmpl-capped",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _text(content: Any) -> str:
    """A message's content as text (a list of content parts joined)."""
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def readable(messages: list[JsonObject]) -> list[JsonObject]:
    """The messages as the handler's template must show them: text verbatim (`Markup` is what
    autoescaping leaves alone), and each tool result as a user turn naming its function."""
    from markupsafe import Markup

    names: dict[str | None, str] = {}  # tool_call_id -> the function it ran
    out = []
    for message in messages:
        m = dict(message)
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                fn = dict(call.get("function") or {})
                names[call.get("id")] = fn.get("name") or "function"
                fn["arguments"] = Markup(fn.get("arguments") or "")
                calls.append({**call, "function": fn})
            m["tool_calls"] = calls
        if m.get("role") == "tool":
            name = names.get(m.get("tool_call_id"), "function")
            m = {"role": "user", "content": f"Result of functions.{name}:\n{_text(m.get('content'))}"}
        if m.get("content") is not None:
            m["content"] = Markup(_text(m["content"]))
        out.append(m)
    return out


def bounded(handler: Any) -> Any:
    """`handler` with the request's max_tokens over all its completions, free-text replies under
    "auto", `length` reported for a reply cut by the cap, and the messages rendered as sent."""

    def handle(*, llama: Any, messages: list[JsonObject], max_tokens: int | None = None, **kwargs: Any) -> Any:
        capped = _Capped(llama, max_tokens)
        out = handler(llama=capped, messages=readable(messages), max_tokens=max_tokens, **kwargs)
        if isinstance(out, dict) and capped.cut:
            for choice in out.get("choices") or ():
                choice["finish_reason"] = "length"
        return out

    handle.__doc__ = bounded.__doc__
    return handle


def counted_ram_cache() -> type[llama_cpp.LlamaRAMCache]:
    """llama-cpp-python's RAM prompt cache, with a state's logits and token ids counted in its size,
    and one row of logits kept per state."""
    import llama_cpp

    class CountedRAMCache(llama_cpp.LlamaRAMCache):
        @property
        def cache_size(self) -> int:
            return sum(s.llama_state_size + s.scores.nbytes + s.input_ids.nbytes for s in self.cache_state.values())

        def __setitem__(self, key: Any, state: Any) -> None:
            # A loaded state's logits are never sampled from: the server replays a token after a
            # load to refresh them. Keep the last row (load_state broadcasts it), not a batch's.
            state.scores = state.scores[-1:].copy()
            super().__setitem__(key, state)

    return CountedRAMCache


def install() -> None:
    """Replace the registered chatml-function-calling handler by its bounded form, and the RAM
    prompt cache by one whose size counts everything it keeps."""
    import llama_cpp
    from llama_cpp import llama_chat_format as fmt

    # the server looks the class up there when it builds its cache: replaced on purpose
    llama_cpp.LlamaRAMCache = counted_ram_cache()  # type: ignore[misc]

    registry = fmt.LlamaChatCompletionHandlerRegistry()
    registry.register_chat_completion_handler(CHAT_FORMAT, bounded(fmt.get_chat_completion_handler(CHAT_FORMAT)), overwrite=True)


def _option(argv: list[str], name: str) -> str | None:
    """Take `name VALUE` out of argv (ours, not llama_cpp.server's) -> VALUE, or None."""
    if name not in argv:
        return None
    i = argv.index(name)
    value = argv[i + 1]
    del argv[i : i + 2]
    return value


def requantize(src: str, dst: str, kind: str) -> None:
    """Write the GGUF `src` converted to the llama.cpp file type `kind` (config.REQUANTIZE_TYPES) to `dst`.

    SmolLM2 ships as Q4_1, for which llama.cpp's x86 CPU backend has only a block-by-block dot
    product; Q8_0 (and Q4_0) go through its tiled matrix kernels (docs/models.md, "model=local").
    """
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind.upper()}")
    params.allow_requantize = True  # from a quantized file: dequantized, then quantized again
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"local_server: could not convert {src} to {kind} at {dst}")


def main() -> None:
    """`--requantize TYPE --requantize_to PATH` (local.py): serve --model converted to TYPE."""
    kind, dst = _option(sys.argv, "--requantize"), _option(sys.argv, "--requantize_to")
    if kind and dst:
        i = sys.argv.index("--model") + 1
        requantize(sys.argv[i], dst, kind)
        sys.argv[i] = dst
    install()
    from llama_cpp.server.__main__ import main as serve

    serve()


if __name__ == "__main__":
    main()
