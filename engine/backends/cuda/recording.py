"""A Device that records kernel launches instead of running them, with no GPU.

Launches go through the real ``Device.launch`` (argument conversion and
cuda-python's kernel-parameter packer), kernels are looked up by name only
(nothing is compiled or loaded), memory is address arithmetic. The launcher
tests check argument packing with it, and ``python -m engine launches`` counts
what one decode step launches: the CUDA graph of a step holds exactly these
kernels, so launches per token are a property of the model's structure,
known on any machine."""

from __future__ import annotations

import ctypes
import math
import types
from collections import Counter

import numpy as np

from . import cubin
from .device import DArray, Device, pdl_attributes


class _Kernel(tuple):
    """(file, kernel name), standing in for a CUfunction (int() keys caches by it)."""

    def __int__(self) -> int:
        return hash(self) & 0xFFFFFFFF


def _resources(kernel: _Kernel):
    from . import compile as nvrtc

    return cubin.resources(nvrtc.compile_cubin(kernel[0], RecordingDevice.arch, kernel.defines))[kernel[1]]


class RecordingDevice:
    sm_count = 132  # an H200's
    max_shared = 227 * 1024
    arch = "sm_90"
    name = "recording device"
    free_bytes = 140 << 30  # an idle H200's free memory (the load's memory check, memory.py)

    def __init__(self, cubin_occupancy: bool = False):
        """``cubin_occupancy``: the occupancy query answers from the kernel
        compiled for sm_90 (cubin.py; every kernel a step launches compiles,
        so the grids planned from it are an H200's); else it answers 2."""
        from cuda.bindings import driver

        self.launches: list[tuple] = []  # ((file, kernel), grid, block, shared bytes, parameter kinds)
        self._next = 1 << 32
        self.stream = driver.CUstream(0)
        self.pdl, self._pdl_attrs = True, pdl_attributes(driver)  # launches go through cuLaunchKernelEx
        ok = (driver.CUresult.CUDA_SUCCESS,)
        dev = self

        class Driver:
            CUfunction_attribute = driver.CUfunction_attribute
            CUlaunchConfig = driver.CUlaunchConfig

            @staticmethod
            def cuFuncSetAttribute(fn, attr, value):
                dev.smem_raised = (fn, value)
                return ok

            @staticmethod
            def cuMemAlloc(nbytes):
                return ok + (dev.empty((nbytes,), np.uint8).ptr,)

            @staticmethod
            def cuMemFree(ptr):
                return ok

            @staticmethod
            def cuMemsetD8Async(ptr, byte, n, stream):
                return ok

            @staticmethod
            def cuMemcpyDtoDAsync(dst, src, n, stream):
                return ok

            @staticmethod
            def cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, shared):
                if not cubin_occupancy:
                    return ok + (2,)
                return ok + (cubin.blocks_beside(cubin.footprint(_resources(fn), threads, shared)),)

            @staticmethod
            def cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
                driver._HelperKernelParams(params)  # raises on arguments cuda-python cannot pack
                kinds = ["ptr" if t in (ctypes.c_void_p, ctypes.c_uint64) else "int" if t is ctypes.c_int else
                         "float" if t is ctypes.c_float else repr(t) for t in params[1]]
                dev.launches.append((fn, (gx, gy, gz), (bx, by, bz), shared, kinds))
                return ok

            @staticmethod
            def cuLaunchKernelEx(cfg, fn, params, extra):
                assert cfg.numAttrs == 1 and cfg.attrs[0].value.programmaticStreamSerializationAllowed == 1
                return Driver.cuLaunchKernel(fn, cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX,
                                             cfg.blockDimY, cfg.blockDimZ, cfg.sharedMemBytes, cfg.hStream,
                                             params, extra)

        self.driver = Driver
        self.launch = types.MethodType(Device.launch, self)

    def function(self, file, name, defines=None):
        kernel = _Kernel((file, name))
        kernel.defines = dict(defines or {})  # what it would compile with (decode_residency)
        return kernel

    def empty(self, shape, dtype=np.float32) -> DArray:
        shape = tuple(int(s) for s in shape)
        a = DArray(self._next, shape, np.dtype(dtype), self)
        self._next += (max(1, int(np.prod(shape))) * np.dtype(dtype).itemsize + 255) // 256 * 256
        return a

    def alloc_raw(self, nbytes: int) -> int:
        return self.empty((nbytes,), np.uint8).ptr

    def mem_free(self) -> int:
        return self.free_bytes

    def upload(self, host: np.ndarray, out: DArray | None = None) -> DArray:
        return out if out is not None else self.empty(host.shape, host.dtype)

    def download(self, a: DArray) -> np.ndarray:
        return np.zeros(a.shape, a.dtype)

    def fill(self, a, byte):
        pass

    def synchronize(self):
        pass

    def capture(self, fn):
        raise RuntimeError("a recording device captures no graph: load the model with eager=True")


