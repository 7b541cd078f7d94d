"""What runs inside the program child: one program, its tests one after another.

The child is forked from a warm worker (interpreter, prelude and numpy already
loaded), contained by `contain.py`, then runs its tests in-process one after
another: a fresh `__main__` module holding the APPS prelude, stdin/stdout/stderr
swapped at the fd level (memfds owned by the worker, so `os.write(1, ...)` is
captured and the worker can read them even after the child died), and one result
frame per test (status, output) back to the worker. The child holds no test input: it
waits for the worker's go, after which the input is in its stdin memfd, and the worker
times each test from outside (worker.py), so no test's time is this process's word.

Only plain data leaves: the status and exit code, and in call mode the return value
converted here to JSON text with exact type checks (`type(x) is int`, never
`isinstance`), so a user object with a lying `__eq__` cannot pass as a value.
Anything the program does to this process (monkey-patching, writing frames of its
own) can at most change *its own* reported output; expected outputs are never here.
"""

from __future__ import annotations

import builtins
import io
import json
import linecache
import os
import pickle
import resource
import sys
import threading
import time
import traceback
import types
from dataclasses import dataclass
from typing import Any, Sequence

from .frames import send_frame

# The APPS import prelude, as the original harness runs it before every program (docs/judge.md).
PRELUDE = """\
import sys
import time
import itertools
from itertools import accumulate, product, permutations, combinations
import collections
from collections import Counter, OrderedDict, deque, defaultdict, ChainMap
from functools import lru_cache
import math
from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2
import fractions
from typing import List, Tuple
import numpy as np
import random
import heapq
from heapq import *
"""

SOURCE_NAME = "solution.py"
# The child <-> worker steps: READY (a frame: set up and compiled), then per test the worker's GO (one byte
# on the control pipe, the input already in place) and the child's result frame; `reference` loads the
# program on LOAD (one byte) and answers LOADED (a frame) first.
READY = b"R"
LOAD = LOADED = b"L"
GO = b"G"
_PRELUDE_NS: dict[str, Any] | None = None

# Private references taken at import time: the program may replace the public ones
# (the reliability guard even sets some to None), the harness must keep working.
_type = type
_len = len
_str = str
_int = int
_float = float
_isinstance = isinstance
_dup2 = os.dup2
_ftruncate = os.ftruncate
_lseek = os.lseek
_pwrite = os.pwrite
_write = os.write
_pread = os.pread
_fstat = os.fstat
_exit = os._exit
_read = os.read
_loads = pickle.loads
_perf = time.perf_counter
_times = os.times
_setrlimit = resource.setrlimit
_getrlimit = resource.getrlimit
_format_exc = traceback.format_exception
_enumerate_threads = threading.enumerate
_main_thread = threading.main_thread
_encode = json.JSONEncoder(allow_nan=True, ensure_ascii=False, separators=(",", ":")).encode
_TextIOWrapper = io.TextIOWrapper
_BufferedReader = io.BufferedReader
_BufferedWriter = io.BufferedWriter
_FileIO = io.FileIO
_ModuleType = types.ModuleType


def prelude_namespace() -> dict[str, Any]:
    """The prelude's names, built once per worker (before any fork)."""
    global _PRELUDE_NS
    if _PRELUDE_NS is None:
        ns: dict[str, Any] = {}
        exec(compile(PRELUDE, "<prelude>", "exec"), ns)
        ns.pop("__builtins__", None)
        _PRELUDE_NS = ns
        _init_np_types()
    return _PRELUDE_NS


def fresh_main() -> types.ModuleType:
    """A new `__main__` module with the prelude in it, installed in sys.modules."""
    mod = _ModuleType("__main__")
    d = mod.__dict__
    d.update(prelude_namespace())
    d["__builtins__"] = builtins
    d["__file__"] = SOURCE_NAME
    d["__cached__"] = None
    sys.modules["__main__"] = mod
    return mod


class NotPlainData(Exception):
    pass


def _np_types() -> tuple[frozenset, frozenset, frozenset, Any]:
    np = sys.modules.get("numpy")
    if np is None:
        return frozenset(), frozenset(), frozenset(), None
    ints = frozenset(
        getattr(np, n) for n in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "intc", "intp", "longlong", "ulonglong") if hasattr(np, n)
    )
    floats = frozenset(getattr(np, n) for n in ("float16", "float32", "float64", "longdouble") if hasattr(np, n))
    bools = frozenset((np.bool_,))
    return ints, floats, bools, np.ndarray


_NP_INTS, _NP_FLOATS, _NP_BOOLS, _NP_ARRAY = _np_types()


