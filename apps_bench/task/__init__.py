"""The task: framing a problem as a prompt, and extracting the submitted program from a reply."""

from apps_bench.task.extract import candidate_blocks, extract_program, fenced_blocks, strip_thinking
from apps_bench.task.prompt import CALL_DIRECTIVE, STDIN_DIRECTIVE, frame

__all__ = ["CALL_DIRECTIVE", "STDIN_DIRECTIVE", "candidate_blocks", "extract_program", "fenced_blocks", "frame", "strip_thinking"]
