"""Structured-config schemas: Hydra checks every composed cell against these types.

Values live in `conf/`; these classes only declare names and types (`MISSING`
marks what a YAML file must provide), so a typo or a wrong type fails at compose
time instead of deep inside a run.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass, make_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Sequence, TypeVar, get_type_hints

from apps_bench.errors import AppsBenchError
from apps_bench.sandbox.limits import SandboxLimits
from apps_bench.types import JsonObject

if TYPE_CHECKING:
    from omegaconf import DictConfig

# OmegaConf's marker of a value the YAML must set (omegaconf.MISSING, its documented value; test_configs checks
# they are equal), spelt here so that reading CONF_DIR or a schema does not import omegaconf (`--help` stays light).
MISSING: Any = "???"

POOL_SOURCES = ("train", "test_minus_eval")  # optimizer.params.pool.source: optimizers/protocol.build_pool
REQUANTIZE_TYPES = (
    "q8_0",
    "q4_0",
    "f16",
)  # model.local.gguf_requantize: the llama.cpp file types models/local_server.py converts to


@dataclass
class DatasetConfig:
    name: str = MISSING  # apps | demo | ...
    source: str = MISSING  # hub | file | demo
    hub_repo: str = MISSING  # the hub repo (or a local mirror of it)
    revision: str = MISSING  # pinned hub revision, recorded with every cell
    split: str = MISSING
    path: Optional[str] = MISSING  # local codeparrot-schema JSONL/parquet; overrides the hub (null: none)
    streaming: bool = MISSING  # stream from the hub when only the first rows are needed


@dataclass
class PriceConfig:
    """What the model's tokens cost, to show a cell's cost in money (never part of its identity:
    a price changes what a cell cost, not what it measured). Null = no price known."""

    input_per_mtok: Optional[float] = MISSING  # USD per million prompt tokens
    output_per_mtok: Optional[float] = MISSING  # USD per million completion tokens
    as_of: Optional[str] = MISSING  # the date the prices were read (e.g. 2026-01-31), shown with every figure


@dataclass
class GoldConfig:
    """The built-in gold server's knobs for tests and benchmarks (`model.gold`, set by conf/model/gold.yaml only)."""

    latency_ms: int = MISSING  # added latency per call
    wrong_fraction: float = MISSING  # seeded fraction of deliberately wrong answers
    fault_fraction: float = MISSING  # seeded fraction of injected 5xx / 429 / timeouts / malformed replies


@dataclass
class LocalConfig:
    """The GGUF and llama-cpp-python server settings (`model.local`, set by conf/model/local.yaml only;
    apps_bench/models/local.py)."""

    gguf_package: Optional[str] = MISSING
    gguf_file: Optional[str] = MISSING
    gguf_path: Optional[str] = MISSING
    gguf_requantize: Optional[str] = MISSING  # serve the GGUF converted to this type (REQUANTIZE_TYPES); None = as is
    chat_format: Optional[str] = MISSING
    n_ctx: int = MISSING
    n_threads: int = MISSING
    start_timeout_s: float = MISSING
    prompt_cache_mb: int = MISSING  # llama.cpp's RAM prompt cache (states by prompt prefix); 0 = off


@dataclass
class ModelConfig:
    name: str = MISSING
    provider: str = MISSING  # gold (built-in server) | local (a small real LLM started here) | openai (any endpoint)
    model_id: str = MISSING
    base_url: Optional[str] = MISSING  # null for gold: the built-in server picks a loopback port
    api_key_env: str = MISSING  # name of the env var holding the key; the key never enters config
    temperature: float = MISSING
    top_p: float = MISSING
    max_tokens: int = MISSING
    extra_body: dict[str, Any] = MISSING  # e.g. repetition_penalty, chat_template_kwargs
    request_timeout_s: float = MISSING
    max_retries: int = MISSING
    retry_backoff_s: float = MISSING
    check_endpoint: bool = MISSING  # probe /v1/models at cell start
    max_concurrency: int = MISSING  # model requests on the wire at once, across the cell's processes; 0 = no limit
    retry_timeouts: bool = MISSING  # false: a timed-out request fails instead of being sent again
    tools_supported: bool = MISSING  # false: the server/model is known to ignore `tools` (warned about)
    accept_tool_drop: bool = MISSING  # run a tool-using cell on a server that drops its tools (server check)
    price: PriceConfig = MISSING  # run-only (cell.RUN_ONLY): cost in money
    # A provider's own settings, under its key: null in every other provider's presets.
    local: Optional[LocalConfig] = MISSING
    gold: Optional[GoldConfig] = MISSING