def _init_np_types() -> None:
    global _NP_INTS, _NP_FLOATS, _NP_BOOLS, _NP_ARRAY
    _NP_INTS, _NP_FLOATS, _NP_BOOLS, _NP_ARRAY = _np_types()
MAX_DEPTH = 400


def to_plain(x: Any, depth: int = 0) -> Any:
    """Convert a return value to JSON types with exact type checks; tuples become lists.

    A subclass of int/str/list/... (which could lie in `__eq__`), a set, a generator or
    any other object raises NotPlainData: the test is a runtime error, never a pass.
    Exact numpy scalars/arrays (not subclasses) are turned into their plain values.
    """
    if depth > MAX_DEPTH:
        raise NotPlainData(f"return value nested deeper than {MAX_DEPTH} levels")
    t = _type(x)
    if x is None or t is bool or t is _int or t is _float or t is _str:
        return x
    if t is list or t is tuple:
        return [to_plain(e, depth + 1) for e in x]
    if t is dict:
        out = {}
        for k, v in x.items():
            kt = _type(k)
            if not (k is None or kt is bool or kt is _int or kt is _float or kt is _str):
                raise NotPlainData(f"dict key of type {kt.__name__} is not plain data")
            out[k] = to_plain(v, depth + 1)
        return out
    if t in _NP_BOOLS:
        return bool(x)
    if t in _NP_INTS:
        return _int(x)
    if t in _NP_FLOATS:
        return _float(x)
    if _NP_ARRAY is not None and t is _NP_ARRAY:
        if x.dtype.kind not in "biuf":
            raise NotPlainData(f"numpy array of dtype {x.dtype} is not plain data")
        return to_plain(x.tolist(), depth + 1)
    raise NotPlainData(f"return value of type {getattr(t, '__name__', '?')} is not plain data (JSON types only)")


def _clip(s: str, n: int = 300) -> str:
    return s if _len(s) <= n else s[: n - 3] + "..."


@dataclass
class ChildSpec:
    """Everything the child needs; it is in the child's memory by fork, not sent."""

    code: str
    mode: str  # "stdin" | "call"
    fn_name: str | None
    n_tests: int  # the inputs are not here: the worker hands over each one when it starts the test's clock
    timeout_s: float
    output_cap: int
    fsize_hard: int
    res_fd: int
    in_fd: int
    out_fd: int
    err_fd: int
    ctl_fd: int  # the worker's go for each step, one byte (see Runner.await_go)
    guard: bool
    start: int  # first test this child runs (a fresh child resumes after a timeout/crash)
    stderr_chars: int  # stderr tail kept per test
    cpu_slack_s: int  # RLIMIT_CPU backstop: CPU seconds past timeout_s (judge.sandbox.cpu_slack_s)
    nonce: str  # echoed in every result frame: blind writes to the channel are rejected
    reference: bool  # run as the original APPS harness does (reference_child.py)
    alarm_s: float  # reference mode: the per-test alarm (the program-wide limit is the worker's)


def stdin_bytes(value: Any) -> bytes:
    if _type(value) is bytes:
        return value
    if _isinstance(value, (list, tuple)):
        value = "\n".join(_str(v) for v in value)
    elif not _isinstance(value, str):
        value = _str(value)
    return value.encode("utf-8", "surrogateescape")


