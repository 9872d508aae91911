"""One compile path for every CUDA kernel: NVRTC at run time, cached on disk.

Kernels live in ``engine/kernels/*.cu`` (one op family per file, shared
helpers in ``*.cuh``). The cache key covers everything that changes the
machine code: the source, every header it includes from that folder, the
options (macros included), the target architecture and the NVRTC version.
The cache directory is ``$ANVIL_CACHE_DIR`` (default
``~/.cache/anvil/kernels``), so two engine builds measured side by side can
be given separate caches and never run each other's kernels.

``ANVIL_NO_COMPILE=1`` turns any compile into an error: set it around a
timed region to prove nothing was compiled inside it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from ...atomic import atomic_open
from ...errors import AnvilError

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
# Every kernel compiled with ANVIL_TRACE (common.cuh trace_mark): each launch
# records when its PDL wait returned. scripts/gpu/decode_trace.py sets it; off
# otherwise (the cache key follows it, as any macro).
TRACE = False
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# Files using instructions of one architecture only (wgmma: sm_90a), compiled for
# that target on its base architecture; on any other, only launchers/gemm.py
# knows not to ask for them.
ARCH_SPECIFIC = {"gemm.cu": ("sm_90", "sm_90a")}


class CompileError(AnvilError):
    """NVRTC rejected a kernel; the message carries NVRTC's full log."""


def cache_dir() -> Path:
    return Path(os.environ.get("ANVIL_CACHE_DIR") or Path.home() / ".cache" / "anvil" / "kernels")


@lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise AnvilError(f"NVRTC is not usable ({err.name}); install the CUDA toolkit or `cuda-toolkit[nvrtc]`")
    return major, minor


@lru_cache(maxsize=None)
def cuda_include_dir() -> str:
    """Where cuda_fp16.h & co. live: the toolkit, else the pip wheels' copy."""
    for d in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if d and (Path(d) / "include" / "cuda_fp16.h").exists():
            return str(Path(d) / "include")
    import cuda.pathfinder

    found = cuda.pathfinder.find_nvidia_header_directory("cudart")
    if not found:
        raise AnvilError("CUDA headers (cuda_fp16.h) not found: set CUDA_HOME or pip install 'cuda-toolkit[cudart]'")
    return found


def _sources(name: str) -> list[tuple[str, str]]:
    """The kernel file and every local header it pulls in, transitively."""
    seen, order, todo = set(), [], [name]
    while todo:
        fname = todo.pop()
        if fname in seen:
            continue
        seen.add(fname)
        path = KERNELS_DIR / fname
        if not path.exists():
            raise AnvilError(f"kernel source {path} not found")
        text = path.read_text()
        order.append((fname, text))
        todo.extend(_INCLUDE.findall(text))
    return order


def _options(arch: str, defines: dict[str, object]) -> dict:
    macros = {**defines, "ANVIL_TRACE": 1} if TRACE else defines
    # fast math as llama.cpp's CUDA build (architectures.md §8): same expf/division shapes
    return dict(std="c++17", arch=arch, use_fast_math=True,
                include_path=[str(KERNELS_DIR), cuda_include_dir()],
                define_macro=[(k, str(v)) for k, v in sorted(macros.items())] or None)


def target(name: str, arch: str) -> str:
    """The architecture ``kernels/<name>`` is compiled for on a GPU of ``arch``."""
    base, specific = ARCH_SPECIFIC.get(name, (None, None))
    return specific if arch == base else arch


def cache_key(name: str, arch: str, defines: dict[str, object] | None = None) -> str:
    arch = target(name, arch)
    h = hashlib.sha256()
    for fname, text in _sources(name):
        h.update(fname.encode() + b"\0" + text.encode() + b"\0")
    h.update(repr(sorted(_options(arch, defines or {}).items())).encode())
    h.update(repr(nvrtc_version()).encode())
    return h.hexdigest()[:32]


def compile_cubin(name: str, arch: str, defines: dict[str, object] | None = None) -> bytes:
    """Machine code for ``kernels/<name>`` on ``arch`` (e.g. "sm_90"), from the
    cache when present."""
    defines = defines or {}
    key = cache_key(name, arch, defines)
    arch = target(name, arch)
    path = cache_dir() / f"{Path(name).stem}-{arch}-{key}.cubin"
    if path.is_file():
        # an entry is the cubin and the sha256 of it: a cut or damaged file
        # (a full disk, a crash, a stray write) is compiled again, never loaded
        data = path.read_bytes()
        cubin, digest = data[:-32], data[-32:]
        if len(data) > 32 and hashlib.sha256(cubin).digest() == digest:
            return cubin
    if os.environ.get("ANVIL_NO_COMPILE") == "1":
        raise AnvilError(f"kernel {name} ({arch}) needs compiling but ANVIL_NO_COMPILE=1 (compile before timing)")
    cubin = _compile(name, arch, defines)
    with atomic_open(path) as f:  # concurrent compilers race harmlessly: same bytes
        f.write(cubin + hashlib.sha256(cubin).digest())
    return cubin


def _compile(name: str, arch: str, defines: dict[str, object], logs=None, ptxas_options=None) -> bytes:
    from cuda.core import Program, ProgramOptions

    source = (KERNELS_DIR / name).read_text()
    options = ProgramOptions(name=name, ptxas_options=ptxas_options, **_options(arch, defines))
    try:
        return Program(source, "c++", options).compile("cubin", logs=logs).code
    except Exception as e:  # cuda.core raises with NVRTC's log in the message
        raise CompileError(f"NVRTC failed on engine/kernels/{name} for {arch}:\n{e}") from None


def compile_log(name: str, arch: str, defines: dict[str, object] | None = None) -> str:
    """What NVRTC and ptxas (``-v``) say compiling ``kernels/<name>`` for ``arch``
    (never from the cache): per kernel its registers and spills, and any change
    ptxas made to the program, such as a ``wgmma.wait_group`` it had to inject."""
    import io

    log = io.StringIO()
    _compile(name, target(name, arch), defines or {}, logs=log, ptxas_options=["-v"])
    return log.getvalue()


@contextmanager
def edited_kernels(file: str, *edits: tuple[str, str]):
    """Inside the block, every kernel compiles from a copy of the kernels with
    each ``(old, new)`` of ``edits`` made in ``file`` (every copy of ``old``,
    which must be there), into a cache of its own: a mutant's deliberate bug, or a
    timing variant that leaves a kernel's phase out. Modules already loaded
    on a Device stay as they were: load the model inside the block."""
    from unittest import mock

    with tempfile.TemporaryDirectory(prefix="anvil-edit-") as tmp:
        kernels = Path(shutil.copytree(KERNELS_DIR, Path(tmp) / "kernels"))
        text = (kernels / file).read_text()
        for old, new in edits:
            if old not in text:
                raise AnvilError(f"engine/kernels/{file} no longer contains {old!r}: update the edit")
            text = text.replace(old, new)
        (kernels / file).write_text(text)
        with mock.patch(f"{__name__}.KERNELS_DIR", kernels), \
                mock.patch.dict(os.environ, {"ANVIL_CACHE_DIR": str(Path(tmp) / "cache")}):
            yield


def kernel_files() -> list[str]:
    return sorted(p.name for p in KERNELS_DIR.glob("*.cu"))