# The values earlier, flat model sections held for the fields of the providers a preset is not (model.gold
# and model.local were top-level keys, set to these by every other preset): the cell key hashes the model
# section in that flat layout (flat_model), so every recorded cell keeps its key.
_FLAT_OFF: dict[str, dict[str, Any]] = {
    "local": {
        "gguf_package": None,
        "gguf_file": None,
        "gguf_path": None,
        "gguf_requantize": None,
        "chat_format": None,
        "n_ctx": 0,
        "n_threads": 0,
        "start_timeout_s": 0.0,
        "prompt_cache_mb": 0,
    },
    "gold": {"latency_ms": 0, "wrong_fraction": 0.0, "fault_fraction": 0.0},
}


def flat_model(model: dict[str, Any]) -> dict[str, Any]:
    """A plain model section in the flat layout of earlier versions (each provider section's fields at the
    top, in the order they had, those of an absent section at the values every other preset held): what the
    cell key hashes, so nesting the settings changed no key. A section already flat (a config.yaml written
    before the nesting) comes back as it was."""
    if not {"local", "gold"} & model.keys():
        return dict(model)
    out = {k: v for k, v in model.items() if k not in _FLAT_OFF}
    for section, off in _FLAT_OFF.items():
        out.update(model.get(section) or off)
    return out


@dataclass
class TopologyConfig:
    name: str = MISSING  # single, independent, sequential_langgraph, ...
    flow: str = MISSING  # single | independent | sequential | centralized | decentralized
    framework: str = MISSING  # langgraph | crewai | autogen | openai
    _target_: str = MISSING  # the runner class (module.Class), built as Class(this config): topologies/registry.get_topology
    team_size: int = MISSING
    rounds: int = MISSING  # debate rounds (decentralized)
    roles_by_size: dict[str, list[str]] = MISSING  # str(team_size) -> ordered roles
    prompts: dict[str, str] = MISSING  # role -> prompt text
    prompt_file: Optional[str] = MISSING  # a PromptSet file (YAML/JSON role -> text) replacing prompts; null: none
    tool_roles: list[str] = MISSING  # roles whose agents may call python_exec
    max_steps: int = MISSING  # per-agent tool-loop steps
    max_turns: int = MISSING  # messages in a group chat / delegations by a manager
    time_limit_s: float = MISSING  # per-problem wall clock


@dataclass
class OptimizerConfig:
    """`params` is typed by the method's own schema (OPTIMIZER_SCHEMAS): each conf/optimizer/<name>.yaml
    names it first in its defaults list, so a misspelt or foreign parameter fails at composition."""

    name: str = MISSING  # none | maspo | gepa
    _target_: str = MISSING  # the method (module.function), called with a MethodRun: optimizers/methods.py
    params: Any = MISSING


@dataclass
class BudgetParams:
    """Hard caps of an optimization (optimizers/protocol.Budget); null = no cap."""

    rollouts: Optional[int] = MISSING  # one pipeline run on one problem (partial re-runs count one)
    tokens: Optional[int] = MISSING  # task-model tokens (prompt + completion)
    optimizer_tokens: Optional[int] = MISSING  # optimizer-model tokens, counted apart


