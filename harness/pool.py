"""A command's work over several GPUs (``--gpus``) or a Ray cluster (``--ray``).

The work is a list of *units*, each one call ``fn(*args)`` of a module-level
function (a worker imports it by name) that returns a picklable result:
what one model costs a command (validate-catalog: its reference sets;
bench: both arms on it; mutants: one mutant, or the control on one model).
Both ways return one ``Outcome`` per unit, in the order given: its result,
or one line saying what stopped it.

``run_local``: one worker process per GPU, each a
``concurrent.futures.ProcessPoolExecutor`` of one spawned process whose
initializer pins it with ``CUDA_VISIBLE_DEVICES`` (and
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so CUDA's device and NVML's index name
one GPU) before anything can initialise CUDA. The largest unit starts
first; a GPU takes the next one when it is free. A unit that raises is an
error on its GPU and the worker goes on; a worker that dies (a crash, the
OOM killer) is an error for the unit it ran, with the exit and the last
line it wrote (its output goes to a log per GPU), and the GPU gets a fresh
worker for the next unit: the other GPUs never notice. Ctrl-C (or SIGTERM)
terminates every worker (each stops its unit as on Ctrl-C, so the
benchmark processes it started are killed too), waits for them, and
raises KeyboardInterrupt: exit status 130.

``run_ray``: the same units as Ray tasks of one GPU each (none for the
NumPy engine), the driver's engine/ and harness/ packages and its catalog
and references shipped with them (``runtime_env``), so every node runs the
build under test against the same references. Ray is imported only here.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.errors import AnvilError

STOP_GRACE_S = 10.0  # after Ctrl-C: how long a worker may take to stop its unit before it is killed
RAY_EXTRA = 'pip install ".[cluster]"'


@dataclass(frozen=True)
class Unit:
    name: str             # what it is (a model, a mutant): progress lines and errors name it
    fn: Callable          # module-level, so that a worker can import it
    args: tuple = ()
    size: int = 0         # its cost, bytes of model: the largest start first
    fresh: bool = False   # in a process of its own (a mutant: its patches must not outlive it)


@dataclass
class Outcome:
    unit: Unit
    result: object = None
    error: str | None = None  # why there is no result, one line
    gpu: int | None = None    # the GPU that ran it: NVML's index on its host
    host: str | None = None
    gpu_name: str | None = None  # its name, where the worker said (a Ray task)
    seconds: float = 0.0

    @property
    def where(self) -> str:
        return ("no GPU" if self.gpu is None else f"GPU {self.gpu}") + (f" of {self.host}" if self.host else "")


# ---- which GPUs ------------------------------------------------------------------------

def gpu_list(text: str) -> str:
    """argparse type of ``--gpus``: ``all`` or NVML indices, ``0,1,...`` (checked against the machine later)."""
    parts = [p.strip() for p in text.split(",")]
    if text != "all" and not (all(p.isdigit() for p in parts) and len(set(map(int, parts))) == len(parts)):
        raise argparse.ArgumentTypeError(f"expected 'all' or distinct GPU indices separated by commas (e.g. 0,1), "
                                         f"got {text!r}")
    return text


def resolve_gpus(text: str) -> list[int]:
    """The NVML indices ``--gpus`` names. ``all``: every GPU NVML reports (of
    those CUDA_VISIBLE_DEVICES lists, where it lists indices); an error
    without a GPU, or for an index the machine does not have."""
    from . import nvml

    names, why = nvml.devices()
    if not names:
        raise AnvilError(f"--gpus {text}: no NVIDIA GPU here ({why or 'NVML reports none'})")
    if text == "all":
        visible = [p.strip() for p in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if p.strip()]
        pick = [i for i in range(len(names)) if not visible or not all(p.isdigit() for p in visible)
                or str(i) in visible]
        if not pick:
            raise AnvilError(f"--gpus all: CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']} names none of "
                             f"the {len(names)} GPUs NVML reports")
        return pick
    gpus = [int(p) for p in text.split(",")]
    if missing := [g for g in gpus if g >= len(names)]:
        raise AnvilError(f"--gpus {text}: no GPU {missing[0]} here (NVML reports {len(names)}: "
                         f"{', '.join(f'{i} {n}' for i, n in enumerate(names))})")
    return gpus


def largest_first(units: list[Unit]) -> list[int]:
    """Indices of ``units``, the largest first (ties in the order given)."""
    return sorted(range(len(units)), key=lambda i: -units[i].size)


def last_line(text: str) -> str:
    """The last non-blank line of ``text``: what a failure says in one line."""
    return next((ln.strip() for ln in reversed(str(text).splitlines()) if ln.strip()), "")


def error_line(e: BaseException) -> str:
    """An exception a unit raised, as one line: an AnvilError's message (its
    last line: a runner's is the child's stderr), else its type and message."""
    text = last_line(str(e))
    return text if isinstance(e, AnvilError) and text else f"{type(e).__name__}: {text}" if text else type(e).__name__


# ---- one worker process per GPU ------------------------------------------------------------

def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _pin(gpu: int | None, log: str | None) -> None:
    """A worker's initializer, before any unit (nothing has initialised CUDA in a spawned process)."""
    if gpu is not None:
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's device order = NVML's: index k is one GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    # terminate() stops a unit as Ctrl-C does: a runner kills the benchmark processes it started
    signal.signal(signal.SIGTERM, _interrupt)
    if log:  # stdout too: a stray print must not land in the command's table
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "ended abruptly"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _tail(log: Path, start: int) -> str:
    """The last line ``log`` got from ``start`` on (a unit's own part of it)."""
    try:
        with open(log, "rb") as f:
            f.seek(start)
            return last_line(f.read()[-65536:].decode(errors="replace"))
    except OSError:
        return ""


