"""Check a composed cell's settings before anything of the cell exists.

Hydra's schema (config/schema.py) checks names and types; `typed_cell` types the composed cell once
into the schema (what the schema refuses becomes a bad setting), and the rules here read that typed
config for what types cannot say: numeric ranges, choices, and settings the chosen mode would
silently ignore. They run in `cell.guard` (so in every single-cell run and, for a sweep, on every
cell before any job starts), and `empty_selection` runs as soon as the problems are loaded, before
the cell's folder, servers, processes or MLflow run are created. A refusal lists every bad setting
with its value, what is allowed and the override that fixes it; the entrypoint exits 2.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, is_dataclass
from typing import Callable, Mapping, TypeGuard

from apps_bench.cell.cpus import requested_processes
from apps_bench.config.schema import (
    OPTIMIZER_SCHEMAS,
    POOL_SOURCES,
    REQUANTIZE_TYPES,
    Config,
    DatasetConfig,
    PoolParams,
    PriceConfig,
    as_plain,
    cell_data,
    typed,
    typed_config,
)
from apps_bench.data import DIFFICULTIES, LoadResult
from apps_bench.errors import AppsBenchError


@dataclass(frozen=True)
class BadSetting:
    key: str  # dotted override path, e.g. `optimizer.params.budget.rollouts`
    value: object  # as the user gave it (shown by _show)
    allowed: str  # what would be accepted
    fix: str  # the override (or action) that fixes it

    def line(self) -> str:
        said = self.key if self.key.startswith("~") else f"{self.key}={_show(self.value)}"  # a deletion has no value
        return f"{said}: {self.allowed}. Fix: {self.fix}"


class CellRefused(AppsBenchError):
    """The composed cell lies outside the experiment grid (and allow_any_cell is false), or its settings are wrong."""


class InvalidSettings(CellRefused):
    """One or more settings are out of range, unknown, or ignored in the chosen mode."""

    def __init__(self, bad: list[BadSetting]) -> None:
        self.bad = list(bad)
        lines = "\n".join("  " + b.line() for b in self.bad)
        super().__init__(f"invalid setting{'s' if len(self.bad) > 1 else ''}, nothing was run:\n{lines}")


def _show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # `top_p=0` was typed, Hydra's schema made it 0.0
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_show(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_show(v)}" for k, v in value.items()) + "}"
    return str(value)


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ----------------------------------------------------------------------------- rules
# (section path, key, predicate, allowed, fix); `None` sections are skipped when absent.

Rule = tuple[str, str, Callable[[object], bool], str, str]


def _int_min(low: int) -> Callable[[object], bool]:
    return lambda v: _is_int(v) and v >= low


def _opt_int_min(low: int) -> Callable[[object], bool]:
    return lambda v: v is None or (_is_int(v) and v >= low)


def _positive(v: object) -> bool:
    return _is_num(v) and v > 0


def _fraction(v: object) -> bool:
    return _is_num(v) and 0 <= v <= 1


def _processes(v: object) -> bool:
    if not isinstance(v, (str, int)):
        return False
    try:
        requested_processes(v)
    except ValueError:
        return False
    return True


def _opt_price(v: object) -> bool:
    return v is None or (_is_num(v) and v >= 0)


def _difficulty(v: object) -> bool:
    return v is None or v in DIFFICULTIES


_DIFFICULTIES = "introductory, interview or competition"

RULES: tuple[Rule, ...] = (
    ("", "limit", _opt_int_min(1), "a whole number >= 1, or null (every selected problem)", "limit=50, or limit=null"),
    ("", "offset", _int_min(0), "a whole number >= 0 (problems skipped before the first one run)", "offset=0"),
    ("", "concurrency", _int_min(1), "a whole number >= 1 (problems in flight at once)", "concurrency=1 or more"),
    ("", "processes", _processes, "auto (one per CPU core) or a whole number >= 1", "processes=auto, or processes=1"),
    ("", "seed", _int_min(0), "a whole number >= 0", "seed=0"),
    ("", "difficulty", _difficulty, f"{_DIFFICULTIES}, or null (all)", "difficulty=interview, or difficulty=null"),
    ("tool", "timeout_s", _positive, "seconds > 0", "tool.timeout_s=10"),
    ("tool", "output_chars", _int_min(1), "a whole number >= 1 (characters of stdout/stderr shown)", "tool.output_chars=4000"),
    ("judge", "timeout_s", _positive, "seconds > 0 (per test)", "judge.timeout_s=4"),
    ("judge", "workers", _int_min(0), "a whole number >= 0 (0 = one per usable CPU)", "judge.workers=0"),
    ("judge", "call_memory_bytes", _int_min(0), "bytes >= 0 (0 disables the cap)", "judge.call_memory_bytes=4000000000"),
    ("judge", "stdin_memory_bytes", _int_min(0), "bytes >= 0 (0 disables the cap)", "judge.stdin_memory_bytes=4000000000"),
    ("model", "temperature", lambda v: _is_num(v) and 0 <= v <= 2, "a number from 0 to 2", "model.temperature=0.2"),
    ("model", "top_p", lambda v: _is_num(v) and 0 < v <= 1, "a number > 0 and <= 1", "model.top_p=0.9"),
    ("model", "max_tokens", _int_min(1), "a whole number >= 1 (tokens per reply)", "model.max_tokens=4096"),
    ("model", "request_timeout_s", _positive, "seconds > 0", "model.request_timeout_s=300"),
    ("model", "max_retries", _int_min(0), "a whole number >= 0", "model.max_retries=3"),
    ("model", "retry_backoff_s", lambda v: _is_num(v) and v >= 0, "seconds >= 0", "model.retry_backoff_s=2"),
    ("model.gold", "latency_ms", _int_min(0), "a whole number >= 0", "model.gold.latency_ms=0"),
    ("model.gold", "wrong_fraction", _fraction, "a fraction from 0 to 1", "model.gold.wrong_fraction=0"),
    ("model.gold", "fault_fraction", _fraction, "a fraction from 0 to 1", "model.gold.fault_fraction=0"),
    ("model.local", "prompt_cache_mb", _int_min(0), "a whole number of MiB >= 0 (0 = off)", "model.local.prompt_cache_mb=1024"),
    (
        "model.local",
        "gguf_requantize",
        lambda v: v is None or v in REQUANTIZE_TYPES,
        f"one of {', '.join(REQUANTIZE_TYPES)}, or null (the GGUF as shipped)",
        "model.local.gguf_requantize=q8_0",
    ),
    (
        "model.price",
        "input_per_mtok",
        _opt_price,
        "USD per million tokens >= 0, or null (no price)",
        "model.price.input_per_mtok=3.7 (your vendor's price)",
    ),
    (
        "model.price",
        "output_per_mtok",
        _opt_price,
        "USD per million tokens >= 0, or null (no price)",
        "model.price.output_per_mtok=11.3 (your vendor's price)",
    ),
    ("topology", "team_size", _int_min(1), "a whole number >= 1", "topology.team_size=4"),
    ("topology", "rounds", _int_min(1), "a whole number >= 1", "topology.rounds=2"),
    ("topology", "max_steps", _int_min(1), "a whole number >= 1 (model calls per agent's tool loop)", "topology.max_steps=8"),
    ("topology", "max_turns", _int_min(1), "a whole number >= 1", "topology.max_turns=12"),
    ("topology", "time_limit_s", _positive, "seconds > 0 (per problem)", "topology.time_limit_s=600"),
    (
        "tracking",
        "trace_problems",
        lambda v: v in ("all", "failed", "errors"),
        "all, failed (not passed, errors included) or errors (infrastructure errors only)",
        "tracking.trace_problems=failed",
    ),
    (
        "tracking",
        "trace_sample",
        lambda v: v is None or (_is_int(v) and v >= 1) or (isinstance(v, float) and 0 < v < 1),
        "null (every problem), a fraction between 0 and 1, or a whole number N >= 1 (N of the cell's problems)",
        "tracking.trace_sample=0.1, or tracking.trace_sample=100, or tracking.trace_sample=null",
    ),
    (
        "tracking",
        "trace_text_chars",
        _int_min(100),
        "a whole number >= 100 (characters kept of each text in a span)",
        "tracking.trace_text_chars=500",
    ),
)

GEPA_COMPONENT_SELECTION = ("round_robin", "all")
GEPA_CANDIDATE_SELECTION = ("pareto", "current_best", "epsilon_greedy", "top_k_pareto")
GEPA_ACCEPTANCE = ("strict_improvement", "improvement_or_equal")


def _weights(names: tuple[str, ...], total: float | None = None) -> Callable[[object], bool]:
    """A mapping of exactly `names` to numbers >= 0 (summing to `total` when given): MASPO's weights
    are a mapping in the schema (`global` is a Python keyword), so its keys are checked here."""

    def ok(v: object) -> bool:
        if not isinstance(v, Mapping) or set(v) != set(names) or not all(_is_num(x) and x >= 0 for x in v.values()):
            return False
        return total is None or abs(sum(v.values()) - total) <= 1e-9

    return ok


# optimizer.params.<path>: checked when the method's params have the key (methods differ; each method's
# schema in config/schema.py refuses a key it does not have when Hydra composes the cell)
OPTIMIZER_RULES: tuple[Rule, ...] = (
    ("budget", "rollouts", _opt_int_min(1), "a whole number >= 1, or null (no cap)", "optimizer.params.budget.rollouts=200"),
    ("budget", "tokens", _opt_int_min(1), "a whole number >= 1, or null (no cap)", "optimizer.params.budget.tokens=null"),
    (
        "budget",
        "optimizer_tokens",
        _opt_int_min(1),
        "a whole number >= 1, or null (no cap)",
        "optimizer.params.budget.optimizer_tokens=null",
    ),
    ("pool", "train_size", _int_min(1), "a whole number >= 1", "optimizer.params.pool.train_size=50"),
    ("pool", "val_size", _int_min(1), "a whole number >= 1", "optimizer.params.pool.val_size=30"),
    ("pool", "difficulty", _difficulty, f"{_DIFFICULTIES}, or null (all)", "optimizer.params.pool.difficulty=interview"),
    ("pool", "split_seed", _int_min(0), "a whole number >= 0", "optimizer.params.pool.split_seed=0"),
    ("", "minibatch", _int_min(1), "a whole number >= 1", "optimizer.params.minibatch=3"),
    ("", "n_traces", _int_min(1), "a whole number >= 1", "optimizer.params.n_traces=5"),
    ("", "infra_retries", _int_min(0), "a whole number >= 0", "optimizer.params.infra_retries=1"),
    ("", "stall_iterations", _int_min(1), "a whole number >= 1", "optimizer.params.stall_iterations=20"),
    ("", "hard_cases", _int_min(0), "a whole number >= 0", "optimizer.params.hard_cases=3"),
    ("", "K", _int_min(1), "a whole number >= 1 (beam width)", "optimizer.params.K=2"),
    ("", "Ksub", _int_min(1), "a whole number >= 1", "optimizer.params.Ksub=2"),
    ("", "T", _int_min(1), "a whole number >= 1", "optimizer.params.T=3"),
    ("", "D", _int_min(1), "a whole number >= 1", "optimizer.params.D=3"),
    ("", "seed", _int_min(0), "a whole number >= 0", "optimizer.params.seed=0"),
    (
        "",
        "reward",
        _weights(("local", "lookahead", "global"), total=1.0),
        "weights local, lookahead and global (numbers >= 0) summing to 1 (the win threshold is 0.5)",
        "optimizer.params.reward={local:0.4,lookahead:0.4,global:0.2}",
    ),
    (
        "",
        "refresh",
        _weights(("local", "global")),
        "weights local and global (numbers >= 0)",
        "optimizer.params.refresh={local:0.7,global:0.3}",
    ),
    (
        "",
        "component_selection",
        lambda v: v in GEPA_COMPONENT_SELECTION,
        f"one of {', '.join(GEPA_COMPONENT_SELECTION)}",
        "optimizer.params.component_selection=round_robin",
    ),
    (
        "",
        "candidate_selection",
        lambda v: v in GEPA_CANDIDATE_SELECTION,
        f"one of {', '.join(GEPA_CANDIDATE_SELECTION)}",
        "optimizer.params.candidate_selection=pareto",
    ),
    (
        "",
        "acceptance",
        lambda v: v in GEPA_ACCEPTANCE,
        f"one of {', '.join(GEPA_ACCEPTANCE)}",
        "optimizer.params.acceptance=strict_improvement",
    ),
)


def _section(config: object, path: str) -> object | None:
    """The typed config's section at a dotted path (`model.price`), None when it has none."""
    node: object = config
    for part in [p for p in path.split(".") if p]:
        node = getattr(node, part, None)
    return node if is_dataclass(node) else None


