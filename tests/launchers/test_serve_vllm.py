"""launchers/serve_vllm.sh and serve_vllm.sbatch: the vLLM command they start, and the presets they serve.

vLLM cannot run here (no GPU, no package), so `vllm` on PATH is a recorder: it answers
`--version` with the version it is told to, and otherwise writes the arguments and the
VLLM_API_KEY it was started with to a file. Everything before that exec is the real script,
run by bash with the environment a GPU node or a SLURM job would give it (CUDA_VISIBLE_DEVICES,
SLURM_GPUS_ON_NODE, a node's `nvidia-smi -L`).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import model_preset

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launchers" / "serve_vllm.sh"
SBATCH = REPO / "launchers" / "serve_vllm.sbatch"
PIN = "0.34.0"
MODEL_IDS = {"qwen": "Qwen/Qwen3.5-9B", "qwen_122b": "Qwen/Qwen3.5-122B-A10B", "qwen_thinking": "Qwen/Qwen3.5-9B"}
KNOBS = (
    "CUDA_",
    "SLURM_",
    "VLLM_",
    "API_KEY",
    "TP",
    "HOST",
    "PORT",
    "MODEL_ID",
    "THINKING",
    "REASONING_PARSER",
    "TOOL_CALL_PARSER",
    "MAX_MODEL_LEN",
    "MAX_NUM_SEQS",
    "GPU_MEM_UTIL",
    "TEXT_ONLY",
)

RECORDER = """#!/usr/bin/env bash
if [ "${1:-}" = --version ]; then echo "INFO 12-03 startup noise"; echo "$STUB_VLLM_VERSION"; exit 0; fi
exec python3 -c 'import json, os, sys
json.dump({"argv": sys.argv[1:], "key": os.environ.get("VLLM_API_KEY")}, open(os.environ["STUB_VLLM_OUT"], "w"))' "$@"
"""
NVIDIA_SMI = """#!/usr/bin/env bash
for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done
"""


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture()
def node(tmp_path: Path):
    """A GPU node's PATH (a recording `vllm` at the pinned version, an `nvidia-smi` listing 8 GPUs) and a HOME."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "vllm", RECORDER)
    _exe(bin_dir / "nvidia-smi", NVIDIA_SMI)
    home = tmp_path / "home"
    home.mkdir()
    return tmp_path


def serve(node: Path, *args: str, script: Path = SCRIPT, **env: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run the script as on a GPU node; (the process, what `vllm serve` was started with or None)."""
    out = node / "vllm_started.json"
    out.unlink(missing_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(KNOBS)}
    base.update(PATH=f"{node / 'bin'}:/usr/bin:/bin", HOME=str(node / "home"), STUB_VLLM_OUT=str(out), STUB_VLLM_VERSION=PIN)
    base.update(env)
    proc = subprocess.run(["bash", str(script), *args], env=base, cwd=REPO, capture_output=True, text=True, timeout=60)
    started = json.loads(out.read_text()) if out.exists() else None
    return proc, started


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def preset(name: str):
    return model_preset(name)  # as Hydra composes it


def test_scripts_parse():
    for script in (SCRIPT, SBATCH):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


@pytest.mark.parametrize("which", ["qwen", "qwen_122b"])
def test_qwen35_is_served_with_its_tool_parser_thinking_off_on_loopback_with_a_key(node: Path, which: str):
    proc, started = serve(node, which)
    assert proc.returncode == 0, proc.stderr
    argv = started["argv"]
    assert argv[:2] == ["serve", MODEL_IDS[which]]
    assert flag(argv, "--tool-call-parser") == "qwen3_coder"  # Qwen3.5 writes XML calls; hermes reads JSON only
    assert "--enable-auto-tool-choice" in argv and flag(argv, "--reasoning-parser") == "qwen3"
    assert json.loads(flag(argv, "--default-chat-template-kwargs")) == {"enable_thinking": False}
    assert "--language-model-only" in argv
    assert flag(argv, "--host") == "127.0.0.1"
    # a key, made once, private, handed over in the environment: never in argv or the log
    key_file = node / "home" / ".config" / "apps-bench" / "vllm-api-key"
    key = key_file.read_text()
    assert len(key) >= 32 and started["key"] == key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key not in " ".join(argv) and key not in proc.stdout + proc.stderr
    assert f'export OPENAI_API_KEY="$(cat {key_file})"' in proc.stderr
    again, started_again = serve(node, which)
    assert started_again["key"] == key  # the same key on a restart: running cells keep working


def test_the_presets_and_the_server_agree(node: Path):
    """Sized together: the server runs at least the requests a preset puts on the wire; a preset's
    reply fits the server's context; its thinking switch is the server's default; and every sampling
    knob is the preset's (the server ignores the model's generation_config.json)."""
    for which, server_arg in (("qwen", "qwen"), ("qwen_122b", "qwen_122b"), ("qwen_thinking", "qwen_thinking")):
        cfg = preset(which)
        proc, started = serve(node, server_arg)
        assert proc.returncode == 0, proc.stderr
        argv = started["argv"]
        assert 0 < cfg.max_concurrency <= int(flag(argv, "--max-num-seqs")), which
        assert cfg.max_tokens * 2 <= int(flag(argv, "--max-model-len")), which
        thinking = cfg.extra_body.chat_template_kwargs.enable_thinking
        assert json.loads(flag(argv, "--default-chat-template-kwargs")) == {"enable_thinking": thinking}, which
        assert flag(argv, "--generation-config") == "vllm"
        assert {"top_k", "min_p", "presence_penalty", "repetition_penalty"} <= set(cfg.extra_body), which
        assert cfg.retry_timeouts is False and cfg.api_key_env == "OPENAI_API_KEY", which
    assert int(flag(argv, "--max-model-len")) >= 65536 and flag(argv, "--reasoning-parser") == "qwen3"


def test_the_concurrency_of_a_cell_fits_the_server(node: Path):
    """concurrency problems x 4 agents at once (independent, decentralized) <= the server's batch."""
    from conftest import compose_cell

    cfg = compose_cell("model=qwen", "topology=independent")
    _, started = serve(node, "qwen")
    assert cfg.concurrency * cfg.topology.team_size <= int(flag(started["argv"], "--max-num-seqs"))


