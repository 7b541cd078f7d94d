"""SandboxPool: warm, contained workers shared by the judge and the agents' tool.

One worker per usable CPU by default (apps_bench.cell.cpus). `run()` is thread-safe: each call takes a free worker
(blocking until one is), runs one program's tests on it in one contained child, and
calls `keep_going(raw)` in the caller's thread after every test so the judge can
compare there and stop early. Only JSON crosses back from a worker.

Containment is chosen at construction: with the `unshare` command each worker is
PID 1 of new PID/net/IPC/mount namespaces with a read-only view of the system; as
root it also gets its own pids cgroup and its own unprivileged uid (see contain.py),
without root the namespaces come from a user namespace (no cgroup, no uid switch).
Without namespaces it falls back to fork + rlimits + a subreaper sweep and logs a
loud warning once: that mode does not stop a program from reading the judge's files
or signalling the judge's processes.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import pickle
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypedDict

from apps_bench.sandbox.env import CLEAN_ENV

from ..cell.cpus import usable_cpus
from ..errors import AppsBenchError
from ..types import JsonObject
from . import cgroups
from .api import RAW_STATUSES, ExecResult, RawRun, RunRequest
from .frames import ChannelClosed, ChannelCorrupt, ChannelTimeout, FrameReader, send_frame
from .limits import SandboxLimits

if TYPE_CHECKING:
    from apps_bench.config.schema import JudgeConfig

log = logging.getLogger(__name__)

_WEAK_WARNED = False
_PIDS_OFF_WARNED = False
_WARN_LOCK = threading.Lock()
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
# Workers start with -S (no `site` scan: ~30 ms less start-up each, no .pth processing),
# get this process's site-packages directories on their path instead and the builtins
# `site` adds (exit, quit, help, ...); should numpy not be found that way (an unusual
# layout), `site` runs after all.
_WORKER_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[2]); sys.path += [p for p in sys.argv[3].split(':') if p]\n"
    "sys.prefix, sys.exec_prefix = sys.argv[4], sys.argv[5]\n"  # as `site` sets them in a virtualenv
    "import importlib.util\n"
    "import site\n"  # under -S importing it runs nothing; add the builtins it would (exit, quit, help, ...)
    "site.setquit(); site.setcopyright(); site.sethelper()\n"
    "if importlib.util.find_spec('numpy') is None:\n"
    "    site.main()\n"
    "if len(sys.argv) > 6:\n"  # behind an `unshare` launcher: write to the caller's stderr, not the launcher's
    "    import os; os.dup2(int(sys.argv[6]), 2); os.close(int(sys.argv[6]))\n"
    "from apps_bench.sandbox.worker import main; main()"
)
_SITE_DIRS = ":".join(p for p in sys.path if p and ":" not in p and p.rstrip("/").endswith(("site-packages", "dist-packages")))
_POOL_SERIAL = itertools.count()
READY_TIMEOUT_S = 120.0
MESSAGE_SLACK_S = 30.0


def _warn_pids_off(reason: str) -> None:
    """Once per process: the workers' programs get no pids cgroup (RLIMIT_NPROC still applies)."""
    global _PIDS_OFF_WARNED
    with _WARN_LOCK:
        if _PIDS_OFF_WARNED:
            return
        _PIDS_OFF_WARNED = True
    if os.geteuid() == 0:  # without root there never is one: the user-namespace mode says so already
        log.warning(
            "sandbox: no pids cgroup for the workers (%s); the process count per program is capped "
            "by RLIMIT_NPROC only, and the sandbox features record pids_cgroup=false",
            reason,
        )


def _warn_weak(reason: str) -> None:
    global _WEAK_WARNED
    with _WARN_LOCK:
        if _WEAK_WARNED:
            return
        _WEAK_WARNED = True
    log.warning(
        "SANDBOX CONTAINMENT IS WEAK (%s): programs run with fork + rlimits only; they can read files "
        "this user can read and signal this user's processes. For the contained sandbox, run on Linux "
        "with the `unshare` command (util-linux) and either root or unprivileged user namespaces.",
        reason,
    )