class RecordingCublas:
    """cuBLAS calls counted, not run."""

    def __init__(self, stream=None):
        self.calls = 0

    def set_workspace(self, buf) -> None:
        pass

    def gemm(self, *args, **kw) -> None:
        self.calls += 1


def decode_step(path, n_ctx: int | None = None, cubin_occupancy: bool = False,
                **options) -> tuple[list[tuple], int]:
    """The launches of one decode step of the model at ``path`` ((kernel,
    grid, block, shared bytes, parameter kinds) each, in order) and the
    layer count: the model on the CUDA backend with a recording device, its
    context ``n_ctx`` (default: the engine's; the attention's split count
    follows it), after a 3-token prompt; ``cubin_occupancy``: grids planned
    as on an H200 (RecordingDevice)."""
    from ...model import Model

    dev = RecordingDevice(cubin_occupancy)
    model = Model(path, n_ctx=n_ctx, backend="cuda", eager=True, device=dev, cublas=RecordingCublas(), **options)
    model.forward([1, 2, 3])
    first = len(dev.launches)
    model.decode_next(4)
    return dev.launches[first:], model.config.n_layer


def decode_launches(path, n_ctx: int | None = None, **options) -> tuple[Counter, int]:
    """The kernels one decode step launches, by name, and the layer count
    (decode_step)."""
    launches, n_layer = decode_step(path, n_ctx, **options)
    return Counter(name for (_, name), *_ in launches), n_layer


def decode_residency(path, n_ctx: int | None = None, **options) -> list[dict]:
    """Each distinct launch of a decode step (a kernel with its grid, block,
    shared memory and compile options, after a distinct kernel), in the
    step's order, with what a block of it takes of an SM (cubin.py: ptxas's
    registers and stack frame, read from the kernel compiled for sm_90), how
    many blocks an SM holds, and how many an SM can take while it holds the
    launch before's blocks: where that is 0, this launch cannot start (or
    request its weights) until the one before leaves the SM. The grids are
    planned as on an H200 (its occupancy, from the same cubins)."""
    launches, _ = decode_step(path, n_ctx, cubin_occupancy=True, **options)
    sm_count = RecordingDevice.sm_count
    rows, seen, before = [], {}, None
    for kernel, grid, block, shared, _ in launches:
        res = _resources(kernel)
        threads, blocks = math.prod(block), math.prod(grid)
        fp = cubin.footprint(res, threads, shared)
        alone = cubin.blocks_beside(fp)
        here = (fp, min(alone, -(-blocks // sm_count)))  # the fullest SM's share of the grid
        name = f"{kernel[1]} {tuple(grid)}"
        key = (kernel, tuple(sorted(kernel.defines.items())), grid, block, shared, before and before[0])
        if key in seen:
            seen[key]["count"] += 1
        else:
            seen[key] = {"launch": name, "after": before[0] if before else None, "count": 1, "threads": threads,
                         "registers": res.registers, "local_bytes": res.local_bytes, "shared": fp.shared,
                         "blocks_per_sm": alone, "beside_before": cubin.blocks_beside(fp, [before[1]]) if before else alone}
            rows.append(seen[key])
        before = (name, here)
    return rows
