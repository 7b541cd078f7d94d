"""MASPO: joint prompt optimization for a multi-agent system by coordinate ascent.

The algorithm works on an abstract agent graph and three callables, so its update rules
are unit-tested with a synthetic world and the real pipeline plugs in unchanged:

- `system.run(prompts, keys) -> [Rollout]`: run the whole system with a prompt map;
- `system.compare(agent, parent, child, keys, parent_rollouts) -> Comparison`: run the
  child (only `agent` and what follows it where the flow allows, else whole) on the same
  problems and return per-problem wins of the child over the parent: local (this agent's
  output), lookahead (its immediate successors' outputs; the final output when it has
  none) and global (the final program);
- `propose(agent, prompt, rollouts) -> [texts]`: the optimizer model's variations.

Update rules, stated here exactly because tests pin them:

- Rounds 0..D-1; in each, agents in topological order; each agent gets T steps with
  the others held at their current best (the shared prompt map).
- Agent state: a beam of at most K nodes (prompt text, cumulative score); it starts as
  [(seed prompt, 0.0)], and the agent's best score starts at 0.0.
- One step, for each beam node in beam order: draw a minibatch (hard cases mined for
  the agent's predecessors first, then a uniform draw from the train keys), run the
  system with the node's prompt, ask for Ksub children; for each child,
  reward = w_local*local + w_lookahead*lookahead + w_global*global (win rates),
  score = parent score + reward - 0.5. A child wins when reward > 0.5 and enters the
  candidates with that score; otherwise a copy of its parent (text and parent score)
  takes its place. A node with no proposals is carried as a copy.
  A winning child whose score beats the agent's best score is written into the shared
  prompt map at once. New beam = the top K candidates by score, deduplicated by text
  (ties keep candidate order).
- Misalignment mining: a problem where the child wins locally (local = 1) but loses
  downstream (lookahead = 0 or global = 0) is kept for the agent (the 3 most recent,
  distinct), and injected first into its successors' minibatches.
- Beam refresh: when an agent is revisited (round >= 1), before its steps, each beam
  node other than the current best is compared against the best on a fresh draw:
  score = 0.7*local + 0.3*global - 0.5; the best is re-anchored at 0.0; the beam is the
  top K of these; the agent's best score becomes the top node's score, and if that node
  is not the current best it is written into the prompt map.
- Budget: `plan()` lowers D, then T, then the minibatch until the estimated rollouts
  fit; at run time a `BudgetExhausted` from any callable ends the run with the prompts
  written so far (`stopped = "budget"`).
- Resume: every evaluation and proposal goes through caches, so a rerun after a kill
  replays to the same result; a checkpoint is written after every step for the logs.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Protocol, Sequence

from apps_bench.config.schema import MaspoParams
from apps_bench.optimizers.cache import Checkpoints
from apps_bench.optimizers.protocol import Budget, BudgetExhausted, ProblemKey
from apps_bench.optimizers.scoring import Rollout
from apps_bench.types import JsonObject

# a step of the schedule: ("refresh", round, agent) or ("step", round, agent, t)
Visit = tuple[str, int, str] | tuple[str, int, str, int]

# --------------------------------------------------------------------------- graph


@dataclass(frozen=True)
class AgentGraph:
    """Agents (roles whose prompts are optimized) in topological order, and edges.

    An edge may point to a node that is not an agent (e.g. "vote"): it has no prompt,
    and for lookahead purposes it stands for the final output.
    """

    agents: tuple[str, ...]
    edges: tuple[tuple[str, str], ...] = ()
    partial_rerun: bool = True  # False: comparisons re-run the whole system (cyclic or hub flows)
    flow: str = ""

    def __post_init__(self) -> None:
        if not self.agents:
            raise ValueError("an agent graph needs at least one agent")
        if len(set(self.agents)) != len(self.agents):
            raise ValueError(f"agents must be distinct, got {self.agents}")
        pos = {a: i for i, a in enumerate(self.agents)}
        for u, v in self.edges:
            if u not in pos:
                raise ValueError(f"edge {u}->{v} starts at {u!r}, which is not an agent of {self.agents}")
            if v in pos and pos[v] <= pos[u]:
                raise ValueError(f"edge {u}->{v} goes backwards: agents must be listed in topological order")

    def predecessors(self, agent: str) -> tuple[str, ...]:
        return tuple(u for u, v in self.edges if v == agent)

    def successors(self, agent: str) -> tuple[str, ...]:
        return tuple(v for u, v in self.edges if u == agent)

    def rerun_from(self, agent: str) -> tuple[str, ...]:
        """Agents a child comparison re-runs: the agent and its descendants, or all."""
        if not self.partial_rerun:
            return self.agents
        seen, todo = {agent}, [agent]
        while todo:
            for v in self.successors(todo.pop()):
                if v in self.agents and v not in seen:
                    seen.add(v)
                    todo.append(v)
        return tuple(a for a in self.agents if a in seen)


def graph_for(flow: str, roles: Sequence[str], *, manager: str = "manager") -> AgentGraph:
    """The MASPO graph of a topology flow, from its ordered role list.

    single: one agent; sequential: the chain (partial re-runs); independent and
    decentralized: the shared role(s), each feeding the vote (whole re-runs);
    centralized: the workers as predecessors of the manager (whole re-runs).
    """
    distinct = tuple(dict.fromkeys(roles))
    if not distinct:
        raise ValueError(f"flow {flow!r} has no roles; check roles_by_size in the topology config")
    if flow == "single":
        if len(distinct) != 1:
            raise ValueError(f"a single flow has one role, got {distinct}")
        return AgentGraph(distinct, (), True, flow)
    if flow == "sequential":
        return AgentGraph(distinct, tuple(zip(distinct, distinct[1:])), True, flow)
    if flow in ("independent", "decentralized"):
        return AgentGraph(distinct, tuple((r, "vote") for r in distinct), False, flow)
    if flow == "centralized":
        if manager not in distinct:
            raise ValueError(f"a centralized flow needs a {manager!r} role, got {distinct}")
        workers = tuple(r for r in distinct if r != manager)
        return AgentGraph(workers + (manager,), tuple((w, manager) for w in workers), False, flow)
    raise ValueError(f"unknown flow {flow!r}; expected single, sequential, independent, decentralized or centralized")


# --------------------------------------------------------------------------- comparisons


@dataclass(frozen=True)
class ProblemComparison:
    """Child vs parent on one problem: 1 = child wins, 0 = loses, 0.5 = tie."""

    key: ProblemKey
    local: float
    lookahead: float
    global_: float


@dataclass(frozen=True)
class Comparison:
    per_problem: tuple[ProblemComparison, ...]

    def _mean(self, attr: str) -> float:
        return sum(getattr(p, attr) for p in self.per_problem) / len(self.per_problem) if self.per_problem else 0.5

    @property
    def local(self) -> float:
        return self._mean("local")

    @property
    def lookahead(self) -> float:
        return self._mean("lookahead")

    @property
    def global_(self) -> float:
        return self._mean("global_")

    def misaligned(self) -> list[ProblemKey]:
        """Problems where the child wins locally but loses downstream."""
        return [p.key for p in self.per_problem if p.local == 1.0 and (p.lookahead == 0.0 or p.global_ == 0.0)]


class MaspoSystem(Protocol):
    def run(self, prompts: Mapping[str, str], keys: Sequence[ProblemKey]) -> list[Rollout]: ...

    def compare(
        self,
        agent: str,
        parent: Mapping[str, str],
        child: Mapping[str, str],
        keys: Sequence[ProblemKey],
        parent_rollouts: Sequence[Rollout],
    ) -> Comparison: ...


ProposeFn = Callable[[str, str, Sequence[Rollout]], list[str]]


# --------------------------------------------------------------------------- config and plan


@dataclass(frozen=True)
class MaspoConfig:
    """The search's settings, read from `optimizer.params` (MaspoParams: conf/optimizer/maspo.yaml holds their values)."""

    K: int  # beam width
    Ksub: int  # children per node per step
    T: int  # steps per agent per round
    D: int  # rounds
    minibatch: int
    w_local: float
    w_lookahead: float
    w_global: float
    refresh_local: float
    refresh_global: float
    hard_cases: int  # mined cases kept per agent
    seed: int

    @classmethod
    def of(cls, p: MaspoParams) -> MaspoConfig:
        out = cls(
            K=p.K,
            Ksub=p.Ksub,
            T=p.T,
            D=p.D,
            minibatch=p.minibatch,
            w_local=p.reward["local"],
            w_lookahead=p.reward["lookahead"],
            w_global=p.reward["global"],
            refresh_local=p.refresh["local"],
            refresh_global=p.refresh["global"],
            hard_cases=p.hard_cases,
            seed=p.seed,
        )
        out.validate()
        return out

    def validate(self) -> None:
        for name in ("K", "Ksub", "T", "D", "minibatch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"maspo.{name} must be >= 1, got {getattr(self, name)}")
        if self.hard_cases < 0:
            raise ValueError(f"maspo.hard_cases must be >= 0, got {self.hard_cases}")
        w = self.w_local + self.w_lookahead + self.w_global
        if abs(w - 1.0) > 1e-9:
            raise ValueError(f"maspo reward weights must sum to 1 (got {w}); the win threshold is 0.5")


@dataclass(frozen=True)
class Plan:
    D: int
    T: int
    minibatch: int
    estimated_rollouts: int
    reductions: tuple[str, ...] = ()
    fits: bool = True


def estimate_rollouts(n_agents: int, cfg: MaspoConfig, D: int, T: int, mb: int) -> int:
    """Upper bound: per step and beam node, one run plus Ksub child runs on the minibatch
    (the very first step of an agent has a one-node beam, later steps at most K nodes);
    per revisit, one run of the best plus K-1 comparisons on a fresh minibatch."""
    steps = (1 + (D * T - 1) * cfg.K) * mb * (1 + cfg.Ksub)
    refresh = (D - 1) * cfg.K * mb
    return n_agents * (steps + refresh)


def plan(n_agents: int, cfg: MaspoConfig, budget_rollouts: int | None) -> Plan:
    """Fit the schedule to the rollout budget: lower D, then T, then the minibatch."""
    D, T, mb = cfg.D, cfg.T, cfg.minibatch
    est = estimate_rollouts(n_agents, cfg, D, T, mb)
    if budget_rollouts is None:
        return Plan(D, T, mb, est)
    reductions: list[str] = []
    while est > budget_rollouts:
        if D > 1:
            D -= 1
            reductions.append(f"D={D}")
        elif T > 1:
            T -= 1
            reductions.append(f"T={T}")
        elif mb > 1:
            mb -= 1
            reductions.append(f"minibatch={mb}")
        else:
            break
        est = estimate_rollouts(n_agents, cfg, D, T, mb)
    return Plan(D, T, mb, est, tuple(reductions), est <= budget_rollouts)


# --------------------------------------------------------------------------- the search


@dataclass
class Node:
    text: str
    score: float


@dataclass
class MaspoResult:
    prompts: dict[str, str]
    best_scores: dict[str, float]
    beams: dict[str, list[Node]]
    hard_cases: dict[str, list[ProblemKey]]
    plan: Plan
    visits: list[Visit]
    events: list[JsonObject]
    steps_done: int
    stopped: str  # "done" | "budget"


def top_k(candidates: Sequence[Node], k: int) -> list[Node]:
    """Top k by score, deduplicated by text (first occurrence in score order wins)."""
    order = sorted(range(len(candidates)), key=lambda i: (-candidates[i].score, i))
    out: list[Node] = []
    seen: set[str] = set()
    for i in order:
        n = candidates[i]
        if n.text in seen:
            continue
        seen.add(n.text)
        out.append(Node(n.text, n.score))
        if len(out) == k:
            break
    return out


class Maspo:
    def __init__(
        self,
        graph: AgentGraph,
        seed_prompts: Mapping[str, str],
        system: MaspoSystem,
        propose: ProposeFn,
        train_keys: Sequence[ProblemKey],
        cfg: MaspoConfig,
        *,
        budget: Budget | None = None,
        checkpoints: Checkpoints | None = None,
        on_event: Callable[[JsonObject], None] | None = None,
    ) -> None:
        missing = [a for a in graph.agents if a not in seed_prompts]
        if missing:
            raise ValueError(f"seed prompts lack agents {missing}; the prompt set has {sorted(seed_prompts)}")
        cfg.validate()
        self.graph = graph
        self.system = system
        self.propose = propose
        self.pool: list[ProblemKey] = list(dict.fromkeys((k[0], k[1]) for k in train_keys))
        self.cfg = cfg
        self.budget = budget
        self.checkpoints = checkpoints
        self.on_event = on_event
        self.plan = plan(len(graph.agents), cfg, budget.max_rollouts if budget else None)
        if self.plan.minibatch > len(self.pool):
            raise ValueError(f"minibatch {self.plan.minibatch} exceeds the {len(self.pool)} training problems")
        self.rng = random.Random(cfg.seed)
        self.prompts: dict[str, str] = dict(seed_prompts)
        self.beams: dict[str, list[Node]] = {a: [Node(seed_prompts[a], 0.0)] for a in graph.agents}
        self.best_score: dict[str, float] = {a: 0.0 for a in graph.agents}
        self.hard: dict[str, list[ProblemKey]] = {a: [] for a in graph.agents}
        self.visits: list[Visit] = []
        self.events: list[JsonObject] = []
        self.steps_done = 0

    # -- helpers

    def _emit(self, **event: object) -> None:
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def _with(self, agent: str, text: str) -> dict[str, str]:
        return {**self.prompts, agent: text}

    def draw_minibatch(self, agent: str, *, inject: bool = True) -> list[ProblemKey]:
        mb = self.plan.minibatch
        injected: list[ProblemKey] = []
        if inject:
            for p in self.graph.predecessors(agent):
                for k in self.hard.get(p, ()):
                    if k not in injected and len(injected) < mb:
                        injected.append(k)
        rest = [k for k in self.pool if k not in injected]
        return injected + self.rng.sample(rest, mb - len(injected))

    def _mine(self, agent: str, keys: Sequence[ProblemKey]) -> None:
        if self.cfg.hard_cases == 0:
            return
        kept = self.hard[agent]
        for k in keys:
            if k in kept:
                kept.remove(k)
            kept.append(k)
        del kept[: max(0, len(kept) - self.cfg.hard_cases)]

    def _set_best(self, agent: str, text: str, score: float, why: str) -> None:
        self.best_score[agent] = score
        if self.prompts[agent] != text:
            self.prompts[agent] = text
            self._emit(kind="best", agent=agent, score=score, text=text, why=why)

    # -- one step and one refresh

    def step(self, agent: str) -> None:
        c = self.cfg
        candidates: list[Node] = []
        for node in list(self.beams[agent]):
            keys = self.draw_minibatch(agent)
            parent = self._with(agent, node.text)
            parent_rollouts = self.system.run(parent, keys)
            texts = list(self.propose(agent, node.text, parent_rollouts))[: c.Ksub]
            if not texts:
                candidates.append(Node(node.text, node.score))
                self._emit(kind="no_proposal", agent=agent, parent=node.text)
                continue
            for text in texts:
                cmp = self.system.compare(agent, parent, self._with(agent, text), keys, parent_rollouts)
                reward = c.w_local * cmp.local + c.w_lookahead * cmp.lookahead + c.w_global * cmp.global_
                score = node.score + reward - 0.5
                won = reward > 0.5
                mined = cmp.misaligned()
                self._mine(agent, mined)
                self._emit(
                    kind="child",
                    agent=agent,
                    parent=node.text,
                    child=text,
                    keys=list(keys),
                    local=cmp.local,
                    lookahead=cmp.lookahead,
                    global_=cmp.global_,
                    reward=reward,
                    score=score,
                    won=won,
                    mined=mined,
                )
                if won:
                    candidates.append(Node(text, score))
                    if score > self.best_score[agent]:
                        self._set_best(agent, text, score, "step")
                else:
                    candidates.append(Node(node.text, node.score))
        self.beams[agent] = top_k(candidates, c.K)

    def refresh(self, agent: str) -> None:
        c = self.cfg
        best = self.prompts[agent]
        others = [n for n in self.beams[agent] if n.text != best]
        rescored = [Node(best, 0.0)]
        if others:
            keys = self.draw_minibatch(agent, inject=False)
            best_rollouts = self.system.run(dict(self.prompts), keys)
            for n in others:
                cmp = self.system.compare(agent, dict(self.prompts), self._with(agent, n.text), keys, best_rollouts)
                s = c.refresh_local * cmp.local + c.refresh_global * cmp.global_ - 0.5
                rescored.append(Node(n.text, s))
                self._emit(
                    kind="refresh", agent=agent, text=n.text, keys=list(keys), local=cmp.local, global_=cmp.global_, score=s
                )
        self.beams[agent] = top_k(rescored, c.K)
        top = self.beams[agent][0]
        self.best_score[agent] = top.score
        self._set_best(agent, top.text, top.score, "refresh")

    # -- the schedule

    def schedule(self) -> list[Visit]:
        items: list[Visit] = []
        for r in range(self.plan.D):
            for a in self.graph.agents:
                if r >= 1:
                    items.append(("refresh", r, a))
                for t in range(self.plan.T):
                    items.append(("step", r, a, t))
        return items

    def run(self) -> MaspoResult:
        stopped = "done"
        self._emit(kind="plan", **asdict(self.plan))
        for item in self.schedule():
            try:
                if item[0] == "refresh":
                    self.refresh(item[2])
                else:
                    self.step(item[2])
            except BudgetExhausted as exc:
                stopped = "budget"
                self._emit(kind="stopped", reason=str(exc), at=list(item))
                break
            self.visits.append(item)
            self.steps_done += 1
            self._checkpoint(item)
            self._emit(
                kind="step_done",
                step=self.steps_done,
                item=list(item),
                best_scores=dict(self.best_score),
                rollouts_charged=self.budget.rollouts if self.budget else 0,
            )
        return MaspoResult(
            prompts=dict(self.prompts),
            best_scores=dict(self.best_score),
            beams={a: [Node(n.text, n.score) for n in b] for a, b in self.beams.items()},
            hard_cases={a: list(h) for a, h in self.hard.items()},
            plan=self.plan,
            visits=list(self.visits),
            events=list(self.events),
            steps_done=self.steps_done,
            stopped=stopped,
        )

    def state(self) -> JsonObject:
        return {
            "prompts": dict(self.prompts),
            "best_scores": dict(self.best_score),
            "beams": {a: [asdict(n) for n in b] for a, b in self.beams.items()},
            "hard_cases": {a: [list(k) for k in h] for a, h in self.hard.items()},
            "budget": self.budget.to_json() if self.budget else None,
        }

    def _checkpoint(self, item: Visit) -> None:
        if self.checkpoints is not None:
            self.checkpoints.save(self.steps_done, {"item": list(item), **self.state()})