def _apply(rules: tuple[Rule, ...], config: object, prefix: str) -> list[BadSetting]:
    bad = []
    for section, key, ok, allowed, fix in rules:
        node = _section(config, section)
        if node is None or not hasattr(node, key):
            continue  # an optimizer rule of a parameter this method does not have
        value = getattr(node, key)
        if not ok(value):
            path = ".".join(p for p in (prefix, section, key) if p)
            bad.append(BadSetting(path, value, allowed, fix))
    return bad


TRACKING_BACKENDS = ("mlflow", "none")


def _foreign_params(opt: Mapping[str, object]) -> list[BadSetting]:
    """What the method's schema refuses in an optimizer section (plain data): a parameter it lacks (Hydra
    refuses it when it composes the cell, except one added with `+`, which opens the node) or a method
    named apart from its option, whose settings are missing."""
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

    schema = OPTIMIZER_SCHEMAS.get(str(opt.get("name")))
    if schema is None:
        return []  # an unknown method is refused when Hydra composes it
    try:
        typed(schema, opt)
    except ConfigKeyError as exc:
        key = f"optimizer.{exc.full_key}"
        parent = _plain_section(opt, ".".join(str(exc.full_key).split(".")[:-1])) or {}
        return [
            BadSetting(
                key,
                parent.get(str(exc.key)),
                f"no setting of optimizer={opt['name']}",
                f"drop {key} (conf/optimizer/{opt['name']}.yaml lists the settings)",
            )
        ]
    except OmegaConfBaseException as exc:  # e.g. `optimizer.name=gepa`: a name without its option's settings
        return [
            BadSetting(
                f"optimizer.{exc.full_key}",
                None,
                f"a setting of optimizer={opt['name']}, missing here",
                f"optimizer={opt['name']} (an option's settings come with it), not optimizer.name=...",
            )
        ]
    return []


