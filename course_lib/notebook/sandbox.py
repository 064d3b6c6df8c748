"""Run a learner's code in a child process, away from the checker.

A function exercise (:mod:`course_lib.notebook.function_exercise`) must
judge code typed by the learner, and code can do anything the Python
process can: replace ``torch.allclose`` with a function that always says
yes, read the expected value from the checker's frame, find the exercise
through ``gc`` and call its reference, or end the process with
``os._exit``, a signal or a crash. Run in the notebook's own kernel, any
of these fools the checker or kills the kernel. So the learner's source
runs in a separate Python process, which receives only the code and the
case inputs, never the reference or the expected values, and sends back
only plain data: tensors, numbers, strings and lists of them, read with
``torch.load(weights_only=True)``, which builds nothing else. The kernel
compares those values with its own reference results.

The child gets a time limit for each call (the same ``SIGALRM`` timer as
:func:`~course_lib.notebook.function_exercise.time_limit`, for a precise
message) and the kernel a hard deadline for the whole run, after which it
kills the child's process group: code that swallows the timer, an
interrupt or every exception cannot wedge anything. The child also gets a
memory limit (``RLIMIT_AS``) and a cap on what it may write.

Starting Python and importing torch takes one to a few seconds, so one
child is started ahead of time and waits for work (:func:`warm_up`); each
run uses it once and starts the next. On a system without POSIX process
control (Windows), :data:`AVAILABLE` is False and the exercise runs the
code in the kernel, as it did before.

Protocol: the kernel writes ``request.pt`` into the child's folder and
sends one line on the child's stdin; the child answers ``ready`` on its
original stdout once its imports are done, writes ``result.pt`` and
``done``, and exits. Everything the learner's code prints goes to
``output.txt``, of which the feedback shows the start.
"""
from __future__ import annotations

import atexit
import builtins
import copy
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

__all__ = ["AVAILABLE", "MAX_SOURCE_CHARS", "Failure", "Outcome", "Opaque",
           "run_source", "warm_up"]

#: Whether learner code can run in a child process here (POSIX only).
AVAILABLE = os.name == "posix" and hasattr(signal, "setitimer")

#: Longer code is refused before it is compiled (a 2,000,000-line source
#: takes over 10 s in ``compile`` alone).
MAX_SOURCE_CHARS = 100_000
#: Longest string, sequence or printed output passed back from the child.
MAX_TEXT = 2_000
MAX_ITEMS = 10_000
MAX_PRINTED = 1_000
#: Memory the learner's code may add to the child (bytes of address space).
MEMORY_LIMIT = 2 * 2**30
#: Largest file the child may write (its result and printed output).
FILE_LIMIT = 64 * 2**20
#: Seconds a freshly started child may take to import torch (a busy
#: machine or a cold Colab disk can take tens of seconds).
STARTUP_LIMIT = 120.0
#: Seconds allowed beyond the calls' own limits for loading and saving.
MARGIN = 5.0


# ---------------------------------------------------------------------------
# What a run reports
# ---------------------------------------------------------------------------
@dataclass
class Failure:
    """How the learner's code ended without returning a value.

    ``kind`` is one of ``"error"`` (an exception; ``type`` and ``message``
    name it), ``"timeout"`` (the call ran past its limit), ``"exit"``
    (``exit()`` or ``SystemExit``), ``"interrupt"`` (``KeyboardInterrupt``),
    ``"crash"`` (the process ended: ``os._exit``, a signal, a segfault;
    ``message`` says which), ``"killed"`` (the hard deadline passed),
    ``"unreadable"`` (the result could not be read back) or ``"start"``
    (the child could not start). ``line`` is the line of the learner's
    code where an exception was raised, if known.
    """
    kind: str
    type: str = ""
    message: str = ""
    line: int | None = None

    def exception(self) -> BaseException:
        """A stand-in exception of the same type, for feedback and for
        matching a diagnosed mistake that raises the same error."""
        from .function_exercise import LearnerTimeout
        if self.kind == "timeout":
            return LearnerTimeout(self.message)
        if self.kind == "exit":
            return SystemExit(self.message)
        if self.kind == "interrupt":
            return KeyboardInterrupt()
        cls = getattr(builtins, self.type, None)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            cls = type(self.type or "Error", (Exception,), {})
        try:
            return cls(self.message)
        except Exception:                      # e.g. UnicodeDecodeError
            return type(self.type, (Exception,), {})(self.message)


