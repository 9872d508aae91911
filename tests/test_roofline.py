"""The scoreboard's rooflines: roofline records (harness roofline --save),
the newest of each GPU, and the measurement itself (on a GPU only)."""

from __future__ import annotations

import pytest

from harness import results, roofline


def rec(gpu="NVIDIA H200", copy=4300.0, gemm=790.0, date="2026-12-01T00:00:00Z", path=None):
    r = {"kind": "roofline", "gpu": gpu, "copy_gb_s": copy, "bf16_tflops": gemm, "date": date}
    return {**r, "_path": path} if path else r


def test_the_newest_record_of_each_gpu_by_name():
    records = [rec(copy=4000.0, date="2026-12-01T00:00:00Z", path="/s/roofline-1.json"),
               rec(copy=4300.0, date="2026-12-02T00:00:00Z", path="/s/roofline-2.json"),
               rec(copy=4100.0, date="2026-11-30T00:00:00Z"),
               rec(gpu="NVIDIA A100", copy=1500.0, gemm=300.0),
               {"kind": "bench", "gpu": "NVIDIA H200", "copy_gb_s": 9e9},  # not a roofline record
               rec(copy=0.0, date="2027-01-01T00:00:00Z"),  # nothing measured is no roofline
               {**rec(date="2027-01-01T00:00:00Z"), "bf16_tflops": None}]
    by = roofline.by_gpu(records)
    assert set(by) == {"NVIDIA H200", "NVIDIA A100"}
    h200 = roofline.for_gpu(records, "NVIDIA H200")
    assert (h200.copy_gb_s, h200.bf16_tflops, h200.file, h200.date) == (4300.0, 790.0, "roofline-2.json",
                                                                         "2026-12-02T00:00:00Z")
    assert h200.text == "4300 GB/s copy, 790 TFLOP/s bf16 on NVIDIA H200 (2026-12-02, roofline-2.json)"
    assert roofline.for_gpu(records, "NVIDIA H100") is None and roofline.for_gpu(records, None) is None
    assert roofline.by_gpu([]) == {}


def test_a_roofline_record_saves_and_loads(tmp_path):
    measured = {"gpu": "NVIDIA H200", "copy_gb_s": 4312.5, "bf16_tflops": 781.25, "date": "2026-12-04T00:00:00Z",
                "copy": {"bytes": 1 << 31, "samples_gb_s": [4310.0, 4315.0]},
                "gemm": {"m": 8192, "n": 8192, "k": 8192, "samples_tflops": [780.0, 782.5]}}
    p = results.save(measured, "roofline", tmp_path)
    assert p.name.startswith("roofline-")
    (back,) = results.load_all(tmp_path)
    assert roofline.for_gpu([back], "NVIDIA H200").copy_gb_s == 4312.5
    assert "copy 4312 GB/s (batches 4310..4315), bf16 GEMM 781 TFLOP/s (batches 780..782, 8192x8192x8192)" in \
        roofline.format_record(back)
    for missing in ("gpu", "copy_gb_s", "bf16_tflops"):
        with pytest.raises(ValueError, match=f"field '{missing}' is missing"):
            results.save({k: v for k, v in measured.items() if k != missing}, "roofline", tmp_path)
    with pytest.raises(ValueError, match="field 'copy_gb_s' is str"):
        results.save({**measured, "copy_gb_s": "fast"}, "roofline", tmp_path)


@pytest.mark.gpu
def test_harness_roofline_measures_this_gpu(tmp_path, capsys):
    """The copy and the GEMM on the GPU: numbers of the right order for any
    recent NVIDIA data-centre GPU, every batch kept, and the record saved."""
    from harness import cli

    assert cli.main(["roofline", "--results-dir", str(tmp_path)]) == 0
    (r,) = results.load_all(tmp_path, kind="roofline")
    assert 100 < r["copy_gb_s"] < 20_000 and 10 < r["bf16_tflops"] < 5_000
    assert len(r["copy"]["samples_gb_s"]) == len(r["gemm"]["samples_tflops"]) >= 5
    assert min(r["copy"]["samples_gb_s"]) <= r["copy_gb_s"] <= max(r["copy"]["samples_gb_s"])
    assert r["gpu"] and r["host"] and r["date"]
    assert roofline.for_gpu([r], r["gpu"]).bf16_tflops == r["bf16_tflops"]
    assert f"{r['gpu']}: copy " in capsys.readouterr().out