def _plain_section(data: Mapping[str, object], path: str) -> Mapping[str, object] | None:
    node: object = data
    for part in [p for p in path.split(".") if p]:
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else None


def _method_apart(config: Config) -> list[BadSetting]:
    """An optimizer whose settings are another method's (`optimizer.name=gepa` on optimizer=none's):
    a Hydra node is typed by the option it composed, so the named method's schema is asked here."""
    schema = OPTIMIZER_SCHEMAS.get(config.optimizer.name)
    if schema is None or isinstance(config.optimizer, schema):
        return []
    return _foreign_params(as_plain(config.optimizer))


def _sandbox_refusal(exc: Exception, data: Mapping[str, object]) -> BadSetting | None:
    """A judge sandbox limit that SandboxLimits refuses while the cell is typed, named as the pool reads it."""
    if not str(exc).startswith("judge.sandbox"):
        return None
    sandbox = _plain_section(data, "judge.sandbox") or {}
    key = next((f"judge.sandbox.{k}" for k in sandbox if f"judge.sandbox.{k} " in str(exc)), "judge.sandbox")
    return BadSetting(
        key,
        sandbox.get(key.rsplit(".", 1)[-1]) if key != "judge.sandbox" else "...",
        str(exc),
        "see conf/judge/seed.yaml's sandbox: block for each limit's meaning and value",
    )


