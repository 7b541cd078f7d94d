"""What runs inside the program child in the `reference` judge profile.

The `reference` profile reproduces hendrycks/apps `eval/testing_util.run_test` as the
APPS eval runs it (one process per program, every test in it, a 4 s alarm per test),
inside the same contained child as `seed` (harness.py): the expected outputs are not
here, only the program and its test inputs; what each test produced goes back as
plain data and the original's comparisons run in the judge process
(apps_bench/judge/reference.py).

What the original does, and so this does (its quirks included, they are the point):
- the prelude and the program are executed as one text in a fresh dict (pyext's
  `RuntimeModule.from_string`), whose names are copied into a module `tmp_sol`;
  the reliability guard is applied first, in both modes;
- stdin mode: every line not starting with `from `/`import ` is indented one tab into
  `def code():`, preceded by module-level `stdin = sys.stdin` / `stdout = sys.stdout`
  (the real streams: what is written there is lost, and the patched readers below are
  installed on that `stdin`); import lines after the first other line are moved into
  the function too;
- per stdin test: `sys.stdout` is a StringIO (whose `close` is a one-argument lambda),
  the real stdin object gets `read`/`readlines`/`readline` replaced (a line iterator
  without newlines), `sys.stdin` becomes a StringIO of the input, `open` a
  `mock_open` of it (built on its first call); `SystemExit` is swallowed;
- call mode: the module (and one `Solution()` when the text contains `class Solution`)
  serves every test; a dict first argument replaces all arguments by its int-keyed copy;
- loading failures are `-2` (compile error) and end the program; an `Exception` in a test
  is `-1` for that test; anything else (`SystemExit` in call mode, `KeyboardInterrupt`,
  `os._exit`, a crash) ends the process, which the original reports as `[-1] * 21`.

Return values are encoded with exact type checks into tagged JSON that keeps what the
original's `==` can tell apart (tuples, sets, dict keys of any plain type, numpy
values); an object of any other type is sent as an opaque marker that equals nothing.
"""

from __future__ import annotations

import builtins
import io
import os
import resource
import signal
import sys
import time
import types
from typing import Any, Callable
from unittest import mock

from ..errors import AppsBenchError
from .frames import send_frame
from .harness import (
    GO,
    LOAD,
    LOADED,
    PRELUDE,
    ChildSpec,
    NotPlainData,
    Runner,
    _clip,
    _encode,
    _exit,
    _int,
    _isinstance,
    _len,
    _str,
    _type,
    reliability_guard,
)

SOURCE_NAME = "<string>"  # exec() of a text, as pyext does
MODULE_NAME = "tmp_sol"
# pyext copies every name of the exec'd dict except its own module globals of these names
PYEXT_HIDDEN = frozenset(
    ("__name__", "__doc__", "__package__", "__loader__", "__spec__", "__file__", "__cached__", "__builtins__")
)
WRAP_HEADER = "stdin = sys.stdin\nstdout = sys.stdout\ndef code():"
MAX_DEPTH = 400

_perf = time.perf_counter
_setitimer = signal.setitimer
_pwrite = os.pwrite
_ftruncate = os.ftruncate
_lseek = os.lseek
_open = os.open
_dup2 = os.dup2
_exec = exec
_compile = compile
_StringIO = io.StringIO
_ModuleType = types.ModuleType


def _is_import_line(line: str) -> bool:
    return line.startswith("from ") or line.startswith("import ")


def wrap_stdin_program(code: str) -> str:
    """The original's stdin transformation: leading import lines stay at module level, the
    rest (later import lines included) is indented one tab into `def code():`."""
    out: list[str] = []
    started = False
    for line in code.split("\n"):
        if _is_import_line(line) and not started:
            out.append(line)
            continue
        if not started:
            out.append(WRAP_HEADER)
            started = True
        out.append("\t" + line)
    return "".join(line + "\n" for line in out)


_MISSING = object()


