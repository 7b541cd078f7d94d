"""Memory of the model=local server while agents take turns: llama-cpp-python's own server
(`python -m llama_cpp.server`: logits of every token kept, a RAM cache that counts only KV
bytes) against the server model=local starts (apps_bench.models.local_server: `--logits_all
false`, every byte of a cached state counted in `--cache_size`).

    python benchmarks/local_server_memory.py [--turns 12]

Starts each real server (conf/model/local.yaml, RAM prompt cache on), sends the same
conversation each time: three agents with their own system prompts take turns, as in a
centralized team, each turn adding ~250 tokens to that agent's conversation. After each
request it reads the server's resident memory (VmRSS). Prints both series, the peaks, their
ratio and the time per turn. Needs the `local` extra.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AGENTS = {
    "manager": "You are the manager of a team of programmers. Hand out the work and check it.",
    "coder": "You are the programmer. Write the complete Python 3 program you are asked for.",
    "tester": "You are the tester. Run the program on the examples and report every failure.",
}
TASK = (
    "Read n and a list of n integers from standard input and print the length of the longest "
    "strictly increasing contiguous run. Constraints: 1 <= n <= 100000. "
) * 4
STEP = (
    "Here is what happened next: the program was run on the first example and printed 3; the "
    "expected output was 3. Then on the second example it printed 1 and 1 was expected. "
) * 5


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def run(server, turns: int) -> tuple[list[float], float]:
    """-> (server RSS in MB after each turn, seconds per turn)."""
    import httpx

    convs = {a: [{"role": "system", "content": p}, {"role": "user", "content": TASK}] for a, p in AGENTS.items()}
    rss, t0 = [], time.perf_counter()
    server.start()
    try:
        for turn in range(turns):
            agent = list(AGENTS)[turn % len(AGENTS)]
            r = httpx.post(
                f"{server.base_url}/chat/completions",
                timeout=600,
                trust_env=False,
                json={"model": server.model_id, "messages": convs[agent], "max_tokens": 16, "temperature": 0, "seed": 0},
            )
            r.raise_for_status()
            convs[agent] += [
                {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or "ok"},
                {"role": "user", "content": STEP},
            ]
            rss.append(rss_mb(server.proc.pid))
    finally:
        server.stop()
    return rss, (time.perf_counter() - t0) / turns


def stock(server):
    """The same server settings on llama-cpp-python's own server, with its defaults."""
    from apps_bench.models.local import LocalServer

    class Stock(LocalServer):
        def command(self) -> list[str]:
            cmd = super().command()
            cmd[cmd.index("apps_bench.models.local_server")] = "llama_cpp.server"
            i = cmd.index("--logits_all")
            return cmd[:i] + cmd[i + 2 :]

    return Stock(**{f.name: getattr(server, f.name) for f in dataclasses.fields(server) if f.init})


def main() -> None:
    from omegaconf import OmegaConf

    from apps_bench.models.local import server_for

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=12)
    args = ap.parse_args()
    base = server_for(OmegaConf.load(ROOT / "apps_bench" / "conf" / "model" / "local.yaml"))
    every, every_s = run(stock(base), args.turns)
    last, last_s = run(base, args.turns)
    print(f"prompt cache {base.prompt_cache_mb} MB, n_ctx {base.n_ctx}, {args.turns} turns of {len(AGENTS)} agents")
    print("turn  RSS MB, llama_cpp.server  RSS MB, model=local's server")
    for i, (a, b) in enumerate(zip(every, last), start=1):
        print(f"{i:4d}  {a:22.0f}  {b:26.0f}")
    print(
        f"peak: {max(every):.0f} MB vs {max(last):.0f} MB (ratio {max(every) / max(last):.2f}); "
        f"s per turn: {every_s:.2f} vs {last_s:.2f} (ratio {every_s / last_s:.2f})"
    )


if __name__ == "__main__":
    main()
