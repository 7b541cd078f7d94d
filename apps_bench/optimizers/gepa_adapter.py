"""GEPA over the pipeline: an adapter from `gepa` 0.1.x to the protocol's `Evaluator`.

The traps found when GEPA was probed, and what this module does about each:
- An adapter that is not a `GEPAAdapter` with `propose_new_texts` silently fails every
  reflection while spending budget: `PipelineAdapter` subclasses `GEPAAdapter` and
  implements `propose_new_texts` itself.
- The default proposer takes the text between the first and last ``` of the reply,
  which breaks on prompts containing code fences: the proposer here asks for tagged
  sections (`proposals.parse_tagged`); an unparsable reply proposes nothing for that
  role (GEPA then skips the child instead of evaluating a copy).
- The budget check runs between iterations (a budget of 80 used 83): the protocol's
  `Budget` is the authority; once exhausted, `evaluate` runs nothing more and returns
  placeholder zeros (flagged), and a stopper ends the loop at the next check, so the
  overshoot is the batch in flight at most.
- On resume GEPA re-scores the seed uncounted: every evaluation goes through the
  rollout cache, so that re-scoring is served from disk and charged nothing new.
- Val ids inside GEPA's state are positions 0..n-1: results are mapped back to problem
  keys (`GepaOutcome.val_scores`).
- An infrastructure failure (model calls failing after the client's retries, a sandbox
  failure) must not be scored: a 0 would count as a wrong answer and bias GEPA against
  the candidate that met it. GEPA has no neutral value (minibatch sums decide acceptance,
  per-problem val scores feed the Pareto front), so, unlike MASPO (a paired comparison,
  where such a problem is a tie), the protocol's evaluator first re-runs the failed
  rollouts (`infra_retries`) and a failure that remains stops the run with
  `InfrastructureDown`; the rerun resumes through the cache without paying twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from gepa.core.adapter import EvaluationBatch, GEPAAdapter
from gepa.core.result import GEPAResult

from apps_bench.config.schema import GepaParams
from apps_bench.optimizers.cache import Checkpoints, stable_hash
from apps_bench.optimizers.proposals import ChatReply, Message, parse_tagged, proposal_messages, role_examples
from apps_bench.optimizers.protocol import Budget, BudgetExhausted, EvalKeyError, EventHook, ProblemKey, make_key
from apps_bench.optimizers.scoring import PERFECT_SCORE, Evaluator, InfrastructureDown, Rollout, example_score
from apps_bench.topologies.base import PromptSet
from apps_bench.types import JsonObject

ReflectFn = Callable[[list[Message], int], ChatReply]  # the optimizer model (e.g. proposals.CachedChat)


# conf/optimizer/gepa.yaml's choices, as the literals gepa.optimize takes (config validation refuses any other)
CANDIDATE_SELECTIONS: dict[str, Literal["pareto", "current_best", "epsilon_greedy", "top_k_pareto"]] = {
    "pareto": "pareto",
    "current_best": "current_best",
    "epsilon_greedy": "epsilon_greedy",
    "top_k_pareto": "top_k_pareto",
}
ACCEPTANCES: dict[str, Literal["strict_improvement", "improvement_or_equal"]] = {
    "strict_improvement": "strict_improvement",
    "improvement_or_equal": "improvement_or_equal",
}


class PipelineAdapter(GEPAAdapter):
    """DataInst = ProblemKey; Trajectory = RolloutOutput = `Rollout`."""

    def __init__(
        self,
        evaluator: Evaluator,
        reflect: ReflectFn,
        *,
        budget: Budget | None = None,
        question_of: Callable[[ProblemKey], str] | None = None,
        n_traces: int = 5,
        seed: int = 0,
        on_proposal: Callable[[JsonObject], None] | None = None,
        base_prompts: Mapping[str, str] | None = None,
    ) -> None:
        self.evaluator = evaluator
        self.base_prompts = dict(base_prompts or {})  # roles not optimized (e.g. other team sizes) ride along
        self.reflect = reflect
        self.budget = budget
        self.question_of = question_of
        self.n_traces = n_traces
        self.seed = seed
        self.on_proposal = on_proposal
        self.budget_hit: str | None = None
        self.placeholder_evals = 0
        self.proposals = 0
        self.unparsable = 0

    # -- evaluation

    def _placeholder(self, key: ProblemKey, why: str) -> Rollout:
        return Rollout(key=key, seed=0, error=why)

    def _evaluate_keys(self, ps: PromptSet, keys: list[ProblemKey]) -> list[Rollout]:
        try:
            return list(self.evaluator.evaluate(ps, keys, capture_traces=True))
        except (BudgetExhausted, EvalKeyError, InfrastructureDown):
            raise
        except Exception:  # noqa: BLE001 - isolate the problem that failed; never raise per problem
            out: list[Rollout] = []
            for k in keys:
                try:
                    out.extend(self.evaluator.evaluate(ps, [k], capture_traces=True))
                except (BudgetExhausted, EvalKeyError, InfrastructureDown):
                    raise
                except Exception as exc:  # noqa: BLE001 - one key's failure becomes its placeholder rollout; the run-stopping errors are re-raised above
                    out.append(self._placeholder(k, f"{type(exc).__name__}: {exc}"))
            return out

    def evaluate(self, batch: list[ProblemKey], candidate: dict[str, str], capture_traces: bool = False) -> EvaluationBatch:
        keys = [make_key(*k) for k in batch]
        ps = PromptSet({**self.base_prompts, **candidate})
        before = self.budget.rollouts if self.budget else None
        try:
            rollouts = self._evaluate_keys(ps, keys) if self.budget_hit is None else None
        except BudgetExhausted as exc:
            self.budget_hit = str(exc)
            rollouts = None
        if rollouts is None:  # the cap is reached: run nothing more (zeros GEPA never selects: the run stops next check)
            self.placeholder_evals += 1
            rollouts = [self._placeholder(k, "budget exhausted: not run") for k in keys]
        else:
            failed = [r for r in rollouts if r.error]
            if failed:
                raise InfrastructureDown(
                    f"{len(failed)} of {len(keys)} rollouts failed for infrastructure reasons after retries, e.g. "
                    f"{failed[0].key[0]}/{failed[0].key[1]}: {failed[0].error!r}. GEPA cannot leave a problem out of "
                    "its scores and a 0 would count as a wrong answer, so the run stops; fix the endpoint/sandbox "
                    "(or raise optimizer.params.infra_retries) and rerun: finished rollouts come from the cache"
                )
        scores = [0.0 if r.error else example_score(r) for r in rollouts]
        charged = (self.budget.rollouts - before) if self.budget is not None and before is not None else None
        return EvaluationBatch(
            outputs=rollouts,
            scores=scores,
            trajectories=rollouts if capture_traces else None,
            num_metric_calls=charged,
        )

    # -- reflection

    def make_reflective_dataset(
        self, candidate: dict[str, str], eval_batch: EvaluationBatch, components_to_update: list[str]
    ) -> dict[str, list[JsonObject]]:
        rollouts = [r for r in (eval_batch.trajectories or []) if isinstance(r, Rollout)]
        out: dict[str, list[JsonObject]] = {}
        for role in components_to_update:
            out[role] = [
                {
                    "Inputs": {"problem": ex["problem"], "agent_input": ex["agent_input"]},
                    "Generated Outputs": ex["agent_output"],
                    "Tool calls": ex["tool_calls"],
                    "Feedback": ex["feedback"],
                }
                for ex in role_examples(role, rollouts, self.question_of, self.n_traces)
            ]
        return out

    def propose_new_texts(
        self,
        candidate: dict[str, str],
        reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],  # GEPA's signature
        components_to_update: list[str],
    ) -> dict[str, str]:
        new: dict[str, str] = {}
        for role in components_to_update:
            examples = [
                {
                    "problem": r.get("Inputs", {}).get("problem", ""),
                    "agent_input": r.get("Inputs", {}).get("agent_input", ""),
                    "agent_output": r.get("Generated Outputs", ""),
                    "tool_calls": r.get("Tool calls", []),
                    "feedback": r.get("Feedback", ""),
                }
                for r in reflective_dataset.get(role, ())
            ]
            self.proposals += 1
            # a fresh request seed per reflection, reproducible on replay (GEPA's sequence is seeded)
            seed = int(stable_hash({"seed": self.seed, "role": role, "call": self.proposals})[:7], 16)
            reply = self.reflect(proposal_messages(role, candidate[role], examples), seed)
            tp = parse_tagged(reply.text)
            child = tp.prompt if tp is not None and tp.prompt != candidate[role] else None
            ok = child is not None
            if child is None:
                self.unparsable += 1
            else:
                new[role] = child
            if self.on_proposal is not None:
                self.on_proposal({"role": role, "parent": candidate, "reply": reply.text, "parsed": ok, "child_text": child})
        return new

    # -- GEPA run_dir persistence (optional hooks GEPA calls by duck typing)

    def get_adapter_state(self) -> JsonObject:
        state = getattr(self.evaluator, "state", None)
        return {"evaluator": state() if callable(state) else None, "budget_hit": self.budget_hit, "proposals": self.proposals}

    def set_adapter_state(self, state: JsonObject) -> None:
        restore = getattr(self.evaluator, "restore", None)
        if callable(restore) and state.get("evaluator"):
            restore(state["evaluator"])
        self.budget_hit = state.get("budget_hit")
        self.proposals = int(state.get("proposals", self.proposals))


class BudgetStopper:
    """GEPA stop callback: the protocol budget is exhausted, or nothing new was charged
    for `stall_iterations` checks in a row (every proposal failing on cached batches)."""

    def __init__(self, budget: Budget, adapter: PipelineAdapter, stall_iterations: int = 20) -> None:
        self.budget = budget
        self.adapter = adapter
        self.stall_iterations = stall_iterations
        self._last: tuple[int, int] | None = None
        self._stalled = 0
        self.reason: str | None = None

    def __call__(self, gepa_state: Any) -> bool:
        if self.adapter.budget_hit or self.budget.exhausted:
            self.reason = "budget"
            return True
        now = (self.budget.rollouts, self.budget.optimizer_calls)
        self._stalled = self._stalled + 1 if now == self._last else 0
        self._last = now
        if self._stalled >= self.stall_iterations:
            self.reason = "stalled"
            return True
        return False


class _EventBridge:
    """GEPA callbacks -> the run's event log: every candidate (parents, changed roles,
    texts, val scores by problem key) and every iteration's outcome."""

    def __init__(
        self, emit: EventHook, val: Sequence[ProblemKey], budget: Budget, checkpoints: Checkpoints | None = None
    ) -> None:
        self.emit = emit
        self.val = list(val)
        self.budget = budget
        self.checkpoints = checkpoints
        self.seen: dict[int, dict[str, str]] = {}

    def on_valset_evaluated(self, event: JsonObject) -> None:
        idx = int(event["candidate_idx"])
        cand = dict(event["candidate"])
        self.seen[idx] = cand
        parents = [p for p in event.get("parent_ids") or () if p is not None]
        base = self.seen.get(parents[0], {}) if parents else {}
        self.emit(
            "gepa_candidate",
            {
                "idx": idx,
                "parents": parents,
                "iteration": event.get("iteration"),
                "changed_roles": sorted(r for r in cand if base and base.get(r) != cand[r]),
                "texts": cand,
                "average": event.get("average_score"),
                "scores": {f"{self.val[int(i)][0]}/{self.val[int(i)][1]}": s for i, s in event["scores_by_val_id"].items()},
                "rollouts_charged": self.budget.rollouts,
            },
        )

    def on_iteration_end(self, event: JsonObject) -> None:
        self.emit(
            "gepa_iteration",
            {
                "iteration": event.get("iteration"),
                "accepted": event.get("proposal_accepted"),
                "rollouts_charged": self.budget.rollouts,
            },
        )
        state = event.get("state")
        if self.checkpoints is not None and state is not None:
            self.checkpoints.save(
                int(event.get("iteration") or 0),
                {
                    "candidates": [dict(c) for c in state.program_candidates],
                    "parents": [list(p) for p in state.parent_program_for_candidate],
                    "val_scores": [float(x) for x in state.program_full_scores_val_set],
                    "budget": self.budget.to_json(),
                },
            )


