"""From a composed optimizer cell to a chosen PromptSet: what the CLI calls for
`optimizer=maspo|gepa`, before it runs the final eval cell with the chosen prompts.

`run_optimizer(cfg)` loads the pool (the train split by default), opens the task
model endpoint (the gold server gets the pool's rows), the sandbox and the judge with
the eval cell's own settings, opens the optimizer model (`optimizer.params.optimizer_model`,
default the task model), and runs `run.optimize`. MLflow logging and the final cell are
the caller's (`hook` receives every event for step metrics).
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Mapping

from apps_bench.config import as_plain
from apps_bench.optimizers.run import OptimizeResult, optimize


def pool_dataset_config(dataset_cfg: Mapping[str, Any], pool: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset the pool is drawn from: the cell's dataset at the pool's split.

    source=train reads the train split (hub, same repo and revision) or `pool.path` (a
    local codeparrot-schema train file); source=test_minus_eval reads the cell's own
    test-split dataset.
    """
    from apps_bench.validate import pool_problems  # noqa: PLC0415

    bad = pool_problems(dataset_cfg, pool)
    if bad:
        raise ValueError(bad[0].line())
    ds = dict(dataset_cfg)
    if pool.get("source", "train") == "train":
        ds["split"] = "train"
        ds["name"] = f"{ds.get('name', 'apps')}_train"
        if pool.get("path"):
            ds["path"], ds["source"] = str(pool["path"]), "file"
    else:  # test_minus_eval
        ds["split"] = "test"
    ds["streaming"] = False  # the whole split is needed
    return ds


def optimizer_model_config(value: Any, task_model: Any) -> Any:
    """The optimizer model's config: null = the task model; a name = `conf/model/<name>.yaml`;
    a mapping = overrides on top of `conf/model/<mapping.name>.yaml` (or a complete model config)."""
    from omegaconf import OmegaConf  # noqa: PLC0415

    from apps_bench.config import ModelConfig  # noqa: PLC0415

    if value is None or value == "" or value == {}:
        return task_model
    model_dir = Path(__file__).resolve().parents[1] / "conf" / "model"
    value = as_plain(value)
    over: dict[str, Any] = {}
    if isinstance(value, str):
        name = value
    elif isinstance(value, Mapping):
        over = dict(value)
        name = str(over.get("name", ""))
    else:
        raise ValueError(f"optimizer.params.optimizer_model must be null, a model name or a mapping, got {value!r}")
    base: Any = {}
    if name and (model_dir / f"{name}.yaml").is_file():
        base = OmegaConf.load(model_dir / f"{name}.yaml")
    elif isinstance(value, str):
        known = sorted(p.stem for p in model_dir.glob("*.yaml"))
        raise ValueError(f"optimizer.params.optimizer_model={name!r}: no conf/model/{name}.yaml; choose one of {known}")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), base, over))
    except Exception as exc:  # noqa: BLE001 - OmegaConf's error names the key
        raise ValueError(f"optimizer.params.optimizer_model={value!r} is not a complete model config: {exc}") from exc


def run_optimizer(cfg: Any, *, out_dir: Path | str, hook: Callable[[str, dict[str, Any]], None] | None = None) -> OptimizeResult:

    from apps_bench.config import typed_config  # noqa: PLC0415
    from apps_bench.data import eval_ids, load_problems  # noqa: PLC0415
    from apps_bench.judge import Judge  # noqa: PLC0415
    from apps_bench.models import open_endpoint  # noqa: PLC0415
    from apps_bench.optimizers.chat import EndpointChat  # noqa: PLC0415
    from apps_bench.optimizers.protocol import load_eval_set  # noqa: PLC0415
    from apps_bench.optimizers.runner import PipelineRunner  # noqa: PLC0415
    from apps_bench.sandbox import SandboxPool  # noqa: PLC0415
    from apps_bench.topologies.prompts import load_prompts, roles_for  # noqa: PLC0415

    cfg = typed_config(cfg)
    method = cfg.optimizer.name
    params = dict(cfg.optimizer.params)
    pool_p = dict(params.get("pool") or {})
    pool_ds = pool_dataset_config(dataclasses.asdict(cfg.dataset), pool_p)
    loaded = load_problems(pool_ds, difficulty=pool_p.get("difficulty", "interview"), max_tests_per_row=int(cfg.max_tests_per_row))
    eval_rows = load_problems(cfg.dataset, only=eval_ids(), max_tests_per_row=int(cfg.max_tests_per_row)).problems
    problems = {p.key: p for p in loaded.problems}

    opt_model_cfg = params.get("optimizer_model")
    with ExitStack() as stack:
        ep = stack.enter_context(open_endpoint(cfg.model, loaded.problems))
        task_ep = ep
        proxy = None
        if params.get("replay", True):  # partial re-runs: identical model requests are answered from the run's cache
            from apps_bench.optimizers.cache import RolloutCache  # noqa: PLC0415
            from apps_bench.optimizers.replay import ReplayProxy  # noqa: PLC0415

            Path(out_dir).mkdir(parents=True, exist_ok=True)
            replay_cache = stack.enter_context(RolloutCache(Path(out_dir) / "cache.sqlite"))
            proxy = ReplayProxy(ep.base_url, replay_cache, timeout_s=float(cfg.model.request_timeout_s) + 5)
            url = stack.enter_context(proxy)
            task_ep = dataclasses.replace(ep, base_url=url)
        opt_cfg = optimizer_model_config(opt_model_cfg, cfg.model)
        if opt_cfg == cfg.model:
            opt_ep = ep  # the task model's endpoint (one gold server, one vLLM connection)
        else:
            opt_ep = stack.enter_context(open_endpoint(opt_cfg, loaded.problems))
        pool = stack.enter_context(SandboxPool.from_config(cfg.judge))
        runner = PipelineRunner(cfg, endpoint=task_ep, pool=pool, judge=Judge.from_config(pool, cfg.judge), problems=problems,
                                replayed=proxy.pop_replayed if proxy is not None else None)  # fmt: skip
        chat = EndpointChat(opt_ep, opt_cfg) if method != "none" else None
        try:
            res = optimize(
                method=method,
                params=params,
                flow=str(cfg.topology.flow),
                roles=roles_for(cfg.topology),
                seed_prompts=load_prompts(cfg.topology),
                problems=loaded.problems,
                dataset_revision=str(loaded.revision),
                eval_set=load_eval_set(),
                eval_problems=eval_rows,
                runner=runner,
                run_seed=int(cfg.seed),
                model=runner.model_identity(),
                settings=runner.settings(),
                out_dir=out_dir,
                chat=chat,
                optimizer_model={"name": str(opt_cfg.name), "model_id": str(opt_cfg.model_id),
                                 "temperature": float(opt_cfg.temperature)},  # fmt: skip
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
