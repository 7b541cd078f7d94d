"""The eval-ID manifest, shipped as package data so every install agrees on the eval set."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from apps_bench.types import JsonObject


@lru_cache(maxsize=1)
def eval_manifest() -> JsonObject:
    """The whole manifest: dataset, split, difficulty and the ordered IDs."""
    text = resources.files("apps_bench.data").joinpath("apps_eval_ids.json").read_text(encoding="utf-8")
    return json.loads(text)


def eval_ids() -> tuple[str, ...]:
    """The 50 eval problem IDs (codeparrot/apps test split, IDs 0-49, interview), as strings."""
    return tuple(str(i) for i in eval_manifest()["ids"])
