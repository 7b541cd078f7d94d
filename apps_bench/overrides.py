"""The command line's overrides, checked before Hydra composes them.

Hydra answers a misspelt option, an unknown setting or a value of the wrong type with its own
message and exit 1 (and suggests `+limt=5` for a misspelt `limit`, which then fails the schema).
Here each is answered like every other bad setting (validate.py): all of them in one message,
what was wrong, "did you mean", the override that fixes it, exit 2, nothing written. The checks
read only the schema (config.py) and the option files under conf/, so they cost milliseconds.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Iterable

from apps_bench.config import OPTIMIZER_SCHEMAS, Config, cell_data, hydra_on
from apps_bench.validate import RULES, BadSetting, InvalidSettings, check_settings

# Hydra's own command-line options that take a value (the value is not an override)
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun"}  # fmt: skip
_KIND = {int: "a whole number", float: "a number", bool: "true or false", str: "text", list: "a list"}


def override_args(argv: Iterable[str]) -> list[str]:
    """The overrides among the command's arguments (flags and their values left out)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _FLAGS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def groups(conf_dir: Path) -> dict[str, list[str]]:
    """Config group -> its options (the YAML files under conf/<group>/), Hydra's own groups left out."""
    out = {}
    for d in sorted(p for p in conf_dir.iterdir() if p.is_dir() and p.name != "hydra"):
        out[d.name] = sorted(f.stem for f in d.glob("*.yaml"))
    return out


def check_overrides(argv: Iterable[str], conf_dir: Path) -> list[BadSetting]:
    """Every override that names no option, no setting, or a value of the wrong type."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    options = groups(conf_dir)
    bad: list[BadSetting] = []
    methods: list[str] | None = None  # the optimizer(s) the command chooses, found when first needed
    for raw in override_args(argv):
        try:
            [ov] = parser.parse_overrides([raw])
        except HydraException as exc:
            reason = str(exc).splitlines()[0]
            key, _, value = raw.partition("=")
            bad.append(BadSetting(key, value, f"cannot be read as an override ({reason})",
                                  "key=value; a list as key=[a,b]; a sweep (with -m) as key=a,b"))  # fmt: skip
            continue
        key = ov.key_or_group
        if ov.is_delete() or key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        values = _values(ov)
        if key in options:
            bad += [_no_option(key, v, options[key]) for v in values if str(v) not in options[key]]
        elif key.startswith("optimizer.params."):
            methods = methods if methods is not None else _chosen_optimizers(argv, conf_dir)
            bad += _params_problems(key, values, methods)
        else:
            bad += _setting_problems(key, values)
    return bad


def _chosen_optimizers(argv: Iterable[str], conf_dir: Path) -> list[str]:
    """The optimizer(s) the command chooses (`optimizer=`, a sweep's choices, or what the other
    overrides compose to), whose params schemas `optimizer.params.*` overrides must name settings of."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    chosen: list[str] = []
    rest = []
    for raw in override_args(argv):
        try:
            [ov] = OverridesParser.create().parse_overrides([raw])
        except Exception:  # noqa: BLE001 - said by check_overrides
            continue
        if ov.key_or_group == "optimizer":
            chosen = [str(v) for v in _values(ov)]
        elif not ov.key_or_group.startswith("optimizer.params."):
            rest.append(raw)
    return chosen or [_composed_optimizer(rest, conf_dir)]


def _params_problems(key: str, values: list[Any], methods: list[str]) -> list[BadSetting]:
    """An `optimizer.params.*` override checked against the chosen methods' params schemas (config.py)."""
    import typing


    schemas = {m: typing.get_type_hints(s)["params"] for m, s in OPTIMIZER_SCHEMAS.items()}
    parts = key.split(".")[2:]
    chosen = [m for m in methods if m in schemas]  # an unknown method is its own override's problem
    lacking = [m for m in chosen if not _walk(parts, schemas[m])[0]]
    shown = values[0] if values else ""
    if not lacking:
        typ = _walk(parts, schemas[chosen[0]])[1] if chosen else None
        return [_wrong_type(key, v, typ) for v in values if not _fits(typ, v)]
    owners = [m for m in schemas if _walk(parts, schemas[m])[0]]
    if owners:
        return [BadSetting(key, shown, f"a setting of optimizer={' or '.join(owners)}; optimizer={', '.join(lacking)} has none",
                           f"optimizer={owners[0]} {key}={_shown(shown)}, or drop {key}")]  # fmt: skip
    guess = closest(key, [f"optimizer.params.{k}" for m in lacking for k in _leaf_keys(schemas[m])])
    return [BadSetting(key, shown, f"no setting of optimizer={', '.join(lacking)}{f' (did you mean {guess})' if guess else ''}",
                       f"{guess}={_shown(shown)}" if guess else f"drop {key} (see conf/optimizer/{lacking[0]}.yaml)")]  # fmt: skip


