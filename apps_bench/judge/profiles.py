"""Judge profiles: the `judge` group of conf/, read from its file and checked against the schema.

For the commands that judge without running a cell (`python -m apps_bench.judge`, re-scoring): the
profile is the `judge` a cell composes with `judge=<profile>` (the same file, the same schema: an
unknown key, a wrong type or a missing value fails), overrides applied, returned typed. It is read
with `config.read_option`, not through a cell's composition: Hydra's import and the composition would
cost these commands ~0.2 s each (docs/benchmarks.md, judge speed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from apps_bench.config.schema import CONF_DIR, JudgeConfig, read_option
from apps_bench.errors import AppsBenchError


class JudgeConfigError(ValueError, AppsBenchError):
    """A judge profile that does not exist, or a judge setting that is wrong; the message says which."""


def available_profiles() -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / "judge").glob("*.yaml"))


def judge_config(profile: str, overrides: Sequence[str] = ()) -> JudgeConfig:
    """The judge `judge=<profile>` composes, as the typed `JudgeConfig` (its `sandbox` a checked
    SandboxLimits), `overrides` (`key=value`, dotted keys such as `sandbox.output_cap_bytes=1000`) applied."""
    from omegaconf.errors import OmegaConfBaseException

    if profile not in available_profiles():
        raise JudgeConfigError(
            f"no judge profile {profile!r} (conf/judge/{profile}.yaml); available: {', '.join(available_profiles())}"
        )
    for item in overrides:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise JudgeConfigError(f"bad judge override {item!r}: use key=value, e.g. sandbox.output_cap_bytes=1000000")
    try:
        judge: JudgeConfig = read_option("judge", profile, overrides)
    except OmegaConfBaseException as e:  # names the key: "Key 'output_cap' not in 'SandboxLimits'"
        raise JudgeConfigError(f"judge profile {profile!r}: {str(e).splitlines()[0]}") from None
    except ValueError as e:  # a limit SandboxLimits refuses (e.g. judge.sandbox.nproc must be > 0)
        raise JudgeConfigError(str(e)) from None
    if judge.profile != profile:
        raise JudgeConfigError(f"conf/judge/{profile}.yaml declares profile {judge.profile!r}; a file names its own profile")
    return judge


def with_rules(recorded: Mapping[str, object]) -> dict[str, object]:
    """A cell's recorded judge settings, with its profile's `_target_` (conf/judge/<profile>.yaml) when
    they name none: cells recorded before profiles named their rules class. The class is code, not a
    setting (it is not in the cell key), so the profile's file says which one judged them."""
    out = dict(recorded)
    if "_target_" not in out and isinstance(out.get("profile"), str):
        out["_target_"] = judge_config(str(out["profile"]))._target_
    return out
