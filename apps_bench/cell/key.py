"""A cell: one point of the experiment grid, its stable key, and the grid guard.

The key is a hash of everything that changes a cell's results (the five axes, the
dataset revision/path, problem selection, test cap, judge profile and settings (its
sandbox limits included: `judge.sandbox`), tool limits, prompts, team size/rounds/limits, model sampling). Run-only settings
(concurrency, paths, verbosity, endpoint location, retries, injected latency/faults, prices)
are left out, so changing them resumes the same cell instead of starting a new one.
Anything not listed as run-only is part of the key: a new setting is safe by default.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from apps_bench.config.schema import Config, GridConfig, ModelConfig, as_plain, config_data, flat_model, typed_config
from apps_bench.config.validate import CellRefused, check_settings, typed_cell
from apps_bench.data.rows import EVAL_SPLIT
from apps_bench.errors import AppsBenchError
from apps_bench.types import JsonObject

AXES: tuple[str, ...] = ("dataset", "topology", "model", "optimizer", "seed")

KEY_VERSION = 1  # bump when the identity layout changes

# Settings that never change a cell's results, by config section ("" = top level).
RUN_ONLY: dict[str, frozenset[str]] = {
    "": frozenset(
        {
            "concurrency",
            "processes",
            "allow_any_cell",
            "out_dir",
            "verbose",
            "progress",
            "tracking",
            "grid",
            "hydra",
            "server_check",
        }
    ),
    "model": frozenset(
        {
            "base_url",
            "api_key_env",
            "request_timeout_s",
            "max_retries",
            "retry_backoff_s",
            "check_endpoint",
            "accept_tool_drop",  # whether a cell may run on a server that drops tools (recorded in provenance)
            "latency_ms",  # gold: added latency per call
            "fault_fraction",  # gold: injected infrastructure faults (errors are retried, never scored)
            "price",  # what tokens cost: changes a cell's cost in money, not its results
        }
    ),
    # the runner class is code, like every module of the project (the code's version is in the provenance):
    # the topology's name, flow, framework and settings identify the cell (and the optimizer's name and params)
    "topology": frozenset({"_target_"}),
    "optimizer": frozenset({"_target_"}),
    "dataset": frozenset({"streaming"}),
    # the judge profile's rules class is code too: the profile's name and `rules` version identify the cell
    "judge": frozenset({"workers", "_target_"}),
}


class CellSetupError(AppsBenchError):
    """The cell cannot start (bad selection, unreadable data, missing framework...): says what to fix."""


@dataclass(frozen=True)
class Cell:
    dataset: str
    topology: str
    model: str
    optimizer: str
    seed: int
    key: str
    identity: JsonObject = field(repr=False, compare=False)  # what the key hashes (cell.json holds it)
    model_id: str = ""  # the served model id, for presets whose id varies (openai, local); "" otherwise
    split: str = ""  # the rows' split as the user said it (dataset.split): in record keys, and in the name

    @property
    def model_label(self) -> str:
        """The model as names, tags and reports show it: `openai:<MODEL_ID>`, not just `openai`."""
        return f"{self.model}:{self.model_id}" if self.model_id else self.model

    def axes(self) -> dict[str, str | int]:
        return {
            "dataset": self.dataset,
            "topology": self.topology,
            "model": self.model,
            "optimizer": self.optimizer,
            "seed": self.seed,
        }

    @property
    def name(self) -> str:
        """Human-readable run name, e.g. `sequential_langgraph·qwen·none·s0`; a cell on rows other than
        the evaluation split says which (`single·gold·none·s0·train`)."""
        split = f"·{self.split}" if self.split and self.split not in (EVAL_SPLIT, self.dataset) else ""
        return f"{self.topology}·{self.model_label}·{self.optimizer}·s{self.seed}{split}"

    @property
    def dir_name(self) -> str:
        """Folder name under outputs/cells/: readable axes, then the key that identifies it."""
        model = re.sub(r"[^A-Za-z0-9_.:-]+", "_", self.model_label).replace(":", "-")
        return f"{self.dataset}-{self.topology}-{model}-{self.optimizer}-s{self.seed}-{self.key}"


def _file_digest(path: str) -> str | None:
    p = Path(path).expanduser()
    if not p.is_file():
        return None
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16]


def identity_of(cfg: Config | Mapping[str, object]) -> JsonObject:
    """The part of a composed config that changes results (see module docstring): of the typed config's
    data (config_data), or of plain data such as a cell folder's config.yaml (re-scoring)."""
    data = config_data(cfg) if isinstance(cfg, Config) else as_plain(cfg)
    if isinstance(data.get("model"), dict):  # hashed in the flat layout the keys were first made from
        data["model"] = flat_model(data["model"])
    out: JsonObject = {"key_version": KEY_VERSION}
    for k, v in data.items():
        if k in RUN_ONLY[""]:
            continue
        if isinstance(v, dict) and k in RUN_ONLY:
            v = {kk: vv for kk, vv in v.items() if kk not in RUN_ONLY[k]}
        out[k] = v
    judge = out.get("judge")
    if isinstance(judge, dict):  # an unset optional judge setting (None) leaves existing keys as they were
        out["judge"] = {k: v for k, v in judge.items() if v is not None}
    ds = out.get("dataset")
    if isinstance(ds, dict) and ds.get("path"):
        ds["path"] = str(Path(ds["path"]).expanduser().resolve())
    topo = out.get("topology")
    if isinstance(topo, dict) and topo.get("prompt_file"):
        # the prompts a file holds change results, not its name
        topo["prompt_file_sha256"] = _file_digest(str(topo["prompt_file"]))
    if isinstance(out.get("only"), list):
        out["only"] = [str(x) for x in out["only"]]
    return out


