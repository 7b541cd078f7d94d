"""The verdict of launchers/first_gpu_run.sh: is this server ready for a study, and if not, what to change.

    python -m apps_bench.launchers.first_run OUT TOPOLOGY ...

Reads what the script left in OUT: the server check (`check.json`, `check.rc`), and per runner
the cell's folder (`cells/<topology>/summary.json`, `records.jsonl`), its exit status and log.
Prints one line per runner and the verdict; exit 0 when ready, 1 when not.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from apps_bench.types import JsonObject

# the runners whose teams get tools through the API (CrewAI describes them in the prompt)
API_TOOLS = {
    "single",
    "independent",
    "sequential_langgraph",
    "centralized_langgraph",
    "centralized_autogen",
    "decentralized_langgraph",
    "decentralized_openai",
}


@dataclass
class Runner:
    topology: str
    rc: int | None
    summary: JsonObject = field(default_factory=dict)  # the cell's summary.json
    tool_calls: int = 0
    log_tail: str = ""

    @property
    def problems(self) -> str:
        s = self.summary
        return f"{s.get('n_recorded', 0)}/{s.get('n_selected', '?')}" if s else "-"


def _json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_runner(out: Path, topology: str) -> Runner:
    rc_text = (out / "cells" / f"{topology}.rc").read_text().strip() if (out / "cells" / f"{topology}.rc").is_file() else ""
    log = out / "cells" / f"{topology}.log"
    tail = [ln for ln in (log.read_text(errors="replace").splitlines() if log.is_file() else []) if ln.strip()]
    r = Runner(topology, int(rc_text) if rc_text.lstrip("-").isdigit() else None, log_tail=tail[-1] if tail else "")
    cell = out / "cells" / topology
    summary = _json(cell / "summary.json")
    r.summary = summary if isinstance(summary, dict) else {}
    records = cell / "records.jsonl"
    if records.is_file():
        for line in records.read_text().splitlines():
            rec = json.loads(line) if line.strip() else {}
            r.tool_calls += sum(int(n) for n in (rec.get("tool_calls_by_role") or {}).values())
    return r


def problems_with(check: object, runners: list[Runner], out: Path) -> list[str]:
    """Each reason the server is not ready, with what to change."""
    reasons: list[str] = []
    if not isinstance(check, dict):
        reasons.append(f"the server check wrote no result ({out / 'check.log'})")
    else:
        for f in check.get("findings") or ():
            if f.get("status") == "FAIL":
                reasons.append(
                    f"check: {f['framework']} {f['item']}: {f['detail']}" + (f" -> {f['fix']}" if f.get("fix") else "")
                )
    for r in runners:
        log = out / "cells" / f"{r.topology}.log"
        if r.rc == 2:
            reasons.append(f"{r.topology}: refused: {r.log_tail} ({log})")
        elif r.rc != 0 or not r.summary:
            reasons.append(f"{r.topology}: exit {r.rc}: {r.log_tail} ({log})")
        elif r.summary.get("n_errors"):
            reasons.append(
                f"{r.topology}: {r.summary['n_errors']} problem(s) ended in an infrastructure error "
                f"(timeouts, server errors): see {log} and {out / 'server.log'}"
            )
        elif r.topology in API_TOOLS and not r.tool_calls:
            reasons.append(
                f"{r.topology}: no tool call in {r.problems} problems: the team ran without its tools "
                "(the check's tools lines say why)"
            )
    return reasons


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        sys.stderr.write("usage: python -m apps_bench.launchers.first_run OUT TOPOLOGY ...\n")
        return 2
    out, topologies = Path(args[0]), args[1:]
    check = _json(out / "check.json")
    runners = [read_runner(out, t) for t in topologies]
    lines = ["", f"first GPU run: {out}"]
    if isinstance(check, dict):
        tools = ", ".join(f"{k}: {v}" for k, v in (check.get("tools") or {}).items())
        lines.append(
            f"server check: {check.get('model_id')} ({check.get('server', {}).get('kind')}), "
            f"{check.get('failed', 0)} item(s) failed; tools: {tools}"
        )
    lines.append(f"{'runner':<24} {'exit':>4} {'problems':>8} {'pass@1':>7} {'errors':>6} {'tool calls':>10}")
    for r in runners:
        s = r.summary
        p1 = f"{s['pass_at_1']:.3f}" if isinstance(s.get("pass_at_1"), (int, float)) else "-"
        lines.append(
            f"{r.topology:<24} {r.rc if r.rc is not None else '-':>4} {r.problems:>8} {p1:>7} "
            f"{s.get('n_errors', '-') if s else '-':>6} {r.tool_calls:>10}"
        )
    reasons = problems_with(check, runners, out)
    if reasons:
        lines += ["", f"VERDICT: NOT READY ({len(reasons)} problem(s)); change these, then rerun:"]
        lines += [f"  - {reason}" for reason in reasons]
    else:
        lines += [
            "",
            "VERDICT: READY: the server passes the check, and every runner solved its problems with its tools. "
            "Next: launchers/sweep_study.sh (docs/models.md, 'Before your first GPU run').",
        ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 1 if reasons else 0


if __name__ == "__main__":
    raise SystemExit(main())