def schema_refusal(exc: Exception) -> BadSetting:
    """A value the schema refuses after the rules passed, as a bad setting: OmegaConf's error names the key."""
    key = str(getattr(exc, "full_key", "") or "the config")
    return BadSetting(
        key,
        None,
        f"the schema (config/schema.py) refuses it: {str(exc).splitlines()[0]}",
        "choose options with group=name (an option's settings come with it, e.g. optimizer=gepa), then change single settings",
    )


def typed_cell(cfg: object) -> Config:
    """The composed cell (a Hydra node, its plain data, or the Config itself) typed once into the schema
    (config.typed_config): what the guard, the cell key, the prompts and the engine read. What the schema
    refuses is an InvalidSettings naming the setting (a parameter the method lacks, a method named apart
    from its option, a sandbox limit out of range, a missing value)."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        return typed_config(cfg)
    except (OmegaConfBaseException, ValueError) as exc:
        data = cell_data(cfg)
        optimizer = data.get("optimizer")
        named = isinstance(optimizer, Mapping) and optimizer.get("name") not in (None, "none")
        bad = _foreign_params(optimizer) if named and isinstance(optimizer, Mapping) else []
        raise InvalidSettings(bad or [_sandbox_refusal(exc, data) or schema_refusal(exc)]) from exc


# ----------------------------------------------------------------------------- ignored settings


# provider -> the preset that uses its own settings (`model.<provider>`); any other model would ignore them
PROVIDER_ONLY = {
    "gold": "gold (the built-in self-check server)",
    "local": "local (the llama-cpp-python server this project starts)",
}


def _ignored(config: Config) -> list[BadSetting]:
    """Settings that the chosen mode would not use: refused, so no one believes they took effect."""
    bad = []
    model = config.model
    for provider, preset in PROVIDER_ONLY.items():
        section = getattr(model, provider, None)
        if model.provider == provider or section is None:
            continue
        for knob, value in asdict(section).items():
            if value is not None:
                bad.append(
                    BadSetting(
                        f"model.{provider}.{knob}",
                        value,
                        f"only model={preset} uses it; model={model.name} would ignore it",
                        f"drop model.{provider}.{knob}, or model={preset}",
                    )
                )
    topo = config.topology
    if topo.flow != "decentralized" and _is_int(topo.rounds) and topo.rounds != 1:
        bad.append(
            BadSetting(
                "topology.rounds",
                topo.rounds,
                f"only the decentralized (debate) flow has rounds; topology={topo.name} ({topo.flow}) would ignore it",
                "topology.rounds=1, or topology=decentralized_langgraph / decentralized_openai",
            )
        )
    dataset = config.dataset
    if dataset.source == "demo" and dataset.path:
        bad.append(
            BadSetting(
                "dataset.path",
                dataset.path,
                f"dataset={dataset.name} is the built-in problems and reads no file; dataset=apps reads a local file",
                f"dataset=apps dataset.path={dataset.path}",
            )
        )
    bad.extend(_half_price(model.price))
    pool = getattr(config.optimizer.params, "pool", None)
    if config.optimizer.name != "none" and isinstance(pool, PoolParams):
        bad.extend(pool_problems(dataset, pool))
    return bad


def _half_price(price: PriceConfig) -> list[BadSetting]:
    """A price is both token prices and the date they were read, or none of them: half a price
    would show a cost that leaves out what the other half costs, or one nobody can date."""
    given = {"input_per_mtok": price.input_per_mtok, "output_per_mtok": price.output_per_mtok, "as_of": price.as_of}
    if all(v is None for v in given.values()) or all(v not in (None, "") for v in given.values()):
        return []
    unset = [k for k, v in given.items() if v in (None, "")]
    return [
        BadSetting(
            f"model.price.{k}",
            None,
            "a price needs both token prices and the date they were read (as_of)",
            "model.price.input_per_mtok=X model.price.output_per_mtok=Y model.price.as_of=YYYY-MM-DD, or none of them",
        )
        for k in unset
    ]


def pool_problems(dataset: DatasetConfig, pool: PoolParams) -> list[BadSetting]:
    """Why the optimizer pool cannot be drawn as configured (optimizers.entry.pool_dataset_config asks too)."""
    source = pool.source
    if source not in POOL_SOURCES:
        return [
            BadSetting(
                "optimizer.params.pool.source", source, f"{' or '.join(POOL_SOURCES)}", "optimizer.params.pool.source=train"
            )
        ]
    if source == "test_minus_eval" and pool.path:
        return [
            BadSetting(
                "optimizer.params.pool.path",
                pool.path,
                "a train file is read only with pool.source=train; pool.source=test_minus_eval draws from the cell's own "
                "test-split dataset and would ignore it",
                "optimizer.params.pool.path=null, or optimizer.params.pool.source=train",
            )
        ]
    if source == "train" and not pool.path:
        if dataset.path:
            return [
                BadSetting(
                    "optimizer.params.pool.path",
                    None,
                    "the cell's dataset is a local file (dataset.path), so the train pool needs a local train file too",
                    "optimizer.params.pool.path=<train.jsonl>, or optimizer.params.pool.source=test_minus_eval",
                )
            ]
        if dataset.source == "demo":
            return [
                BadSetting(
                    "optimizer.params.pool.path",
                    None,
                    "the demo dataset has no train split to draw the pool from",
                    "dataset=apps, or optimizer.params.pool.path=<train.jsonl>",
                )
            ]
    return []


def _roles_and_prompts(config: Config) -> list[BadSetting]:
    """The team size must have a role list and every role its prompt (a prompt file is read here)."""
    # here, not at the top: re-scoring imports this module (through cell/key.py) and loads no topology code
    from apps_bench.topologies.prompts import TopologyConfigError, load_prompts, roles_for, sizes_of

    topo = config.topology
    size = topo.team_size
    if not _is_int(size) or size < 1:
        return []  # the range rule already said so
    try:
        roles_for(topo)
    except TopologyConfigError:
        sizes = sizes_of(topo)
        return [
            BadSetting(
                "topology.team_size",
                size,
                f"a team size topology={topo.name} has a role list for: {', '.join(map(str, sizes)) or 'none'}",
                f"topology.team_size={sizes[0] if sizes else 1}, or add a role list for {size} under topology.roles_by_size",
            )
        ]
    try:
        load_prompts(topo)
    except (TopologyConfigError, OSError, ValueError) as exc:
        key = "topology.prompt_file" if topo.prompt_file else "topology.prompts"
        return [
            BadSetting(
                key,
                topo.prompt_file or "...",
                str(exc),
                "point it at a YAML/JSON file with a prompt for every role of the team and no other",
            )
        ]
    return []


def check_settings(cfg: object) -> None:
    """Raise InvalidSettings naming every bad setting of a composed cell (typed once: typed_cell)."""
    config = typed_cell(cfg)
    bad = _apply(RULES, config, "")
    if config.optimizer.name != "none":
        bad += _apply(OPTIMIZER_RULES, config.optimizer.params, "optimizer.params")
        bad += _method_apart(config)
    if config.tracking.backend not in TRACKING_BACKENDS:
        bad.append(
            BadSetting(
                "tracking.backend",
                config.tracking.backend,
                f"one of {', '.join(TRACKING_BACKENDS)}",
                "tracking=mlflow, or tracking=none",
            )
        )
    bad += _ignored(config)
    if not any(b.key.startswith("topology.") for b in bad):
        bad += _roles_and_prompts(config)
    if bad:
        raise InvalidSettings(bad)


# ----------------------------------------------------------------------------- selection


def empty_selection(loaded: LoadResult, config: Config) -> BadSetting | None:
    """Which setting selected no problem at all (a cell of zero problems is an error, not a 0.0 score)."""
    if loaded.problems:
        return None
    ds = config.dataset
    where = ds.path or f"dataset={ds.name}"
    only = [str(x) for x in config.only]
    difficulty, offset = config.difficulty, config.offset
    matched = loaded.rows_matched
    if loaded.rows_selected:
        reasons = ", ".join(f"{n} {r}" for r, n in sorted(loaded.skipped.items()))
        return BadSetting(
            "dataset.path" if ds.path else "dataset",
            ds.path or ds.name,
            f"rows with usable tests; all {loaded.rows_selected} selected rows of {where} were skipped ({reasons})",
            "select other rows (only=, offset=, difficulty=), or fix the file",
        )
    if only and len(loaded.missing_ids) == len(only):
        return BadSetting(
            "only",
            only,
            f"problem IDs that {where} holds; none of these is there",
            "only=[...] with IDs of that dataset, or drop only",
        )
    if difficulty and matched == 0:
        among = f" among only={_show(only)}" if only else ""
        return BadSetting(
            "difficulty",
            difficulty,
            f"a difficulty that {where} has rows of{among}; it has none of {difficulty}",
            "difficulty=null, or another of introductory, interview, competition",
        )
    if matched and offset >= matched:
        return BadSetting(
            "offset",
            offset,
            f"less than the {matched} problems the selection matches in {where}",
            f"offset={max(0, matched - 1)} or lower, e.g. offset=0",
        )
    return BadSetting("dataset", ds.name, f"a dataset with rows; {where} has none", "check the file, or pick another dataset")