class Runner:
    """Runs the tests of one program in this (already contained) process."""

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.code_obj: Any = None
        self.compile_detail = ""
        self._out: io.TextIOWrapper | None = None
        self._err: io.TextIOWrapper | None = None

    # -- set-up --------------------------------------------------------------------
    def compile(self) -> None:
        code = self.spec.code
        linecache.cache[SOURCE_NAME] = (_len(code), None, code.splitlines(True), SOURCE_NAME)
        try:
            self.code_obj = compile(code, SOURCE_NAME, "exec", dont_inherit=True)
        except BaseException as e:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
            self.code_obj = None
            self.compile_detail = _clip("".join(traceback.format_exception_only(_type(e), e)).strip() or repr(e))

    def await_go(self) -> bytes:
        """Block until the worker says go (b"G": a test's input is in the stdin memfd; b"L": load);
        b"" when it is gone. The worker times each step from just before it wrote the input."""
        try:
            return _read(self.spec.ctl_fd, 1)
        except OSError:
            return b""

    def take_input(self) -> Any:
        """The current test's input as the worker pickled it into the stdin memfd (call mode, and every
        `reference` test), removed from there: the program's own stdin stays empty."""
        fd = self.spec.in_fd
        data = _pread(fd, _fstat(fd).st_size, 0)
        _ftruncate(fd, 0)
        return _loads(data)

    def ready(self) -> None:
        """Tell the worker this child is set up and compiled (no program code has run): its clock may start."""
        try:
            send_frame(self.spec.res_fd, READY)
        except BaseException:
            _exit(3)

    def _stdio(self) -> None:
        s = self.spec
        _setrlimit(resource.RLIMIT_FSIZE, (s.output_cap + 1, s.fsize_hard))
        for fd in (s.out_fd, s.err_fd):
            _ftruncate(fd, 0)
            _lseek(fd, 0, os.SEEK_SET)
        _lseek(s.in_fd, 0, os.SEEK_SET)
        _dup2(s.in_fd, 0)
        _dup2(s.out_fd, 1)
        _dup2(s.err_fd, 2)
        stdin = _TextIOWrapper(_BufferedReader(_FileIO(0, "r", closefd=False)), encoding="utf-8", newline="\n")
        out = _TextIOWrapper(_BufferedWriter(_FileIO(1, "w", closefd=False)), encoding="utf-8", newline="\n")
        err = _TextIOWrapper(
            _BufferedWriter(_FileIO(2, "w", closefd=False)),
            encoding="utf-8", errors="backslashreplace", newline="\n", line_buffering=True,
        )
        sys.stdin = sys.__stdin__ = stdin  # type: ignore[misc]  # typeshed marks it Final; the program must see fresh streams there too
        sys.stdout = sys.__stdout__ = out  # type: ignore[misc]  # typeshed marks it Final; the program must see fresh streams there too
        sys.stderr = sys.__stderr__ = err  # type: ignore[misc]  # typeshed marks it Final; the program must see fresh streams there too
        self._out, self._err = out, err
        sys.argv = [SOURCE_NAME]
        sys.setrecursionlimit(1000)  # each test starts like a fresh interpreter
        sys.set_int_max_str_digits(0)
        # CPU backstop for this test (the worker's wall-clock deadline is the real limit).
        t = _times()
        used = t.user + t.system
        soft, hard_cpu = _getrlimit(resource.RLIMIT_CPU)
        want = _int(used + self.spec.timeout_s + self.spec.cpu_slack_s)
        if hard_cpu == resource.RLIM_INFINITY or want <= hard_cpu:
            try:
                _setrlimit(resource.RLIMIT_CPU, (want, hard_cpu))
            except (ValueError, OSError):
                pass

    def _flush(self) -> bool:
        """Flush like interpreter exit does; False when stdout could not be flushed."""
        ok = True
        seen: list[object] = []
        for f in (sys.stdout, sys.stderr, self._out, self._err):
            if f is None or any(f is g for g in seen):
                continue
            seen.append(f)
            try:
                if getattr(f, "closed", False):
                    continue
                f.flush()
            except BaseException:
                if f is self._out or f is sys.stdout:
                    ok = False
        return ok

    def _write_err(self, text: str) -> None:
        try:
            _write(self.spec.err_fd, text.encode("utf-8", "backslashreplace"))
        except OSError:
            pass

    def _traceback(self, e: BaseException, skip: int = 1) -> str:
        tb = e.__traceback__
        for _ in range(skip):
            if tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
        try:
            text = "".join(_format_exc(_type(e), e, tb))
        except BaseException:
            text = f"{_type(e).__name__}\n"
        return text

    @staticmethod
    def _join_threads() -> None:
        main = _main_thread()
        for t in _enumerate_threads():
            if t is not main and not t.daemon:
                t.join()

    # -- one test ------------------------------------------------------------------
    def run_stdin(self, index: int) -> dict:
        self._stdio()
        mod = fresh_main()
        status, code, detail = "ok", 0, ""
        t0 = _perf()
        try:
            try:
                exec(self.code_obj, mod.__dict__)
            finally:
                self._join_threads()
        except SystemExit as e:
            c = e.code
            if c is None:
                code = 0
            elif _type(c) is _int or _type(c) is bool:
                code = _int(c) & 0xFF
            else:
                self._flush()
                self._write_err(f"{c}\n")
                code = 1
            if code:
                status, detail = "runtime_error", f"exit status {code}"
        except BaseException as e:
            secs = _perf() - t0
            self._flush()
            text = self._traceback(e)
            self._write_err(text)
            status = "memory_limit" if _isinstance(e, MemoryError) else "runtime_error"
            lines = text.strip().splitlines()
            return {"i": index, "status": status, "exit_code": 1, "seconds": secs,
                    "detail": _clip(lines[-1] if lines else _type(e).__name__)}
        secs = _perf() - t0
        if not self._flush() and status == "ok":
            status, code, detail = "runtime_error", 120, "stdout could not be flushed"
        return {"i": index, "status": status, "exit_code": code, "seconds": secs, "detail": detail}

    def run_call(self, index: int, args: Any) -> dict:
        self._stdio()
        mod = fresh_main()
        args = list(args) if _type(args) in (list, tuple) else [args]
        fn_name = self.spec.fn_name or ""
        t0 = _perf()
        try:
            exec(self.code_obj, mod.__dict__)
            ns = mod.__dict__
            sol: Any = ns.get("Solution")  # the program's own class, if it defines one
            if _isinstance(sol, _type):
                target = getattr(sol(), fn_name)
            elif fn_name in ns:
                target = ns[fn_name]
            else:
                raise NameError(f"the program defines neither class Solution nor a function {fn_name!r}")
            value = target(*args)
            secs = _perf() - t0
            value_json = _encode(to_plain(value))
        except NotPlainData as e:
            secs = _perf() - t0
            self._flush()
            return {"i": index, "status": "runtime_error", "exit_code": 1, "seconds": secs, "detail": _clip(str(e))}
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: a call must return
            secs = _perf() - t0
            self._flush()
            text = self._traceback(e)
            self._write_err(text)
            lines = text.strip().splitlines()
            status = "memory_limit" if _isinstance(e, MemoryError) else "runtime_error"
            return {"i": index, "status": status, "exit_code": 1, "seconds": secs,
                    "detail": _clip(lines[-1] if lines else _type(e).__name__)}
        self._flush()
        if _len(value_json) > self.spec.output_cap:
            return {"i": index, "status": "output_limit", "exit_code": None, "seconds": secs,
                    "detail": f"return value larger than {self.spec.output_cap} bytes"}
        return {"i": index, "status": "ok", "exit_code": 0, "seconds": secs, "value_json": value_json}

    def _captured(self) -> tuple[bytes, bytes]:
        """This test's stdout (up to the cap + 1 byte) and the tail of its stderr."""
        s = self.spec
        size = _fstat(s.out_fd).st_size
        out = _pread(s.out_fd, min(size, s.output_cap + 1), 0) if size else b""
        esize = _fstat(s.err_fd).st_size
        n = max(1024, s.stderr_chars * 4)
        err = _pread(s.err_fd, min(esize, n), max(0, esize - n)) if esize else b""
        return out, err

    def serve(self) -> None:
        """Say ready, then run tests start..n-1, each on the worker's go, one result frame after each.

        The worker sends the next go as soon as a result arrives (the judge compares meanwhile)
        and kills this process as soon as the judge says stop.
        """
        s = self.spec
        self.ready()
        for index in range(s.start, s.n_tests):
            if self.await_go() != GO:
                break
            if self.code_obj is None:
                res = {"i": index, "status": "compile_error", "exit_code": 1, "seconds": 0.0,
                       "detail": self.compile_detail}
            elif s.mode == "call":
                res = self.run_call(index, self.take_input())
            else:
                res = self.run_stdin(index)
            self.send_result(res)
            if self.code_obj is None:
                break
        _exit(0)

    def send_result(self, res: dict) -> None:
        """One result frame: the metadata, then this test's stdout and stderr tail (exits if the link is gone)."""
        s = self.spec
        try:
            out, err = self._captured()
            res["n"] = s.nonce
            res["out_len"] = _len(out)
            res["err_len"] = _len(err)
            meta = _encode(res).encode("utf-8", "surrogateescape")
            send_frame(s.res_fd, _int(_len(meta)).to_bytes(4, "big") + meta + out + err)
        except BaseException:
            _exit(3)


