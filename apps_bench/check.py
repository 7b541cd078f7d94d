"""`python -m apps_bench.check [OVERRIDE ...] [--json]`: the model server's check, as a table.

Composed like a cell (`model=qwen`, `topology=...`, `concurrency=...`, any override), so it
checks the server the cell would use, with that cell's settings: per framework, whether offered
tools come back as a structured call (with `tool_choice` absent and `"auto"`), the token cap,
`stop`, usage; then usage when streamed, thinking, a context overflow, and throughput at 1, 2,
4, ... requests at once against the cell's concurrency x team size (models/server_check.py).
Each failure says what to change. `--json` (or `server_check.json=PATH`) writes the result as
JSON; `server_check.quick=true` runs only what a cell runs at its start.

Exit status: 0 when nothing failed, 1 when an item failed, 2 for bad settings or an endpoint
that cannot be reached.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from apps_bench.__main__ import _refuse_bad_overrides, command_config_dir
from apps_bench.config.overrides import split_config_dir
from apps_bench.config.schema import Config, compose, problems_in_flight
from apps_bench.data.demo import DEMO_PROBLEMS
from apps_bench.models import ModelEndpointError, open_endpoint
from apps_bench.models import server_check as sc
from apps_bench.types import JsonObject


def run(config: Config) -> JsonObject:
    """Open the cell's endpoint (starting gold or local as a cell does), check it, return the result."""
    sc_cfg = config.server_check
    frameworks = list(sc_cfg.frameworks)
    with open_endpoint(config.model, DEMO_PROBLEMS) as endpoint:
        server = sc.describe_server(endpoint, config.model)
        if sc_cfg.quick:
            findings = asyncio.run(sc.quick_findings(endpoint, config.model, server, frameworks, max_tokens=sc_cfg.max_tokens))
        else:
            findings = asyncio.run(
                sc.full_findings(
                    endpoint,
                    config.model,
                    server,
                    frameworks,
                    sc_cfg,
                    in_flight=problems_in_flight(config),
                    team_size=config.topology.team_size,
                    concurrency=config.concurrency,
                )
            )
        return {
            "endpoint": endpoint.base_url if endpoint.provider == "openai" else f"{endpoint.provider} (started here)",
            "model_id": endpoint.model_id,
            "server": {"kind": server.kind, "key": server.key, "identity": server.identity},
            "tools": {fw: sc.tools_verdict(findings, fw) for fw in frameworks},
            "findings": sc.as_json(findings),
            "failed": sum(1 for f in findings if f.status == sc.FAIL),
        }


def table(result: JsonObject) -> str:
    """The findings as a console table, each failure's fix under it."""
    rows = [(f["framework"], f["item"], f["status"], f["detail"]) for f in result["findings"]]
    widths = [max(len(r[i]) for r in [("framework", "item", "status", ""), *rows]) for i in range(3)]
    out = [f"server check: {result['model_id']} at {result['endpoint']} ({result['server']['kind']} server)", ""]
    out.append(f"{'framework':<{widths[0]}}  {'item':<{widths[1]}}  {'status':<{widths[2]}}  detail")
    for f, (fw, item, status, detail) in zip(result["findings"], rows):
        out.append(f"{fw:<{widths[0]}}  {item:<{widths[1]}}  {status:<{widths[2]}}  {detail}")
        if f.get("fix") and status != "ok":
            out.append(f"{'':<{widths[0] + widths[1] + widths[2] + 6}}-> {f['fix']}")
    tools = ", ".join(f"{fw}: {v}" for fw, v in result["tools"].items())
    n = result["failed"]
    verdict = "PASS" if not n else f"{n} item(s) FAILED: apply the fixes above"
    out += ["", f"tools as each framework's runners send them: {tools}", f"verdict: {verdict}"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("--help", "-h") for a in args):
        sys.stdout.write(__doc__ or "")
        return 0
    as_json = "--json" in args
    args = [a for a in args if a != "--json"]
    dirs, args = split_config_dir(args)
    with command_config_dir(["--config-dir", *dirs] if dirs else []):
        return _check(args, as_json)


def _check(args: list[str], as_json: bool) -> int:
    _refuse_bad_overrides(args)
    try:
        config = compose(args)
        result = run(config)
    except ModelEndpointError as exc:
        sys.stderr.write(f"apps-bench check: {exc}\n")
        return 2
    except ImportError as exc:  # MissingFrameworkError: the pip extra to install
        sys.stderr.write(f"apps-bench check: {exc}; or check only the installed frameworks: server_check.frameworks=[...]\n")
        return 2
    target = "-" if as_json else config.server_check.json
    if target == "-":
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
    else:
        sys.stdout.write(table(result) + "\n")
        if target:
            Path(target).expanduser().write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
