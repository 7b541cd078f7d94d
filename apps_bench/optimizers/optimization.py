"""One optimizer run, protocol first: splits and manifest, the method, val re-scoring,
the chosen PromptSet on disk. The caller (the CLI cell) supplies the pipeline pieces
and then runs the final eval cell with `prompts.yaml` (`topology.prompt_file=...`).

Order matters for fairness and resumption:
1. pool + disjoint splits + `manifest.json`, before any model call (a rerun must agree);
2. every rollout through `ProtocolEvaluator` (gate, paired seeds, cache, budget), every
   optimizer-model call through `CachedChat` (cache, budget), both logged to `events.jsonl`;
3. the method's own selection; then seed and chosen prompts scored on the whole val set
   (not charged to the optimizer budget; counted apart as `val_rescoring`);
4. `prompts.yaml` (the chosen PromptSet, loadable by a cell) and `result.json`.
A rerun with the same out_dir replays through the cache to the same result and the
same charged budget.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from apps_bench.config.schema import OptimizerConfig, PoolParams
from apps_bench.optimizers.cache import RolloutCache
from apps_bench.optimizers.methods import MethodRun, method_of
from apps_bench.optimizers.proposals import CachedChat, ChatFn
from apps_bench.optimizers.protocol import (
    Budget,
    EvalSet,
    EventHook,
    Pool,
    ScoringGate,
    Splits,
    build_pool,
    key_str,
    make_splits,
    manifest_dict,
    write_manifest,
)
from apps_bench.optimizers.scoring import EvalRecord, Objective, ProtocolEvaluator, Runner, objective
from apps_bench.topologies.base import PromptSet
from apps_bench.types import JsonObject, Problem, Verdict


class EventLog:
    """Append-only JSONL of everything an optimizer run does (candidates, evaluations,
    optimizer-model calls, steps), plus an optional hook (e.g. MLflow step metrics)."""

    def __init__(self, path: Path, hook: EventHook | None = None) -> None:
        self.path = path
        self.hook = hook
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        # a rerun (resume) appends a new attempt that replays the earlier ones through the cache:
        # readers take the last attempt as the run's complete log
        self.attempt = 1
        if path.exists():
            with open(path, encoding="utf-8", errors="replace") as fh:
                self.attempt += sum(1 for line in fh if '"kind": "start"' in line)

    def __call__(self, kind: str, payload: JsonObject) -> None:
        rec = {**payload, "t": round(time.time(), 3), "kind": kind, "attempt": self.attempt}
        line = json.dumps(rec, ensure_ascii=False, default=_jsonable)
        with self._lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        if self.hook is not None:
            self.hook(kind, dict(payload))


def _jsonable(obj: object) -> object:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    return str(obj)


@dataclass
class OptimizeResult:
    method: str
    chosen: dict[str, str]
    seed_val: Objective
    chosen_val: Objective
    budget: JsonObject
    val_rescoring: JsonObject
    stopped: str
    details: JsonObject = field(default_factory=dict)
    out_dir: str = ""

    @property
    def prompts_path(self) -> Path:
        return Path(self.out_dir) / "prompts.yaml"

    def to_json(self) -> JsonObject:
        d = asdict(self)
        d["seed_val"] = self.seed_val._asdict()
        d["chosen_val"] = self.chosen_val._asdict()
        return d


def write_prompt_set(path: Path, texts: Mapping[str, str]) -> Path:
    """A PromptSet file a cell loads with `topology.prompt_file=PATH` (YAML, literal blocks)."""
    import yaml  # noqa: PLC0415

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, data: str) -> Any:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)

    _Dumper.add_representer(str, _str)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.dump(dict(texts), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=10_000)
    if yaml.safe_load(text) != dict(texts):  # literal blocks cannot hold some texts (e.g. trailing spaces)
        text = yaml.safe_dump(dict(texts), sort_keys=False, allow_unicode=True, width=10_000)
    path.write_text(text, encoding="utf-8")
    return path


def pool_and_splits(
    problems: Sequence[Problem], eval_set: EvalSet, eval_problems: Sequence[Problem], pool_p: PoolParams
) -> tuple[EvalSet, Pool, Splits]:
    """The eval set with the questions of the eval rows among `problems` and `eval_problems`, the pool drawn
    from `problems` without them, and its train/val splits (ValueError, with the fix, when the pool is too small)."""
    eval_set = eval_set.with_questions([*problems, *eval_problems])
    pool = build_pool(problems, eval_set=eval_set, source=pool_p.source, difficulty=pool_p.difficulty)
    splits = make_splits(pool, train_size=pool_p.train_size, val_size=pool_p.val_size, split_seed=pool_p.split_seed)
    return eval_set, pool, splits


def optimize(
    *,
    optimizer: OptimizerConfig,
    flow: str,
    roles: Sequence[str],
    seed_prompts: PromptSet,
    problems: Sequence[Problem],
    dataset_revision: str,
    eval_set: EvalSet,
    runner: Runner,
    run_seed: int,
    model: JsonObject,
    settings: JsonObject,
    out_dir: Path | str,
    chat: ChatFn | None = None,
    optimizer_model: JsonObject | None = None,
    score_program: Callable[[Problem, str | None], Verdict] | None = None,
    extract_program: Callable[[str], str | None] | None = None,
    hook: EventHook | None = None,
    eval_problems: Sequence[Problem] = (),
) -> OptimizeResult:
    """Run one optimizer cell's optimization (see module doc). `problems`: loaded rows of
    the pool's split; eval rows are excluded by key and, for the eval rows found among
    `problems` and `eval_problems` (the final cell's rows), by question text."""
    method, params = optimizer.name, optimizer.params
    run_method = method_of(optimizer._target_, method)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = EventLog(out / "events.jsonl", hook)
    eval_set, pool, splits = pool_and_splits(problems, eval_set, eval_problems, params.pool)
    write_manifest(out / "manifest.json", manifest_dict(splits, pool, dataset_revision=dataset_revision, eval_set=eval_set))
    log("start", {"method": method, "train": [key_str(k) for k in splits.train], "val": [key_str(k) for k in splits.val]})

    cache = RolloutCache(out / "cache.sqlite")
    budget = Budget.of(params.budget)
    gate = ScoringGate(eval_set, splits)

    def on_eval(rec: EvalRecord) -> None:
        log("evaluation", {**asdict(rec), "keys": [key_str(k) for k in rec.keys], "rollouts_charged": budget.rollouts})

    retries = params.infra_retries
    evaluator = ProtocolEvaluator(
        runner, cache, budget, gate, run_seed, dict(model), dict(settings), on_evaluate=on_eval, infra_retries=retries
    )
    question_of = lambda key: pool.problems[tuple(key)].question  # noqa: E731 - statements only, never solutions
    cchat = None
    if chat is not None:
        cchat = CachedChat(chat, cache, dict(optimizer_model or model), budget, on_call=lambda c: log("optimizer_call", c))

    seed_texts = dict(seed_prompts.texts)
    optimized_roles = list(dict.fromkeys(roles))
    details: JsonObject = {
        "train": len(splits.train),
        "val": len(splits.val),
        "pool": len(pool.problems),
        "dropped": dict(pool.dropped),
        "roles": optimized_roles,
        "optimizer_model": dict(optimizer_model or model),
    }
    outcome = run_method(
        MethodRun(
            params=params,
            flow=flow,
            roles=optimized_roles,
            seed_texts=seed_texts,
            splits=splits,
            pool=pool,
            evaluator=evaluator,
            chat=cchat,
            budget=budget,
            question_of=question_of,
            score_program=score_program,
            extract_program=extract_program,
            out=out,
            log=log,
        )
    )
    chosen, stopped = outcome.chosen, outcome.stopped
    details.update(outcome.details)

    # val re-scoring of the seed and the chosen prompts: same cache and gate, its own uncapped budget
    val_budget = Budget()
    val_eval = ProtocolEvaluator(runner, cache, val_budget, gate, run_seed, dict(model), dict(settings), infra_retries=retries)
    # (the val step's metrics use the optimizer's final charged count as their step)
    seed_rs = val_eval.evaluate(PromptSet(seed_texts), list(splits.val))
    chosen_rs = val_eval.evaluate(PromptSet(dict(chosen)), list(splits.val))
    failed = {r.key for r in (*seed_rs, *chosen_rs) if r.error}  # left out on both sides: the comparison stays paired
    seed_val = objective([r for r in seed_rs if r.key not in failed])
    chosen_val = objective([r for r in chosen_rs if r.key not in failed])
    details["val_infra_errors"] = sorted(key_str(k) for k in failed)
    log(
        "val",
        {
            "seed": seed_val._asdict(),
            "chosen": chosen_val._asdict(),
            "rollouts_charged": budget.rollouts,
            "infra_errors": details["val_infra_errors"],
        },
    )

    write_prompt_set(out / "prompts.yaml", chosen)
    result = OptimizeResult(
        method, dict(chosen), seed_val, chosen_val, budget.to_json(), val_budget.to_json(), stopped, details, str(out)
    )
    (out / "result.json").write_text(json.dumps(result.to_json(), indent=2, default=_jsonable) + "\n", encoding="utf-8")
    log("done", {"stopped": stopped, "budget": budget.to_json()})
    cache.close()
    return result


def step_metrics(kind: str, payload: JsonObject) -> tuple[int, dict[str, float]] | None:
    """An event as MLflow step metrics `(step, {name: value})`, or None for events that are
    logs only. The step is the charged rollout count, so curves of every method share an x-axis.
    Use as `hook=lambda k, p: (m := step_metrics(k, p)) and mlflow.log_metrics(m[1], step=m[0])`."""
    step = int(payload.get("rollouts_charged", 0) or 0)
    if kind == "evaluation":
        return step, {
            "opt/eval_strict": float(payload["strict"]),
            "opt/eval_fraction": float(payload["fraction"]),
            "opt/rollouts_charged": float(step),
        }
    if kind == "maspo_step_done":
        m = {f"opt/best_score/{a}": float(s) for a, s in dict(payload.get("best_scores", {})).items()}
        return step, {**m, "opt/steps": float(payload.get("step", 0))}
    if kind == "gepa_candidate" and payload.get("average") is not None:
        return step, {"opt/candidate_val": float(payload["average"]), "opt/candidates": float(payload["idx"]) + 1}
    if kind == "val":
        return step, {
            "val/seed_strict": float(payload["seed"]["strict"]),
            "val/chosen_strict": float(payload["chosen"]["strict"]),
            "val/seed_fraction": float(payload["seed"]["fraction"]),
            "val/chosen_fraction": float(payload["chosen"]["fraction"]),
        }
    return None