RELIABILITY_GUARD_OS = (
    "kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork", "forkpty",
    "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
    "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir",
)


def reliability_guard() -> None:
    """APPS' reliability guard for call-based code: destructive functions disabled.

    Not a security boundary (the program can re-import or use ctypes); the process
    containment around it is. Kept because APPS verdicts depend on it (e.g. exit()).
    """
    import faulthandler
    import shutil
    import subprocess

    faulthandler.disable()
    builtins.exit = None  # type: ignore[assignment]
    builtins.quit = None  # type: ignore[assignment]
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in RELIABILITY_GUARD_OS:
        if hasattr(os, name):
            setattr(os, name, None)
    shutil.rmtree = None  # type: ignore[assignment]
    shutil.move = None  # type: ignore[assignment]
    shutil.chown = None  # type: ignore[assignment]
    subprocess.Popen = None  # type: ignore[assignment,misc]
    builtins.help = None  # type: ignore[assignment]
    for mod in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[mod] = None  # type: ignore[assignment]


def child_main(spec: ChildSpec) -> None:
    """Entry point after containment; never returns."""
    try:
        runner = Runner(spec)
        runner.compile()
        if spec.guard and spec.mode == "call":
            reliability_guard()
        runner.serve()
    except BaseException:
        pass
    _exit(4)