class _Patches:
    """Attributes set for one test and put back afterwards in reverse order, as `mock.patch`
    does for these targets: an attribute of the instance itself is restored, one found on
    its class is deleted again (so the class's shows through); a missing one is an error."""

    def __init__(self) -> None:
        self.undo: list[tuple[object, str, object]] = []

    def set(self, obj: object, name: str, value: object) -> None:
        own = getattr(obj, "__dict__", None)
        if own is not None and name in own:
            self.undo.append((obj, name, own[name]))
        else:
            getattr(obj, name)  # AttributeError when there is nothing to patch, as mock.patch
            self.undo.append((obj, name, _MISSING))
        setattr(obj, name, value)

    def __enter__(self) -> _Patches:
        return self

    def __exit__(self, *exc: object) -> None:
        for obj, name, old in reversed(self.undo):
            if old is _MISSING:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
            else:
                setattr(obj, name, old)


def _lazy_mock_open(mock: types.ModuleType, text: str) -> Callable[..., object]:
    """`open` as the original's `mock_open(read_data=text)`, built on the first call (building
    one costs ~4 ms, and most programs never call open)."""
    made: list[Callable[..., object]] = []

    def open_(*args: object, **kwargs: object) -> object:
        if not made:
            made.append(mock.mock_open(read_data=text))
        return made[0](*args, **kwargs)

    return open_


class ReferenceTimeout(AppsBenchError):
    """The per-test alarm; an Exception, so a program's `except Exception` catches it as in the original."""


def _on_alarm(signum: int, frame: types.FrameType | None) -> None:
    print("alarm went off")  # the original's handler prints (into the captured stdout, in stdin mode)
    raise ReferenceTimeout


# ------------------------------------------------------------------ return values


def _np_kinds() -> tuple[dict, Any]:
    np = sys.modules.get("numpy")
    if np is None:
        return {}, None
    names = (
        "bool_",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "longdouble",
    )
    return {getattr(np, n): np.dtype(getattr(np, n)).str for n in names if hasattr(np, n)}, np.ndarray


def encode_value(x: Any, depth: int = 0) -> Any:
    """A return value as tagged JSON data (exact types only; see module docstring).

    Objects: {"t": tuple items}, {"d": [[key, value], ...]}, {"s": set items},
    {"f": frozenset items}, {"q": deque items}, {"C": Counter pairs}, {"j": [re, im]},
    {"b": bytes as latin-1}, {"n": [dtype, value]} numpy scalar, {"a": [dtype, nested list]}
    numpy array, {"x": type name} anything else (equal to nothing).
    """
    if depth > MAX_DEPTH:
        raise NotPlainData(f"return value nested deeper than {MAX_DEPTH} levels")
    t = _type(x)
    if x is None or t is bool or t is _int or t is float or t is _str:
        return x
    if t is list:
        return [encode_value(e, depth + 1) for e in x]
    if t is tuple:
        return {"t": [encode_value(e, depth + 1) for e in x]}
    coll = sys.modules.get("collections")
    if t is dict or (coll is not None and (t is coll.OrderedDict or t is coll.defaultdict)):
        return {"d": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in dict.items(x)]}
    if coll is not None and t is coll.Counter:
        return {"C": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in dict.items(x)]}
    if coll is not None and t is coll.deque:
        return {"q": [encode_value(e, depth + 1) for e in list(x)]}
    if t is set:
        return {"s": [encode_value(e, depth + 1) for e in set.__iter__(x)]}
    if t is frozenset:
        return {"f": [encode_value(e, depth + 1) for e in frozenset.__iter__(x)]}
    if t is complex:
        return {"j": [x.real, x.imag]}
    if t is bytes:
        return {"b": bytes.decode(x, "latin-1")}
    kinds, ndarray = _NP
    if t in kinds:
        v = x.item()
        return {"n": [kinds[t], v if _type(v) in (bool, _int, float) else float(v)]}
    if ndarray is not None and t is ndarray and x.dtype.kind in "biuf":
        return {"a": [x.dtype.str, x.tolist()]}
    return {"x": getattr(t, "__name__", "?")[:80]}


# The worker imports this module after numpy.
_NP: tuple[dict, Any] = _np_kinds()


def _warm_up() -> None:
    """Build one mock_open in the worker, so its lazy set-up (mock's magic-method tables,
    ~5 ms) is inherited by every child instead of redone in each."""
    mock.mock_open(read_data="x")().read()


_warm_up()


# ------------------------------------------------------------------ the child


