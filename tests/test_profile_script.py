"""scripts/gpu/profile_decode.py --summarize reads Nsight Compute's CSV
(kernel names, grids, durations with thousands separators) into the
per-kernel table the decode notes quote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "profile_decode.py"

CSV = '''==PROF== Connected to process 581 (/usr/bin/python3.12)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","581","python3.12","127.0.0.1","rms_norm","1","13","(1024, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","3,712"
"1","581","python3.12","127.0.0.1","gemv_q4_k","1","13","(128, 1, 1)","(512, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","9,312"
"2","581","python3.12","127.0.0.1","gemv_q4_k","1","13","(128, 1, 1)","(512, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","5.504"
"3","581","python3.12","127.0.0.1","gemv_q6_k","1","13","(128, 1, 1)","(9496, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","244,608"
'''


def test_summarize_ncu_csv(tmp_path):
    f = tmp_path / "ncu.csv"
    f.write_text(CSV)
    out = subprocess.run([sys.executable, str(SCRIPT), "--summarize", str(f)], capture_output=True, text=True,
                         check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "4 kernels, 263.1 us of kernel time in the step"
    head, q4k, norm = lines[2], next(ln for ln in lines if ln.startswith("gemv_q4_k")), lines[-1]
    assert lines[2].split()[:2] == ["gemv_q6_k", "(9496,"] and "244.6" in head
    assert q4k.split()[-4:] == ["2", "14.8", "7.41", "5.6"]  # two launches, 9.312 + 5.504 us
    assert norm.startswith("rms_norm")
