"""The GPU: context, stream, memory, kernel modules, launches, graphs.

Raw ``cuda.bindings.driver`` calls, each through ``check()``, which turns a
failure into an exception naming the call and the CUDA error. Importing this
module needs no GPU; ``Device()`` does.

Device memory is a ``DArray``: a pointer, a shape and a NumPy dtype, with
views (reshape, row slices) that share the allocation. Temporaries of one
forward pass come from a bump ``Workspace`` reset at the start of each pass,
so a decode step allocates the same addresses every time and can be captured
once as a CUDA graph and replayed.
"""

from __future__ import annotations

import ctypes
import math
import os
from dataclasses import dataclass

import numpy as np

from ...errors import AnvilError
from . import compile as nvrtc_compile


class CudaError(AnvilError):
    pass


def check(result):
    """Unwrap a cuda-python call's ``(err, *values)``; raise on error."""
    from cuda.bindings import driver

    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        raise CudaError(f"CUDA error {name.decode() if name else err}: {text.decode() if text else ''}")
    return values[0] if len(values) == 1 else (tuple(values) if values else None)


def _error_text(driver, err) -> str:
    _, name = driver.cuGetErrorName(err)
    _, text = driver.cuGetErrorString(err)
    return f"{name.decode() if name else err} ({text.decode() if text else 'no description'})"


def gpu_probe() -> str | None:
    """Why no NVIDIA GPU is usable here, in the driver's words (None: one is).
    Callers that skip GPU work can say why; callers that need a GPU can fail
    with it."""
    try:
        from cuda.bindings import driver
    except Exception as e:  # no cuda-python, or a broken install of it
        return f"cuda.bindings is not importable ({type(e).__name__}: {e})"
    try:
        err = driver.cuInit(0)[0]
        if err != driver.CUresult.CUDA_SUCCESS:
            return f"cuInit: {_error_text(driver, err)}"
        err, n = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS:
            return f"cuDeviceGetCount: {_error_text(driver, err)}"
    except Exception as e:  # e.g. libcuda.so missing or of another version
        return f"the CUDA driver failed ({type(e).__name__}: {e})"
    return None if n > 0 else "the CUDA driver reports no devices"


def gpu_available() -> bool:
    return gpu_probe() is None


