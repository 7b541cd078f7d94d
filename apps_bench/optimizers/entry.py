"""From a composed optimizer cell to a chosen PromptSet: what the CLI calls for
`optimizer=maspo|gepa`, before it runs the final eval cell with the chosen prompts.

`run_optimizer(cfg)` loads the pool (the train split by default) and runs `run.optimize` on
the cell's engine (cell/engine.py: the task model's endpoint, the sandbox, the judge and the solver
processes, with the eval cell's own settings; the optimizer cell passes its own, which then
evaluates the chosen prompts), behind the replay proxy, with the optimizer model
(`optimizer.params.optimizer_model`, default the task model). MLflow logging and the final
cell are the caller's (`hook` receives every event for step metrics).
"""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from apps_bench.cell.engine import Engine, fork_solvers
from apps_bench.config.schema import (
    CONF_DIR,
    Config,
    DatasetConfig,
    ModelConfig,
    PoolParams,
    as_plain,
    compose,
    typed,
    typed_config,
)
from apps_bench.config.validate import pool_problems
from apps_bench.data import LoadResult, eval_ids, load_problems
from apps_bench.models import open_endpoint
from apps_bench.optimizers.cache import RolloutCache
from apps_bench.optimizers.chat import EndpointChat
from apps_bench.optimizers.optimization import OptimizeResult, optimize
from apps_bench.optimizers.protocol import EventHook, load_eval_set
from apps_bench.optimizers.replay import ReplayProxy
from apps_bench.optimizers.runner import PipelineRunner
from apps_bench.topologies.prompts import load_prompts, roles_for
from apps_bench.types import Problem

if TYPE_CHECKING:  # pragma: no cover
    from omegaconf import DictConfig


def pool_dataset_config(dataset_cfg: DatasetConfig, pool: PoolParams) -> DatasetConfig:
    """The dataset the pool is drawn from: the cell's dataset at the pool's split.

    source=train reads the train split (hub, same repo and revision) or `pool.path` (a
    local codeparrot-schema train file); source=test_minus_eval reads the cell's own
    test-split dataset.
    """
    bad = pool_problems(dataset_cfg, pool)
    if bad:
        raise ValueError(bad[0].line())
    if pool.source == "test_minus_eval":
        return dataclasses.replace(dataset_cfg, split="test", streaming=False)  # the whole split is needed
    if pool.path:
        return dataclasses.replace(
            dataset_cfg, split="train", name=f"{dataset_cfg.name}_train", path=pool.path, source="file", streaming=False
        )
    return dataclasses.replace(dataset_cfg, split="train", name=f"{dataset_cfg.name}_train", streaming=False)


def optimizer_model_config(value: Any, task_model: ModelConfig) -> ModelConfig:
    """The optimizer model's config: null = the task model; a name = the preset `model=<name>` composes;
    a mapping = overrides on top of `model=<mapping.name>` (or, without a name, a complete model config)."""
    from hydra.errors import MissingConfigException  # noqa: PLC0415
    from omegaconf import OmegaConf  # noqa: PLC0415

    if value is None or value == "" or value == {}:
        return task_model
    value = as_plain(value)
    if isinstance(value, str):
        name, over = value, {}
    elif isinstance(value, Mapping):
        name, over = str(value.get("name", "")), dict(value)
    else:
        raise ValueError(f"optimizer.params.optimizer_model must be null, a model name or a mapping, got {value!r}")
    try:
        base: Any = compose([f"model={name}"]).model if name else {}
    except MissingConfigException:
        known = sorted(p.stem for p in (Path(CONF_DIR) / "model").glob("*.yaml"))
        raise ValueError(f"optimizer.params.optimizer_model={name!r}: no conf/model/{name}.yaml; choose one of {known}") from None
    try:
        return typed(ModelConfig, OmegaConf.merge(OmegaConf.structured(ModelConfig), base, over))
    except Exception as exc:  # noqa: BLE001 - OmegaConf's error names the key
        raise ValueError(f"optimizer.params.optimizer_model={value!r} is not a complete model config: {exc}") from exc


@dataclass(frozen=True)
class OptimizerPool:
    """The problems an optimizer trains on (`loaded`: the pool's split) and the eval cell's rows it must never see."""

    loaded: LoadResult
    eval_rows: list[Problem]

    @property
    def problems(self) -> list[Problem]:
        return list(self.loaded.problems)


