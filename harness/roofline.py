"""The ceilings a speed figure is read against, measured on its GPU.

``harness roofline --save`` measures the GPU's device-to-device copy
bandwidth and its bf16 GEMM rate (engine/backends/cuda/roofline.py) and
saves them as a ``roofline`` record. The scoreboard reads each decode
figure against the copy bandwidth and each prefill figure against the GEMM
rate of the newest roofline record of the same GPU (by name, as the records
spell it); a GPU with none has no roofline on the page ("no roofline
measured"), never another GPU's or a datasheet's.
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Roofline:
    gpu: str
    copy_gb_s: float    # device-to-device copy, bytes read + written per second / 1e9
    bf16_tflops: float  # bf16 GEMM with fp32 accumulation
    file: str = ""      # the record
    date: str = ""

    @property
    def text(self) -> str:
        return (f"{self.copy_gb_s:.0f} GB/s copy, {self.bf16_tflops:.0f} TFLOP/s bf16 on {self.gpu} "
                f"({self.date[:10] or 'undated'}{', ' + self.file if self.file else ''})")


def by_gpu(records: list[dict]) -> dict[str, Roofline]:
    """GPU name -> its newest roofline (by the record's date, then file name)."""
    out: dict[str, tuple] = {}
    for rec in records:
        if rec.get("kind") != "roofline" or not rec.get("gpu"):
            continue
        try:
            copy, gemm = float(rec["copy_gb_s"]), float(rec["bf16_tflops"])
        except (KeyError, TypeError, ValueError):
            continue
        if not (copy > 0 and gemm > 0):
            continue
        file = Path(rec["_path"]).name if rec.get("_path") else ""
        key = (str(rec.get("date") or ""), file)
        if rec["gpu"] not in out or key > out[rec["gpu"]][0]:
            out[rec["gpu"]] = (key, Roofline(rec["gpu"], copy, gemm, file, key[0]))
    return {gpu: r for gpu, (_, r) in out.items()}


def for_gpu(records: list[dict], gpu: str | None) -> Roofline | None:
    """The newest roofline measured on ``gpu``, or None."""
    return by_gpu(records).get(gpu) if gpu else None


def measure_record() -> dict:
    """Measure this machine's GPU 0 (CUDA backend) and return the record to save."""
    from engine.backends.cuda.roofline import measure

    from . import nvml

    with nvml.Sampler() as s:  # clocks and power while it ran; NVML's name of the GPU, as bench records spell it
        rec = measure()
    static = {k: v for k, v in s.static.items() if v is not None} if s.available else {}
    if static.get("gpu"):
        rec["cuda_name"], rec["gpu"] = rec["gpu"], static["gpu"]
    rec["nvml"] = s.summary() if s.available else {"available": False, "reason": s.reason}
    rec.update(driver=static.get("driver"), host=socket.gethostname(),
               date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return rec


def format_record(rec: dict) -> str:
    c, g = rec.get("copy") or {}, rec.get("gemm") or {}
    spread = lambda xs: f"{min(xs):.0f}..{max(xs):.0f}" if xs else "?"  # noqa: E731
    return (f"{rec['gpu']}: copy {rec['copy_gb_s']:.0f} GB/s (batches {spread(c.get('samples_gb_s'))}), "
            f"bf16 GEMM {rec['bf16_tflops']:.0f} TFLOP/s (batches {spread(g.get('samples_tflops'))}, "
            f"{g.get('m', '?')}x{g.get('n', '?')}x{g.get('k', '?')})")