class ReferenceRunner(Runner):
    """Loads the program once and runs its tests in this process, as run_test does."""

    def __init__(self, spec: ChildSpec) -> None:
        super().__init__(spec)
        self.method: Any = None
        self.real_stdin: Any = None
        self.real_stdout: Any = None
        self.mock: Any = None

    def _streams(self) -> None:
        s = self.spec
        _ftruncate(s.in_fd, 0)  # the real stdin is empty (the original's process reads /dev/null)
        _lseek(s.in_fd, 0, os.SEEK_SET)
        _dup2(s.in_fd, 0)
        try:  # the real stdout: what a program writes there is lost, as in the original
            sink = _open("/dev/null", os.O_WRONLY)
        except OSError:
            sink = s.err_fd
        _dup2(sink, 1)
        _dup2(s.err_fd, 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (s.output_cap + 1, s.fsize_hard))
        self.real_stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
        self.real_stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8")
        err = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8", errors="backslashreplace", line_buffering=True
        )
        # the original's process had these as its interpreter's own streams (typeshed marks them Final)
        sys.stdin = sys.__stdin__ = self.real_stdin  # type: ignore[misc]
        sys.stdout = sys.__stdout__ = self.real_stdout  # type: ignore[misc]
        sys.stderr = sys.__stderr__ = err  # type: ignore[misc]
        self._out, self._err = self.real_stdout, err
        sys.argv = [SOURCE_NAME]
        sys.setrecursionlimit(1000)
        sys.set_int_max_str_digits(0)  # the original interpreters had no digit limit

    def _arm(self) -> None:
        _setitimer(signal.ITIMER_REAL, self.spec.alarm_s)

    @staticmethod
    def _disarm() -> None:
        _setitimer(signal.ITIMER_REAL, 0)

    def load(self) -> str | None:
        """Execute the prelude and the program; None when loaded, else the -2 detail."""
        s = self.spec
        call = s.mode == "call"
        source = PRELUDE + (s.code if call else wrap_stdin_program(s.code))
        self._arm()
        try:
            g: dict[str, object] = {}
            _exec(_compile(source, SOURCE_NAME, "exec", dont_inherit=True), g)
            mod = _ModuleType(MODULE_NAME, "")
            mod.__dict__.update({k: v for k, v in g.items() if k not in PYEXT_HIDDEN})
            mod.__file__ = "<runtime_module>"
            sys.modules[MODULE_NAME] = mod
            target = mod.Solution() if call and "class Solution" in s.code else mod
            self._disarm()
        except Exception as e:  # noqa: BLE001 - whatever the program raised while loading is its compile error
            self._disarm()
            return _clip(f"compile error: {_type(e).__name__}: {e}")
        try:
            self.method = getattr(target, (s.fn_name or "") if call else "code")
        except BaseException as e:  # noqa: BLE001 - the original's bare `except:`
            return _clip(f"unable to get function: {_type(e).__name__}: {e}")
        return None

    def _failed(self, index: int, e: BaseException, t0: float) -> dict:
        secs = _perf() - t0
        text = self._traceback(e)
        self._write_err(text)
        timeout = _isinstance(e, ReferenceTimeout)
        status = "timeout" if timeout else "memory_limit" if _isinstance(e, MemoryError) else "runtime_error"
        lines = text.strip().splitlines()
        detail = f"alarm after {self.spec.alarm_s:g}s" if timeout else (lines[-1] if lines else _type(e).__name__)
        return {"i": index, "status": status, "exit_code": 1, "seconds": secs, "detail": _clip(detail)}

    def run_call(self, index: int, args: Any) -> dict:
        try:  # JSON forced string keys: a dict first argument becomes its int-keyed copy, alone
            if _isinstance(args[0], dict):
                args = [{_int(k): v for k, v in args[0].items()}]
        except BaseException:  # noqa: BLE001 - the original's bare except: the arguments stay as they are
            pass
        t0 = _perf()
        self._arm()
        try:
            value = self.method(*args)
            self._disarm()
        except Exception as e:  # noqa: BLE001 - whatever the program raised is its test's runtime error
            self._disarm()
            return self._failed(index, e, t0)
        except BaseException:  # noqa: BLE001 - SystemExit, KeyboardInterrupt: the original's test process ends here
            _exit(1)  # SystemExit, KeyboardInterrupt: the original's test process ends here
        secs = _perf() - t0
        try:
            value_json = _encode(encode_value(value))
        except (NotPlainData, RecursionError, ValueError, TypeError) as e:
            value_json = _encode({"x": _clip(_str(e), 80)})
        if _len(value_json) > self.spec.output_cap:
            return {
                "i": index,
                "status": "output_limit",
                "exit_code": None,
                "seconds": secs,
                "detail": f"return value larger than {self.spec.output_cap} bytes",
            }
        return {"i": index, "status": "ok", "exit_code": 0, "seconds": secs, "value_json": value_json}

    def _patched_input(self, text: str) -> _Patches:
        """The original's patches, applied in the order its decorators enter them: the
        readers of whatever `sys.stdin` is now first, then `sys.stdin`, then `open`."""
        lines = iter(text.split("\n"))
        p = _Patches()
        stdin = sys.stdin
        p.set(stdin, "read", lambda *a: text)
        p.set(stdin, "readlines", lambda *a: text.split("\n"))
        p.set(stdin, "readline", lambda *a: next(lines))
        p.set(sys, "stdin", _StringIO(text))
        p.set(builtins, "open", _lazy_mock_open(self.mock, text))
        return p

    def run_text(self, index: int, text: Any) -> dict:
        """One standard-input test, `text` its input as the row has it (a list is joined, as the original does)."""
        s = self.spec
        if _isinstance(text, list):
            try:
                text = "\n".join(text)
            except BaseException:  # noqa: BLE001 - the original fails outside any handler here: the process ends
                _exit(1)  # the original fails outside any handler here: the process ends
        capture = _StringIO()
        capture.close = lambda x: 1  # type: ignore[method-assign,assignment,misc]  # the original's close (which raises TypeError when called)
        outer = sys.stdout
        sys.stdout = capture
        t0 = _perf()
        self._arm()
        failed = None
        try:
            with self._patched_input(text):
                try:
                    self.method()
                except SystemExit:
                    pass
            self._disarm()
        except Exception as e:  # noqa: BLE001 - whatever the program raised is its test's runtime error
            self._disarm()
            failed = e
        except BaseException:  # noqa: BLE001 - SystemExit, KeyboardInterrupt: the original's test process ends here
            _exit(1)
        secs = _perf() - t0
        sys.stdout = outer
        try:
            got = _StringIO.getvalue(capture)
        except BaseException:  # noqa: BLE001 - the program may have replaced the capture's methods: the process ends
            _exit(1)
        if failed is not None:
            return self._failed(index, failed, t0)
        data = got.encode("utf-8", "surrogatepass")
        _ftruncate(s.out_fd, 0)
        if data:
            _pwrite(s.out_fd, data[: s.output_cap + 1], 0)
        return {"i": index, "status": "ok", "exit_code": 0, "seconds": secs}

    def _captured(self) -> tuple[bytes, bytes]:
        out, err = super()._captured()
        if self.spec.mode == "call":
            out = b""
        return out, err

    def serve(self) -> None:
        s = self.spec
        self.mock = mock
        self._streams()
        _ftruncate(s.out_fd, 0)
        reliability_guard()  # before the program is loaded, in both modes, as the original
        signal.signal(signal.SIGALRM, _on_alarm)
        self.ready()
        if self.await_go() != LOAD:
            _exit(0)
        detail = self.load()
        if detail is not None:
            self.send_result({"i": 0, "status": "compile_error", "exit_code": 1, "seconds": 0.0, "detail": detail})
            _exit(0)
        try:
            send_frame(s.res_fd, LOADED)
        except BaseException:  # noqa: BLE001 - the worker is gone: nothing to report to
            _exit(3)
        for index in range(s.start, s.n_tests):
            if self.await_go() != GO:
                break
            inp = self.take_input()
            res = self.run_call(index, inp) if s.mode == "call" else self.run_text(index, inp)
            self.send_result(res)
            _ftruncate(s.out_fd, 0)
            _ftruncate(s.err_fd, 0)
            _lseek(s.err_fd, 0, os.SEEK_SET)
        _exit(0)


def child_main(spec: ChildSpec) -> None:
    """Entry point after containment; never returns."""
    try:
        ReferenceRunner(spec).serve()
    except BaseException:  # noqa: BLE001 - the child never returns, whatever the program did: its exit code says it
        pass
    _exit(4)