@dataclass
class Outcome:
    """What one run of the learner's code gave.

    ``setup`` is a :class:`Failure` if the code itself (compiling, running
    its top level, finding the function) failed, else None. ``results``
    holds, for each case in order, the returned value (plain data) or a
    :class:`Failure`; it stops at the first failure. ``printed`` is the
    start of what the code printed.
    """
    setup: Failure | None = None
    results: list[Any] = field(default_factory=list)
    printed: str = ""


class Opaque:
    """A returned value the child could not pass back as data (a module, a
    generator, an object of the learner's own class): only its type name
    and a short ``repr`` survive. It equals nothing."""

    def __init__(self, type_name: str, text: str) -> None:
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__


# ---------------------------------------------------------------------------
# The kernel's side
# ---------------------------------------------------------------------------
class _Child:
    """One started child process, waiting in its own folder."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="course-sandbox-"))
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root] + [p for p in env.get("PYTHONPATH", "").split(
                os.pathsep) if p])
        env["OMP_NUM_THREADS"] = "1"
        env.pop("COURSE_LANGUAGE", None)
        with open(self.folder / "output.txt", "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "course_lib.notebook.sandbox",
                 str(self.folder)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out,
                cwd=self.folder, env=env, start_new_session=True)
        self.ready = False

    def wait_ready(self, timeout: float) -> bool:
        """Whether the child has done its imports (waits up to
        ``timeout`` seconds for its ``ready``)."""
        if not self.ready:
            self.ready = self.wait_line(timeout) == b"ready"
        return self.ready

    def wait_line(self, timeout: float) -> bytes | None:
        """The next protocol line, or None at end of file or timeout."""
        import select
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            return None
        return self.process.stdout.readline().strip()

    def kill(self) -> None:
        """End the child and everything it started; remove its folder."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        shutil.rmtree(self.folder, ignore_errors=True)


_spare: dict[str, _Child | None] = {"child": None}


def _take_child() -> _Child:
    child, _spare["child"] = _spare["child"], None
    if child is None or child.process.poll() is not None:
        if child is not None:
            child.kill()
        child = _Child()
    return child


def warm_up(*, wait: bool = False) -> None:
    """Start the child the next run will use, if none is waiting (it then
    imports torch while the learner types). Returns at once, or with
    ``wait=True`` once the child is ready (tests that time a run)."""
    if not AVAILABLE:
        return
    if _spare["child"] is None or _spare["child"].process.poll() is not None:
        _spare["child"] = _Child()
    if wait:
        _spare["child"].wait_ready(STARTUP_LIMIT)


@atexit.register
def _stop_spare() -> None:
    child, _spare["child"] = _spare["child"], None
    if child is not None:
        child.kill()


