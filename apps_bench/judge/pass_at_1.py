"""pass@1 over all problems, over problems with extracted code, and per difficulty tier.

Problems whose judging hit a sandbox (infrastructure) error are counted apart and
left out of every pass@1 denominator: an outage is never a wrong answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from apps_bench.judge.reference import passes
from apps_bench.types import JsonObject, Outcome, Problem, Verdict

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console
    from rich.table import Table

TIER_ORDER = ("introductory", "interview", "competition")

# what summarize() counts: (Problem or difficulty, Verdict or its record) pairs, or verdict records (JSON lines)
SummaryItem = tuple[Problem | str | None, Verdict | JsonObject] | JsonObject


@dataclass
class TierStats:
    n: int = 0
    passed: int = 0

    @property
    def pass_at_1(self) -> float:
        return self.passed / self.n if self.n else 0.0


@dataclass
class Summary:
    n_problems: int = 0  # judged problems (sandbox errors excluded)
    n_passed: int = 0
    n_extracted: int = 0
    n_passed_extracted: int = 0
    n_sandbox_errors: int = 0
    by_difficulty: dict[str, TierStats] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # dataset rows skipped, by reason
    profile: str = ""
    seconds: float | None = None
    sandbox: JsonObject | None = None  # SandboxPool.features: the containment the verdicts ran under

    @property
    def pass_at_1(self) -> float:
        return self.n_passed / self.n_problems if self.n_problems else 0.0

    @property
    def pass_at_1_extracted(self) -> float:
        return self.n_passed_extracted / self.n_extracted if self.n_extracted else 0.0

    def to_dict(self) -> JsonObject:
        d = asdict(self)
        d["pass_at_1"] = self.pass_at_1
        d["pass_at_1_extracted"] = self.pass_at_1_extracted
        d["by_difficulty"] = {k: {"n": v.n, "passed": v.passed, "pass_at_1": v.pass_at_1} for k, v in self.by_difficulty.items()}
        d["n_skipped"] = sum(self.skipped.values())
        return d

    def metrics(self) -> dict[str, float]:
        """Flat numeric metrics (e.g. for MLflow): pass_at_1, pass_at_1_extracted, pass_at_1_<tier>, counts."""
        m: dict[str, float] = {
            "pass_at_1": self.pass_at_1,
            "pass_at_1_extracted": self.pass_at_1_extracted,
            "n_problems": self.n_problems,
            "n_passed": self.n_passed,
            "n_extracted": self.n_extracted,
            "n_sandbox_errors": self.n_sandbox_errors,
            "n_skipped": sum(self.skipped.values()),
        }
        for tier, s in self.by_difficulty.items():
            m[f"pass_at_1_{tier}"] = s.pass_at_1
            m[f"n_{tier}"] = s.n
        return m

    def table(self) -> Table:
        """A rich Table of the summary."""
        notes = []
        if self.n_sandbox_errors:
            notes.append(f"{self.n_sandbox_errors} problem(s) hit a sandbox error and are not scored")
        notes.append("rows skipped: " + (", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())) or "0"))
        if self.seconds is not None:
            notes.append(f"{self.seconds:.2f} s")
        return pass_table(
            self.to_dict(), title=f"APPS strict accuracy (judge profile {self.profile or '?'})", caption="; ".join(notes)
        )

    def print(self, console: Console | None = None) -> None:
        from rich.console import Console

        (console or Console()).print(self.table())


def pass_table(summary: Mapping[str, Any], *, title: str, caption: str) -> Table:
    """The pass@1 table (all / extracted / per difficulty) of a summary dict: the judge CLI's
    and a cell's (tracking/console.py) are this one."""
    from rich.table import Table

    t = Table(title=title, caption=caption)
    for col in ("set", "problems", "passed", "pass@1"):
        t.add_column(col, justify="left" if col == "set" else "right")
    t.add_row("all", str(summary["n_problems"]), str(summary["n_passed"]), f"{summary['pass_at_1']:.4f}")
    t.add_row(
        "extracted", str(summary["n_extracted"]), str(summary["n_passed_extracted"]), f"{summary['pass_at_1_extracted']:.4f}"
    )
    for tier, s in (summary.get("by_difficulty") or {}).items():
        t.add_row(tier or "(none)", str(s["n"]), str(s["passed"]), f"{s['pass_at_1']:.4f}")
    return t