class _Slot:
    """One GPU: its worker (made on first use, again after one dies) and its log."""

    def __init__(self, gpu: int, log_dir: Path):
        self.gpu, self.log = gpu, log_dir / f"gpu{gpu}.log"
        self.pool = None  # a concurrent.futures.ProcessPoolExecutor of one process
        self.host = platform.node()

    def _worker(self):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        if self.pool is None:
            self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_pin,
                                            initargs=(self.gpu, str(self.log)))
        return self.pool

    def _exit(self) -> str:
        # the dead worker's exit status: only the executor holds its process (no public accessor).
        # The executor's own thread reaps it too: where it wins the wait, our join returns at once
        # with no status until that thread has stored it, so wait for the status itself (a broken
        # pool's worker is dead or dying; a stop's grace at most)
        procs = list((getattr(self.pool, "_processes", None) or {}).values())
        deadline = time.monotonic() + STOP_GRACE_S
        while procs and procs[0].exitcode is None and time.monotonic() < deadline:
            procs[0].join(0.05)
        return _exit_text(procs[0].exitcode if procs else None)

    def run(self, unit: Unit, lock: threading.Lock, stop: threading.Event) -> Outcome | None:
        """``unit`` on this GPU's worker; None if stopped before it started.
        A worker only starts under ``lock`` and while ``stop`` is clear: once
        the stopping thread has set it (under the lock), every worker there
        will be is there to be stopped."""
        from concurrent.futures.process import BrokenProcessPool

        out = Outcome(unit, gpu=self.gpu, host=self.host)
        start = self.log.stat().st_size if self.log.exists() else 0
        t0 = time.perf_counter()
        with lock:
            if stop.is_set():
                return None
            future = self._worker().submit(unit.fn, *unit.args)  # a spawned worker is running on return
        try:
            out.result = future.result()
        except BrokenProcessPool:
            said = _tail(self.log, start)
            out.error = (f"the worker on GPU {self.gpu} died ({self._exit()})"
                         f"{': ' + said if said else ', saying nothing'} (log: {self.log})")
            self.close()
        except (Exception, KeyboardInterrupt) as e:  # the unit raised (a worker sent SIGINT too); the worker lives on
            out.error = f"on GPU {self.gpu}: {error_line(e)}"
        out.seconds = time.perf_counter() - t0
        if unit.fresh:
            self.close()
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def _stop(slots: list[_Slot]) -> None:
    """Every worker stopped: SIGTERM (each stops its unit as on Ctrl-C), then, after STOP_GRACE_S, SIGKILL."""
    import multiprocessing

    children = multiprocessing.active_children()  # this process's: the workers
    for p in children:
        p.terminate()
    for s in slots:  # a worker whose unit stopped then finds no more work, and ends
        if s.pool is not None:
            s.pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in children:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in children:
        if p.is_alive():
            p.kill()
            p.join()


