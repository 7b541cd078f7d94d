"""A warm sandbox worker: started once, serves jobs from the pool over a pipe.

Start-up (once): numeric libraries pinned to one thread, then the interpreter, the
APPS prelude (numpy included) and the stdlib modules programs commonly use are
imported, so forked children start warm; then only the standard library and the judge
profile's `sandbox.packages` stay importable (packages.py). In contained mode the worker is PID 1 of
fresh PID/net/IPC/mount namespaces and builds its filesystem view (contain.py).

Per job (one program and its test inputs): fork one contained child, wait until it is
ready (set up, compiled), then for each test write the input where the child reads it,
send a go and time the test here until its result frame arrives (wall-clock deadline;
the next go is sent at once, so the child computes while the pool judges), send a
plain-JSON RawRun to the pool, and kill the child as soon as the pool says stop. A timeout or crash kills the
child; if the pool wants more, the remaining tests continue in a fresh child.
After the job everything the program started is killed and reaped, its SysV IPC
objects removed and its writable dirs emptied; only then does the worker say `end`.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
    os.environ[_var] = "1"

import gc  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import secrets  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

from . import contain, packages, seccomp  # noqa: E402
from .frames import ChannelClosed, ChannelCorrupt, ChannelTimeout, FrameReader, send_frame  # noqa: E402
from .harness import ChildSpec, child_main, prelude_namespace, stdin_bytes  # noqa: E402

# Modules programs commonly import: loaded here once so children find them in
# sys.modules (fast, and importable even when the interpreter's files are not
# readable by the child's uid).
# Kept lean: every module here makes each fork (one per program) a little dearer.
PREIMPORT = (
    "array bisect cmath collections collections.abc copy dataclasses datetime decimal enum fractions "
    "functools heapq io itertools json math numbers operator queue random re statistics string struct "
    "threading time traceback types typing faulthandler shutil subprocess resource numpy"
).split()
for _m in PREIMPORT:
    try:
        __import__(_m)
    except Exception:  # noqa: BLE001 - a preimport that fails is loaded (or not) by the program itself, later
        pass
for _enc in ("utf_8", "latin_1", "ascii", "utf_16", "utf_32", "cp1252", "idna"):
    try:
        __import__("encodings." + _enc)
    except Exception:  # noqa: BLE001 - an encoding that fails to preload is loaded (or not) by the program itself, later
        pass
# The reference profile's child (and unittest.mock, its stdin patches): after numpy, whose
# scalar types it records. Imported here because the package is hidden once contained.
from .reference_child import child_main as reference_child_main  # noqa: E402

sys.set_int_max_str_digits(0)
prelude_namespace()
gc.collect()
gc.freeze()  # children's collections skip everything loaded above: no copy-on-write storm

CHILD_STATUSES = frozenset(("ok", "runtime_error", "memory_limit", "compile_error", "output_limit", "timeout"))


def _world_readable(path: str) -> bool:
    """Whether any uid can traverse to and read `path` (every ancestor o+x, the dir o+rx)."""
    p = os.path.realpath(path)
    try:
        st = os.stat(p)
        if st.st_mode & 0o005 != 0o005:
            return False
        while p != "/":
            p = os.path.dirname(p)
            if not os.stat(p).st_mode & 0o001:
                return False
    except OSError:
        return False
    return True


def _drop_probe(uid: int | None, filt: seccomp.Filter | None) -> int:
    """Drop a program's privileges (to `uid`) in a throw-away child: 0 = done, no capability left;
    2 = done but the bounding set stays full (not root in any namespace); 1 = refused here."""
    pid = os.fork()
    if pid == 0:
        try:
            contain.drop_privileges(uid)
            if filt is not None:
                filt.install()
            with open("/proc/self/status") as f:
                caps = [int(line.split()[1], 16) for line in f if line.startswith(("CapEff", "CapPrm", "CapBnd"))]
            os._exit(0 if not any(caps) else 2)
        except BaseException:  # noqa: BLE001 - the probe child exits with a code whatever happened; it never returns
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _pidfd(pid: int) -> int:
    """A pollable handle on the child (Linux >= 5.3); -1 where unavailable (then polled)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