@dataclass
class PoolParams:
    """Where the optimizer's problems come from (never the evaluation IDs: optimizers/protocol.build_pool)."""

    source: str = MISSING  # one of POOL_SOURCES
    path: Optional[str] = MISSING  # a local codeparrot-schema train file; null = the hub train split
    difficulty: Optional[str] = MISSING  # null = every difficulty
    train_size: int = MISSING
    val_size: int = MISSING
    split_seed: int = MISSING


@dataclass
class OptimizerParams:
    """What every optimization method reads (the protocol's part)."""

    budget: BudgetParams = MISSING
    pool: PoolParams = MISSING
    minibatch: int = MISSING
    n_traces: int = MISSING  # examples per role shown to the optimizer model
    seed: int = MISSING
    infra_retries: int = MISSING  # re-runs of a rollout that failed for infrastructure
    replay: bool = MISSING  # answer byte-identical model requests from the run's cache
    optimizer_model: Any = MISSING  # null = the task model; a conf/model name; or {name: ..., overrides}


@dataclass
class MaspoParams(OptimizerParams):
    K: int = MISSING  # beam width per agent
    Ksub: int = MISSING  # variations asked per beam node and step
    T: int = MISSING  # steps per agent per round
    D: int = MISSING  # rounds of coordinate ascent
    reward: dict[str, float] = (
        MISSING  # local, lookahead, global (`global` is a keyword: a mapping, its keys checked by config/validate.py)
    )
    refresh: dict[str, float] = MISSING  # local, global
    hard_cases: int = MISSING  # misaligned cases kept per agent


@dataclass
class GepaParams(OptimizerParams):
    component_selection: str = MISSING  # round_robin | all
    candidate_selection: str = MISSING  # pareto | current_best | epsilon_greedy | top_k_pareto
    acceptance: str = MISSING  # strict_improvement | improvement_or_equal
    use_merge: bool = MISSING
    stall_iterations: int = MISSING  # stop after this many iterations that charged nothing


@dataclass
class NoParams:
    """optimizer=none has no parameters."""


@dataclass
class MaspoOptimizer(OptimizerConfig):
    params: MaspoParams = MISSING


@dataclass
class GepaOptimizer(OptimizerConfig):
    params: GepaParams = MISSING


@dataclass
class NoOptimizer(OptimizerConfig):
    params: NoParams = MISSING


# optimizer name -> its schema, stored as `schema/optimizer/<name>` (the first entry of each
# conf/optimizer/<name>.yaml's defaults list)
OPTIMIZER_SCHEMAS: dict[str, type[OptimizerConfig]] = {"none": NoOptimizer, "maspo": MaspoOptimizer, "gepa": GepaOptimizer}


@dataclass
class GridConfig:
    name: str = MISSING
    axes: dict[str, list[Any]] = MISSING  # axis -> allowed values
    exclude: list[dict[str, Any]] = MISSING  # partial cells that are refused


@dataclass
class JudgeConfig:
    profile: str = MISSING  # seed | reference
    _target_: str = MISSING  # the profile's rules (module.Class), built as Class(): judge/rules.py, judge/core.profile_rules
    rules: int = MISSING  # the profile's rules version (in the cell key): a resumed cell never mixes rule sets
    timeout_s: float = MISSING  # per test
    stop_on_first_failure: bool = MISSING
    call_memory_bytes: int = MISSING  # APPS_CALL_BASED_MEMORY_BYTES; 0 disables
    stdin_memory_bytes: int = MISSING
    workers: int = MISSING  # sandbox workers; 0 = one per usable CPU (apps_bench.cell.cpus)
    # reference: the whole program's limit (the original's TIMEOUT + 1 s); unset for seed
    program_timeout_s: Optional[float] = MISSING
    sandbox: SandboxLimits = MISSING  # the limits that can change a verdict (conf/judge/*.yaml `sandbox:`)


