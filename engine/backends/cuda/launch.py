"""The one launcher convention every kernel launcher module follows.

A launcher takes ``DArray`` operands, checks what the kernel assumes (sizes,
alignment), picks grid/block/shared memory from shapes only (never from
positions or context length, which kernels read from device memory, so a
captured decode graph replays correctly as the context grows) and enqueues
the kernel with ``dev.launch`` on ``dev.stream``; nothing is synchronised.
The helpers here are the only way launchers look up kernels, opt in to more
shared memory, pass NULL pointers and get scratch memory.
"""

from __future__ import annotations

import ctypes
import os
import weakref

import numpy as np

from ...errors import AnvilError
from ...quants import QType
from .device import DArray, Device, check

DEFAULT_SMEM = 48 * 1024  # dynamic shared memory a kernel may use without opting in


def switched_on(name: str) -> bool:
    """Whether a kernel that is off in the tree is switched on for this process
    and the processes it starts (scripts/gpu/switched.py sets ANVIL_SWITCHES,
    e.g. ``int8,wgmma_moe``; a mutant run's processes then take the same kernels)."""
    return name in os.environ.get("ANVIL_SWITCHES", "").split(",")

_scratch: "weakref.WeakKeyDictionary[Device, dict[str, DArray]]" = weakref.WeakKeyDictionary()
_smem_raised: "weakref.WeakKeyDictionary[Device, dict]" = weakref.WeakKeyDictionary()


def function(dev: Device, file: str, name: str, defines: dict | None = None, shared: int = 0):
    """Kernel ``name`` of ``engine/kernels/<file>`` (compiled with ``defines``),
    opted in to ``shared`` bytes of dynamic shared memory when that is over 48 KB."""
    fn = dev.function(file, name, defines)
    if shared > DEFAULT_SMEM:
        raised = _smem_raised.setdefault(dev, {})
        key = (file, name, tuple(sorted((defines or {}).items())))  # one compiled kernel
        if raised.get(key, 0) < shared:
            attr = dev.driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(dev.driver.cuFuncSetAttribute(fn, attr, shared))
            raised[key] = shared
    return fn


_resident: "weakref.WeakKeyDictionary[Device, dict]" = weakref.WeakKeyDictionary()


def resident_blocks(dev: Device, fn, threads: int, shared: int) -> int:
    """How many blocks of ``fn`` (``threads`` threads, ``shared`` bytes of dynamic
    shared memory) the whole GPU holds at once: the grid of a kernel whose
    blocks loop over their work, so none waits for a second wave."""
    cache = _resident.setdefault(dev, {})
    key = (int(fn), threads, shared)
    n = cache.get(key)
    if n is None:
        per_sm = check(dev.driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, shared))
        n = cache[key] = max(1, int(per_sm)) * dev.sm_count
    return n


def null():
    """A NULL pointer argument. Not ctypes.c_void_p(0): Device.launch passes
    ``.value`` on, which is None for a null c_void_p, and cuda-python rejects
    None for a c_void_p parameter. An 8-byte zero packs the same bytes."""
    return ctypes.c_uint64(0)


def null_or(a: DArray | None):
    return null() if a is None else a


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def grid(dev: Device, work_items: int, threads: int = 256) -> tuple[int]:
    """For grid-stride kernels: enough blocks to fill the GPU, no more."""
    return (max(1, min(ceil_div(work_items, threads), dev.sm_count * 16)),)


def aligned(a: DArray, what: str, n: int = 16) -> None:
    if a.ptr % n:
        raise AnvilError(f"CUDA kernel argument {what} must be {n}-byte aligned (address {a.ptr:#x})")


def check_f32(*arrays: DArray | None) -> None:
    for a in arrays:
        if a is not None and a.dtype != np.float32:
            raise TypeError(f"expected a float32 DArray, got {a.dtype} {a.shape}")


def check_bf16_bits(a: DArray | None, size: int) -> None:
    """``a`` (where given) holds ``size`` bf16 values as uint16 bits, 8-byte
    aligned (the kernels store four at a time beside a float4)."""
    if a is not None and (a.dtype != np.uint16 or a.size != size):
        raise TypeError(f"expected {size} bf16 values as a uint16 DArray, got {a.dtype} {a.shape}")
    if a is not None:
        aligned(a, "the bf16 copy", 8)


def scratch(dev: Device, name: str, nbytes: int) -> DArray:
    """A per-device buffer of at least ``nbytes``, reused across calls (one
    stream, so consecutive kernels never use it concurrently). Allocated
    with the driver directly, outside Device's list, so dev.free_all() (which
    tests call between cases) cannot free it while we still hold it. It is
    allocated on first use: run a step eagerly before capturing a graph
    (cuMemAlloc is not allowed inside a capture)."""
    bufs = _scratch.setdefault(dev, {})
    buf = bufs.get(name)
    if buf is None or buf.nbytes < nbytes:
        if buf is not None:
            dev.synchronize()  # kernels already queued may still use the old one
            check(dev.driver.cuMemFree(buf.ptr))
        nbytes = ceil_div(max(nbytes, 1), 1 << 20) << 20  # whole MiB: few regrowths
        buf = DArray(int(check(dev.driver.cuMemAlloc(nbytes))), (nbytes,), np.dtype(np.uint8), dev)
        bufs[name] = buf
    return buf


def counter(dev: Device, name: str, n: int = 1) -> DArray:
    """``n`` per-device uint32s at 0 that the kernels using them return to 0
    before they exit (last-block-done tickets: moe.cu's moe_router_f32,
    attention.cu's split decode). Allocated and zeroed on first use, like
    ``scratch``: eagerly, before any graph capture."""
    key = f"counter:{name}"
    old = _scratch.get(dev, {}).get(key)
    buf = scratch(dev, key, 4 * n)
    if buf is not old:  # new, or regrown (a regrown buffer is not zeroed)
        dev.fill(buf, 0)
    return DArray(buf.ptr, (n,), np.dtype(np.uint32), dev)


# ---- the GGUF weight types the kernels read (gemv.cu, dequant.cu) ----------

WEIGHT_TYPES: tuple[QType, ...] = (
    QType.F32, QType.F16, QType.BF16, QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1,
    QType.Q8_0, QType.Q4_K, QType.Q5_K, QType.Q6_K,
)
TYPE_SUFFIX = {QType.F32: "f32", QType.F16: "f16", QType.BF16: "bf16", QType.Q4_0: "q4_0", QType.Q4_1: "q4_1",
           QType.Q5_0: "q5_0", QType.Q5_1: "q5_1", QType.Q8_0: "q8_0", QType.Q4_K: "q4_k", QType.Q5_K: "q5_k",
           QType.Q6_K: "q6_k"}


def weight_type(qtype, what: str) -> QType:
    try:
        qt = QType(int(qtype))
    except ValueError:
        qt = None
    if qt not in TYPE_SUFFIX:
        name = qt.name if qt is not None else f"ggml type {int(qtype)}"
        raise AnvilError(f"CUDA {what}: unsupported weight type {name}; "
                         f"supported: {', '.join(t.name for t in WEIGHT_TYPES)}")
    return qt