def run_source(source: str, func_name: str,
               cases: Sequence[tuple[tuple, dict]], *,
               time_limit: float) -> Outcome:
    """Run ``source``, then ``func_name(*args, **kwargs)`` for each case, in
    a child process; the values it returned, as plain data.

    The kernel waits at most ``time_limit`` seconds for the top level and
    for each call (the child reports a call that runs longer), plus
    :data:`MARGIN`; past that it kills the child. Interrupting the kernel
    while it waits ends the child too and reports the interrupt.

    Args:
        source: the learner's code (at most :data:`MAX_SOURCE_CHARS`
            characters; the caller checks that).
        func_name: the function the code must define.
        cases: ``(args, kwargs)`` pairs, which must pickle (tensors,
            numbers, tuples...).
        time_limit: seconds for the top level and for each call.
    """
    import torch
    child = _take_child()
    try:
        torch.save({"source": source, "func_name": func_name,
                    "cases": list(cases), "time_limit": float(time_limit)},
                   child.folder / "request.pt")
        try:
            if not child.wait_ready(STARTUP_LIMIT):
                return Outcome(setup=_ended(child, "start"))
            child.process.stdin.write(b"go\n")
            child.process.stdin.flush()
            deadline = time_limit * (len(cases) + 1) + MARGIN
            try:
                child.process.wait(timeout=deadline)
            except subprocess.TimeoutExpired:
                child.kill()
                return Outcome(setup=Failure("killed", message=f"{deadline:g}"),
                               printed=_printed(child))
        except KeyboardInterrupt:
            child.kill()
            return Outcome(setup=Failure("interrupt"))
        except (BrokenPipeError, OSError):
            return Outcome(setup=_ended(child, "crash"))
        if child.wait_line(0) != b"done":
            return Outcome(setup=_ended(child, "crash"),
                           printed=_printed(child))
        try:
            data = torch.load(child.folder / "result.pt", weights_only=True)
            outcome = _outcome(data)
        except Exception as exc:                      # anything unexpected
            return Outcome(setup=Failure("unreadable", type(exc).__name__,
                                         str(exc)[:200]),
                           printed=_printed(child))
        outcome.printed = _printed(child)
        return outcome
    finally:
        child.kill()
        warm_up()


def _ended(child: _Child, kind: str) -> Failure:
    """How a child that gave no result ended."""
    try:
        code = child.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return Failure("killed")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return Failure(kind, message=name)
    detail = ""
    if kind == "start":
        detail = _printed(child)[-MAX_TEXT:]
    return Failure(kind, message=detail or f"exit status {code}")


def _printed(child: _Child) -> str:
    try:
        with open(child.folder / "output.txt", "rb") as f:
            text = f.read(MAX_PRINTED + 1).decode("utf-8", "replace")
    except OSError:
        return ""
    return text if len(text) <= MAX_PRINTED else text[:MAX_PRINTED] + "..."


def _outcome(data: Any) -> Outcome:
    """Check the shape of the child's answer and decode it."""
    if not isinstance(data, dict) or not isinstance(data.get("results"),
                                                    list):
        raise ValueError("not a result")
    setup = _failure(data["setup"]) if data.get("setup") is not None \
        else None
    results = [_failure(r["failure"]) if "failure" in r else
               _decode(r["value"]) for r in data["results"]]
    return Outcome(setup=setup, results=results)


def _failure(d: dict) -> Failure:
    line = d.get("line")
    return Failure(str(d["kind"]), str(d.get("type", ""))[:100],
                   str(d.get("message", ""))[:MAX_TEXT],
                   line if isinstance(line, int) else None)


def _decode(value: Any) -> Any:
    """Plain data from the child's encoding (see :func:`_encode`)."""
    if isinstance(value, dict):
        if "__complex__" in value:
            real, imag = value["__complex__"]
            return complex(float(real), float(imag))
        if "__opaque__" in value:
            return Opaque(str(value["__opaque__"]),
                          str(value.get("repr", ""))[:200])
        if "__tuple__" in value:
            return tuple(_decode(v) for v in value["__tuple__"])
        if "__dict__" in value:
            return {k: _decode(v) for k, v in value["__dict__"]}
        raise ValueError("unknown encoding")
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