@dataclass
class DArray:
    """A typed view of device memory (row-major)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    device: "Device"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def reshape(self, *shape) -> "DArray":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else tuple(shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(self.size // known if s == -1 else s for s in shape)
        assert math.prod(shape) == self.size, (self.shape, shape)
        return DArray(self.ptr, shape, self.dtype, self.device)

    def rows(self, start: int, stop: int) -> "DArray":
        """Rows ``start:stop`` of the first axis (contiguous, so a view)."""
        row = self.nbytes // self.shape[0]
        return DArray(self.ptr + start * row, (stop - start,) + self.shape[1:], self.dtype, self.device)

    def numpy(self) -> np.ndarray:
        return self.device.download(self)


class Workspace:
    """Bump allocator over one device allocation: per-pass temporaries (reset
    each pass), or the weights (never reset; tensors loaded one after another
    sit back to back, which lets Q/K/V or gate/up run as one kernel)."""

    def __init__(self, device: "Device", nbytes: int, align: int = 256):
        self.device, self.capacity, self.ALIGN = device, nbytes, align
        self.base = device.alloc_raw(nbytes)
        self.offset = self.mark = 0
        self.high_water = 0

    def reset(self) -> None:
        self.offset = 0
        self.mark = 0

    def set_mark(self) -> None:
        """Where ``keep`` will put the values it keeps."""
        self.mark = self.offset

    def keep(self, a: DArray) -> DArray:
        """Copy ``a`` to the mark and free everything allocated after it.
        ``a`` is at the mark already (kept before and updated in place), or
        wholly after it (a new result), or wholly before it (the first layer's
        input, the embedding, updated in place): the copy never overlaps."""
        dst = DArray(self.base + self.mark, a.shape, a.dtype, self.device)
        assert a.ptr == dst.ptr or a.ptr >= dst.ptr + a.nbytes or a.ptr + a.nbytes <= dst.ptr, "overlapping keep"
        if a.ptr != dst.ptr:
            check(self.device.driver.cuMemcpyDtoDAsync(dst.ptr, a.ptr, a.nbytes, self.device.stream))
        self.offset = self.mark + (a.nbytes + self.ALIGN - 1) // self.ALIGN * self.ALIGN
        return dst

    def align_to(self, n: int) -> None:
        """The next array starts at a multiple of ``n`` bytes (a kernel's wider loads)."""
        self.offset = (self.offset + n - 1) // n * n

    def empty(self, shape, dtype=np.float32) -> DArray:
        shape = tuple(int(s) for s in shape)
        n = max(1, math.prod(shape)) * np.dtype(dtype).itemsize
        if self.offset + n > self.capacity:
            raise CudaError(f"workspace exhausted: need {self.offset + n} bytes, have {self.capacity}")
        a = DArray(self.base + self.offset, shape, np.dtype(dtype), self.device)
        self.offset += (n + self.ALIGN - 1) // self.ALIGN * self.ALIGN
        self.high_water = max(self.high_water, self.offset)
        return a


def pdl_attributes(driver) -> list:
    """The launch attribute list that lets a kernel start before the previous
    one on the stream has finished (it waits in griddepcontrol.wait)."""
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    return [attr]


class Device:
    def __init__(self, ordinal: int = 0):
        from cuda.bindings import driver
        from cuda.core import Device as CoreDevice

        if why := gpu_probe():
            raise AnvilError(f"no usable NVIDIA GPU ({why}): use --backend numpy")
        self.driver = driver
        self.core = CoreDevice(ordinal)
        self.core.set_current()
        self.handle = check(driver.cuDeviceGet(ordinal))
        major = check(driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.handle))
        minor = check(driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.handle))
        self.arch = f"sm_{major}{minor}"
        self.sm_count = check(driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.handle))
        self.max_shared = check(driver.cuDeviceGetAttribute(  # dynamic shared memory a block may opt in to
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, self.handle))
        self.name = check(driver.cuDeviceGetName(256, self.handle)).split(b"\0")[0].decode()
        self.stream = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value))
        # Programmatic dependent launch (common.cuh): each kernel may start
        # while the previous one runs. Hopper and later; ANVIL_PDL=0 turns it off.
        self.pdl = major >= 9 and os.environ.get("ANVIL_PDL", "1") != "0"
        self._pdl_attrs = pdl_attributes(driver)
        self._modules: dict[tuple, object] = {}
        self._functions: dict[tuple, object] = {}
        self._allocs: list[int] = []
        self.allocated = 0
        self.trace: DArray | None = None  # compile.TRACE's buffer (_point_trace)

    # ---- memory ---------------------------------------------------------
    def mem_free(self) -> int:
        """Bytes of device memory free now (cuMemGetInfo)."""
        free, _total = check(self.driver.cuMemGetInfo())
        return int(free)

    def alloc_raw(self, nbytes: int) -> int:
        ptr = int(check(self.driver.cuMemAlloc(max(1, int(nbytes)))))
        self._allocs.append(ptr)
        self.allocated += int(nbytes)
        return ptr

    def align_to(self, n: int) -> None:
        """The next array starts at a multiple of ``n`` bytes (a kernel's wider loads)."""
        self.offset = (self.offset + n - 1) // n * n

    def empty(self, shape, dtype=np.float32) -> DArray:
        shape = tuple(int(s) for s in shape)
        return DArray(self.alloc_raw(max(1, math.prod(shape)) * np.dtype(dtype).itemsize), shape, np.dtype(dtype), self)

    def upload(self, host: np.ndarray, out: DArray | None = None) -> DArray:
        host = np.ascontiguousarray(host)
        if out is None:
            out = self.empty(host.shape, host.dtype)
        assert out.nbytes == host.nbytes, (out.shape, host.shape)
        check(self.driver.cuMemcpyHtoDAsync(out.ptr, host.ctypes.data, host.nbytes, self.stream))
        self.synchronize()  # the host array may be a temporary
        return out

    def download(self, a: DArray) -> np.ndarray:
        host = np.empty(a.shape, a.dtype)
        check(self.driver.cuMemcpyDtoHAsync(host.ctypes.data, a.ptr, a.nbytes, self.stream))
        self.synchronize()
        return host

    def fill(self, a: DArray, byte: int) -> None:
        check(self.driver.cuMemsetD8Async(a.ptr, byte, a.nbytes, self.stream))

    def synchronize(self) -> None:
        check(self.driver.cuStreamSynchronize(self.stream))

    def free_all(self) -> None:
        for p in self._allocs:
            self.driver.cuMemFree(p)
        self._allocs.clear()
        self.allocated = 0

    # ---- kernels --------------------------------------------------------
    def function(self, file: str, name: str, defines: dict | None = None):
        key = (file, name, tuple(sorted((defines or {}).items())))
        fn = self._functions.get(key)
        if fn is None:
            mkey = (file, key[2])
            module = self._modules.get(mkey)
            if module is None:
                cubin = nvrtc_compile.compile_cubin(file, self.arch, defines)
                module = check(self.driver.cuModuleLoadData(cubin))
                self._modules[mkey] = module
                if nvrtc_compile.TRACE:
                    self._point_trace(module)
            fn = check(self.driver.cuModuleGetFunction(module, name.encode()))
            self._functions[key] = fn
        return fn

    TRACE_RECORDS = 1 << 20

    def _point_trace(self, module) -> None:
        """Point the module's anvil_trace (common.cuh, compile.TRACE) at the
        device's trace buffer, made on first use with its capacity set (not
        one of free_all's: modules outlive it)."""
        if self.trace is None:
            nbytes = 8 * (2 + 2 * self.TRACE_RECORDS)
            self.trace = DArray(int(check(self.driver.cuMemAlloc(nbytes))), (nbytes // 8,), np.dtype(np.uint64), self)
            self.upload(np.array([0, self.TRACE_RECORDS], np.uint64), DArray(self.trace.ptr, (2,), np.uint64, self))
        ptr, size = check(self.driver.cuModuleGetGlobal(module, b"anvil_trace"))
        self.upload(np.array([self.trace.ptr], np.uint64), DArray(int(ptr), (1,), np.uint64, self))

    def trace_records(self, reset: bool = False) -> np.ndarray:
        """The trace's records so far, [n, 2] (globaltimer ns, grid packed as
        common.cuh trace_mark packs it); ``reset`` empties it afterwards."""
        if self.trace is None:
            raise AnvilError("no trace on this device: load the model with compile.TRACE set "
                             "(scripts/gpu/decode_trace.py)")
        n = min(int(self.download(DArray(self.trace.ptr, (1,), np.uint64, self))[0]), self.TRACE_RECORDS)
        recs = self.download(DArray(self.trace.ptr + 16, (n, 2), np.uint64, self)) if n else np.zeros((0, 2), np.uint64)
        if reset:
            self.upload(np.zeros(1, np.uint64), DArray(self.trace.ptr, (1,), np.uint64, self))
        return recs

    def launch(self, fn, grid, block, args, shared: int = 0) -> None:
        """Launch ``fn``; ``args`` are DArrays (passed as pointers), Python
        ints (int32), floats (float32) or ctypes values (passed as given)."""
        values, types = [], []
        for a in args:
            if isinstance(a, DArray):
                values.append(a.ptr)
                types.append(ctypes.c_void_p)
            elif isinstance(a, (bool, np.bool_)):
                values.append(int(a))
                types.append(ctypes.c_int)
            elif isinstance(a, (int, np.integer)):
                values.append(int(a))
                types.append(ctypes.c_int)
            elif isinstance(a, (float, np.floating)):
                values.append(float(a))
                types.append(ctypes.c_float)
            else:  # an explicit ctypes value, e.g. ctypes.c_void_p(None) for a null pointer
                values.append(a.value if a.value is not None else 0)
                types.append(type(a))
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        params = (tuple(values), tuple(types))
        if not self.pdl:
            check(self.driver.cuLaunchKernel(fn, *grid, *block, shared, self.stream, params, 0))
            return
        cfg = self.driver.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
        cfg.sharedMemBytes, cfg.hStream = shared, self.stream
        cfg.attrs, cfg.numAttrs = self._pdl_attrs, 1
        check(self.driver.cuLaunchKernelEx(cfg, fn, params, 0))

    # ---- graphs ---------------------------------------------------------
    def capture(self, fn) -> object:
        """Record everything ``fn()`` launches on the stream into an
        executable graph (nothing runs during capture)."""
        d = self.driver
        check(d.cuStreamBeginCapture(self.stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        try:
            fn()
        finally:
            graph = check(d.cuStreamEndCapture(self.stream))
        return check(d.cuGraphInstantiate(graph, 0))

    def replay(self, graph_exec) -> None:
        check(self.driver.cuGraphLaunch(graph_exec, self.stream))