@dataclass
class _Plan:
    """How a job's tests run: its size, limits and how each test's input is handed over."""

    inputs: list[Any]
    n: int
    fsize_hard: int
    timeout: float
    limit: float  # a test's limit (reference: the alarm's length)
    # reference: one process runs every test (no fresh child after a death) within one program-wide
    # deadline (the original's global limit); each test (and the load) is limited to the alarm's length.
    one_process: bool
    raw_stdin: bool  # seed stdin: the bytes are the program's stdin (else the input pickled)

    @classmethod
    def of(cls, job: dict[str, Any], output_cap: int) -> _Plan:
        inputs = job["inputs"]
        max_in = 0
        if job["mode"] != "call":
            # An upper bound is enough (UTF-8 takes at most 4 bytes a character).
            max_in = max((4 * len(x) if type(x) is str else len(stdin_bytes(x)) for x in inputs), default=0)
        one_process = bool(job["reference"])
        timeout = float(job["timeout_s"])
        return cls(
            inputs=inputs,
            n=len(inputs),
            fsize_hard=max(output_cap, max_in) + 1,
            timeout=timeout,
            limit=float(job["alarm_s"]) if one_process else timeout,
            one_process=one_process,
            raw_stdin=job["mode"] != "call" and not one_process,
        )

    def data(self, k: int) -> bytes:
        """Test k's input as the child takes it."""
        x = self.inputs[k]
        return stdin_bytes(x) if self.raw_stdin else pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)


@dataclass
class _Clock:
    """One child's running step: when it started (t0), its deadline, the program's, the frame awaited."""

    t0: float
    program_deadline: float
    deadline: float = 0.0
    step: bytes = b"R"  # the control frame awaited: R(eady), L(oaded), then b"" (test results)


@dataclass
class Child:
    pid: int
    pidfd: int
    res_r: int
    reader: FrameReader
    in_fd: int
    out_fd: int
    err_fd: int
    ctl_w: int
    nonce: str = ""
    reaped: bool = False


