"""Judge profiles: the `judge` group of conf/, composed by Hydra and checked against the schema.

For the commands that judge without running a cell (`python -m apps_bench.judge`, re-scoring):
the profile is composed as a cell's `judge` would be (`config.compose`: an unknown key, a wrong type
or a missing value fails), overrides applied, and returned typed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from apps_bench.config import CONF_DIR, Config, JudgeConfig, compose


class JudgeConfigError(ValueError):
    """A judge profile that does not exist, or a judge setting that is wrong; the message says which."""


def available_profiles() -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / "judge").glob("*.yaml"))


def judge_config(profile: str, overrides: Sequence[str] = ()) -> JudgeConfig:
    """The judge `judge=<profile>` composes, as the typed `JudgeConfig` (its `sandbox` a checked
    SandboxLimits), `overrides` (`key=value`, dotted keys such as `sandbox.output_cap_bytes=1000`) applied."""
    return judge_cell(profile, overrides).judge


def judge_cell(profile: str, overrides: Sequence[str] = (), cell: Sequence[str] = ()) -> Config:
    """The whole cell `judge=<profile>` and the cell overrides `cell` compose (one composition: each
    costs ~0.15 s of CPU), its judge checked as `judge_config` says."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if profile not in available_profiles():
        raise JudgeConfigError(
            f"no judge profile {profile!r} (conf/judge/{profile}.yaml); available: {', '.join(available_profiles())}")
    for item in overrides:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise JudgeConfigError(f"bad judge override {item!r}: use key=value, e.g. sandbox.output_cap_bytes=1000000")
    try:
        composed = compose([f"judge={profile}", *(f"judge.{item}" for item in overrides), *cell])
    except (HydraException, OmegaConfBaseException) as e:
        raise JudgeConfigError(f"judge profile {profile!r}: {_first_line(e)}") from None
    except ValueError as e:  # a limit SandboxLimits refuses (e.g. judge.sandbox.nproc must be > 0)
        raise JudgeConfigError(str(e)) from None
    if composed.judge.profile != profile:
        raise JudgeConfigError(
            f"conf/judge/{profile}.yaml declares profile {composed.judge.profile!r}; a file names its own profile")
    return composed


def _first_line(exc: BaseException) -> str:
    """Hydra wraps OmegaConf's error (which names the key) in a composition error: the innermost says most."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return str(exc).splitlines()[0]
