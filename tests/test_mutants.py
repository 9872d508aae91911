"""`harness mutants`: every planted engine bug must fail the gate (cpu tier,
NumPy engine: the suite CI runs; `--backend cuda` runs the same on the GPU)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness import catalog, mutants


def test_the_whole_suite_is_caught(big_model_lock):
    suite = mutants.for_backend("numpy")
    n = len(suite)
    assert n >= 15
    # gelu-erf is caught on gemma3-270m only: it runs under the lock that keeps two such models from
    # being loaded at once (by this worker and another); the rest need tiny models only
    big = ["gelu-erf"]
    out = []
    for names, locked in (([m.name for m in suite if m.name not in big], False), (big, True)):
        acquire, release = big_model_lock if locked else (lambda: None, lambda: None)
        acquire()
        try:
            p = subprocess.run([sys.executable, "-m", "harness.cli", "mutants", *(f"--mutant={x}" for x in names)],
                               capture_output=True, text=True)
        finally:
            release()
        assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
        assert f"caught {len(names)} of {len(names)} mutants" in p.stdout
        out.append(p.stdout)
    for m in suite:  # one row per mutant, naming the model and the checks that caught it
        (row,) = [line for stdout in out for line in stdout.splitlines() if line.startswith(f"| {m.name} |")]
        assert "NOT CAUGHT" not in row and "NOT JUDGED" not in row and ("(twin)" in row or "(cpu)" in row), row


def test_candidates_are_the_models_with_the_feature_sharpest_first():
    cat = catalog.load()
    pairs = mutants.candidates(cat, mutants.BY_NAME["qkv-bias-dropped"], "numpy", ["cpu"])
    assert {n for n, _ in pairs} == {"tiny-qwen2", "tiny-qwen2-f32"}  # the only models with Q/K/V biases
    assert pairs[0][1] == "twin" or pairs[0][0].endswith("-f32")  # an fp32 comparison first
    assert [s for _, s in pairs][-1] == "cpu"  # the quantised file's own (noisy) references last
    softcap = {n for n, _ in mutants.candidates(cat, mutants.BY_NAME["softcap-dropped"], "numpy", ["cpu"])}
    assert softcap == {"tiny-gemma3", "tiny-gemma3-f32", "tiny-gemma4", "tiny-gemma4moe", "tiny-gemma4moe-f32"}  # gemma3-270m's file has none


def test_a_mutants_first_models_are_tried_first():
    cat = catalog.load()
    gelu = mutants.BY_NAME["gelu-erf"]
    pairs = mutants.candidates(cat, gelu, "numpy", ["cpu"])
    assert pairs[0] == ("gemma3-270m", "twin") and {n for n, _ in pairs} > {"gemma3-270m", "tiny-gemma3"}
    plain = mutants.candidates(cat, mutants.Mutant("x", "", gelu.has_feature, gelu.patches), "numpy", ["cpu"])
    assert sorted(plain) == sorted(pairs) and plain[0][0] != "gemma3-270m"  # else cheapest first
    for m in mutants.MUTANTS:  # a misspelt name would silently try nothing first
        assert set(m.first) <= set(cat), m.name


def test_mutants_of_code_one_engine_lacks_run_on_that_engine_only(capsys):
    from harness import cli

    cuda_only = [m.name for m in mutants.MUTANTS if m.backends == ("cuda",)]
    assert {"xq-min-sums-swapped", "xq-q6k-offset-dropped"} <= set(cuda_only)
    assert not set(cuda_only) & {m.name for m in mutants.for_backend("numpy")}
    assert {m.name for m in mutants.for_backend("cuda")} == {m.name for m in mutants.MUTANTS}
    assert cli.main(["mutants", "--mutant", "xq-q6k-offset-dropped", "--backend", "numpy"]) != 0
    assert "only for the cuda engine, not numpy" in capsys.readouterr().err


def test_an_uncaught_mutant_fails_the_command(monkeypatch, capsys):
    from harness import cli

    noop = mutants.Mutant("no-op", "changes nothing", lambda c: c.arch == "qwen2", lambda: iter(()))
    monkeypatch.setitem(mutants.BY_NAME, "no-op", noop)

    def in_process(cat, names, backend, tiers, models=None, progress=None, jobs=1, exclude=()):
        # the child process would not know this mutant: run it here
        rows = []
        for name in names:
            row = mutants.run_one(mutants.BY_NAME[name], backend,
                                  mutants.candidates(cat, mutants.BY_NAME[name], backend, tiers)[:1])
            row.update(bug=mutants.BY_NAME[name].bug, seconds=0.0)
            rows.append(row)
        return rows

    monkeypatch.setattr(mutants, "run_suite", in_process)
    monkeypatch.setattr(mutants, "control", lambda *a, **kw: [])
    assert cli.main(["mutants", "--mutant", "no-op", "--backend", "numpy"]) == 1
    out = capsys.readouterr().out
    assert "NOT CAUGHT" in out and "caught 0 of 1 mutants" in out


def test_a_failed_child_is_not_judged_not_uncaught():
    rows = [{"mutant": "rms-eps", "bug": "eps", "caught": False, "tried": [], "seconds": 1.0,
             "error": "the mutant's process killed by signal 15"},
            {"mutant": "rope-base", "bug": "base", "caught": False, "tried": ["tiny-llama (twin)"], "seconds": 2.0}]
    table = mutants.format_rows(rows)
    assert "| rms-eps | eps | NOT JUDGED | the mutant's process killed by signal 15 |" in table
    assert "| rope-base | base | NOT CAUGHT | passed on tiny-llama (twin) |" in table


def test_kernel_source_mutants_still_apply_and_compile():
    """A CUDA mutant edits a kernel's source: the text it replaces must still
    be there, and the result must compile (NVRTC runs without a GPU; one row
    per GEMV block, the quickest build of the files that take it)."""
    one = {"GEMV_ROWS": 1}
    for name, file, mark, compiled, defines in (
            ("gelu-erf", "common.cuh", "erff(", "elementwise.cu", {}),
            ("moe-router-sigmoid", "moe.cu", "__expf(-p[i])", "moe.cu", one),
            ("moe-weights-reversed", "moe.cu", "weights[k - 1 - lane]", "moe.cu", one),
            ("post-norms-skipped", "norm.cu", "return v;", "norm.cu", {}),
            ("xq-min-sums-swapped", "gemv.cuh", "* hi.s), mhi", "gemv.cu", one),
            ("xq-q6k-offset-dropped", "gemv.cuh", "0 * __dp4a(", "gemv.cu", one),
            ("glu-up-row-shifted", "gemv.cuh", "(r < H ? 0 : n_out - 1)", "gemv.cu", {"GEMV_ROWS": 2, "GEMV_GLU": 1}),
            ("bulk-glu-up-row-shifted", "gemv.cuh", "(GLU && p ? n_out - 1 : 0)", "gemv.cu",
             {"GEMV_ROWS": 2, "GEMV_GLU": 1, "GEMV_BULK": 1}),
            ("bulk-split-stage-half-refetched", "gemv.cuh", "bulk_copy(part + cut, a0, n - cut, bar);", "gemv.cu",
             {"GEMV_ROWS": 2, "GEMV_BULK": 1, "GEMV_PRE_HALVES": 3}),
            ("ffn-norm-fold-weight-dropped", "gemv.cuh", "return make_float4(v.x, v.y, v.z, v.w);", "gemv.cu",
             {"GEMV_ROWS": 2, "GEMV_GLU": 1, "GEMV_NORM": 1}),
            ("heads-in-v-keys-unformed", "gemv.cu", "if (h < n_head) qk_head", "gemv.cu",
             {"GEMV_ROWS": 1, "GEMV_LATE_WAIT": 1, "GEMV_HEADS": 2}),
            ("attn-merge-first-split", "attention.cu", "u ? 0.0f : e;", "attention.cu", {}),
            ("attn-merge-few-last-split", "attention.cu", "u < n_active - 1) {", "attention.cu", {}),
            ("attn-store-head0-key", "attention.cu", "to_kv(k_new[i])", "attention.cu", {}),
            ("decode-feed-position-stuck", "argmax.cu", "*pos += 0;", "argmax.cu", {}),
            ("deq-q4k-scale-nibble-swapped", "quants.cuh", "(b2 >> 4) | ((b0 >> 6) << 4)", "dequant.cu", {}),
            ("attn-prefill-tile-unmasked", "attention.cu", "kb <= wq_lo &&", "attention.cu", {}),
            ("gelu-quick", "common.cuh", "__expf(-1.702f * g)", "elementwise.cu", {}),
            ("deltanet-conv-state-dropped", "deltanet.cu", "t * C + c] : 0.0f;", "deltanet.cu", {}),
            ("deltanet-decay-sign", "deltanet.cu", "g[i] = -sp * ssm_a[h];", "deltanet.cu", {}),
            ("deltanet-key-heads-grouped", "deltanet.cu", "hk = h / (H_v / H_k);", "deltanet.cu", {}),
            # the precision-class mutants (gemv-acc-f16 twice: its edits are in the staged and the bulk kernel)
            ("gemv-acc-f16", "gemv.cuh", "acc[r] = __half2float(__float2half_rn(acc[r] + Q::dot(buf", "gemv.cu", one),
            ("gemv-acc-f16", "gemv.cuh", "acc[r] = __half2float(__float2half_rn(acc[r] + Q::dot(st", "gemv.cu",
             {"GEMV_ROWS": 2, "GEMV_BULK": 1}),
            ("xq-scale-bf16", "gemv.cuh", "xs.g[g].d = __bfloat162float(__float2bfloat16_rn(", "gemv.cu", one),
            ("xq-block-sum-word-dropped", "gemv.cuh", "o.s = i < 3 ? __dp4a(", "gemv.cu", one),
            ("kv-bf16", "attention.cu", "return __float2half_rn(__bfloat162float(", "attention.cu", {}),
            ("attn-merge-deep-last-split", "attention.cu", "qp >= 2048 ? n_active - 1 : n_active);", "attention.cu",
             {}),
            ("deltanet-chunk-boundary-off-by-one", "deltanet.cu", "t0 += DR_C - 1) {", "deltanet.cu", {})):
        code = ("from harness.mutants import BY_NAME; from engine.backends.cuda import compile as c\n"
                f"with BY_NAME[{name!r}].on():\n"
                f"    assert {mark!r} in (c.KERNELS_DIR / {file!r}).read_text()\n"
                f"    print(len(c.compile_cubin({compiled!r}, 'sm_90', {defines!r})))\n"
                f"assert {mark!r} not in (c.KERNELS_DIR / {file!r}).read_text()  # undone on exit\n")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert p.returncode == 0 and int(p.stdout) > 0, (name, p.stderr[-2000:])


@pytest.mark.parametrize("group,file,kernel", [("INT8_GEMM_MUTANTS", "moe_gemm.cu", b"moe_gemm_i8_q6_k"),
                                               ("WGMMA_GEMM_MUTANTS", "gemm.cu", b"gemm_grouped_q4_k")])
def test_switched_kernel_mutants_apply_and_compile(group, file, kernel):
    """The mutants of a kernel that is off in the tree (the int8 grouped GEMM,
    the wgmma GEMMs; in the suite once the engine runs it): each edit is made
    inside its block alone, and the result compiles."""
    from engine.backends.cuda import compile as nvrtc

    before = (nvrtc.KERNELS_DIR / file).read_text()
    for m in getattr(mutants, group):
        (old, new), = m.patches.kernel_edits[1]
        with m.on():
            text = (nvrtc.KERNELS_DIR / file).read_text()
            assert new in text and old not in text, m.name
            assert kernel in nvrtc.compile_cubin(file, "sm_90"), m.name
    assert (nvrtc.KERNELS_DIR / file).read_text() == before
    assert not {m.name for m in getattr(mutants, group)} & set(mutants.BY_NAME)  # the kernel is off


def test_each_kernel_edit_finds_its_text_once():
    """A kernel-source mutant's text to replace is in its file exactly once
    (the edit replaces every copy: a second copy elsewhere would be a second,
    unintended bug), and every mutant of the suite that edits a kernel says
    which edits it makes."""
    from engine.backends.cuda import compile as nvrtc

    # its `if (u < n_active) {` is in both merges: it was run on the H200 like that
    twice = {"attn-merge-few-last-split"}
    edited = [m for m in mutants.MUTANTS + mutants.INT8_GEMM_MUTANTS + mutants.WGMMA_GEMM_MUTANTS
              if hasattr(m.patches, "kernel_edits")]
    assert {"gemv-acc-f16", "xq-scale-bf16", "xq-block-sum-word-dropped", "kv-bf16", "attn-merge-deep-last-split",
            "deltanet-chunk-boundary-off-by-one"} <= {m.name for m in edited}
    for m in edited:
        file, edits = m.patches.kernel_edits
        text = (nvrtc.KERNELS_DIR / file).read_text()
        for old, new in edits:
            assert text.count(old) == (2 if m.name in twice else 1), (m.name, old)
            assert new not in text, (m.name, new)


def test_a_mutant_is_undone_when_its_block_ends(model_path):
    """Switched on inside ``with mutant.on()`` only: the engine is sound again after."""
    import engine

    path = model_path("tiny-llama-f32")
    before = engine.load(path).config
    with mutants.BY_NAME["rope-base"].on():
        assert engine.load(path).config.rope_base[0] == before.rope_base[0] * 1.01
    assert engine.load(path).config == before


def test_pairs_the_build_itself_fails_judge_no_mutant(monkeypatch):
    """The control (the build with no mutant) runs first: a pair it fails is
    left out of every mutant's tries, and a mutant with no pair left is not
    judged, not caught."""
    from harness import catalog

    cat = catalog.load()
    calls = []

    def child(name, backend, pairs, env):
        calls.append((name, list(pairs)))
        if name == mutants.CONTROL:
            bad = [p for p in pairs if p[0] == "tiny-qwen2"]
            return {"mutant": name, "failed": [{"model": m, "references": s, "first": "FAIL ..."} for m, s in bad]}
        return {"mutant": name, "caught": True, "model": pairs[0][0], "references": pairs[0][1], "checks": ["kl"],
                "first": "FAIL", "tried": [f"{pairs[0][0]} ({pairs[0][1]})"]}

    monkeypatch.setattr(mutants, "_child", child)
    names = ["qkv-bias-dropped", "rms-eps"]  # qkv biases: qwen2 models only
    failed = mutants.control(cat, names, "numpy", ["cpu"])
    assert {f["model"] for f in failed} == {"tiny-qwen2"}
    rows = mutants.run_suite(cat, names, "numpy", ["cpu"], exclude=[(f["model"], f["references"]) for f in failed])
    tried = {name: pairs for name, pairs in calls if name != mutants.CONTROL}
    assert all(m != "tiny-qwen2" for m, _ in tried["rms-eps"])
    bias = next(r for r in rows if r["mutant"] == "qkv-bias-dropped")
    assert "qkv-bias-dropped" in tried or bias.get("error")  # tiny-qwen2-f32 is left for it, or nothing is
