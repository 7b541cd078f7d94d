"""Judge profiles: conf/judge/<profile>.yaml read and checked against the schema.

The same file Hydra composes as the `judge` group of a cell, here for the commands that
judge without composing a cell (`python -m apps_bench.judge`, re-scoring): loaded with
OmegaConf, merged onto the `JudgeConfig` schema (an unknown key or a wrong type fails),
overrides applied, every required key checked present (its `sandbox:` block included), and
returned typed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from apps_bench.config import JudgeConfig, typed

JUDGE_CONF_DIR = Path(__file__).resolve().parents[1] / "conf" / "judge"


class JudgeConfigError(ValueError):
    """A judge profile that does not exist, or a judge setting that is wrong; the message says which."""


def available_profiles() -> list[str]:
    return sorted(p.stem for p in JUDGE_CONF_DIR.glob("*.yaml"))


def judge_config(profile: str, overrides: Sequence[str] = ()) -> JudgeConfig:
    """conf/judge/<profile>.yaml as the typed `JudgeConfig` (its `sandbox` a checked SandboxLimits),
    `overrides` (`key=value`, dotted keys such as `sandbox.output_cap_bytes=1000`) applied on top."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = JUDGE_CONF_DIR / f"{profile}.yaml"
    if not profile or "/" in profile or not path.is_file():
        raise JudgeConfigError(
            f"no judge profile {profile!r} (conf/judge/{profile}.yaml); available: {', '.join(available_profiles())}")
    for item in overrides:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise JudgeConfigError(f"bad judge override {item!r}: use key=value, e.g. sandbox.output_cap_bytes=1000000")
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(JudgeConfig), OmegaConf.load(path), OmegaConf.from_dotlist(list(overrides)))
        missing = sorted(OmegaConf.missing_keys(cfg))
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise JudgeConfigError(f"judge profile {profile!r}: {str(e).splitlines()[0]}") from None
    if missing:
        raise JudgeConfigError(f"conf/judge/{profile}.yaml does not set {', '.join(missing)}")
    if cfg.profile != profile:
        raise JudgeConfigError(f"conf/judge/{profile}.yaml declares profile {cfg.profile!r}; a file names its own profile")
    try:
        return typed(JudgeConfig, cfg)
    except ValueError as e:  # a limit SandboxLimits refuses (e.g. judge.sandbox.nproc must be > 0)
        raise JudgeConfigError(str(e)) from None
