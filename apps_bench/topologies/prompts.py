"""Role lists and prompt sets, read from the typed topology config (never from globals).

Team size is a list length: `roles_by_size[str(team_size)]` is the ordered role list a
runner plays. Prompts come from the config's `prompts` mapping or, when `prompt_file`
is set, from a YAML/JSON file mapping role -> text (an optimizer's output), so any role
prompt can be replaced without touching code.
"""

from __future__ import annotations

import json
from pathlib import Path

from apps_bench.config.schema import TopologyConfig
from apps_bench.errors import AppsBenchError
from apps_bench.topologies.base import PromptSet


class TopologyConfigError(ValueError, AppsBenchError):
    """A topology config (or its prompt file) that cannot be run as written."""


def sizes_of(cfg: TopologyConfig) -> list[int]:
    """Team sizes the config declares a role list for."""
    out = []
    for key in cfg.roles_by_size:
        try:
            out.append(int(key))
        except (TypeError, ValueError):
            raise TopologyConfigError(
                f"topology {cfg.name!r}: roles_by_size key {key!r} is not a team size (an integer)"
            ) from None
    return sorted(out)


def roles_for(cfg: TopologyConfig, team_size: int | None = None) -> list[str]:
    """Ordered roles for `team_size` (default: cfg.team_size)."""
    size = int(cfg.team_size if team_size is None else team_size)
    roles = cfg.roles_by_size.get(str(size))
    if not roles:
        raise TopologyConfigError(
            f"topology {cfg.name!r} has no role list for team_size={size}; "
            f"available sizes: {sizes_of(cfg)} (set topology.team_size to one of them, "
            f"or add topology.roles_by_size.'{size}')"
        )
    return [str(r) for r in roles]


def declared_roles(cfg: TopologyConfig) -> list[str]:
    """Every role the topology can play at any team size, in first-seen order."""
    seen: dict[str, None] = {}
    by_size = cfg.roles_by_size
    for key in sorted(by_size, key=lambda k: int(k)):
        for role in by_size[key]:
            seen.setdefault(str(role), None)
    return list(seen)


def read_prompt_file(path: str | Path) -> dict[str, str]:
    """A prompt-set file: YAML or JSON mapping role -> text (optionally under a `prompts:` key)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise TopologyConfigError(f"prompt_file {str(path)!r} not found (resolved to {p.resolve()})")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # parse errors of either format: say which file and why
        raise TopologyConfigError(f"prompt_file {str(path)!r} is not valid {p.suffix or 'YAML'}: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("prompts"), dict):
        data = data["prompts"]
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise TopologyConfigError(
            f"prompt_file {str(path)!r} must map role names to prompt texts (strings), e.g. 'coder: |\\n  You are ...'"
        )
    return dict(data)


def load_prompts(cfg: TopologyConfig) -> PromptSet:
    """The prompt set a cell runs with: the file's texts when `prompt_file` is set, else `prompts`.

    Every role of the current team size must have a text; a role the topology never plays
    is an error (it is almost always a typo, and a silently ignored prompt would make an
    optimized prompt set look like it did nothing).
    """
    name = cfg.name
    needed = roles_for(cfg)
    known = set(declared_roles(cfg))
    prompt_file = cfg.prompt_file
    if prompt_file:
        texts, source = read_prompt_file(prompt_file), f"prompt_file {prompt_file!r}"
    else:
        texts, source = dict(cfg.prompts), f"topology.prompts of {name!r}"
    extra = sorted(set(texts) - known)
    if extra:
        raise TopologyConfigError(
            f"{source} has prompts for roles {extra} that topology {name!r} does not have; its roles are {sorted(known)}"
        )
    missing = [r for r in dict.fromkeys(needed) if not str(texts.get(r, "")).strip()]
    if missing:
        raise TopologyConfigError(f"{source} lacks prompts for roles {missing} (team_size={cfg.team_size} plays {needed})")
    return PromptSet({r: str(t) for r, t in texts.items()})