@pytest.mark.parametrize(
    "env, tp",
    [
        ({"CUDA_VISIBLE_DEVICES": "0,3", "SLURM_GPUS_ON_NODE": "4"}, "2"),  # the devices this job may use
        ({"CUDA_VISIBLE_DEVICES": "GPU-8a1e,GPU-77c2,GPU-0f3d"}, "3"),  # UUIDs count too
        ({"SLURM_GPUS_ON_NODE": "3"}, "3"),
        ({}, "8"),  # no allocation said anything: every GPU nvidia-smi lists
        ({"TP": "1", "CUDA_VISIBLE_DEVICES": "0,1"}, "1"),
    ],
)
def test_tensor_parallel_size_is_the_allocations_gpu_count(node: Path, env: dict, tp: str):
    proc, started = serve(node, "qwen", **env)
    assert proc.returncode == 0, proc.stderr
    assert flag(started["argv"], "--tensor-parallel-size") == tp


def test_thinking_gets_a_reasoning_parser_and_room(node: Path):
    proc, started = serve(node, "qwen_thinking", "--enable-log-requests")
    assert proc.returncode == 0, proc.stderr
    argv = started["argv"]
    assert json.loads(flag(argv, "--default-chat-template-kwargs")) == {"enable_thinking": True}
    assert flag(argv, "--reasoning-parser") == "qwen3" and int(flag(argv, "--max-model-len")) >= 65536
    assert argv[-1] == "--enable-log-requests"  # arguments after the preset go to vllm serve


@pytest.mark.parametrize(
    "args, env, needles",
    [
        (["qwen_thinking"], {"REASONING_PARSER": "none"}, ["REASONING_PARSER=qwen3"]),
        (["qwen"], {"THINKING": "1", "REASONING_PARSER": "none"}, ["REASONING_PARSER=qwen3"]),
        (["qwen_thinking"], {"MAX_MODEL_LEN": "32768"}, ["MAX_MODEL_LEN >= 65536"]),
        (["qwen"], {"HOST": "0.0.0.0", "API_KEY": "none"}, ["API_KEY=none", "HOST=127.0.0.1"]),
        (["qwen"], {"CUDA_VISIBLE_DEVICES": ""}, ["no GPU visible", "--gres=gpu"]),
        (["meta-llama/Llama-3.1-8B-Instruct"], {}, ["set TOOL_CALL_PARSER", "hermes"]),
        (
            ["qwen"],
            {"STUB_VLLM_VERSION": "0.19.1"},
            ["vllm 0.19.1 is installed", f"pip install 'vllm=={PIN}'", "VLLM_VERSION=0.19.1"],
        ),
    ],
)
def test_refused_settings_say_what_to_change_and_start_nothing(node: Path, args, env, needles):
    proc, started = serve(node, *args, **env)
    assert proc.returncode == 2 and started is None
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_another_vllm_version_runs_once_named(node: Path):
    proc, started = serve(node, "qwen", STUB_VLLM_VERSION="0.19.1", VLLM_VERSION="0.19.1")
    assert proc.returncode == 0 and started is not None, proc.stderr


def test_a_key_given_or_none_on_loopback(node: Path):
    _, started = serve(node, "qwen", API_KEY="team-key-123")
    assert started["key"] == "team-key-123" and "team-key-123" not in started["argv"]
    _, started = serve(node, "qwen", API_KEY="none", VLLM_API_KEY="stale")
    assert started["key"] is None and flag(started["argv"], "--host") == "127.0.0.1"
    assert not (node / "home" / ".config" / "apps-bench" / "vllm-api-key").exists()


def test_dry_run_prints_the_command_and_starts_nothing(node: Path):
    proc, started = serve(node, "qwen", VLLM_DRY_RUN="1", CUDA_VISIBLE_DEVICES="0,1")
    assert proc.returncode == 0 and started is None, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith("VLLM_API_KEY=<set> vllm serve Qwen/Qwen3.5-9B ")
    assert "--tool-call-parser qwen3_coder" in line and "--tensor-parallel-size 2" in line


def test_the_sbatch_job_serves_the_cluster_with_a_key_on_its_gpus(node: Path):
    env = {"SLURM_SUBMIT_DIR": str(REPO), "SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    proc, started = serve(node, "qwen_122b", script=SBATCH, **env)
    assert proc.returncode == 0, proc.stderr
    argv = started["argv"]
    assert flag(argv, "--host") == "0.0.0.0" and started["key"]  # reachable from the cells' nodes, so keyed
    assert flag(argv, "--tensor-parallel-size") == "4" and argv[1] == "Qwen/Qwen3.5-122B-A10B"
    assert "export VLLM_BASE_URL=http://" in proc.stderr and "127.0.0.1" not in proc.stderr
    proc, started = serve(node, "qwen", script=SBATCH, API_KEY="none", **env)
    assert proc.returncode == 2 and started is None and "API_KEY=none" in proc.stderr
