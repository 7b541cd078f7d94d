"""The command line's overrides, checked before Hydra composes them.

Hydra answers a misspelt option, an unknown setting or a value of the wrong type with its own
message and exit 1 (and suggests `+limt=5` for a misspelt `limit`, which then fails the schema).
Here each is answered like every other bad setting (config/validate.py): all of them in one message,
what was wrong, "did you mean", the override that fixes it, exit 2, nothing written. The checks
read only the schema (config/schema.py) and the option files under conf/, so they cost milliseconds.
"""

from __future__ import annotations

import difflib
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from apps_bench.config.schema import CONF_DIR, OPTIMIZER_SCHEMAS, Config, hydra_on, overlay_dirs
from apps_bench.config.validate import PROVIDER_ONLY, RULES, BadSetting, InvalidSettings, check_settings

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from hydra.core.config_loader import ConfigLoader
    from hydra.core.override_parser.types import Override

# Hydra's own command-line options that take a value (the value is not an override)
_FLAGS_WITH_VALUE = {
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
}
_KIND: dict[object, str] = {int: "a whole number", float: "a number", bool: "true or false", str: "text", list: "a list"}


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


def config_dirs_of(argv: Iterable[str]) -> list[str]:
    """The command's `--config-dir DIR` (`-cd DIR`, `--config-dir=DIR`): the last one, as Hydra takes it."""
    return split_config_dir(argv)[0]


