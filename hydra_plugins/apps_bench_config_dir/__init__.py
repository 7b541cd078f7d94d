"""`--config-dir DIR` searched before apps-bench's own conf/ (Hydra searches it after).

A preset in DIR of a packaged preset's name (DIR/model/gold.yaml) would otherwise be silently
shadowed by the packaged one. The folders come from `apps_bench.config.schema.config_dirs`, which every
command enters with its `--config-dir`; outside one this plugin changes nothing.
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.plugins.search_path_plugin import SearchPathPlugin


class ConfigDirFirst(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from apps_bench.config.schema import overlay_dirs

        for path in overlay_dirs():
            search_path.prepend("apps-bench --config-dir", f"file://{path}", anchor=SearchPathQuery(provider="main"))
