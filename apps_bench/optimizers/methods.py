"""The optimization methods as the protocol calls them: each conf/optimizer/<name>.yaml names its
function as `_target_`, and `run.optimize` calls it with one `MethodRun` (the protocol's pieces,
built the same for every method) for a `MethodResult`. A new method is a schema in config/schema.py, a
YAML and a function here; nothing else lists the methods.

The methods' own machinery is imported inside each function: `gepa` is an optional package, and
`optimizer=none` loads neither method.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from apps_bench.config.schema import GepaParams, MaspoParams, OptimizerParams, TargetError, resolve_target
from apps_bench.optimizers.cache import Checkpoints
from apps_bench.optimizers.maspo import Maspo, MaspoConfig, graph_for
from apps_bench.optimizers.maspo_system import EvaluatorSystem, ModelTextJudge
from apps_bench.optimizers.proposals import CachedChat, ModelProposer
from apps_bench.optimizers.protocol import Budget, EventHook, Pool, ProblemKey, Splits, key_str
from apps_bench.optimizers.scoring import ProtocolEvaluator
from apps_bench.task import extract_program
from apps_bench.types import JsonObject, Problem, Verdict


@dataclass
class MethodRun:
    """What a method gets: its params, the team, the seed prompts, the splits, and the only ways it
    may reach the model (the gated, budgeted `evaluator` for rollouts, `chat` for the optimizer model)."""

    params: OptimizerParams
    flow: str
    roles: list[str]  # the roles whose prompts are optimized
    seed_texts: dict[str, str]
    splits: Splits
    pool: Pool
    evaluator: ProtocolEvaluator
    chat: CachedChat | None
    budget: Budget
    question_of: Callable[[ProblemKey], str]  # a training problem's statement (never its solutions)
    score_program: Callable[[Problem, str | None], Verdict] | None
    extract_program: Callable[[str], str | None] | None
    out: Path
    log: EventHook


@dataclass
class MethodResult:
    chosen: dict[str, str]  # the prompt set the method picked (every role of the seed set)
    stopped: str  # done | budget | ... (the method's own reason)
    details: JsonObject = field(default_factory=dict)  # merged into result.json `details`


Method = Callable[[MethodRun], MethodResult]


def _needs_chat(run: MethodRun, method: str) -> CachedChat:
    if run.chat is None:
        raise ValueError(f"optimizer={method} needs an optimizer model (chat callable); none was given")
    return run.chat


def keep_seed(run: MethodRun) -> MethodResult:
    """optimizer=none: the seed prompts, unchanged (scored on val like any method's choice)."""
    return MethodResult(dict(run.seed_texts), "done")


def run_maspo(run: MethodRun) -> MethodResult:
    params = run.params
    assert isinstance(params, MaspoParams), f"optimizer=maspo takes MaspoParams, got {type(params).__name__}"
    chat = _needs_chat(run, "maspo")
    if run.score_program is None:
        raise ValueError("optimizer=maspo needs score_program (the judge on training tests) for its execution-grounded reward")

    extract = run.extract_program or extract_program
    cfg = MaspoConfig.of(params)
    graph = graph_for(run.flow, run.roles)
    system = EvaluatorSystem(
        run.evaluator,
        graph,
        judge_program=_judge_program(run.pool.problems, run.score_program),
        extract_program=extract,
        text_judge=ModelTextJudge(chat, cfg.seed),
        question_of=run.question_of,
    )
    proposer = ModelProposer(chat, ksub=cfg.Ksub, n_traces=params.n_traces, question_of=run.question_of, seed=cfg.seed)

    def on_event(ev: JsonObject) -> None:
        run.log(f"maspo_{ev.get('kind')}", ev)

    m = Maspo(
        graph,
        run.seed_texts,
        system,
        proposer,
        list(run.splits.train),
        cfg,
        budget=run.budget,
        checkpoints=Checkpoints(run.out / "checkpoints"),
        on_event=on_event,
    )
    res = m.run()
    return MethodResult(
        res.prompts,
        res.stopped,
        {
            "plan": asdict(res.plan),
            "steps": res.steps_done,
            "best_scores": res.best_scores,
            "hard_cases": {a: [key_str(k) for k in h] for a, h in res.hard_cases.items()},
            "graph": {
                "agents": list(graph.agents),
                "edges": [list(e) for e in graph.edges],
                "partial_rerun": graph.partial_rerun,
            },
        },
    )


def run_gepa(run: MethodRun) -> MethodResult:
    params = run.params
    assert isinstance(params, GepaParams), f"optimizer=gepa takes GepaParams, got {type(params).__name__}"
    chat = _needs_chat(run, "gepa")
    try:
        from apps_bench.optimizers.gepa_adapter import run_gepa as gepa
    except ImportError as exc:
        if "gepa" not in str(exc):
            raise
        raise ImportError(
            f"optimizer=gepa needs the `gepa` package ({exc}); install it with: pip install 'apps-bench[optimizers]'"
        ) from exc

    seed = run.seed_texts
    res = gepa(
        {r: seed[r] for r in run.roles},
        run.splits.train,
        run.splits.val,
        run.evaluator,
        chat,
        budget=run.budget,
        cfg=params,
        question_of=run.question_of,
        base_prompts=seed,
        on_event=run.log,
        checkpoints=Checkpoints(run.out / "checkpoints"),
    )
    return MethodResult(
        {**seed, **res.best},
        res.stopped,
        {
            "candidates": len(res.candidates),
            "best_idx": res.best_idx,
            "val_aggregate": res.val_aggregate,
            "parents": res.parents,
            "proposals": res.proposals,
            "unparsable": res.unparsable,
            "placeholder_evals": res.placeholder_evals,
        },
    )


def _judge_program(problems: Mapping[ProblemKey, Problem], score: Callable[[Problem, str | None], Verdict]):
    def judge(key: ProblemKey, program: str | None) -> tuple[bool, float]:
        problem = problems[(key[0], key[1])]
        v = score(problem, program)
        n = v.n_tests or len(problem.tests)
        return bool(v.passed), (v.tests_passed / n if n else 0.0)

    return judge


def method_of(target: str, name: str) -> Method:
    """The function `optimizer._target_` names (module.function)."""
    try:
        fn = resolve_target(target)
    except TargetError as e:
        raise ValueError(f"optimizer {name!r}: {e}; check optimizer._target_ (conf/optimizer/{name}.yaml)") from None
    if not callable(fn):
        raise ValueError(
            f"optimizer {name!r}: {target!r} is not a function; check optimizer._target_ (conf/optimizer/{name}.yaml)"
        )
    return fn  # type: ignore[no-any-return]