def split_config_dir(argv: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the command's `--config-dir` as config_dirs_of gives it, the other arguments)."""
    found: list[str] = []
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        flag, eq, value = arg.partition("=")
        if flag in ("--config-dir", "-cd"):
            value = value if eq else next(it, "")
            found = [value] if value else found
        else:
            rest.append(arg)
    return found, rest


def _searchpath(argv: Iterable[str]) -> list[str]:
    """The command's `hydra.searchpath=[...]` override, which Hydra applies when it loads a config."""
    return [a for a in override_args(argv) if a.split("=", 1)[0] == "hydra.searchpath"]


def groups(argv: Iterable[str] = ()) -> dict[str, list[str]]:
    """Config group -> its options (the YAML files of conf/<group>/) in every folder the command `argv`
    searches: its `--config-dir` (config.config_dirs, entered by the command), the package's conf/ and
    `hydra.searchpath`. The groups are the package's (Hydra's own left out); a folder adds options.
    Read from the folders (milliseconds; Hydra's own listing costs a tenth of a second a group)."""
    package = Path(CONF_DIR)
    names = sorted(d.name for d in package.iterdir() if d.is_dir() and d.name != "hydra")
    out: dict[str, set[str]] = {g: set() for g in names}
    for folder in [*map(Path, overlay_dirs()), package, *_searchpath_folders(_searchpath(argv))]:
        for group in names:
            where = folder / group
            if where.is_dir():
                out[group].update(f.name[: -len(".yaml")] for f in where.iterdir() if f.name.endswith(".yaml"))
    return {g: sorted(o) for g, o in out.items()}


def _searchpath_folders(searchpath: list[str]) -> list[Traversable]:
    """The folders of a `hydra.searchpath=[...]` override: file:// (or plain) paths and pkg:// packages."""
    from importlib import resources

    from hydra.core.override_parser.overrides_parser import OverridesParser

    folders: list[Traversable] = []
    for raw in searchpath:
        try:
            entries = OverridesParser.create().parse_overrides([raw])[0].value()
        except Exception:  # noqa: BLE001 - Hydra says what is wrong with it
            continue
        for entry in entries if isinstance(entries, list) else []:
            text = str(entry)
            if text.startswith("pkg://"):
                package, _, sub = text.removeprefix("pkg://").partition("/")
                try:
                    folders.append(resources.files(package.replace("/", ".")).joinpath(sub) if sub else resources.files(package))
                except (ModuleNotFoundError, TypeError):
                    continue
            else:
                folders.append(Path(text.removeprefix("file://")))
    return folders


# settings that come with an option and decide what runs: set apart from the option, the cell would be
# labelled one thing and run another (`topology.name=independent` on the single runner)
OPTION_KEYS: dict[str, tuple[str, ...]] = {
    "dataset": ("name", "source"),
    "topology": ("name", "flow", "framework", "_target_"),
    "model": ("name", "provider"),
    "optimizer": ("name", "_target_"),
    "judge": ("profile", "_target_"),  # the rules class decides verdicts; the records name the profile
}
# groups a cell may go without (config.yaml: `optional experiment: null`, `debug: null`)
OPTIONAL_GROUPS = ("experiment", "debug")


def check_overrides(argv: Iterable[str]) -> list[BadSetting]:
    """Every override that names no option, no setting, or a value of the wrong type; a setting that
    comes with an option (OPTION_KEYS); a key given twice; a deletion a cell cannot do without; and a
    preset of the command's own folders (`--config-dir`, `hydra.searchpath`) that does not load."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    argv = list(argv)
    bad: list[BadSetting] = []
    methods: list[str] | None = None  # the optimizer(s) the command chooses, found when first needed
    models: list[tuple[str, str]] | None = None  # (name, provider) of the model(s) it chooses, likewise
    seen: dict[str, str] = {}
    searchpath = _searchpath(argv)
    options = groups(argv)
    bad += _shadowed(searchpath)
    own = _own_presets(searchpath)
    mine: list[tuple[str, str]] = []  # the user's presets the command selects: loaded below, to check them
    for raw in override_args(argv):
        try:
            [ov] = parser.parse_overrides([raw])
        except HydraException as exc:
            reason = str(exc).splitlines()[0]
            key, _, value = raw.partition("=")
            bad.append(
                BadSetting(
                    key,
                    value,
                    f"cannot be read as an override ({reason})",
                    "key=value; a list as key=[a,b]; a sweep (with -m) as key=a,b",
                )
            )
            continue
        key = ov.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        if key in seen:
            bad.append(_twice(key, seen[key], raw))
            continue
        seen[key] = raw
        if ov.is_delete():
            bad += _deletion(key, options)
            continue
        values = _values(ov)
        if key in options:
            missing = [v for v in values if str(v) not in options[key]]
            bad += [_no_option(key, v, options[key]) for v in missing]
            mine += [(key, str(v)) for v in values if f"{key}/{v}" in own]
        elif key.partition(".")[0] in OPTION_KEYS and key.partition(".")[2] in OPTION_KEYS[key.partition(".")[0]]:
            bad += [_comes_with_option(key, v, options) for v in values[:1]]
        elif key.startswith("optimizer.params."):
            methods = methods if methods is not None else _chosen_optimizers(argv)
            bad += _params_problems(key, values, methods)
        elif key.startswith(_PROVIDER_KEYS):
            models = models if models is not None else _chosen_models(argv)
            bad += _provider_problems(key, values, models) or _setting_problems(key, values, options)
        else:
            bad += _setting_problems(key, values, options)
    # a preset of a packaged name replaces it wherever it is selected, by the command line or by default
    mine += [(g, o) for g, _, o in (p.partition("/") for p in sorted(own)) if (Path(CONF_DIR) / g / f"{o}.yaml").is_file()]
    if mine:
        with _loader() as loader:
            bad += [p for key, option in dict.fromkeys(mine) for p in _unloadable(loader, key, option, searchpath)]
    return bad


def _own_presets(searchpath: list[str]) -> set[str]:
    """`group/option` of every preset in the user's folders (`--config-dir`, `hydra.searchpath`)."""
    folders = [*map(Path, overlay_dirs()), *_searchpath_folders(searchpath)]
    return {
        f"{d.name}/{f.name[: -len('.yaml')]}"
        for folder in folders
        if folder.is_dir()
        for d in folder.iterdir()
        if d.is_dir()
        for f in d.iterdir()
        if f.name.endswith(".yaml")
    }


@contextmanager
def _loader() -> Iterator[ConfigLoader]:
    """Hydra's config loader on the command's search path (config.hydra_on)."""
    from hydra.core.global_hydra import GlobalHydra

    with hydra_on(CONF_DIR):
        yield GlobalHydra.instance().config_loader()


def _shadowed(searchpath: list[str]) -> list[BadSetting]:
    """A file in a `hydra.searchpath` folder of a packaged preset's name: Hydra searches those folders after the
    package's conf/, so the packaged preset would run instead of it, without a word."""
    bad = []
    for folder in _searchpath_folders(searchpath):
        if not isinstance(folder, Path) or not folder.is_dir():
            continue
        for own in sorted(folder.glob("*/*.yaml")):
            if (Path(CONF_DIR) / own.parent.name / own.name).is_file():
                bad.append(
                    BadSetting(
                        "hydra.searchpath",
                        searchpath[-1].partition("=")[2],
                        f"{own} has the name of the packaged {own.parent.name}={own.stem}, which Hydra finds first "
                        "(hydra.searchpath is searched after the package's conf/), so it would never be used",
                        f"--config-dir {folder} (searched first), or rename {own.name}",
                    )
                )
    return bad


def _twice(key: str, first: str, second: str) -> BadSetting:
    """Hydra keeps the last of two values of a setting without a word (and stops with a traceback for a group)."""
    said = second.partition("=")[0] if second.startswith("~") else key  # a deletion is said without a value
    return BadSetting(
        said,
        second.partition("=")[2],
        f"given twice ({first} and {second}); a cell has one value",
        f"give it once (e.g. {second.lstrip('+')}); to run both values: -m {key}=A,B",
    )


def _deletion(key: str, options: dict[str, list[str]]) -> list[BadSetting]:
    """`~group` and `~setting`: a cell cannot go without an axis or a setting of the schema (every one has a
    value: its default, or null where the schema allows it). Inside a free-form mapping (model.extra_body)
    and for an optional group, Hydra deletes as documented."""
    if key in OPTIONAL_GROUPS:
        return []
    if key in options:
        return [
            BadSetting(
                f"~{key}",
                "",
                f"a cell needs a {key} (options: {', '.join(options[key])})",
                f"drop ~{key} (the default option), or {key}=NAME",
            )
        ]
    if not _walk(key.split("."))[0]:
        return _setting_problems(key, [""], options)
    if not _is_schema_node(key):
        return []  # a key of a free-form mapping (model.extra_body.x): deleted as Hydra documents
    return [
        BadSetting(
            f"~{key}",
            "",
            "a setting of the schema, which every cell has (it cannot be deleted)",
            f"drop ~{key} (its default), or {key}=VALUE{' (null: none)' if _nullable(key) else ''}",
        )
    ]


def _is_schema_node(key: str) -> bool:
    """Whether `key` is a field of a schema dataclass (not a key inside a free-form mapping)."""
    import dataclasses

    parts = key.split(".")
    parent: object = Config
    for part in parts[:-1]:
        known, parent = _field_type(parent, part)
        if not known:
            return False
    return dataclasses.is_dataclass(parent) and _field_type(parent, parts[-1])[0]


def _nullable(key: str) -> bool:
    import dataclasses
    import typing

    parts = key.split(".")
    parent: object = Config
    for part in parts[:-1]:
        parent = _field_type(parent, part)[1]
    if not dataclasses.is_dataclass(parent):
        return True
    hint = typing.get_type_hints(parent).get(parts[-1])
    return type(None) in typing.get_args(hint)


def _comes_with_option(key: str, value: object, options: dict[str, list[str]]) -> BadSetting:
    group, _, leaf = key.partition(".")
    choices = options.get(group, [])
    if leaf == "name" and str(value) in choices:
        fix = f"{group}={value}"
    else:
        guess = closest(str(value), choices) if leaf == "name" else None
        fix = (
            f"{group}={guess or 'NAME'} (options: {', '.join(choices)}), or a preset of your own: "
            f"--config-dir DIR with DIR/{group}/{value if leaf == 'name' else 'NAME'}.yaml"
        )
    return BadSetting(
        key,
        value,
        f"comes with the {group} option: the option names the cell and decides what runs, "
        f"so {group}.{leaf} is not set apart from it",
        fix,
    )


def _unloadable(loader: ConfigLoader, group: str, option: str, searchpath: list[str]) -> list[BadSetting]:
    """The option composed alone (with the command's search path): a file that does not parse, named with its
    path and line, or a preset Hydra cannot compose, with Hydra's reason."""
    from hydra.types import RunMode

    try:
        loader.load_configuration("config", [f"{group}={option}", *searchpath], run_mode=RunMode.RUN)
    except Exception as exc:  # noqa: BLE001 - any reason a preset does not load is the answer
        return [BadSetting(group, option, *_load_failure(exc, group, option))]
    return []


def _load_failure(exc: BaseException, group: str, option: str) -> tuple[str, str]:
    """(what is wrong, the fix) for a preset that does not load: a YAML error's file and line when there is one."""
    import yaml

    err: BaseException | None = exc
    while err is not None and not isinstance(err, yaml.MarkedYAMLError):
        err = err.__cause__ or err.__context__
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}"
        ctx = err.context_mark
        since = f" at line {ctx.line + 1}" if ctx is not None and ctx.line != mark.line else ""
        what = " ".join(p for p in (err.problem, f"({err.context}{since})" if err.context else "") if p)
        return f"the preset's file does not parse: {where}: {what}", f"correct line {mark.line + 1} of {mark.name}"
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"the preset does not load: {reason}", f"fix {group}/{option}.yaml in your config folder"