# ---------------------------------------------------------------------------
# The child's side
# ---------------------------------------------------------------------------
def _encode(value: Any, depth: int = 0) -> Any:
    """``value`` as data ``torch.load(weights_only=True)`` can read: plain
    tensors, numbers, short strings, lists; anything else as its type name
    and a short repr."""
    import numpy as np
    import torch
    if depth > 20:
        return {"__opaque__": "nested", "repr": "<nested too deep>"}
    if isinstance(value, torch.Tensor):
        if value.is_meta or value.layout != torch.strided and \
                value.layout != torch.sparse_coo:
            return _opaque(value)
        plain = torch.Tensor.as_subclass(value, torch.Tensor)
        plain = plain.detach()
        if plain.layout == torch.sparse_coo:
            plain = plain.to_dense()
        return plain.cpu().clone()
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return _opaque(value)
        return torch.from_numpy(np.array(value))
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or type(value) in (bool, int, float):
        return value
    if type(value) is complex:
        return {"__complex__": [value.real, value.imag]}
    if type(value) is str:
        return value[:MAX_TEXT]
    if type(value) in (list, tuple) and len(value) <= MAX_ITEMS:
        items = [_encode(v, depth + 1) for v in value]
        return items if type(value) is list else {"__tuple__": items}
    if type(value) is dict and len(value) <= MAX_ITEMS and \
            all(type(k) is str for k in value):
        return {"__dict__": [[k[:MAX_TEXT], _encode(v, depth + 1)]
                             for k, v in value.items()]}
    return _opaque(value)


def _opaque(value: Any) -> dict:
    try:
        text = repr(value)
    except BaseException:
        text = "<no repr>"
    if not isinstance(text, str):
        text = "<no repr>"
    return {"__opaque__": type(value).__name__[:100], "repr": text[:200]}


def _describe_failure(exc: BaseException, time_limit: float) -> dict:
    from .function_exercise import LearnerTimeout, learner_line_number
    if isinstance(exc, LearnerTimeout):
        return {"kind": "timeout", "message": f"{time_limit:g}"}
    if isinstance(exc, SystemExit):
        return {"kind": "exit"}
    if isinstance(exc, KeyboardInterrupt):
        return {"kind": "interrupt"}
    line = learner_line_number(exc)
    try:
        message = str(exc)[:MAX_TEXT]
    except BaseException:
        message = ""
    return {"kind": "error", "type": type(exc).__name__[:100],
            "message": message, "line": line}


def _child_main(folder: Path) -> None:
    """Wait for the go, run the request, write the result, exit."""
    import numpy as np
    import torch
    from .function_exercise import time_limit as limit
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                       # prints go to output.txt
    torch.set_num_threads(1)
    try:
        import resource
        used = _address_space()
        if used:
            resource.setrlimit(resource.RLIMIT_AS,
                               (used + MEMORY_LIMIT, used + MEMORY_LIMIT))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    except (ImportError, ValueError, OSError):
        pass
    protocol.write(b"ready\n")
    protocol.flush()
    if sys.stdin.readline().strip() != "go":
        os._exit(0)
    request = torch.load(folder / "request.pt", weights_only=False)
    seconds = request["time_limit"]
    result: dict[str, Any] = {"setup": None, "results": []}
    namespace = {"torch": torch, "np": np, "numpy": np, "math": math,
                 "__name__": "__learner__"}
    name = request["func_name"]
    try:
        with limit(seconds):
            code = compile(request["source"], f"<your {name}>", "exec")
            exec(code, namespace)
        func = namespace.get(name)
        if not callable(func):
            result["setup"] = {"kind": "missing"}
        else:
            for args, kwargs in request["cases"]:
                try:
                    with limit(seconds):
                        got = func(*copy.deepcopy(args),
                                   **copy.deepcopy(kwargs))
                        value = _encode(got)
                except BaseException as exc:
                    result["results"].append(
                        {"failure": _describe_failure(exc, seconds)})
                    break
                result["results"].append({"value": value})
    except SyntaxError as exc:
        result["setup"] = {"kind": "syntax", "message": str(exc.msg),
                           "line": exc.lineno}
    except BaseException as exc:
        result["setup"] = _describe_failure(exc, seconds)
    try:
        torch.save(result, folder / "result.pt")
    except BaseException as exc:        # e.g. past the file-size limit
        torch.save({"setup": {"kind": "error", "type": type(exc).__name__,
                              "message": "the result is too large to pass "
                                         "back"}, "results": []},
                   folder / "result.pt")
    sys.stdout.flush()
    protocol.write(b"done\n")
    protocol.flush()
    os._exit(0)                         # threads the code started end too


def _address_space() -> int:
    """Bytes of address space this process uses now (0 if unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    _child_main(Path(sys.argv[1]))
