"""Prompt optimizers: one protocol (pool, splits, scoring gate, budgets, paired seeds,
rollout cache) shared by every method (MASPO, GEPA).

Submodules are imported by name (``apps_bench.optimizers.maspo``...), so importing this
package stays cheap; `gepa` is only imported inside `gepa_adapter`.
"""

from __future__ import annotations

__all__ = ["protocol", "cache", "scoring", "proposals", "maspo", "gepa_adapter"]