def namespaces_possible() -> tuple[bool, str]:
    """Whether the contained arrangement can be tried here, and why not."""
    if not sys.platform.startswith("linux"):
        return False, f"platform {sys.platform} has no Linux namespaces"
    if shutil.which("unshare") is None:
        return False, "the `unshare` command (util-linux) is not installed"
    return True, ""


def _count_processes_of(uid: int) -> int:
    n = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                n += os.stat(f"/proc/{p}").st_uid == uid
            except OSError:
                pass
    return n


class WorkerBroken(AppsBenchError):
    pass


class Job(TypedDict):
    """One RunRequest as the pool sends it to a worker (sandbox/worker.py reads these keys)."""

    code: str
    mode: str
    fn_name: str | None
    inputs: list[object]
    timeout_s: float
    memory_bytes: int
    stderr_chars: int
    reference: bool
    alarm_s: float


class _Worker:
    """The pool's handle on one worker process."""

    def __init__(self, pool: SandboxPool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.uid = pool._uid_base + index
        self.cgroup: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.reader: FrameReader | None = None
        self.ready = False
        self.features: JsonObject = {}  # what the worker reported at start-up
        self.contained = pool._contain_mode

    def _make_cgroup(self) -> tuple[str | None, str]:
        """-> (the worker's pids cgroup, or None and why the limit is off)."""
        parent = self.pool._pids_parent
        if parent.path is None:
            return None, parent.why
        try:
            return cgroups.make(parent, f"{os.getpid()}-{self.pool._serial}-{self.index}", self.pool.limits.pids_max), ""
        except OSError as exc:
            return None, f"cannot make a pids cgroup under {parent.path} ({parent.version}): {exc}"

    def start(self) -> None:
        self.cgroup, cgroup_off = self._make_cgroup()
        if cgroup_off:
            _warn_pids_off(cgroup_off)
        limits = self.pool.limits.to_dict()
        # RLIMIT_NPROC counts every process of the uid: without our own uid, leave
        # room for this user's other processes.
        limits["nproc"] = self.pool.limits.nproc + (_count_processes_of(os.getuid()) if os.geteuid() != 0 else 0)
        cfg = {
            "contained": self.contained,
            "user_namespace": os.geteuid() != 0,
            "uid": self.uid,
            "cgroup": self.cgroup,
            "cgroup_off": cgroup_off,
            "limits": limits,
        }

        env = dict(CLEAN_ENV, HOME="/tmp")
        cmd = [
            sys.executable,
            "-S",
            "-s",
            "-c",
            _WORKER_BOOT,
            json.dumps(cfg),
            _PACKAGE_ROOT,
            _SITE_DIRS,
            sys.prefix,
            sys.exec_prefix,
        ]
        if self.contained:
            # Without root, a user namespace (mapping this user to root inside) makes the
            # same namespaces possible; there is then no pids cgroup and no uid switch.
            userns = ["--user", "--map-root-user"] if os.geteuid() != 0 else []
            cmd = [
                "unshare",
                *userns,
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "--net",
                "--ipc",
                "--uts",
                "--mount",
                "--propagation",
                "private",
                "--",
                *cmd,
            ]
        # The launcher's own stderr is a pipe, read only to say why a worker did not start; the
        # worker gets this process's stderr under another number. A kill that reaches the worker
        # before its launcher (a process-tree kill going deepest first) makes util-linux's unshare
        # say on its stderr that it cannot re-raise SIGKILL on itself: nothing for the caller.
        caller_err = os.dup(2) if self.contained else None
        try:
            self.proc = subprocess.Popen(
                cmd + ([str(caller_err)] if caller_err is not None else []),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE if caller_err is not None else None,
                env=env,
                close_fds=True,
                pass_fds=() if caller_err is None else (caller_err,),
                start_new_session=True,
                cwd="/",
            )
        finally:
            if caller_err is not None:
                os.close(caller_err)
        assert self.proc.stdout is not None  # stdout=PIPE
        self.reader = FrameReader(self.proc.stdout.fileno())
        self.ready = False

    def wait_ready(self) -> None:
        try:
            msg = self.recv(time.monotonic() + READY_TIMEOUT_S)
        except WorkerBroken as e:
            said = self._launcher_said()
            self.stop()
            raise WorkerBroken(f"sandbox worker did not start: {e}" + (f" ({said})" if said else "")) from None
        if msg.get("t") != "ready":
            self.stop()
            raise WorkerBroken(f"sandbox worker did not start: {msg.get('error', msg)}")
        self.features = msg.get("features", {})
        self.ready = True
        if self.features.get("uid_switch_skipped"):
            log.warning(
                "sandbox worker %d cannot give programs their own uid (%s); they run as the worker's user%s",
                self.index,
                self.features["uid_switch_skipped"],
                " (root)" if os.geteuid() == 0 else "",
            )

    def _launcher_said(self) -> str:
        """What the `unshare` launcher wrote on its stderr so far, on one line."""
        err = self.proc.stderr if self.proc is not None else None
        if err is None:
            return ""
        os.set_blocking(err.fileno(), False)
        try:
            text = (err.read() or b"").decode(errors="replace")
        except OSError:
            return ""
        return "; ".join(line.strip() for line in text.splitlines() if line.strip())

    def send(self, data: bytes) -> None:
        if self.proc is None or self.proc.stdin is None:
            raise WorkerBroken("worker link closed: the worker is stopped")
        try:
            send_frame(self.proc.stdin.fileno(), data)
        except (ChannelClosed, OSError) as e:
            raise WorkerBroken(f"worker link closed: {e}") from None

    def recv(self, deadline: float) -> JsonObject:
        if self.reader is None:
            raise WorkerBroken("worker link closed: the worker was never started")
        try:
            msg = json.loads(self.reader.read(deadline))
        except ChannelTimeout:
            raise WorkerBroken("worker did not answer in time") from None
        except (ChannelClosed, ChannelCorrupt, ValueError) as e:
            raise WorkerBroken(f"worker link broken: {e}") from None
        if not isinstance(msg, dict):
            raise WorkerBroken("worker sent a non-object message")
        return msg

    def stop(self, wait_s: float = 2.0) -> None:
        p = self.proc
        if p is None:
            return
        self.proc = None
        self.ready = False
        try:
            if p.stdin is not None:
                p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(wait_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.kill()
            p.wait()
        for pipe in (p.stdout, p.stderr):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        self._remove_cgroup()

    def _remove_cgroup(self) -> None:
        if not self.cgroup:
            return
        for _ in range(50):
            try:
                os.rmdir(self.cgroup)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)
        self.cgroup = None

    def restart(self) -> None:
        self.stop(wait_s=0.5)
        self.start()


class SandboxPool:
    """Warm contained workers; thread-safe `run()` and `python_exec()`.

    workers: 0 = one per CPU this process may use. limits: the judge config's `sandbox`
    block (no limit has a default here). contain: None = contained when possible (root and
    `unshare`), else a loud fallback; False = force the weak fallback; True = refuse to run
    without containment.
    """

    def __init__(self, workers: int, limits: SandboxLimits, *, contain: bool | None = None) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be an integer >= 0 (0 = one per usable CPU), got {workers!r}")
        if not isinstance(limits, SandboxLimits):
            raise TypeError(f"SandboxPool needs SandboxLimits (a typed JudgeConfig's `sandbox`), got {type(limits).__name__}")
        self.workers = workers or usable_cpus()
        self.limits = limits
        possible, why = namespaces_possible()
        if contain is True and not possible:
            raise RuntimeError(f"contained sandbox requested but unavailable: {why}")
        self._contain_mode = bool(possible and contain is not False)
        self._require_contain = contain is True
        if not self._contain_mode:
            _warn_weak(why or "containment disabled by the caller")
        # One unprivileged uid per worker (RLIMIT_NPROC counts per uid), distinct across
        # pools of this process and, barring pid wrap-around, across processes.
        self._serial = next(_POOL_SERIAL)
        self._uid_base = 1_000_000 + ((os.getpid() % 20_000) * 16 + self._serial % 16) * 256
        if self.workers > 256:
            raise ValueError(f"at most 256 sandbox workers per pool, got {self.workers}")
        self._pids_parent = cgroups.pids_parent()
        cgroups.remove_stale(self._pids_parent)
        self._free: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._all: list[_Worker] = []
        self._closed = False
        for k in range(self.workers):
            w = _Worker(self, k)
            w.start()
            self._all.append(w)
            self._free.put(w)
        self._finalizer = weakref.finalize(self, SandboxPool._shutdown, list(self._all))

    @classmethod
    def from_config(cls, judge_cfg: JudgeConfig, *, workers: int | None = None, contain: bool | None = None) -> SandboxPool:
        """The pool a typed judge config (conf/judge/<profile>.yaml) declares: its `workers` (unless
        `workers` is given) and its `sandbox` limits."""
        return cls(judge_cfg.workers if workers is None else int(workers), judge_cfg.sandbox, contain=contain)

    # -- worker management ----------------------------------------------------------
    def _ensure_ready(self, w: _Worker) -> None:
        if w.proc is None:
            w.start()
        elif w.proc.poll() is not None:  # died while idle: replace it
            log.warning("sandbox worker %d exited (status %s); restarting it", w.index, w.proc.returncode)
            w.restart()
        if w.ready:
            return
        try:
            w.wait_ready()
        except WorkerBroken as e:
            if not w.contained or self._require_contain:
                raise RuntimeError(f"sandbox worker {w.index} failed to start: {e}") from None
            _warn_weak(f"contained worker failed to start: {e}")
            w.contained = False
            w.start()
            w.wait_ready()

    def _acquire(self) -> _Worker:
        if self._closed:
            raise RuntimeError("SandboxPool is closed")
        w = self._free.get()
        try:
            self._ensure_ready(w)
        except BaseException:
            self._free.put(w)
            raise
        return w

    def _release(self, w: _Worker) -> None:
        if self._closed:  # closed while this run was in flight: do not leave it running
            w.stop(wait_s=0.5)
        self._free.put(w)

    @property
    def features(self) -> JsonObject:
        """The containment the workers actually have, as they reported it when they started.

        Plain JSON data, stable across runs on one host (no pids, uids or paths of a run):
        `contained`, the namespaces, `readonly_root`, `pids_cgroup`, `uid_switch`, `nice`
        (the programs' priority: the pool's own, never raised), `rlimits`, `hidden`, plus
        `workers`. A feature on which the ready workers disagree (one fell back to the weak
        mode) is "mixed". Waits for one worker to be ready when none is yet."""
        reports = [dict(w.features) for w in self._all if w.ready and w.proc is not None]
        if not reports:
            w = self._acquire()
            try:
                reports = [dict(w.features)]
            finally:
                self._release(w)
        keys = list(dict.fromkeys(k for r in reports for k in r))
        out: JsonObject = {}
        for k in keys:
            values = [r.get(k) for r in reports]
            out[k] = values[0] if all(v == values[0] for v in values) else "mixed"
        out["workers"] = self.workers
        return out

    def worker_pids(self) -> list[int]:
        """PIDs of the worker processes (and their `unshare` launchers) as seen from here."""
        out = []
        for w in self._all:
            if w.proc is not None:
                out.append(w.proc.pid)
                try:
                    kids = Path(f"/proc/{w.proc.pid}/task/{w.proc.pid}/children").read_text().split()
                    out += [int(k) for k in kids]
                except OSError:
                    pass
        return out

    # -- running --------------------------------------------------------------------
    def run(
        self, req: RunRequest, keep_going: Callable[[RawRun], bool] | None = None, *, stderr_chars: int | None = None
    ) -> list[RawRun]:
        """Run `req`'s tests in order in one contained child; see module docstring."""
        if not isinstance(req, RunRequest):
            raise TypeError(f"SandboxPool.run needs a RunRequest, got {type(req).__name__}")
        n = len(req.inputs)
        if n == 0:
            return []
        job: Job = {
            "code": req.code,
            "mode": req.mode,
            "fn_name": req.fn_name,
            "inputs": list(req.inputs),
            "timeout_s": float(req.timeout_s),
            "memory_bytes": int(req.memory_bytes),
            "stderr_chars": int(stderr_chars if stderr_chars is not None else self.limits.stderr_chars),
            "reference": bool(req.reference),
            "alarm_s": float(req.alarm_s),
        }
        w = self._acquire()
        try:
            return self._run_on(w, job, n, keep_going)
        finally:
            self._release(w)

    def _run_on(self, w: _Worker, job: Job, n: int, keep_going: Callable[[RawRun], bool] | None) -> list[RawRun]:
        """Drive one job. The worker's child runs ahead; every result but the last (and a
        compile error) gets a C(ontinue)/S(top) reply, also results that arrive after a
        stop (they are discarded), so the worker can account for every reply."""
        st = _JobResults(n, keep_going)
        try:
            w.send(b"J" + pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
            self._follow(w, float(job["timeout_s"]) + MESSAGE_SLACK_S, st)
        except WorkerBroken as e:
            self._broke(w, e)
            if st.go and len(st.results) < n:  # (every result already in: the job stands as it is)
                st.results.append(RawRun(index=len(st.results), status="sandbox_error", detail=f"sandbox worker broke: {e}"))
            if st.pending is not None:
                raise st.pending from e
            return st.results
        if st.pending is not None:
            raise st.pending
        if st.compile_detail is not None and st.go and not job.get("reference"):  # reference: [-2] alone
            st.fill_compile_errors()
        return st.results

    @staticmethod
    def _follow(w: _Worker, per_msg: float, st: _JobResults) -> None:
        """Read the job's results up to its `end`, replying to each one that owes a reply."""
        while True:
            msg = w.recv(time.monotonic() + per_msg)
            kind = msg.get("t")
            if kind == "end":
                if msg.get("damaged"):  # the program damaged this worker: a fresh one judges the next
                    log.warning("sandbox worker %d replaced: %s", w.index, msg["damaged"])
                    w.restart()
                return
            if kind != "raw":
                raise WorkerBroken(f"unexpected worker message {kind!r}")
            raw = _raw_from_msg(msg, expected=st.next_index)
            st.next_index += 1
            st.take(raw)
            if raw.status != "compile_error" and raw.index < st.n - 1:
                w.send(b"C" if st.go else b"S")

    def _broke(self, w: _Worker, e: WorkerBroken) -> None:
        if self._closed:
            w.stop(wait_s=0.5)
            return
        log.error("sandbox worker %d broke (%s); restarting it", w.index, e)
        try:
            w.restart()
        except Exception as e2:  # noqa: BLE001 - a worker that cannot restart is logged; the job's result says the sandbox broke
            log.error("sandbox worker %d failed to restart: %s", w.index, e2)

    def python_exec(self, code: str, stdin: str = "", *, timeout_s: float, output_chars: int) -> ExecResult:
        """Run a script once in a fresh child (the agents' tool); output clipped.

        The limit and the clip are the `tool:` config's; memory and the rest are the pool's."""
        if not isinstance(code, str):
            raise TypeError("python_exec: code must be a string")
        if not isinstance(stdin, str):
            raise TypeError("python_exec: stdin must be a string")
        req = RunRequest(code=code, mode="stdin", inputs=[stdin], timeout_s=timeout_s, memory_bytes=self.limits.exec_memory_bytes)
        (raw,) = self.run(req, stderr_chars=output_chars)[:1]
        stdout = raw.stdout
        if len(stdout) > output_chars:
            stdout = stdout[:output_chars] + f"\n[... stdout clipped: {len(raw.stdout) - output_chars} more characters]"
        stderr = raw.stderr
        if raw.status == "output_limit":
            stderr = (stderr + f"\n[output limit of {self.limits.output_cap_bytes} bytes exceeded]").lstrip("\n")
        elif raw.status == "memory_limit" and "MemoryError" not in stderr:
            stderr = (stderr + "\n[memory limit exceeded]").lstrip("\n")
        elif raw.status == "sandbox_error":
            stderr = f"[sandbox error: {raw.detail}]"
        elif raw.status == "runtime_error" and not stderr and raw.detail:
            stderr = f"[{raw.detail}]"
        timed_out = raw.status == "timeout"
        if timed_out:
            stderr = (stderr + f"\n[killed: time limit of {timeout_s:g}s exceeded]").lstrip("\n")
        return ExecResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=None if timed_out else raw.exit_code,
            timed_out=timed_out,
            seconds=raw.seconds,
            status=raw.status,
        )

    # -- lifetime ---------------------------------------------------------------------
    @staticmethod
    def _shutdown(workers: list[_Worker]) -> None:
        # Tell every worker to finish first (end of its job stream), then wait for each:
        # they sweep and exit side by side instead of one after another.
        for w in workers:
            if w.proc is not None and w.proc.stdin is not None:
                try:
                    w.proc.stdin.close()
                except OSError:
                    pass
        for w in workers:
            try:
                w.stop()
            except Exception:  # noqa: BLE001 - best effort while closing: the other workers are still stopped
                pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _JobResults:
    """One job's results on the pool's side, and whether the caller wants more."""

    n: int
    keep_going: Callable[[RawRun], bool] | None
    results: list[RawRun] = field(default_factory=list)
    go: bool = True
    pending: BaseException | None = None  # raised by keep_going: re-raised once the worker has been told to stop
    compile_detail: str | None = None
    next_index: int = 0

    def take(self, raw: RawRun) -> None:
        """Keep a result while the caller wants more, and ask it whether to go on."""
        if not self.go:  # arrived after a stop: discarded
            return
        self.results.append(raw)
        if self.keep_going is not None:
            try:
                self.go = bool(self.keep_going(raw))
            except BaseException as e:  # noqa: BLE001 - tell the worker to stop, then re-raise
                self.pending, self.go = e, False
        if raw.status == "compile_error":
            self.compile_detail = raw.detail

    def fill_compile_errors(self) -> None:
        """A program that does not compile fails every test left, as far as the caller wants them."""
        for i in range(len(self.results), self.n):
            raw = RawRun(index=i, status="compile_error", exit_code=1, detail=self.compile_detail or "")
            self.results.append(raw)
            if self.keep_going is not None and not self.keep_going(raw):
                break


def _raw_from_msg(msg: JsonObject, expected: int) -> RawRun:
    """Build a RawRun from a worker message, checking every field's type."""
    status = msg.get("status")
    index = msg.get("index")
    if status not in RAW_STATUSES or type(index) is not int or index != expected:
        raise WorkerBroken(f"malformed result from worker: status={status!r} index={index!r}")

    def s(key: str) -> str:
        v = msg.get(key)
        return v if isinstance(v, str) else ""

    vj = msg.get("value_json")
    ec = msg.get("exit_code")
    secs = msg.get("seconds")
    return RawRun(
        index=index,
        status=status,
        stdout=s("stdout"),
        value_json=vj if isinstance(vj, str) else None,
        stderr=s("stderr"),
        exit_code=ec if type(ec) is int else None,
        seconds=float(secs) if isinstance(secs, (int, float)) and not isinstance(secs, bool) else 0.0,
        detail=s("detail"),
        fatal=msg.get("fatal") is True,
        late=msg.get("late") is True,
    )