def run_local(units: list[Unit], gpus: list[int], log_dir: Path,
              progress: Callable[[Outcome, int, int], None] | None = None) -> list[Outcome]:
    """``units`` over ``gpus`` (NVML indices), a worker each; ``progress(outcome,
    done, total)`` as each unit ends (from one thread at a time); the workers'
    output in ``log_dir/gpu<i>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    todo = collections.deque(largest_first(units))
    outcomes: list[Outcome | None] = [None] * len(units)
    lock, stop = threading.Lock(), threading.Event()
    slots = [_Slot(g, log_dir) for g in gpus]
    failed: list[BaseException] = []

    def serve(slot: _Slot) -> None:
        try:
            while True:
                with lock:
                    if stop.is_set() or not todo:
                        break
                    i = todo.popleft()
                out = slot.run(units[i], lock, stop)
                if out is None or stop.is_set():
                    return  # interrupted: the unit did not end, it was stopped
                with lock:
                    outcomes[i] = out
                    if progress:
                        progress(out, sum(o is not None for o in outcomes), len(units))
            slot.close()
        except BaseException as e:  # a bug here, not in a unit: the command fails with it
            failed.append(e)

    threads = [threading.Thread(target=serve, args=(s,), name=f"gpu{s.gpu}", daemon=True) for s in slots]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.25)  # in short waits: Ctrl-C reaches this thread at once
    except BaseException:
        with lock:  # no worker starts after this
            stop.set()
        _stop(slots)
        raise
    if failed:
        raise failed[0]
    return [o if o is not None else Outcome(units[i], error="not run") for i, o in enumerate(outcomes)]


# ---- Ray -----------------------------------------------------------------------------------

def import_ray():
    try:
        import ray
    except ImportError:
        raise AnvilError(f"--ray needs Ray, which is not installed here: {RAY_EXTRA}") from None
    return ray


def _ray_task(fn: Callable, args: tuple):
    """A unit as a Ray task: (its result, the GPU Ray gave it, that GPU's name, the host)."""
    import ray

    from . import nvml

    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # before the unit initialises CUDA (see _pin)
    ids = ray.get_gpu_ids()
    gpu = int(ids[0]) if ids and str(ids[0]).isdigit() else None
    names = nvml.devices()[0] if gpu is not None else []
    return fn(*args), gpu, names[gpu] if gpu is not None and gpu < len(names) else None, platform.node()


def _runtime_env(stage: Path) -> dict:
    """What the tasks run: this process's engine and harness packages, and the
    project's catalog and references (copied into ``stage``: the tasks' working
    directory, where they find the project)."""
    import shutil

    import engine
    import harness

    from . import project

    shutil.copytree(project.ROOT / "references", stage / "references",
                    ignore=shutil.ignore_patterns("__pycache__", "*.gguf"))
    return {"py_modules": [str(Path(engine.__file__).parent), str(Path(harness.__file__).parent)],
            "working_dir": str(stage), "env_vars": {"ANVIL_PROJECT": ""}}


def run_ray(units: list[Unit], address: str, num_gpus: float,
            progress: Callable[[Outcome, int, int], None] | None = None) -> list[Outcome]:
    """``units`` as Ray tasks of ``num_gpus`` GPUs each on the cluster at
    ``address`` (``auto``: the running cluster this machine knows of, else a
    local Ray instance for this run). A fresh unit's process ends with it
    (max_calls=1). No task is retried: a failure is the unit's outcome."""
    import logging
    import tempfile

    ray = import_ray()
    with tempfile.TemporaryDirectory(prefix="anvil-ray-") as stage:
        try:
            ray.init(address=None if address == "auto" else address, runtime_env=_runtime_env(Path(stage)),
                     logging_level=logging.WARNING, log_to_driver=False)
        except Exception as e:
            raise AnvilError(f"--ray {address}: cannot start or reach a Ray cluster: {error_line(e)}") from None
        try:
            if num_gpus and not ray.cluster_resources().get("GPU"):  # its tasks would wait for one forever
                raise AnvilError(f"--ray {address}: the cluster has no GPU, and each task needs one")
            return _gather(ray, units, num_gpus, progress)
        finally:
            ray.shutdown()


def _gather(ray, units, num_gpus, progress) -> list[Outcome]:
    remotes, refs = {}, {}
    for i in largest_first(units):
        u = units[i]
        if u.fresh not in remotes:
            remotes[u.fresh] = ray.remote(num_gpus=num_gpus, max_retries=0,
                                          **({"max_calls": 1} if u.fresh else {}))(_ray_task)
        refs[remotes[u.fresh].remote(u.fn, u.args)] = (i, time.perf_counter())
    outcomes: list[Outcome | None] = [None] * len(units)
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                i, t0 = refs[ref]
                out = Outcome(units[i])
                try:
                    out.result, out.gpu, out.gpu_name, out.host = ray.get(ref)
                except ray.exceptions.RayTaskError as e:  # the unit raised: its own last line
                    out.error = f"Ray task: {error_line(e.cause) if e.cause is not None else last_line(str(e))}"
                except ray.exceptions.RayError as e:  # its worker or node died
                    out.error = f"Ray task failed ({type(e).__name__}): {last_line(str(e))}"
                out.seconds = time.perf_counter() - t0
                outcomes[i] = out
                if progress:
                    progress(out, sum(o is not None for o in outcomes), len(units))
    except BaseException:
        for ref in pending:
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
        raise
    return outcomes