@dataclass
class ToolConfig:
    timeout_s: float = MISSING  # python_exec limit the model cannot raise
    output_chars: int = MISSING  # stdout/stderr clip


@dataclass
class ServerCheckConfig:
    """The model server's check (models/server_check.py; python -m apps_bench.check)."""

    at_cell_start: bool = MISSING  # a cell on a real model runs the quick part first (cached)
    cache: str = MISSING  # the cache of cell checks (JSON): the user's cache directory
    cache_max_age_s: float = MISSING  # a remote server's cached check is redone after this long
    max_tokens: int = MISSING  # per check request (model=local makes ~15 tokens/s)
    frameworks: list[str] = MISSING  # the CLI's frameworks (a cell checks its own)
    concurrency_levels: list[int] = MISSING  # the CLI's throughput sweep
    min_gain: float = MISSING  # the sweep stops when throughput rises by less than this fraction
    quick: bool = MISSING  # the CLI: only the quick part (what a cell runs)
    json: Optional[str] = MISSING  # the CLI: also write the result as JSON to this path ("-" = stdout)


@dataclass
class CellLockConfig:
    heartbeat_s: float = MISSING  # how often a running cell refreshes its folder's lock (tracking/cell_lock.py)
    stale_after_s: float = MISSING  # a lock whose heartbeat is older is a dead run's: taken over


@dataclass
class StoreCheckConfig:
    check_timeout_s: float = MISSING  # the one request that checks an MLflow server at the start
    http_retries: int = MISSING  # MLFLOW_HTTP_REQUEST_MAX_RETRIES, unless the environment sets it
    http_timeout_s: int = MISSING  # MLFLOW_HTTP_REQUEST_TIMEOUT, unless the environment sets it


@dataclass
class TrackingConfig:
    """Where a cell is logged. The store URI is not here: MLFLOW_TRACKING_URI (env) or the
    embedded default, an absolute-path SQLite file under the working directory's `outputs/`."""

    backend: str = MISSING  # mlflow | none (conf/tracking/)
    experiment: str = MISSING  # MLflow experiment name (the study)
    log_transcripts: bool = MISSING  # transcripts.jsonl as a per-cell artifact
    # a trace per problem in the cell's run; null = on for real models, off for model=gold
    # (the rule: tracking/traces.traces_enabled)
    traces: Optional[bool] = MISSING
    trace_problems: str = MISSING  # all | failed | errors: which problems get a trace
    trace_sample: Any = MISSING  # null, a fraction 0 < x < 1, or a whole number N >= 1 (an int stays an int)
    trace_text_chars: int = MISSING  # characters kept of each text in a span
    cell_lock: CellLockConfig = MISSING  # one writer per cell folder
    store: Optional[StoreCheckConfig] = MISSING  # the MLflow store's check (null for tracking=none)


@dataclass
class Config:
    dataset: DatasetConfig = MISSING
    topology: TopologyConfig = MISSING
    model: ModelConfig = MISSING
    optimizer: OptimizerConfig = MISSING
    grid: GridConfig = MISSING
    judge: JudgeConfig = MISSING
    tool: ToolConfig = MISSING
    server_check: ServerCheckConfig = MISSING
    seed: int = MISSING
    limit: Optional[int] = MISSING
    offset: int = MISSING
    only: list[str] = MISSING
    difficulty: Optional[str] = MISSING
    max_tests_per_row: int = MISSING
    concurrency: int = MISSING
    processes: str = MISSING  # "auto" or a count of solving processes (apps_bench.cell.solving)
    allow_any_cell: bool = MISSING
    out_dir: Optional[str] = MISSING  # default: outputs/<cell key> under the working directory
    verbose: bool = MISSING  # print code and per-test results per problem
    # MLflow experiment name lives at `tracking.experiment`: a top-level `experiment` key
    # would collide with the `experiment` config group (`experiment=x` selects a group file).
    tracking: TrackingConfig = MISSING
    progress: bool = MISSING  # progress bar on stderr