def _composed_optimizer(overrides: list[str], conf_dir: Path) -> str:
    from hydra import compose


    try:
        with hydra_on(conf_dir):
            return str(compose("config", overrides=overrides).optimizer.name)
    except Exception:  # noqa: BLE001 - another override's problem: said by check_overrides or by Hydra
        return ""


def _values(ov: Any) -> list[Any]:
    """The value(s) an override gives: each choice of a sweep, nothing to check for a range sweep."""
    from hydra.core.override_parser.types import ChoiceSweep

    if not ov.is_sweep_override():
        return [ov.value()]
    value = ov.value()
    return list(value.list) if isinstance(value, ChoiceSweep) else []


def closest(word: str, choices: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def _no_option(group: str, value: Any, choices: list[str]) -> BadSetting:
    guess = closest(str(value), choices)
    hint = f", did you mean {guess}" if guess else ""
    return BadSetting(group, value, f"no such {group}{hint} (options: {', '.join(choices)})",
                      f"{group}={guess or choices[0]}")  # fmt: skip


def _field_type(cls: Any, name: str) -> tuple[bool, Any]:
    """(whether dataclass `cls` has setting `name`, its type with Optional unwrapped)."""
    import dataclasses
    import typing

    if not dataclasses.is_dataclass(cls) or name not in {f.name for f in dataclasses.fields(cls)}:
        return False, None
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        hint = args[0]
    return True, hint


def _walk(parts: list[str], root: Any = None) -> tuple[bool, Any]:
    """(whether the schema (`root`, default Config) has the setting at `parts`, its type); type None =
    inside a free-form mapping (model.extra_body, optimizer.params.optimizer_model, ...), where any key goes."""
    import dataclasses
    import typing


    typ: Any = root or Config
    for part in parts:
        if typ is dict or typing.get_origin(typ) is dict or typ is Any:
            return True, None
        known, typ = _field_type(typ, part)
        if not known:
            return False, None
    return True, (None if dataclasses.is_dataclass(typ) else typ)


def _leaf_keys(cls: Any = None, prefix: str = "") -> list[str]:
    import dataclasses


    cls = cls or Config
    out = []
    for f in dataclasses.fields(cls):
        _, typ = _field_type(cls, f.name)
        if dataclasses.is_dataclass(typ):
            out += _leaf_keys(typ, f"{prefix}{f.name}.")
        else:
            out.append(f"{prefix}{f.name}")
    return out


def _fits(typ: Any, value: Any) -> bool:
    """Whether the schema would take `value` for a setting of type `typ` (None: null is allowed
    where Hydra allows it; the settings check says where it is not)."""
    import typing

    if value is None or typ is None or typ is Any:
        return True
    origin = typing.get_origin(typ) or typ
    if origin is bool:
        return isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is str:
        return isinstance(value, (str, int, float, bool))
    if origin is list:
        return isinstance(value, list)
    if origin is dict:
        return isinstance(value, dict)
    return True


def _setting_problems(key: str, values: list[Any]) -> list[BadSetting]:
    """An unknown setting (with the closest real one), or values its schema type refuses."""
    known, typ = _walk(key.split("."))
    if not known:
        guess = closest(key, _leaf_keys())
        shown = values[0] if values else ""
        return [BadSetting(key, shown, f"unknown setting{f' (did you mean {guess})' if guess else ''}",
                           f"{guess}={_shown(shown)}" if guess else "python -m apps_bench --help lists the settings")]  # fmt: skip
    return [_wrong_type(key, v, typ) for v in values if not _fits(typ, v)]


def _wrong_type(key: str, value: Any, typ: Any) -> BadSetting:
    import typing


    parent, _, leaf = key.rpartition(".")
    for section, name, _ok, allowed, fix in RULES:  # the settings check's own words where it has them
        if (section, name) == (parent, leaf):
            return BadSetting(key, value, allowed, fix)
    origin = typing.get_origin(typ) or typ
    if origin is list:
        items = value if isinstance(value, (list, tuple)) else [value]
        return BadSetting(key, value, "a list", f"{key}=[{','.join(str(i) for i in items)}]")
    kind = _KIND.get(origin, f"a value of type {getattr(origin, '__name__', origin)}")
    return BadSetting(key, value, kind, f"{key}=<{kind}>")


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return "null" if value is None else str(value)


def with_range_problems(bad: list[BadSetting], argv: Iterable[str], conf_dir: Path) -> list[BadSetting]:
    """`bad` plus what the settings check (validate.py) finds in the cell the other overrides compose,
    so one message lists every bad setting (a sweep's choices are left to the sweep's own check)."""
    from hydra import compose


    named = {b.key for b in bad}
    rest = [a for a in override_args(argv) if a.lstrip("+~").split("=", 1)[0] not in named]
    try:
        with hydra_on(conf_dir):
            data = cell_data(compose("config", overrides=rest))
        check_settings(data)
    except InvalidSettings as exc:
        return bad + [b for b in exc.bad if b.key not in named]
    except Exception:  # noqa: BLE001 - a sweep or another error: the overrides' own problems are the answer
        pass
    return bad
