"""extract_program over tricky replies: the last parsing block, labelled before bare, fences paired properly."""

from __future__ import annotations

import pytest

from apps_bench.task import extract_program, fenced_blocks, strip_thinking

F = "```"


def block(code: str, label: str = "python", fence: str = F) -> str:
    return f"{fence}{label}\n{code}\n{fence}"


def test_single_python_block():
    assert extract_program(f"Here it is:\n{block('print(1)')}\nDone.") == "print(1)\n"


@pytest.mark.parametrize(
    "label",
    ["python", "py", "Python", "PYTHON", "python3", "Python3", "py3", "python title=sol.py", "{.python}", "python:solution.py"],
)
def test_python_labels_any_case(label):
    assert extract_program(block("x = 1", label)) == "x = 1\n"


@pytest.mark.parametrize(
    "label",
    ["cpp", "java", "text", "bash", "json", "output", "pycon", "javascript", "plaintext", "python-repl", "cython", "{.text}"],
)
def test_other_labels_never_taken(label):
    # valid Python, but labelled as something else
    assert extract_program(block("x = 1", label)) is None


def test_other_label_ignored_even_when_last():
    reply = block("print('mine')") + "\nSample run:\n" + block("x = 2", "text")
    assert extract_program(reply) == "print('mine')\n"


def test_last_of_several_labelled_candidates():
    reply = "First try:\n" + block("print('old')") + "\nBetter:\n" + block("print('new')")
    assert extract_program(reply) == "print('new')\n"


def test_labelled_preferred_over_later_bare():
    reply = block("print('code')") + "\nOutput:\n" + block("42", "")
    assert extract_program(reply) == "print('code')\n"


def test_bare_fence_used_when_no_labelled_block():
    assert extract_program("Answer:\n" + block("print(7)", "")) == "print(7)\n"


def test_last_block_not_parsing_falls_back_to_previous():
    reply = block("print('good')") + "\nand a fix:\n" + block("def f(:\n    pass")
    assert extract_program(reply) == "print('good')\n"


def test_labelled_none_parse_then_bare_taken():
    reply = block("def (broken") + "\n" + block("print('bare')", "")
    assert extract_program(reply) == "print('bare')\n"


def test_prose_in_bare_fence_not_taken():
    reply = block("The answer is: two apples, three pears.", "")
    assert extract_program(reply) is None


def test_bare_fence_never_captures_prose_between_blocks():
    # A naive ```(.*?)``` regex pairs the first block's closing fence with the second's opening.
    reply = block("a = 1") + "\nThis is prose between the blocks, and it mentions x.\n" + block("b = 2", "text") + "\n"
    blocks = fenced_blocks(reply)
    assert [b.label for b in blocks] == ["python", "text"]
    assert [b.code for b in blocks] == ["a = 1", "b = 2"]
    assert extract_program(reply) == "a = 1\n"


def test_prose_between_bare_blocks_is_not_a_block():
    reply = block("x = 1", "") + "\nwhy = ok\n" + block("Some output text here.", "")
    # 'why = ok' sits between two blocks: it must never be taken; the bare blocks are x = 1 and the prose.
    assert extract_program(reply) == "x = 1\n"


def test_nested_longer_fence_holds_shorter_ones():
    reply = "````python\ns = '''\n```\nnot a fence end\n```\n'''\nprint(s)\n````"
    assert extract_program(reply) == "s = '''\n```\nnot a fence end\n```\n'''\nprint(s)\n"


def test_answer_wrapped_in_markdown_fence():
    reply = "````markdown\nHere is my code:\n```python\nprint('inner')\n```\n````"
    assert extract_program(reply) == "print('inner')\n"


def test_unclosed_fence_runs_to_end():
    assert extract_program("Solution:\n```python\nn = int(input())\nprint(n * 2)\n") == "n = int(input())\nprint(n * 2)\n"


def test_unclosed_last_fence_that_does_not_parse():
    reply = block("print('done')") + "\n```python\ndef trunc(a,\n"
    assert extract_program(reply) == "print('done')\n"


def test_closing_fence_with_info_string_is_content():
    reply = "```python\nx = 1\n```python\ny = 2\n```"
    # CommonMark: a fence line with an info string cannot close a block; the content does not parse.
    assert fenced_blocks(reply)[0].code == "x = 1\n```python\ny = 2"


def test_tilde_fences():
    assert extract_program("~~~python\nprint('t')\n~~~") == "print('t')\n"
    assert extract_program("~~~python\nx = '```'\n```\n~~~") is None  # ``` line inside a tilde block does not close it
    assert extract_program("~~~python\nprint(1)\n~~~~") == "print(1)\n"


def test_backtick_fence_not_closed_by_tildes():
    reply = "```python\nx = 1\n~~~\ny = 2\n```"
    assert fenced_blocks(reply)[0].code == "x = 1\n~~~\ny = 2"


def test_indented_fence_in_list_item():
    reply = "1. Read input\n2. Code:\n\n   ```python\n   def f(n):\n       return n + 1\n   print(f(int(input())))\n   ```\n"
    assert extract_program(reply) == "def f(n):\n    return n + 1\nprint(f(int(input())))\n"


def test_uniformly_indented_code_dedented():
    reply = "```python\n    x = 1\n    print(x)\n```"
    assert extract_program(reply) == "x = 1\nprint(x)\n"


def test_think_tags_removed_first():
    reply = "<think>\nDraft:\n```python\nprint('draft')\n```\n</think>\nFinal:\n```python\nprint('final')\n```"
    assert extract_program(reply) == "print('final')\n"


def test_think_only_code_is_not_an_answer():
    assert extract_program("<think>```python\nprint('draft')\n```</think>No code, sorry.") is None


def test_stray_closing_think_tag():
    reply = "reasoning...\n```python\nprint('draft')\n```\n</think>\n```python\nprint('final')\n```"
    assert strip_thinking(reply).strip().startswith("```python\nprint('final')")
    assert extract_program(reply) == "print('final')\n"


def test_unclosed_think_dropped():
    assert extract_program("```python\nprint(1)\n```\n<think>\n```python\nprint(2)\n```") == "print(1)\n"


def test_inline_backticks_are_not_fences():
    reply = "Use ```python print(1)``` inline? No:\n" + block("print(2)")
    assert extract_program(reply) == "print(2)\n"


@pytest.mark.parametrize("reply", [None, "", "no code at all", "x = 1\nprint(x)", block("   \n", "python")])
def test_no_program(reply):
    assert extract_program(reply) is None


def test_top_level_return_still_parses():
    # an APPS quirk: reference solutions sometimes have a top-level return; the judge decides, not extraction
    assert extract_program(block("return 5")) == "return 5\n"


def test_crlf_and_unicode_separators():
    assert extract_program("```python\r\nprint(1)\r\n```\r\n") == "print(1)\n"
    code = "s = 'a\u2028b\x0cc'\nprint(s)"
    assert extract_program(block(code)) == code + "\n"


def test_whitespace_only_lines_inside_strings_kept():
    code = 's = """\n   \n"""\nprint(repr(s))'
    assert extract_program(block(code)) == code + "\n"
