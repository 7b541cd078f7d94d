"""model=local's speed against llama.cpp's own benchmark of the same build and model (issue #27).

    python benchmarks/local_model_speed.py --llama-bench PATH [--reps 5] [key=value ...]

Tokens/s of prompt evaluation and generation, the same prompt and model three ways:

- server: the HTTP server model=local starts (conf/model/local.yaml, `key=value` overrides it,
  e.g. `n_threads=2`): per repetition one chat completion with `max_tokens: 1` (prompt eval) and
  one with `max_tokens: 128` (the difference is generation), wall time at the client. Each
  request starts with its own system line, so no cache serves a prompt the server has seen.
- in-process: the same requests on `llama_cpp.Llama` in this process, same settings (no HTTP).
- llama-bench: llama.cpp's benchmark on the same GGUF, threads, batch sizes and flash-attn:
  `-p <prompt tokens> -n 0` and `-p 0 -n 128 -d <prompt tokens>` (generation after the
  prompt, as the server's). The ceiling; the ratios are server / llama-bench.

Also printed: the server's own llama.cpp timings of the same requests (its log), i.e. the
server without the HTTP and Python around llama.cpp.

llama-bench must come from the source and CMAKE_ARGS llama-cpp-python was built with (the
`local` extra; the flags live in launchers/llama_cmake_args). Build it (~10 min on one core):

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release \\
      -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF $(cat launchers/llama_cmake_args)
    cmake --build build --target llama-bench                   # -> build/bin/llama-bench

`--llama-bench` (or env LLAMA_BENCH) is its path. It runs on the venv's own llama.cpp
libraries (LD_LIBRARY_PATH), so the library measured is the one the server loads.
Needs the `local` extra; run on a quiet machine (median of --reps).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GEN_TOKENS = 128
N_BATCH = 512  # llama-cpp-python's server's n_batch and n_ubatch (model=local leaves them), flash-attn off
TASK = (
    "Read n and a list of n integers from standard input and print the length of the longest "
    "strictly increasing contiguous run. Constraints: 1 <= n <= 100000. "
) * 27
ASK = "\nWrite a long essay about this problem and how to solve it in Python."  # a reply that runs to max_tokens


def messages(tag: str) -> list[dict[str, str]]:
    """~1,100 prompt tokens; `tag` makes the first tokens differ, so nothing is reused."""
    return [
        {"role": "system", "content": f"{tag}: You are a careful Python programmer."},
        {"role": "user", "content": TASK + ASK},
    ]


def pair(complete, tag: str) -> tuple[int, float, int, float]:
    """One prompt-only and one full request -> (prompt tokens, s, generated tokens, s)."""
    t0 = time.perf_counter()
    a = complete(messages(f"{tag}a"), 1)
    t1 = time.perf_counter()
    b = complete(messages(f"{tag}b"), GEN_TOKENS)
    t2 = time.perf_counter()
    return a["prompt_tokens"], t1 - t0, b["completion_tokens"], t2 - t1


def rates(runs: list[tuple[int, float, int, float]]) -> tuple[int, float, float, int]:
    """-> (prompt tokens, prompt tok/s, generation tok/s, generated tokens): medians over runs."""
    pp = statistics.median(p / a for p, a, _, _ in runs)
    tg = statistics.median((n - 1) / (b - a) for _, a, n, b in runs)
    return runs[0][0], pp, tg, min(n for _, _, n, _ in runs)


def server_rates(server, cfg, reps: int) -> tuple[tuple[int, float, float, int], str]:
    """Through the HTTP server model=local starts -> (rates, the server's own timing lines)."""
    import httpx

    def complete(msgs, max_tokens):
        r = httpx.post(
            f"{server.base_url}/chat/completions",
            timeout=900,
            trust_env=False,
            json={
                "model": server.model_id,
                "messages": msgs,
                "max_tokens": max_tokens,
                "temperature": cfg.temperature,
                "top_p": cfg.top_p,
                "seed": 0,
            },
        )
        r.raise_for_status()
        return r.json()["usage"]

    server.start()
    try:
        complete(messages("warm-up"), 4)
        runs = [pair(complete, f"s{i}") for i in range(reps)]
        log = server.log_path.read_text(errors="replace")
    finally:
        server.stop()
    return rates(runs), own_rates(log)


def own_rates(log: str) -> tuple[float, float]:
    """The server's own llama.cpp timings of the measured requests (its log: llama_perf_context_print)
    -> median (prompt tok/s, generation tok/s): the same requests without the HTTP and Python around them."""
    pp = [float(m) for m in re.findall(r"prompt eval time =.*?([\d.]+) tokens per second", log) if float(m) > 0]
    tg = [float(m) for m in re.findall(r"\s eval time =.*?/\s*(?:[2-9]\d|\d{3,}) runs.*?([\d.]+) tokens per second", log)]
    return statistics.median(pp[1:] or [0.0]), statistics.median(tg or [0.0])  # [1:]: not the warm-up


def in_process_rates(server, model: Path, cfg, reps: int) -> tuple[int, float, float, int]:
    """The same requests on llama_cpp.Llama in this process, with the server's settings."""
    import llama_cpp

    from apps_bench.models.local_server import install

    install()  # the server's chat handler, so the prompt is token for token the server's
    llm = llama_cpp.Llama(
        model_path=str(model),
        n_ctx=server.n_ctx,
        n_threads=server.n_threads,
        n_threads_batch=server.n_threads,
        n_batch=N_BATCH,
        n_ubatch=N_BATCH,
        chat_format=server.chat_format,
        logits_all=False,
        verbose=False,
    )

    def complete(msgs, max_tokens):
        out = llm.create_chat_completion(
            messages=msgs, max_tokens=max_tokens, temperature=cfg.temperature, top_p=cfg.top_p, seed=0
        )
        return out["usage"]

    complete(messages("warm-up"), 4)
    return rates([pair(complete, f"p{i}") for i in range(reps)])


def llama_bench_rates(path: str, server, model: Path, prompt_tokens: int, reps: int) -> tuple[float, float]:
    """llama-bench on the venv's llama.cpp libraries -> (prompt tok/s, generation tok/s)."""
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    env = {**os.environ, "LD_LIBRARY_PATH": f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    common = [
        path,
        "-m",
        str(model),
        "-t",
        str(server.n_threads),
        "-b",
        str(N_BATCH),
        "-ub",
        str(N_BATCH),
        "-fa",
        "1" if False else "0",
        "-r",
        str(reps),
        "-o",
        "json",
    ]
    out = {}
    for name, args in (
        ("pp", ["-p", str(prompt_tokens), "-n", "0"]),
        ("tg", ["-p", "0", "-n", str(GEN_TOKENS), "-d", str(prompt_tokens)]),
    ):
        proc = subprocess.run(common + args, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"llama-bench failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        out[name] = json.loads(proc.stdout)[0]["avg_ts"]
    return out["pp"], out["tg"]


def main() -> None:
    from omegaconf import OmegaConf

    from apps_bench.models.local import server_for

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--llama-bench",
        default=os.environ.get("LLAMA_BENCH"),
        help="path of llama-bench built from the same source and flags (see this file's docstring)",
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-in-process", action="store_true", help="skip the in-process column")
    ap.add_argument("overrides", nargs="*", help="conf/model/local.yaml settings, e.g. n_threads=2")
    args = ap.parse_args()
    if not args.llama_bench or not Path(args.llama_bench).is_file():
        ap.error("give --llama-bench PATH (or env LLAMA_BENCH): llama-bench built as this file's docstring says")
    cfg = OmegaConf.merge(
        OmegaConf.load(ROOT / "apps_bench" / "conf" / "model" / "local.yaml"), OmegaConf.from_dotlist(args.overrides)
    )
    server = server_for(cfg)
    (p, s_pp, s_tg, n), (o_pp, o_tg) = server_rates(server, cfg, args.reps)
    with tempfile.TemporaryDirectory() as tmp:
        model = server.model_path  # what the server served: the GGUF, or as it converted it (local_server.py)
        if server.requantize:
            from apps_bench.models.local_server import requantize

            model = Path(tmp) / f"{model.stem}.{server.requantize}.gguf"
            requantize(str(server.model_path), str(model), server.requantize)
        i_pp, i_tg = (None, None) if args.no_in_process else in_process_rates(server, model, cfg, args.reps)[1:3]
        b_pp, b_tg = llama_bench_rates(args.llama_bench, server, model, p, args.reps)

    print(
        f"{server.model_path.name} served as {server.requantize or 'shipped'}, threads {server.n_threads}, batch {N_BATCH}/{N_BATCH}, "
        f"flash-attn off; prompt {p} tokens, {n}-{GEN_TOKENS} generated; median of {args.reps}"
    )
    print(f"{'tokens/s':<12}{'llama-bench':>12}{'server':>10}{'its timings':>13}{'in-process':>12}{'server/bench':>14}")
    for name, b, s, o, i in (("prompt eval", b_pp, s_pp, o_pp, i_pp), ("generation", b_tg, s_tg, o_tg, i_tg)):
        print(f"{name:<12}{b:12.1f}{s:10.1f}{o:13.1f}{'-' if i is None else f'{i:.1f}':>12}{s / b:14.2f}")
    print("server: wall time at the client; its timings: the server's llama.cpp timings of the same requests")


if __name__ == "__main__":
    main()