SCHEMA_NAME = "apps_bench_schema"


def register_configs() -> None:
    """Register the schema so `conf/config.yaml` (defaults list: `apps_bench_schema` first)
    is type-checked in struct mode: a misspelled key or a wrong type fails at compose time.
    Idempotent; called by the entrypoint and by tests before composing."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=Config)
    for name, schema in OPTIMIZER_SCHEMAS.items():
        store.store(group="schema/optimizer", name=name, node=schema)


CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")

# the running command's `--config-dir` folders (absolute): searched before the package's conf/, so a preset there
# is selectable like a packaged one and one of a packaged preset's name takes its place
# (hydra_plugins/apps_bench_config_dir puts them on every Hydra search path made while they are set)
_CONFIG_DIRS: list[str] = []


class ConfigDirMissing(ValueError, AppsBenchError):
    """`--config-dir DIR` names no folder."""


@contextmanager
def config_dirs(dirs: Sequence[str]) -> Iterator[None]:
    """Search `dirs` (a command's `--config-dir`) before the package's conf/ while the command runs:
    its own checks, Hydra's composition of the cell or sweep, and every `compose` in between."""
    found = [str(Path(d).expanduser().resolve()) for d in dirs]
    missing = [d for d, f in zip(dirs, found) if not Path(f).is_dir()]
    if missing:
        raise ConfigDirMissing(
            f"--config-dir {missing[0]}: no such folder; give a folder of presets laid out like conf/ (e.g. DIR/model/NAME.yaml)"
        )
    before = list(_CONFIG_DIRS)
    _CONFIG_DIRS[:] = found
    try:
        yield
    finally:
        _CONFIG_DIRS[:] = before


def overlay_dirs() -> list[str]:
    """The `--config-dir` folders in effect (config_dirs), first to search."""
    return list(_CONFIG_DIRS)


@contextmanager
def hydra_on(conf_dir: str | Path, job_name: str = "apps_bench") -> Iterator[None]:
    """Hydra initialized on `conf_dir` (with the schemas registered, after the command's `--config-dir`
    folders) for a composition outside a running app; the Hydra state from before (an enclosing app's or
    a test's) is back afterwards, also on an error."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    before = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir), job_name=job_name):
            yield
    finally:
        GlobalHydra.instance().clear()
        if before is not None:
            GlobalHydra.instance().initialize(before)


# the axes whose option's name is the label of a cell, and whose behaviour comes from the option's other settings
# (a dataset's source, a topology's runner, a model's provider): the name is the option selected
# (`model=goldslow` names the cell goldslow, also when its file takes everything from `gold`). The optimizer's
# name is its method (OPTIMIZER_SCHEMAS), so an optimizer preset names the method it runs.
NAMED_BY_CHOICE = ("dataset", "topology", "model")


def option_names(choices: Mapping[str, object] | None) -> dict[str, str]:
    """{group: the option selected} for NAMED_BY_CHOICE, from Hydra's `runtime.choices` of a composition."""
    return {g: str(choices[g]) for g in NAMED_BY_CHOICE if choices is not None and choices.get(g)}


def compose(overrides: Sequence[str] = ()) -> Config:
    """The cell `python -m apps_bench OVERRIDES` composes, typed: how a command or step reads conf/'s
    values outside a cell (a model preset, an optimizer's defaults, the tracking settings), through Hydra
    like a cell. Inside a running Hydra app it composes with that app's search path; elsewhere with the
    package's conf/ after the command's `--config-dir` (config_dirs). Each option's name is the option
    selected (option_names). Hydra's errors pass through. A command that needs one self-contained option
    file and no cell reads it with read_option instead (Hydra's import and a cell's composition: ~0.2 s)."""
    from hydra import compose as hydra_compose
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        register_configs()
        return _named_cell(hydra_compose("config", overrides=list(overrides), return_hydra_config=True))
    with hydra_on(CONF_DIR):
        return _named_cell(hydra_compose("config", overrides=list(overrides), return_hydra_config=True))


class ConfFileError(ValueError, AppsBenchError):
    """A conf/ file that read_option or read_setting cannot read on its own; the message says which and why."""


def conf_file(*parts: str) -> Path | None:
    """conf/<parts> (e.g. `judge`, `seed.yaml`): the command's `--config-dir` folders first, then the
    package's conf/, the order the composition searches them; None when no folder has it."""
    for root in [*overlay_dirs(), CONF_DIR]:
        path = Path(root).joinpath(*parts)
        if path.is_file():
            return path
    return None


def read_option(group: str, option: str, overrides: Sequence[str] = ()) -> Any:
    """`group=option` as a composed cell holds it, read from its one YAML file without composing a cell:
    typed by the group's schema (a Config field: an unknown key, a wrong type or a missing value fails
    naming the key), its name the option selected (NAMED_BY_CHOICE), `overrides` (`key=value` inside the
    group, dotted keys, YAML values) applied on top. For the commands that read a group or two and never
    run a cell (the judge command, re-scoring): milliseconds, against ~0.2 s for Hydra's import and a
    cell's composition. A file that composes others (a defaults list, a `# @package` line) is refused
    (ConfFileError): only compose() reads it as a cell would. OmegaConf's errors and the schema's
    ValueErrors pass through."""
    from omegaconf import OmegaConf

    path = conf_file(group, f"{option}.yaml")
    if path is None:
        raise ConfFileError(f"no {group} option {option!r} (conf/{group}/{option}.yaml)")
    text = path.read_text(encoding="utf-8")
    node = OmegaConf.create(text)
    header = itertools.takewhile(lambda line: line.startswith("#"), text.splitlines())  # where Hydra reads @package
    if any("@package" in line for line in header) or "defaults" in node:
        raise ConfFileError(
            f"{path} composes other config files (a defaults list or a @package line): "
            f"read {group}={option} through config.compose"
        )
    if group in NAMED_BY_CHOICE:
        node.name = option
    node = OmegaConf.merge(node, OmegaConf.from_dotlist(list(overrides)))
    return typed(get_type_hints(Config)[group], node)


def read_setting(key: str) -> Any:
    """A top-level setting as conf/config.yaml sets it, typed by the schema, without composing a cell.
    It is the composed cell's value too: the groups a cell composes by default set only their own
    package (only `experiment` and `debug`, null by default, write top-level keys; test_configs holds it)."""
    from omegaconf import DictConfig, OmegaConf

    path = conf_file("config.yaml")
    node = OmegaConf.load(path) if path is not None else None
    if not isinstance(node, DictConfig) or key not in node or key == "defaults":
        raise ConfFileError(f"conf/config.yaml sets no {key!r}")
    schema = make_dataclass("Setting", [(key, get_type_hints(Config)[key])])
    return getattr(typed(schema, {key: node[key]}), key)


def _named_cell(cfg: DictConfig) -> Config:
    """A composition with its Hydra node as the typed cell, each option named by the option selected."""
    from omegaconf import open_dict

    name_options(cfg, cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return typed_config(cfg)


class TargetError(ValueError, AppsBenchError):
    """A config's `_target_` that names nothing in this install: the message says which part is missing."""


def resolve_target(target: str) -> Any:
    """The object a config's `_target_` names (`module.attribute`: a runner class, an optimizer method),
    imported. A missing module or attribute is a TargetError; an ImportError from inside the module
    (one of its own dependencies missing) passes through as it is."""
    import importlib

    module_name, _, attr = target.rpartition(".")
    if not module_name:
        raise TargetError(f"{target!r} is not a module.attribute path")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not exc.name or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise
        raise TargetError(f"{target} is not in this install (no module {exc.name!r})") from None
    if not hasattr(module, attr):
        raise TargetError(f"module {module_name} has no {attr!r}")
    return getattr(module, attr)


def as_plain(value: object) -> Any:
    """A config value as plain Python (dicts, lists, scalars) that SDKs can JSON-encode and
    callers may change: an OmegaConf node resolved (a missing value as None), a dataclass as
    its fields, anything else deep-copied."""
    import copy
    from dataclasses import asdict, is_dataclass

    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if hasattr(value, "_get_node"):  # an OmegaConf container (omegaconf is imported only when one is passed)
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True, throw_on_missing=False)
    return copy.deepcopy(value)


def cell_data(cfg: object) -> JsonObject:
    """A composed cell as plain data, without the `hydra` node (whose `${hydra:...}` values do
    not resolve outside a running job): what the grid guard, the cell key and config.yaml read.
    When the node is there, each option is named by the option selected (option_names)."""
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(cfg, DictConfig):
        assert isinstance(cfg, Mapping), f"a composed cell is a mapping, not {type(cfg).__name__}"
        return dict(as_plain(dict(cfg)))
    out: JsonObject = {}
    for k in cfg.keys():
        if k == "hydra":
            continue
        out[str(k)] = None if OmegaConf.is_missing(cfg, k) else as_plain(cfg[k])
    choices = OmegaConf.select(cfg, "hydra.runtime.choices") if "hydra" in cfg else None
    for group, name in option_names(choices).items():
        if isinstance(out.get(group), dict):
            out[group]["name"] = name
    return out


def name_options(cfg: DictConfig, choices: Mapping[str, object] | None) -> None:
    """Set each NAMED_BY_CHOICE option's name in a composed cell (a running job's config, whose Hydra node
    is apart: `HydraConfig.get().runtime.choices`) to the option selected, as cell_data does."""
    from omegaconf import OmegaConf, read_write

    with read_write(cfg):
        for group, name in option_names(choices).items():
            if group in cfg:
                OmegaConf.update(cfg, f"{group}.name", name, merge=False)


T = TypeVar("T")


def typed(schema: type[T], data: object) -> T:
    """`data` (a mapping or an OmegaConf node) as the schema dataclass `schema`, checked the way
    Hydra checks a composed node: an unknown key, a wrong type or a missing value (no code
    default fills it: the YAML under conf/ sets every key) fails here, naming the key."""
    from omegaconf import OmegaConf

    if isinstance(data, schema):
        return data
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), data))  # type: ignore[return-value]