def load_pool(cfg: Config) -> OptimizerPool:
    """The pool of `cfg`'s optimizer (ValueError: bad pool settings, with the fix)."""
    pool_p = cfg.optimizer.params.pool
    pool_ds = pool_dataset_config(cfg.dataset, pool_p)
    loaded = load_problems(pool_ds, difficulty=pool_p.difficulty, max_tests_per_row=cfg.max_tests_per_row)
    eval_rows = load_problems(cfg.dataset, only=eval_ids(), max_tests_per_row=cfg.max_tests_per_row).problems
    return OptimizerPool(loaded=loaded, eval_rows=list(eval_rows))


def run_optimizer(
    cfg: Config | DictConfig,
    *,
    out_dir: Path | str,
    hook: EventHook | None = None,
    engine: Engine | None = None,
    pool: OptimizerPool | None = None,
) -> OptimizeResult:
    """Optimize `cfg`'s prompts on its pool, on `engine` (the cell's; default: one opened here for the pool)."""
    cfg = typed_config(cfg)
    pool = pool or load_pool(cfg)
    with _engine_for(cfg, pool, engine) as open_engine:
        return _optimize_on(open_engine, cfg, pool, out_dir=out_dir, hook=hook)


def _engine_for(cfg: Config, pool: OptimizerPool, engine: Engine | None) -> AbstractContextManager[Engine]:
    """`engine` when given (the caller's: left open), else one of the pool's own, opened now and closed after."""
    if engine is not None:
        return nullcontext(engine)
    return Engine.open(cfg, pool.problems, forked=fork_solvers(cfg, len(pool.problems)))


def _optimize_on(
    engine: Engine, cfg: Config, pool: OptimizerPool, *, out_dir: Path | str, hook: EventHook | None
) -> OptimizeResult:
    """`run_optimizer`'s work, on an open engine."""
    method = cfg.optimizer.name
    params = cfg.optimizer.params
    problems = {p.key: p for p in pool.problems}
    with ExitStack() as stack:
        proxy, replay_url = None, None
        if params.replay:  # partial re-runs: identical model requests are answered from the run's cache
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            replay_cache = stack.enter_context(RolloutCache(Path(out_dir) / "cache.sqlite"))
            proxy = ReplayProxy(engine.endpoint.base_url, replay_cache, timeout_s=cfg.model.request_timeout_s + 5)
            replay_url = stack.enter_context(proxy)
        opt_cfg = optimizer_model_config(params.optimizer_model, cfg.model)
        if opt_cfg == cfg.model:
            opt_ep = engine.endpoint  # the task model's endpoint (one gold server, one vLLM connection)
        else:
            opt_ep = stack.enter_context(open_endpoint(opt_cfg, pool.problems))
        runner = PipelineRunner(
            engine, problems=problems, replay_url=replay_url, replayed=proxy.pop_replayed if proxy is not None else None
        )
        chat = EndpointChat(opt_ep, opt_cfg) if method != "none" else None
        try:
            res = optimize(
                optimizer=cfg.optimizer,
                flow=cfg.topology.flow,
                roles=roles_for(cfg.topology),
                seed_prompts=load_prompts(cfg.topology),
                problems=pool.problems,
                dataset_revision=str(pool.loaded.revision),
                eval_set=load_eval_set(),
                eval_problems=pool.eval_rows,
                runner=runner,
                run_seed=cfg.seed,
                model=runner.model_identity(),
                settings=runner.settings(),
                out_dir=out_dir,
                chat=chat,
                optimizer_model={
                    "name": str(opt_cfg.name),
                    "model_id": str(opt_cfg.model_id),
                    "temperature": float(opt_cfg.temperature),
                },
                score_program=runner.score_program,
                hook=hook,
            )
            if proxy is not None:  # replayed answers: served with usage zeroed, their tokens counted here and in the budget
                res.details["replay"] = proxy.stats()
                import json  # noqa: PLC0415

                (Path(out_dir) / "result.json").write_text(json.dumps(res.to_json(), indent=2, default=str) + "\n")
            return res
        finally:
            if chat is not None:
                chat.close()