def _chosen_optimizers(argv: Iterable[str]) -> list[str]:
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
    return chosen or [_composed_optimizer(rest)]


def _params_problems(key: str, values: list[object], methods: list[str]) -> list[BadSetting]:
    """An `optimizer.params.*` override checked against the chosen methods' params schemas (config/schema.py)."""
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
        return [
            BadSetting(
                key,
                shown,
                f"a setting of optimizer={' or '.join(owners)}; optimizer={', '.join(lacking)} has none",
                f"optimizer={owners[0]} {key}={_shown(shown)}, or drop {key}",
            )
        ]
    guess = closest(key, [f"optimizer.params.{k}" for m in lacking for k in _leaf_keys(schemas[m])])
    return [
        BadSetting(
            key,
            shown,
            f"no setting of optimizer={', '.join(lacking)}{f' (did you mean {guess})' if guess else ''}",
            f"{guess}={_shown(shown)}" if guess else f"drop {key} (see conf/optimizer/{lacking[0]}.yaml)",
        )
    ]


def _composed_optimizer(overrides: list[str]) -> str:
    from hydra import compose

    try:
        with hydra_on(CONF_DIR):
            return str(compose("config", overrides=overrides).optimizer.name)
    except Exception:  # noqa: BLE001 - another override's problem: said by check_overrides or by Hydra
        return ""