def typed_config(cfg: object) -> Config:
    """The composed cell (a Hydra node or its plain data) as the schema's dataclasses: the one
    object every stage reads after composition. Plain data is checked against the schema the
    way Hydra checks a composed node (a wrong type or an unknown key fails here)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, Config):
        return cfg
    if isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is Config and "hydra" not in cfg:
        # composed on the schema, so already checked as below: only converted (3 ms, not 30)
        return OmegaConf.to_object(cfg)  # type: ignore[return-value]
    data = cell_data(cfg)
    optimizer = data.get("optimizer")
    schema = OPTIMIZER_SCHEMAS.get(str(optimizer.get("name"))) if isinstance(optimizer, dict) else None
    if schema is not None:  # plain data names its method: its params are typed as Hydra types them
        data = {**data, "optimizer": typed(schema, optimizer)}
    return typed(Config, data)


def config_data(config: Config) -> JsonObject:
    """The typed config as plain data: what config.yaml holds and the cell key is computed from."""
    from dataclasses import asdict

    return asdict(config)


def problems_in_flight(config: Config) -> int:
    """Problems solved at once: `concurrency`, but no more than the model server answers at once
    (`model.max_concurrency`, when set). On a one-request-at-a-time server a further problem only
    waits in the queue, and its time cap would count other problems' calls: the same problem could
    pass or hit its cap depending on how many problems ran beside it."""
    capacity = config.model.max_concurrency
    return min(config.concurrency, capacity) if capacity > 0 else config.concurrency