class Worker:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.contained = bool(cfg.get("contained"))
        self.uid: int | None = cfg["uid"] if os.geteuid() == 0 else None
        # What this worker's programs actually get; stable across runs on one host (no pids,
        # uids or paths that change per run), so cells can be compared on it.
        self.features: dict[str, Any] = {"contained": False}
        # The judge config's sandbox limits (apps_bench/sandbox/limits.py): every key is required.
        lim = cfg["limits"]
        self.output_cap = int(lim["output_cap_bytes"])
        self.nproc = int(lim["nproc"])
        self.nofile = int(lim["nofile"])
        self.tmp_size = str(lim["tmp_size"])
        self.shm_size = str(lim["shm_size"])
        self.grace_s = float(lim["grace_s"])
        self.first_test_slack_s = float(lim["first_test_slack_s"])
        self.cpu_slack_s = int(lim["cpu_slack_s"])
        # The pool's link: move it off 0/1 so nothing stray can write into it.
        self.rfd = os.dup(0)
        self.wfd = os.dup(1)
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        self.reader = FrameReader(self.rfd)

    # -- start-up -----------------------------------------------------------------
    def setup(self) -> None:
        """The worker's rooms, once, before any program: its cgroup, its view of the system, what
        every program is stripped of, and the programs' environment (all inherited by fork)."""
        self._join_cgroup()
        if self.contained:
            self._enter_namespaces()
        else:
            self._weak_root()
        self._strip_programs()
        self._programs_env()

    def _join_cgroup(self) -> None:
        cg = self.cfg.get("cgroup")
        self.features["pids_cgroup"] = False
        if self.cfg.get("cgroup_off"):  # why there is none: the features must not let a reader assume one
            self.features["pids_cgroup_off"] = str(self.cfg["cgroup_off"])
        if cg:
            try:
                contain.join_cgroup(cg)
                self.features["pids_cgroup"] = True
            except OSError as e:
                self.features["pids_cgroup_error"] = str(e)

    def _enter_namespaces(self) -> None:
        """Contained: PID 1 of new namespaces, a read-only view of the system, /tmp as the root of the runs."""
        if os.getpid() != 1:
            raise RuntimeError("contained worker is not PID 1 of a new PID namespace")
        keep = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *self.cfg.get("keep", [])]
        keep += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
        hidden = contain.setup_worker_namespace(keep, "/tmp/run", self.tmp_size, self.shm_size)
        self.root = "/tmp"
        self.features.update(
            contained=True,
            pid_namespace=True,
            net_namespace=True,
            ipc_namespace=True,
            uts_namespace=True,
            mount_namespace=True,
            user_namespace=bool(self.cfg["user_namespace"]),
            readonly_root=True,
            hidden=hidden,
        )

    def _weak_root(self) -> None:
        """Without namespaces: a subreaper, a private temporary root, room in RLIMIT_NPROC for this user."""
        contain.prctl(contain.PR_SET_CHILD_SUBREAPER, 1)
        if self.uid is not None and not all(_world_readable(p) for p in {sys.base_prefix, sys.prefix}):
            # Without a mount namespace we cannot re-expose the interpreter to another
            # uid: a switched child could not import what was not pre-imported.
            self.features["uid_switch_skipped"] = "the interpreter is not readable by other users"
            self.uid = None
        self.root = tempfile.mkdtemp(prefix="apps-bench-sandbox-")
        os.chmod(self.root, 0o711)  # the child's uid must reach run/ by absolute path
        self.features["subreaper"] = True
        if self.uid is None:
            # RLIMIT_NPROC counts every process of this uid: leave room for the user's own.
            mine = 0
            uid = os.getuid()
            for p in os.listdir("/proc"):
                if p.isdigit():
                    try:
                        mine += os.stat(f"/proc/{p}").st_uid == uid
                    except OSError:
                        pass
            self.nproc = mine + self.nproc

    def _strip_programs(self) -> None:
        """No capability and the seccomp filter for every program (contain.drop_privileges, seccomp.py):
        a worker where they cannot be had refuses to start, saying why (no weaker judge in silence).
        The bounding set is emptied here, once: every child inherits it, and the probes check it."""
        contain.empty_bounding_set(contain.last_capability())
        raw = seccomp.build()
        if raw is None:
            raise RuntimeError(f"no seccomp filter for this architecture ({os.uname().machine})")
        self.filter = seccomp.Filter(raw)
        probe = _drop_probe(None, self.filter)
        if probe == 1:
            raise RuntimeError("programs cannot be stripped of capabilities and filtered by seccomp here")
        self.features.update(capabilities="none" if probe == 0 else "bounding set kept (not root)", seccomp=True)
        if self.uid is not None and _drop_probe(self.uid, None) == 1:
            # e.g. inside a user namespace that maps only root: the uid does not exist here.
            self.features["uid_switch_skipped"] = f"switching to uid {self.uid} is refused here"
            self.uid = None

    def _programs_env(self) -> None:
        """The programs' run dir, environment and signal dispositions, set up once here (children
        inherit them by fork): clearing and refilling the environment in every child dirtied ~100
        copy-on-write pages (~0.5 ms a program). spawn() re-checks it before every fork."""
        self.run_dir = os.path.join(self.root, "run")
        contain.reset_environment(self.run_dir)
        self.program_env = dict(os.environ)
        contain.reset_signals()
        contain.wipe_dir(self.run_dir, self.uid)
        self.damaged = ""  # why this worker may not judge again (set by sweep)
        self.view = self._view()
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.features["uid_switch"] = self.uid is not None
        self.features["rlimits"] = ["AS", "CPU", "FSIZE", "NOFILE", "NPROC", "CORE"]
        # Programs run at the priority of the process that started the pool (never raised,
        # whatever the privilege): a verdict near the time limit must not depend on root.
        self.features["nice"] = os.nice(0)

    def send(self, msg: dict[str, Any]) -> None:
        send_frame(self.wfd, json.dumps(msg, ensure_ascii=True).encode("ascii"))

    # -- children -----------------------------------------------------------------
    def spawn(self, job: dict[str, Any], fsize_hard: int, start: int) -> Child:
        res_r, res_w = os.pipe()
        ctl_r, ctl_w = os.pipe()  # the worker's go for each step (one byte)
        os.set_blocking(ctl_w, False)
        in_fd = os.memfd_create("stdin")
        out_fd = os.memfd_create("stdout")
        err_fd = os.memfd_create("stderr")
        n_left = len(job["inputs"]) - start
        nonce = secrets.token_hex(8)
        worker_pid = os.getpid()
        if os.environ != self.program_env:  # never expected; cheap, and before the fork
            contain.reset_environment(self.run_dir)
            self.program_env = dict(os.environ)
        # Built before the fork (a child's every allocation dirties copy-on-write pages);
        # keep_only_fds numbers the kept fds 3, 4, 5, 6, 7 in the child.
        spec = ChildSpec(
            code=job["code"],
            mode=job["mode"],
            fn_name=job.get("fn_name"),
            n_tests=len(job["inputs"]),
            timeout_s=float(job["timeout_s"]),
            output_cap=self.output_cap,
            fsize_hard=fsize_hard,
            res_fd=3,
            in_fd=4,
            out_fd=5,
            err_fd=6,
            ctl_fd=7,
            guard=job["mode"] == "call",
            nonce=nonce,
            start=start,
            stderr_chars=int(job["stderr_chars"]),
            cpu_slack_s=self.cpu_slack_s,
            reference=bool(job["reference"]),
            alarm_s=float(job["alarm_s"]),
        )
        main = reference_child_main if spec.reference else child_main
        pid = os.fork()
        if pid == 0:  # ---- the program child
            try:
                os.setsid()
                if contain.keep_only_fds([res_w, in_fd, out_fd, err_fd, ctl_r]) != [3, 4, 5, 6, 7]:
                    os._exit(7)
                os.dup2(4, 0)
                os.dup2(5, 1)
                os.dup2(6, 2)
                # Signal dispositions and the environment are the worker's, set for programs in setup().
                contain.set_rlimits(
                    memory_bytes=int(job["memory_bytes"]),
                    # reference: timeout_s is the whole program's limit, not a test's
                    cpu_s=(
                        int(job["timeout_s"]) + self.cpu_slack_s
                        if spec.reference
                        else int(n_left * (job["timeout_s"] + self.cpu_slack_s)) + self.cpu_slack_s
                    ),
                    fsize=fsize_hard,
                    nofile=self.nofile,
                    nproc=self.nproc,
                )
                os.chdir(self.run_dir)  # the environment is already the programs' (see setup)
                contain.drop_privileges(self.uid)
                # After the uid switch: changing credentials clears the parent-death signal.
                contain.prctl(contain.PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != worker_pid:
                    os._exit(6)
                self.filter.install()  # last: from here on only what a program needs
                main(spec)
            finally:
                os._exit(5)
        os.close(res_w)
        os.close(ctl_r)
        max_frame = 2 * self.output_cap + 4 * max(1024, int(job["stderr_chars"])) + (1 << 20)
        return Child(pid, _pidfd(pid), res_r, FrameReader(res_r, max_frame=max_frame), in_fd, out_fd, err_fd, ctl_w, nonce)

    def kill_child(self, c: Child) -> int | None:
        """SIGKILL the child's process group and reap the child; returns its wait status."""
        if c.reaped:
            return None
        for f in (lambda: os.killpg(c.pid, signal.SIGKILL), lambda: os.kill(c.pid, signal.SIGKILL)):
            try:
                f()
            except (ProcessLookupError, PermissionError):
                pass
        try:
            _, status = os.waitpid(c.pid, 0)
        except ChildProcessError:
            status = None
        c.reaped = True
        return status

    def close_child(self, c: Child) -> None:
        for fd in (c.pidfd, c.res_r, c.in_fd, c.out_fd, c.err_fd, c.ctl_w):
            if fd < 0:
                continue
            try:
                os.close(fd)
            except OSError:
                pass

    def sweep(self) -> None:
        """Kill what the program left running and take back what it left lying: its files (its run dir,
        /dev/shm), SysV IPC objects. A worker it managed to damage anyway (its filesystem view changed)
        is marked, judges nothing more and is replaced by the pool (`damaged`)."""
        try:
            if self.contained:
                contain.sweep_namespace()
                contain.wipe_contents("/dev/shm")
                contain.remove_sysv_ipc()
            else:
                contain.sweep_descendants()
            contain.wipe_dir(self.run_dir, self.uid)
            if self.view != self._view():
                self.damaged = "its filesystem view changed"
        except Exception as e:  # noqa: BLE001 - whatever it was, this worker is not trusted again
            self.damaged = f"cleaning up after it failed ({type(e).__name__}: {e})"

    def _view(self) -> tuple[int, ...]:
        """The devices of the run dir, /tmp and / (a tripwire: the seccomp filter already refuses mounts)."""
        return tuple(os.stat(p).st_dev for p in (self.run_dir, "/tmp", "/"))

    def _read_out(self, c: Child) -> bytes:
        """The dead child's stdout, up to the cap + 1 byte (so a longer one shows)."""
        size = os.fstat(c.out_fd).st_size
        return os.pread(c.out_fd, min(size, self.output_cap + 1), 0) if size else b""

    def _read_err(self, c: Child, stderr_chars: int) -> bytes:
        esize = os.fstat(c.err_fd).st_size
        n = max(1024, stderr_chars * 4)
        return os.pread(c.err_fd, min(esize, n), max(0, esize - n)) if esize else b""

    def _wait_exit(self, c: Child, deadline: float) -> int | None:
        """Wait until the child exits or the deadline passes; its wait status or None."""
        while True:
            try:
                pid, status = os.waitpid(c.pid, os.WNOHANG)
            except ChildProcessError:
                c.reaped = True
                return None
            if pid:
                c.reaped = True
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if c.pidfd >= 0:
                try:
                    select.select([c.pidfd], [], [], left)
                except InterruptedError:
                    pass
            else:
                time.sleep(min(left, 0.005))

    def _parse_frame(self, c: Child, i: int, payload: bytes) -> tuple[dict[str, Any], bytes, bytes] | None:
        """Validate a result frame from the child; None when it is not one of ours."""
        if len(payload) < 4:
            return None
        mlen = int.from_bytes(payload[:4], "big")
        try:
            meta = json.loads(payload[4 : 4 + mlen])
        except (ValueError, RecursionError):
            return None
        if not (
            isinstance(meta, dict) and meta.get("n") == c.nonce and meta.get("i") == i and meta.get("status") in CHILD_STATUSES
        ):
            return None
        ol, el = meta.get("out_len"), meta.get("err_len")
        if type(ol) is not int or type(el) is not int or ol < 0 or el < 0 or 4 + mlen + ol + el != len(payload):
            return None
        vj = meta.get("value_json")
        if vj is not None:
            if not isinstance(vj, str):
                return None
            try:
                json.loads(vj)
            except (ValueError, RecursionError):
                return None
        out = payload[4 + mlen : 4 + mlen + ol]
        err = payload[4 + mlen + ol :]
        return meta, out, err

    @staticmethod
    def _read_frame(c: Child, deadline: float, ev: str) -> tuple[bytes | None, str]:
        """The child's next frame, or None and why not ('timeout', 'died', 'corrupt'); `ev` is what
        `_wait_any` saw ('child': its result channel is readable, so no second select)."""
        if ev == "timeout":
            return None, "timeout"
        try:
            return c.reader.read(deadline, readable=ev == "child"), ""
        except ChannelTimeout:
            return None, "timeout"
        except ChannelClosed:
            return None, "died"
        except ChannelCorrupt:
            return None, "corrupt"

    def collect(
        self,
        c: Child,
        i: int,
        job: dict[str, Any],
        t0: float,
        wall: float,
        deadline: float,
        parsed: tuple[dict[str, Any], bytes, bytes] | None,
        reason: str,
        limit: float,
    ) -> tuple[dict[str, Any], bool]:
        """Test i's result from child c's parsed frame (or its death), timed here: `wall` runs from just
        before this process made the input available (t0) to the frame's arrival; over `limit` it is a
        timeout, whatever the program's process says. Returns (raw, child usable)."""
        stderr_chars = int(job["stderr_chars"])
        raw: dict[str, Any] = {
            "index": i,
            "status": "runtime_error",
            "stdout": "",
            "value_json": None,
            "stderr": "",
            "exit_code": None,
            "seconds": round(wall, 6),
            "detail": "",
            "fatal": parsed is None,
        }
        if parsed is not None:
            out, err = self._as_reported(raw, parsed, wall, limit)
        else:
            out, err = self._after_death(c, raw, job, t0, deadline, reason)
        etext = err.decode("utf-8", "replace")
        raw["stderr"] = etext[-stderr_chars:] if len(etext) > stderr_chars else etext
        if len(out) > self.output_cap:  # (out is read up to the cap + 1 byte)
            raw.update(status="output_limit", value_json=None, detail=f"output over {self.output_cap} bytes")
        elif (
            raw["status"] == "runtime_error" and parsed is None and ("MemoryError" in etext or "Cannot allocate memory" in etext)
        ):
            raw["status"] = "memory_limit"
        raw["stdout"] = out[: self.output_cap].decode("utf-8", "replace")
        return raw, parsed is not None

    @staticmethod
    def _as_reported(
        raw: dict[str, Any], parsed: tuple[dict[str, Any], bytes, bytes], wall: float, limit: float
    ) -> tuple[bytes, bytes]:
        """A test the child reported: its status and exit code, unless this worker's clock says timeout.
        Returns its stdout and stderr tail."""
        meta, out, err = parsed
        ec = meta.get("exit_code")
        d = meta.get("detail")
        raw.update(
            status=meta["status"],
            exit_code=ec if type(ec) is int else None,
            value_json=meta.get("value_json"),
            detail=d[:300] if isinstance(d, str) else "",
        )
        if wall > limit and raw["status"] != "compile_error":
            raw.update(status="timeout", detail=f"took {wall:.2f}s > {limit:g}s", value_json=None, late=raw["status"] == "ok")
        return out, err

    def _after_death(
        self, c: Child, raw: dict[str, Any], job: dict[str, Any], t0: float, deadline: float, reason: str
    ) -> tuple[bytes, bytes]:
        """A test whose child sent no usable frame (`reason`: died, timeout, corrupt): the child is reaped
        or killed, the test classified by why; returns what its stdout and stderr memfds hold."""
        status_word = None
        if reason == "died":
            status_word = self._wait_exit(c, deadline)
            if status_word is None:  # result channel closed but still running
                reason = "corrupt" if time.monotonic() < deadline else "timeout"
        if status_word is None:
            status_word = self.kill_child(c)
        raw["seconds"] = round(time.monotonic() - t0, 6)
        if reason == "timeout":
            raw.update(status="timeout", detail=f"killed at the {float(job['timeout_s']):g}s deadline")
        elif reason == "corrupt":
            raw.update(status="runtime_error", detail="the program corrupted the result channel")
        else:
            raw.update(self._classify_exit(status_word, job["mode"]))
        return self._read_out(c), self._read_err(c, int(job["stderr_chars"]))

    @staticmethod
    def _classify_exit(status_word: int | None, mode: str) -> dict[str, Any]:
        if status_word is None:
            return {"status": "runtime_error", "detail": "the program's process vanished"}
        if os.WIFSIGNALED(status_word):
            sig = os.WTERMSIG(status_word)
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            if sig == signal.SIGXCPU:
                return {"status": "timeout", "detail": "CPU time limit (SIGXCPU)", "exit_code": -sig}
            if sig == signal.SIGXFSZ:
                return {"status": "output_limit", "detail": "file size limit (SIGXFSZ)", "exit_code": -sig}
            if sig == signal.SIGSEGV:
                return {"status": "runtime_error", "detail": "killed by SIGSEGV (stack overflow?)", "exit_code": -sig}
            return {"status": "runtime_error", "detail": f"killed by {name}", "exit_code": -sig}
        code = os.WEXITSTATUS(status_word)
        if code == 0 and mode != "call":
            return {"status": "ok", "exit_code": 0, "detail": "exited with os._exit(0)"}
        if code == 0:
            return {"status": "runtime_error", "exit_code": 0, "detail": "the process exited during the call"}
        return {"status": "runtime_error", "exit_code": code, "detail": f"exit status {code}"}

    # -- jobs ---------------------------------------------------------------------
    def _wait_any(self, c: Child, deadline: float) -> str:
        """'parent' (a keep-going reply), 'child' (a result), or 'timeout'."""
        while True:
            if self.reader.frame_ready():
                return "parent"
            if c.reader.frame_ready():
                return "child"
            left = deadline - time.monotonic()
            try:  # a result already in the pipe counts even when the worker looks late
                ready, _, _ = select.select([self.rfd, c.res_r], [], [], max(0.0, left))
            except InterruptedError:
                continue
            if self.rfd in ready:
                return "parent"
            if c.res_r in ready:
                return "child"
            if left <= 0:
                return "timeout"

    def _reply(self) -> bool:
        """Read one keep-going reply from the pool: True = continue."""
        return self.reader.read() == b"C"

    def _go(self, c: Child, token: bytes, data: bytes | None) -> float:
        """Put the next step's input where the child reads it and say go; returns when the step's
        clock started (before the input existed for the child: nothing it computes can predate it)."""
        t0 = time.monotonic()
        if data is not None:
            os.ftruncate(c.in_fd, 0)
            if data:
                os.pwrite(c.in_fd, data, 0)
        try:
            os.write(c.ctl_w, token)
        except OSError:  # gone (or not reading: a go is pending): its result channel says what happened
            pass
        return t0

    def handle(self, job: dict[str, Any]) -> None:
        """Run a job's tests, each timed here, pipelined: the next test's go is sent as soon as a
        result arrives, so the child computes while the pool judges.

        A child first says it is ready (set up, program compiled, nothing of the program run yet);
        in `reference` it is then told to load the program (timed like a test, as the original's
        alarm covers it); then each test's input is written and a go sent, and the test lasts
        until its result frame arrives. Every result except the last (and a compile error) gets
        exactly one C/S reply from the pool; all replies are consumed before `end`, so none leaks
        into the next job. After S (or the last test) the child is killed and everything swept.
        """
        plan = _Plan.of(job, self.output_cap)
        i = 0
        pending = 0  # results sent that still owe a reply
        stop = False
        while i < plan.n and not stop:
            c = self.spawn(job, plan.fsize_hard, i)
            try:
                i, pending, stop = self._run_child(c, job, plan, i, pending)
            finally:
                self.kill_child(c)
                self.close_child(c)
                self.sweep()
            if self.damaged and not stop:  # no fresh child here: what is left fails, the program's doing
                pending = self._fail_left(i, plan.n, pending)
                break
            # Before starting a fresh child, hear what the pool decided so far.
            while pending and not stop and i < plan.n:
                pending -= 1
                stop = not self._reply()
        while pending:
            pending -= 1
            self._reply()
        self.send({"t": "end", "damaged": self.damaged})
        if self.damaged:  # the pool replaces this worker; it judges nothing more
            raise ChannelClosed(self.damaged)

    def _run_child(self, c: Child, job: dict[str, Any], plan: _Plan, i: int, pending: int) -> tuple[int, int, bool]:
        """Tests i.. in child c until the job ends, the pool says stop or the child is lost.
        Returns (the next test, the replies still owed, stop)."""
        t0 = time.monotonic()
        clock = _Clock(t0=t0, program_deadline=t0 + plan.timeout + self.grace_s)
        # set-up and compiling are not the program's: they get the first-test slack on top
        clock.deadline = clock.program_deadline + self.first_test_slack_s
        stop = False
        while i < plan.n and not stop:
            if plan.one_process:
                clock.deadline = min(clock.deadline, clock.program_deadline)
            ev = self._wait_any(c, clock.deadline)
            if ev == "parent":
                pending -= 1
                stop = not self._reply()
                continue
            frame, reason = self._read_frame(c, clock.deadline, ev)
            if clock.step and frame == clock.step:
                if self._next_step(c, plan, clock, i):
                    continue
                frame, reason = None, "slow_load"
            raw, alive = self._result(c, job, plan, clock, i, frame, reason)
            i += 1
            self.send({"t": "raw", **raw})
            if raw["status"] == "compile_error":
                stop = True
            elif i < plan.n:
                pending += 1
            if not alive:
                stop = stop or plan.one_process
                break
        return i, pending, stop

    def _next_step(self, c: Child, plan: _Plan, clock: _Clock, i: int) -> bool:
        """The child answered the step awaited (R: ready, L: loaded): start the next one (load, or test
        i). False when the load took longer than a test may."""
        if clock.step == b"R" and plan.one_process:
            clock.step, clock.t0 = b"L", self._go(c, b"L", None)
            clock.deadline = clock.t0 + plan.limit + self.grace_s
            return True
        if clock.step == b"L" and time.monotonic() - clock.t0 > plan.limit:
            return False
        clock.step, clock.t0 = b"", self._go(c, b"G", plan.data(i))
        clock.deadline = self._test_deadline(plan, clock)
        return True

    def _test_deadline(self, plan: _Plan, clock: _Clock) -> float:
        return clock.program_deadline if plan.one_process else clock.t0 + plan.timeout + self.grace_s

    def _result(
        self, c: Child, job: dict[str, Any], plan: _Plan, clock: _Clock, i: int, frame: bytes | None, reason: str
    ) -> tuple[dict[str, Any], bool]:
        """Test i's result (raw, child usable); the next test's go is sent first when the child goes on."""
        if reason == "slow_load":
            self.kill_child(c)
            return {
                "index": i,
                "status": "compile_error",
                "stdout": "",
                "value_json": None,
                "stderr": "",
                "exit_code": None,
                "seconds": round(time.monotonic() - clock.t0, 6),
                "fatal": True,
                "detail": f"loading took more than {plan.limit:g}s",
            }, False
        wall = time.monotonic() - clock.t0  # the result is here: the test is over
        parsed = self._parse_frame(c, i, frame) if frame is not None else None
        if frame is not None and parsed is None:
            reason = "corrupt"
        t_next = None
        if parsed is not None and i + 1 < plan.n and parsed[0]["status"] != "compile_error":
            # the child goes on while its result is built here and judged by the pool
            t_next = self._go(c, b"G", plan.data(i + 1))
        raw, alive = self.collect(c, i, job, clock.t0, wall, clock.deadline, parsed, reason, plan.limit)
        if t_next is not None:
            clock.t0 = t_next
            clock.deadline = self._test_deadline(plan, clock)
        return raw, alive

    def _fail_left(self, i: int, n: int, pending: int) -> int:
        """Tests i..n-1 of a program that damaged its sandbox fail; returns the replies then owed."""
        while i < n:
            self.send(
                {
                    "t": "raw",
                    "index": i,
                    "status": "runtime_error",
                    "stdout": "",
                    "value_json": None,
                    "stderr": "",
                    "exit_code": None,
                    "seconds": 0.0,
                    "fatal": True,
                    "detail": f"the program damaged its sandbox: {self.damaged}",
                }
            )
            i += 1
            pending += i < n
        return pending

    def serve(self) -> None:
        try:
            self.send({"t": "ready", "features": self.features})
        except ChannelClosed:  # the cell stopped (killed, interrupted) while this worker set up: end quietly
            return
        while True:
            try:
                frame = self.reader.read()
            except (ChannelClosed, ChannelCorrupt):
                return
            if frame[:1] != b"J":
                continue
            job = pickle.loads(frame[1:])
            try:
                self.handle(job)
            except (ChannelClosed, BrokenPipeError):
                return


def main() -> None:
    cfg = json.loads(sys.argv[1])
    w = Worker(cfg)
    try:
        # Before any program: only the standard library and the profile's packages stay importable
        # (packages.py); their versions are what the programs get, recorded with the features.
        packages.restrict(cfg["limits"]["packages"])
        w.features["packages"] = packages.versions(cfg["limits"]["packages"])
        gc.collect()
        gc.freeze()
        w.setup()
    except Exception as e:  # noqa: BLE001 - report why, so the pool can fall back loudly
        try:
            w.send({"t": "failed", "error": f"{type(e).__name__}: {e}"})
        finally:
            os._exit(3)
    try:
        w.serve()
    finally:
        if w.contained:
            try:
                contain.sweep_namespace()
            except Exception:  # noqa: BLE001 - best effort at exit: the pool kills what is left
                pass
        else:
            contain.sweep_descendants()
            contain.remove_tree(w.root)
    os._exit(0)


if __name__ == "__main__":
    main()