def counted_tests(verdict: Verdict | None) -> dict[str, int]:
    """A recorded verdict's tests as the test-case average counts them: passed, run, and kept (the
    denominator: the row's tests after the `max_tests_per_row` cap). Under the `reference` profile the
    original's own result list decides what passed, so a program it lost whole (`[-1] * 21`) or could
    not compile (`[-2]`) passed none, whatever ran before; a missing verdict (no program) counts 0."""
    if verdict is None:
        return {"tests_passed": 0, "tests_run": 0, "tests_kept": 0}
    ref = verdict.reference_results
    passed = verdict.tests_passed if ref is None else sum(passes(x) for x in ref)
    return {"tests_passed": passed, "tests_run": verdict.tests_run, "tests_kept": verdict.n_tests}


def _unpack(item: SummaryItem) -> tuple[str, bool, bool, bool]:
    """(difficulty, passed, extracted, sandbox_error) from a (Problem|difficulty, Verdict) pair or a record dict."""
    if isinstance(item, tuple) and len(item) == 2:
        who, v = item
        diff = who.difficulty if isinstance(who, Problem) else str(who or "")
        if isinstance(v, Verdict):
            return diff, v.passed, v.extracted, any(r.outcome is Outcome.SANDBOX_ERROR for r in v.results)
        item = {**dict(v), "difficulty": diff}
    if isinstance(item, Mapping):
        results = item.get("results") or ()
        sandbox = bool(item.get("sandbox_error")) or any(
            (r.get("outcome") if isinstance(r, Mapping) else getattr(r, "outcome", None))
            in ("sandbox_error", Outcome.SANDBOX_ERROR)
            for r in results
        )
        return str(item.get("difficulty") or ""), bool(item.get("passed")), bool(item.get("extracted", True)), sandbox
    raise TypeError(f"summarize() takes (Problem, Verdict) pairs or verdict records (dicts), got {type(item).__name__}")


def summarize(
    items: Iterable[SummaryItem],
    *,
    skipped: Mapping[str, int] | None = None,
    profile: str = "",
    seconds: float | None = None,
    sandbox: JsonObject | None = None,
) -> Summary:
    """Aggregate verdicts. Items: (Problem, Verdict) or (difficulty, Verdict) pairs, or records with
    `passed`, `extracted`, `difficulty` and optionally `results`/`sandbox_error` (e.g. VERDICTS.jsonl lines).
    `sandbox`: the pool's features, recorded with the summary."""
    s = Summary(
        skipped=dict(skipped or {}), profile=profile, seconds=seconds, sandbox=dict(sandbox) if sandbox is not None else None
    )
    tiers: dict[str, TierStats] = {}
    for item in items:
        if not profile and isinstance(item, tuple) and isinstance(item[1], Verdict):
            s.profile = s.profile or item[1].profile
        diff, passed, extracted, sandbox_error = _unpack(item)
        if sandbox_error:
            s.n_sandbox_errors += 1
            continue
        s.n_problems += 1
        s.n_passed += passed
        if extracted:
            s.n_extracted += 1
            s.n_passed_extracted += passed
        t = tiers.setdefault(diff, TierStats())
        t.n += 1
        t.passed += passed
    order = {k: i for i, k in enumerate(TIER_ORDER)}
    s.by_difficulty = {k: tiers[k] for k in sorted(tiers, key=lambda k: (order.get(k, len(order)), k))}
    return s
