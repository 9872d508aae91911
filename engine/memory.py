"""Whether a model fits, said before anything large is allocated.

The NumPy engine holds every weight dequantised to float32 (qwen3-8b: 33 GB
from its 5 GB file) and a float32 KV cache; the CUDA engine holds the file's
blocks, its KV cache and one micro-batch's workspace on the device. A model
that does not fit is refused in one line with both numbers and the largest
context that would fit, rather than swapping the machine to a standstill or
failing halfway through an upload. The needs are estimates (temporaries
aside): ``ANVIL_MEMORY_CHECK=0`` loads the model anyway.
"""

from __future__ import annotations

import math
import os
import resource

from .errors import AnvilError

ENV = "ANVIL_MEMORY_CHECK"
CTX_STEP = 256  # a context that fits is said in multiples of this


def gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def _meminfo(key: str, path: str = "/proc/meminfo") -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """Room left under this process's cgroup (v2) memory limit, if it has one
    (a container's /proc/meminfo shows the host's memory)."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current") as f:
            return int(limit) - int(f.read())
    except (OSError, ValueError):
        return None


def host_available() -> tuple[int, str] | None:
    """(bytes this process can still take, where that figure comes from): the
    least of MemAvailable, the cgroup's limit and RLIMIT_AS; None if unknown."""
    found = []
    avail = _meminfo("MemAvailable")
    if avail is not None:
        found.append((avail, "available (MemAvailable)"))
    room = _cgroup_room()
    if room is not None:
        found.append((room, "left under the cgroup's memory.max"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    used = _meminfo("VmSize", "/proc/self/status")
    if soft != resource.RLIM_INFINITY and used is not None:
        found.append((soft - used, "left under the address-space limit (ulimit -v)"))
    return min(found) if found else None


def float32_bytes(gf, largest: int | None = None) -> int:
    """Every tensor of the file as float32: what the NumPy engine holds; or
    only the ``largest`` few (its lazy oracle holds those at most)."""
    sizes = sorted((math.prod(gf.tensor_shape(name)) for name in gf.tensor_names()), reverse=True)
    return 4 * sum(sizes[:largest] if largest is not None else sizes)


def kv_bytes_per_token(cfg, kinds: list[str], itemsize: int) -> int:
    """K and V of one position in every softmax-attention layer."""
    return sum(2 * c.n_head_kv * c.head_dim * itemsize
               for il, kind in enumerate(kinds) if kind == "attention" for c in [cfg.layer(il)])


def check_fits(path, engine: str, fixed: dict[str, int], kv_per_token: int, n_ctx: int,
               have: tuple[int, str] | None, fix: str) -> None:
    """Refuse (AnvilError, one line) when ``fixed`` (named byte counts) plus
    ``n_ctx`` positions of KV cache exceed ``have`` (bytes, where from)."""
    if have is None or os.environ.get(ENV) == "0":
        return
    free, where = have
    need = {**fixed, f"KV cache at --ctx {n_ctx}": kv_per_token * n_ctx}
    total = sum(need.values())
    if total <= free:
        return
    parts = " + ".join(f"{k} {gb(v)}" for k, v in need.items() if v)
    room = (free - sum(fixed.values())) // kv_per_token // CTX_STEP * CTX_STEP if kv_per_token else 0
    fits = f"--ctx {room} would fit, or " if room >= CTX_STEP else ""
    raise AnvilError(f"{path}: {engine} needs {gb(total)} ({parts}) but {gb(max(free, 0))} is {where}: {fits}{fix} "
                     f"({ENV}=0 loads it anyway)")