class _ListLogger:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(str(message))


@dataclass
class GepaOutcome:
    best: dict[str, str]
    best_idx: int
    candidates: list[dict[str, str]]
    parents: list[list[int | None]]
    val_aggregate: list[float]
    val_scores: list[dict[ProblemKey, float]]  # per candidate, by problem key (not GEPA's positions)
    stopped: str
    budget: JsonObject
    placeholder_evals: int
    proposals: int
    unparsable: int
    log: list[str] = field(default_factory=list)


def run_gepa(
    seed_prompts: Mapping[str, str],
    train_keys: Sequence[ProblemKey],
    val_keys: Sequence[ProblemKey],
    evaluator: Evaluator,
    reflect: ReflectFn,
    *,
    budget: Budget,
    cfg: GepaParams,
    question_of: Callable[[ProblemKey], str] | None = None,
    run_dir: str | None = None,
    callbacks: list[Any] | None = None,
    base_prompts: Mapping[str, str] | None = None,
    on_event: EventHook | None = None,
    checkpoints: Checkpoints | None = None,
) -> GepaOutcome:
    """Optimize `seed_prompts` with `gepa.optimize`; the protocol budget decides when to stop."""
    import gepa  # noqa: PLC0415

    train = [make_key(*k) for k in train_keys]
    val = [make_key(*k) for k in val_keys]
    adapter = PipelineAdapter(
        evaluator,
        reflect,
        budget=budget,
        question_of=question_of,
        n_traces=cfg.n_traces,
        seed=cfg.seed,
        base_prompts=base_prompts,
        on_proposal=(lambda p: on_event("gepa_proposal", p)) if on_event else None,
    )
    bridge = _EventBridge(on_event or (lambda k, p: None), val, budget, checkpoints) if (on_event or checkpoints) else None
    stopper = BudgetStopper(budget, adapter, cfg.stall_iterations)
    logger = _ListLogger()
    result: GEPAResult[Rollout, int] = gepa.optimize(
        seed_candidate=dict(seed_prompts),
        trainset=train,
        valset=val,
        adapter=adapter,
        candidate_selection_strategy=CANDIDATE_SELECTIONS[cfg.candidate_selection],
        reflection_minibatch_size=cfg.minibatch,
        perfect_score=PERFECT_SCORE,
        skip_perfect_score=True,
        module_selector=cfg.component_selection,
        use_merge=cfg.use_merge,
        stop_callbacks=[stopper],
        logger=logger,
        run_dir=run_dir,
        callbacks=(list(callbacks or []) + ([bridge] if bridge else [])) or None,
        seed=cfg.seed,
        raise_on_exception=True,
        acceptance_criterion=ACCEPTANCES[cfg.acceptance],
        display_progress_bar=False,
    )
    val_scores = [{val[int(pos)]: float(s) for pos, s in sub.items()} for sub in result.val_subscores]
    return GepaOutcome(
        best=dict(result.candidates[result.best_idx]),  # best_candidate, as the dict it is for a dict seed
        best_idx=result.best_idx,
        candidates=[dict(c) for c in result.candidates],
        parents=[list(p) for p in result.parents],
        val_aggregate=list(result.val_aggregate_scores),
        val_scores=val_scores,
        stopped=stopper.reason or "done",
        budget=budget.to_json(),
        placeholder_evals=adapter.placeholder_evals,
        proposals=adapter.proposals,
        unparsable=adapter.unparsable,
        log=logger.lines,
    )
