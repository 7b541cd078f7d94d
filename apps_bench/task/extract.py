"""Take the submitted program out of a model reply.

Rule (docs/topologies.md): the last fenced block that parses as Python, preferring blocks
labelled python/py/python3 (any case) over bare fences; blocks with any other
label are never taken. `<think>...</think>` is removed first. Fences are paired
line by line the CommonMark way (same character, at least as long, no info
string on the closing line), so a bare fence never captures the prose between
two blocks, a longer fence can hold shorter ones, and an unclosed fence runs to
the end of the reply.
"""

from __future__ import annotations

import functools
import re
import textwrap
from dataclasses import dataclass

from apps_bench.task.syntax import parse

PYTHON_LABELS = frozenset({"python", "py", "python3", "py3"})
CONTAINER_LABELS = frozenset({"", "markdown", "md"})  # may wrap a whole answer, fences included

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_LABEL = re.compile(r"[{.\s]*([A-Za-z0-9_+#-]+)")  # `python`, `{.python}`, `python:sol.py` -> python
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    label: str  # first word of the info string, lower-cased; "" for a bare fence
    code: str
    closed: bool


def strip_thinking(reply: str) -> str:
    """Drop reasoning: every <think>...</think>, text before a stray </think>, and an unclosed <think> tail."""
    text = _THINK_BLOCK.sub("", reply)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:  # chat templates often drop the opening tag: everything before it was thinking
        text = text[closes[-1].end() :]
    m = _THINK_OPEN.search(text)
    if m:  # thinking that never ended is not an answer
        text = text[: m.start()]
    return text


def _dedent(line: str, width: int) -> str:
    i = 0
    while i < width and i < len(line) and line[i] in " \t":
        i += 1
    return line[i:]


def fenced_blocks(text: str) -> list[Block]:
    """All top-level fenced blocks, in order."""
    blocks: list[Block] = []
    # split on newlines only: str.splitlines() would also split inside code on \x0c, \x1c, \u2028, ...
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or (m.group("fence")[0] == "`" and "`" in m.group("info")):
            i += 1
            continue
        indent, fence = len(m.group("indent")), m.group("fence")
        info = m.group("info").strip()
        lm = _LABEL.match(info)
        label = lm.group(1).lower() if lm else ("" if not info else info.split()[0].lower())
        body: list[str] = []
        closed = False
        j = i + 1
        while j < len(lines):
            c = _FENCE.match(lines[j])
            if c and c.group("fence")[0] == fence[0] and len(c.group("fence")) >= len(fence) and not c.group("info").strip():
                closed = True
                break
            body.append(_dedent(lines[j], indent))
            j += 1
        code = "\n".join(body)
        if not parses(code):  # uniformly indented code; dedent only then (it also blanks whitespace-only lines)
            dedented = textwrap.dedent(code)
            code = dedented if parses(dedented) else code
        blocks.append(Block(label=label, code=code, closed=closed))
        i = j + 1
    return blocks


@functools.lru_cache(maxsize=4096)
def parses(code: str) -> bool:
    """Whether `code` is valid Python (cached: every reply's blocks are checked more than once)."""
    if not code.strip():
        return False
    try:
        parse(code)  # under the process's one AST lock (syntax.py): solver threads extract at once
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def candidate_blocks(text: str, depth: int = 0) -> list[Block]:
    """Fenced blocks in order; a bare/markdown block that is not Python itself is replaced by the blocks it wraps."""
    out: list[Block] = []
    for b in fenced_blocks(text):
        if depth < 3 and b.label in CONTAINER_LABELS and not parses(b.code):
            inner = candidate_blocks(b.code, depth + 1)
            if inner:
                out.extend(inner)
                continue
        out.append(b)
    return out


def extract_program(reply: str | None) -> str | None:
    """The submitted program, or None when the reply holds no usable python block."""
    if not reply:
        return None
    blocks = candidate_blocks(strip_thinking(reply))
    labelled = [b for b in blocks if b.label in PYTHON_LABELS]
    bare = [b for b in blocks if b.label == ""]
    for group in (labelled, bare):
        for b in reversed(group):
            if parses(b.code):
                return b.code.strip("\n") + "\n"
    return None