# a provider's own settings (model.gold.*, model.local.*): only its presets have the section to set them in
_PROVIDER_KEYS = tuple(f"model.{p}." for p in PROVIDER_ONLY)


def _chosen_models(argv: Iterable[str]) -> list[tuple[str, str]]:
    """(name, provider) of each model the command chooses (`model=`, a sweep's choices, or the default),
    as its other model settings compose it; none for a choice that does not compose (said elsewhere)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    chosen: list[str] = []
    rest = []
    for raw in override_args(argv):
        try:
            [ov] = OverridesParser.create().parse_overrides([raw])
        except Exception:  # noqa: BLE001 - said by check_overrides
            continue
        key = ov.key_or_group.lstrip("+")
        if key == "model":
            chosen = [str(v) for v in _values(ov)]
        elif key.startswith("model.") and not key.startswith(_PROVIDER_KEYS) and not ov.is_sweep_override():
            rest.append(raw)
    found = [_composed_model([*rest, f"model={name}"] if name else rest) for name in chosen or [""]]
    return [m for m in found if m is not None]


def _composed_model(overrides: list[str]) -> tuple[str, str] | None:
    from hydra import compose

    try:
        with hydra_on(CONF_DIR):
            model = compose("config", overrides=overrides).model
    except Exception:  # noqa: BLE001 - another override's problem: said by check_overrides or by Hydra
        return None
    return str(model.name), str(model.provider)


def _provider_problems(key: str, values: list[object], models: list[tuple[str, str]]) -> list[BadSetting]:
    """A provider's own setting on a model of another provider, which has no such section (and would ignore it)."""
    provider = key.split(".")[1]
    shown = values[0] if values else ""
    for name, theirs in models:
        if theirs != provider:
            why = f"only model={PROVIDER_ONLY[provider]} uses it; model={name} would ignore it"
            return [BadSetting(key, shown, why, f"drop {key}, or model={provider}")]
    return []