def cell_key(identity: Mapping[str, object]) -> str:
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def resolve_cell(cfg: object) -> Cell:
    """Compose-time config -> Cell (axes + stable key). Whatever shape `cfg` comes in (a Hydra node, its
    plain data, the typed Config), the key is computed from the typed config's data (`config_data`, what
    config.yaml holds): one serialisation, so no two paths can give one cell two keys."""
    config = typed_config(cfg)
    ident = identity_of(config)
    return Cell(
        dataset=config.dataset.name,
        topology=config.topology.name,
        model=config.model.name,
        optimizer=config.optimizer.name,
        seed=config.seed,
        key=cell_key(ident),
        identity=ident,
        model_id=_varying_model_id(config.model),
        split=config.dataset.split,
    )


# Presets whose model id comes from the environment or the user, so their name alone does not
# say which model ran (the key always does: model_id is part of the identity).
VARYING_MODEL_PROVIDERS = frozenset({"openai", "local"})


def _varying_model_id(model: ModelConfig) -> str:
    return model.model_id if model.provider in VARYING_MODEL_PROVIDERS else ""


def _same(a: object, b: object) -> bool:
    return str(a) == str(b)


def axes_of(config: Config) -> dict[str, str | int]:
    """The five axes of a composed cell (as `Cell.axes`): each option's name, and the seed."""
    return {
        "dataset": config.dataset.name,
        "topology": config.topology.name,
        "model": config.model.name,
        "optimizer": config.optimizer.name,
        "seed": config.seed,
    }


def grid_refusal(values: Mapping[str, str | int], grid: GridConfig) -> str | None:
    """Why the cell of these axes (`axes_of`, `Cell.axes`) lies outside `grid` (a message naming the axis
    and the value), or None."""
    gname = grid.name
    for axis in AXES:
        allowed = grid.axes.get(axis)
        if allowed is None:  # axis not constrained by this grid
            continue
        if not any(_same(values[axis], a) for a in allowed):
            return (
                f"cell refused: {axis}={values[axis]} is outside the experiment grid '{gname}' "
                f"(allowed {axis} values: {', '.join(str(a) for a in allowed)}). "
                f"Add it to conf/grid/{gname}.yaml, or pass allow_any_cell=true to run it anyway."
            )
    for rule in grid.exclude:
        if rule and all(_same(values.get(k), v) for k, v in rule.items()):
            combo = ", ".join(f"{k}={v}" for k, v in rule.items())
            first = next(iter(rule))
            return (
                f"cell refused: the combination {combo} is excluded by the experiment grid '{gname}' "
                f"(axis {first}={values.get(first)}). "
                f"Edit conf/grid/{gname}.yaml, or pass allow_any_cell=true to run it anyway."
            )
    return None


def guard(cfg: object) -> Cell:
    """Type the composed cell once (validate.typed_cell), refuse it if it lies outside the grid (unless
    allow_any_cell), then check its settings (config/validate.py). Every refusal comes before anything of the
    cell exists."""
    config = typed_cell(cfg)
    if not config.allow_any_cell:
        why = grid_refusal(axes_of(config), config.grid)
        if why:
            raise CellRefused(why)
    check_settings(config)
    return resolve_cell(config)
