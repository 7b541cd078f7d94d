"""`python -m apps_bench.optimize`: the seed's optimizer command, flags as they were.

    python -m optimizers.protocol.run --method maspo --dataset apps --topology sequential \\
        --model qwen --seed 0 --out runs/maspo/apps/sequential/qwen/0 [--allow-any-cell]

becomes the override command `python -m apps_bench optimizer=maspo dataset=apps
topology=... model=qwen seed=0 out_dir=... [allow_any_cell=true]`, which is printed and
then run in this process (same grid guard, outputs and MLflow runs as any cell). Why a
separate entry point: `python -m apps_bench` takes Hydra overrides only and refuses
flags with the override to use; scripts written for the seed can call this one instead.

The seed's `--topology sequential` (and `centralized`, `decentralized`) names a family
with two runners here; it is refused with the choices, never guessed. Anything after
the flags is passed on as overrides (e.g. `optimizer.params.budget.rollouts=200`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from apps_bench import __main__ as entry
from apps_bench.config.schema import CONF_DIR
from apps_bench.errors import AppsBenchError

# flag -> override key; the order is the printed command's
FLAG_TO_KEY: dict[str, str] = {
    "method": "optimizer",
    "dataset": "dataset",
    "topology": "topology",
    "model": "model",
    "seed": "seed",
    "out": "out_dir",
}


class SeedFormError(ValueError, AppsBenchError):
    """A seed-form value with no single override: the message lists the choices."""


def _choices(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


def _resolve(group: str, value: str) -> str:
    """`value` when conf/<group>/<value>.yaml exists; a family name (the seed's `sequential`) is refused with its members."""
    names = _choices(group)
    if value in names:
        return value
    family = [n for n in names if n.startswith(value + "_")]
    if family:
        raise SeedFormError(
            f"--{'method' if group == 'optimizer' else group} {value} is ambiguous here: it names {len(family)} runners "
            f"({', '.join(family)}); pass one of them"
        )
    raise SeedFormError(
        f"--{'method' if group == 'optimizer' else group} {value}: no conf/{group}/{value}.yaml; choose one of {names}"
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m apps_bench.optimize",
        description="The seed's optimizer command (optimizers.protocol.run), run as apps-bench overrides.",
        epilog="Extra arguments are passed on as Hydra overrides. Mapping: --method -> optimizer=, --dataset -> dataset=, "
        "--topology -> topology= (seed's sequential: sequential_langgraph or sequential_crewai), --model -> model=, "
        "--seed -> seed=, --out -> out_dir=, --allow-any-cell -> allow_any_cell=true.",
    )
    ap.add_argument("--method", required=True, help="optimizer: none, maspo, gepa")
    ap.add_argument("--dataset", default=None, help="dataset config (apps, demo, ...)")
    ap.add_argument("--topology", default=None, help="topology config (sequential_langgraph, ...)")
    ap.add_argument("--model", default=None, help="model config (qwen, qwen_122b, openai, gold)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default=None, help="the cell's output folder (optimizer files land in OUT/optimizer/)")
    ap.add_argument("--allow-any-cell", action="store_true", help="run a cell outside conf/grid")
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides")
    return ap


def to_overrides(argv: list[str]) -> list[str]:
    """The seed-form arguments as `python -m apps_bench` overrides (raises SeedFormError)."""
    args = parser().parse_intermixed_args(argv)
    out: list[str] = []
    for flag, key in FLAG_TO_KEY.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if key in ("optimizer", "dataset", "topology", "model"):
            value = _resolve(key, str(value))
        out.append(f"{key}={value}")
    if args.allow_any_cell:
        out.append("allow_any_cell=true")
    return out + list(args.overrides)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        overrides = to_overrides(argv)
    except AppsBenchError as exc:
        sys.stderr.write(f"apps-bench: {exc}\n")
        raise SystemExit(2) from None
    sys.stderr.write("apps-bench: running  python -m apps_bench " + " ".join(shlex.quote(o) for o in overrides) + "\n")

    sys.argv = [sys.argv[0], *overrides]
    entry.main()


if __name__ == "__main__":
    main()