def _values(ov: Override) -> list[object]:
    """The value(s) an override gives: each choice of a sweep, nothing to check for a range sweep."""
    from hydra.core.override_parser.types import ChoiceSweep

    if not ov.is_sweep_override():
        return [ov.value()]
    value = ov.value()
    return list(value.list) if isinstance(value, ChoiceSweep) else []


def closest(word: str, choices: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def _no_option(group: str, value: object, choices: list[str]) -> BadSetting:
    guess = closest(str(value), choices)
    hint = f", did you mean {guess}" if guess else ""
    return BadSetting(group, value, f"no such {group}{hint} (options: {', '.join(choices)})", f"{group}={guess or choices[0]}")


def _field_type(cls: object, name: str) -> tuple[bool, object]:
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


def _walk(parts: list[str], root: object = None) -> tuple[bool, object]:
    """(whether the schema (`root`, default Config) has the setting at `parts`, its type); type None =
    inside a free-form mapping (model.extra_body, optimizer.params.optimizer_model, ...), where any key goes."""
    import dataclasses
    import typing

    typ: object = root or Config
    for part in parts:
        if typ is dict or typing.get_origin(typ) is dict or typ is Any:
            return True, None
        known, typ = _field_type(typ, part)
        if not known:
            return False, None
    return True, (None if dataclasses.is_dataclass(typ) else typ)


def _leaf_keys(cls: object = None, prefix: str = "") -> list[str]:
    import dataclasses

    cls = cls or Config
    assert dataclasses.is_dataclass(cls), cls
    out = []
    for f in dataclasses.fields(cls):
        _, typ = _field_type(cls, f.name)
        if dataclasses.is_dataclass(typ):
            out += _leaf_keys(typ, f"{prefix}{f.name}.")
        else:
            out.append(f"{prefix}{f.name}")
    return out


def _fits(typ: object, value: object) -> bool:
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


def _setting_problems(key: str, values: list[object], options: dict[str, list[str]]) -> list[BadSetting]:
    """An unknown setting (with the closest group, for a word without a dot, or the closest real setting),
    or values its schema type refuses."""
    known, typ = _walk(key.split("."))
    shown = values[0] if values else ""
    group = closest(key, options) if "." not in key else None
    if not known and group:
        choices = options[group]
        picked = [str(v) for v in values if str(v) in choices] or [closest(str(shown), choices) or choices[0]]
        return [
            BadSetting(
                key,
                shown,
                f"no such group or setting (did you mean the group {group}; options: {', '.join(choices)})",
                f"{group}={','.join(picked) if len(values) > 1 else picked[0]}",
            )
        ]
    if not known:
        settable = [k for k in _leaf_keys() if k.partition(".")[2] not in OPTION_KEYS.get(k.partition(".")[0], ())]
        guess = closest(key, settable)
        return [
            BadSetting(
                key,
                shown,
                f"unknown setting{f' (did you mean {guess})' if guess else ''}",
                f"{guess}={_shown(shown)}" if guess else "python -m apps_bench --help lists the settings",
            )
        ]
    return [_wrong_type(key, v, typ) for v in values if not _fits(typ, v)]


def _wrong_type(key: str, value: object, typ: object) -> BadSetting:
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


def _shown(value: object) -> str:
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return "null" if value is None else str(value)


def with_range_problems(bad: list[BadSetting], argv: Iterable[str]) -> list[BadSetting]:
    """`bad` plus what the settings check (config/validate.py) finds in the cell the other overrides compose,
    so one message lists every bad setting (a sweep's choices are left to the sweep's own check)."""
    from hydra import compose

    named = {b.key for b in bad}
    rest = [a for a in override_args(argv) if a.lstrip("+~").split("=", 1)[0] not in named]
    try:
        with hydra_on(CONF_DIR):
            composed = compose("config", overrides=rest)
        check_settings(composed)
    except InvalidSettings as exc:
        return bad + [b for b in exc.bad if b.key not in named]
    except Exception:  # noqa: BLE001 - a sweep or another error: the overrides' own problems are the answer
        pass
    return bad
