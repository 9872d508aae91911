"""Bad input: every user mistake is one line naming the file and the key,
tensor or value, a non-zero exit, and no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

N_EMBD, N_HEAD, N_FF, N_VOCAB, N_LAYER = 32, 2, 64, 40, 1


def write_tiny(path, *, arch="llama", drop_key=None, tensor_shapes=None, q2k=False, keys=None, values=None):
    """A minimal random-weight llama-style GGUF, optionally broken on purpose:
    ``keys`` {name: (adder name, value)} adds or replaces metadata, ``values``
    {tensor: (index, value)} plants one value in a tensor."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), arch)
    extra_keys = keys
    keys = {
        f"{arch}.context_length": (w.add_uint32, 16),
        f"{arch}.embedding_length": (w.add_uint32, N_EMBD),
        f"{arch}.block_count": (w.add_uint32, N_LAYER),
        f"{arch}.feed_forward_length": (w.add_uint32, N_FF),
        f"{arch}.attention.head_count": (w.add_uint32, N_HEAD),
        f"{arch}.attention.layer_norm_rms_epsilon": (w.add_float32, 1e-5),
    }
    keys.update({k: (getattr(w, add), v) for k, (add, v) in (extra_keys or {}).items()})
    for k, (add, v) in keys.items():
        if k != drop_key:
            add(k, v)
    w.add_token_list([f"t{i}" for i in range(N_VOCAB)])
    shapes = {
        "token_embd.weight": (N_VOCAB, N_EMBD), "output_norm.weight": (N_EMBD,),
        "blk.0.attn_norm.weight": (N_EMBD,), "blk.0.attn_q.weight": (N_EMBD, N_EMBD),
        "blk.0.attn_k.weight": (N_EMBD, N_EMBD), "blk.0.attn_v.weight": (N_EMBD, N_EMBD),
        "blk.0.attn_output.weight": (N_EMBD, N_EMBD), "blk.0.ffn_norm.weight": (N_EMBD,),
        "blk.0.ffn_gate.weight": (N_FF, N_EMBD), "blk.0.ffn_up.weight": (N_FF, N_EMBD),
        "blk.0.ffn_down.weight": (N_EMBD, N_FF),
    }
    shapes.update(tensor_shapes or {})
    for name, shape in shapes.items():
        t = rng.standard_normal(shape).astype(np.float32) * 0.1
        if name in (values or {}):
            t.reshape(-1)[values[name][0]] = values[name][1]
        w.add_tensor(name, t)
    if q2k:  # a Q2_K tensor: a valid GGUF type that Anvil does not implement
        w.add_tensor("blk.0.extra.weight", np.zeros((1, 84), np.uint8), raw_dtype=GGMLQuantizationType.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def run_generate(path, *extra):
    return subprocess.run([sys.executable, "-m", "engine", "generate", str(path), "--prompt-ids", "1,2,3", "-n", "2",
                           *extra], capture_output=True, text=True)


def assert_one_line_error(r, *fragments):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def test_good_tiny_model_generates(tmp_path):
    r = run_generate(write_tiny(tmp_path / "ok.gguf"), "--json")
    assert r.returncode == 0, r.stderr
    assert '"tokens": [' in r.stdout


def test_not_a_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("hello, this is not a model\n")
    assert_one_line_error(run_generate(p), str(p), "not a GGUF")


def test_missing_file(tmp_path):
    assert_one_line_error(run_generate(tmp_path / "nope.gguf"), "nope.gguf", "no such file")


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_truncated(tmp_path, keep):
    """Cut inside the tensor data (tensors are most of a file)."""
    good = write_tiny(tmp_path / "ok.gguf").read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(good[: int(len(good) * keep)])
    assert_one_line_error(run_generate(p), str(p), "truncated")


def test_truncated_in_header(tmp_path):
    good = write_tiny(tmp_path / "ok.gguf").read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(good[:200])
    assert_one_line_error(run_generate(p), str(p), "truncated")


def test_missing_required_key(tmp_path):
    p = write_tiny(tmp_path / "nokey.gguf", drop_key="llama.attention.layer_norm_rms_epsilon")
    assert_one_line_error(run_generate(p), str(p), "llama.attention.layer_norm_rms_epsilon")


def test_unsupported_architecture(tmp_path):
    p = write_tiny(tmp_path / "mamba.gguf", arch="mamba")
    assert_one_line_error(run_generate(p), str(p), "unsupported architecture 'mamba'")


def test_unsupported_tensor_type(tmp_path):
    p = write_tiny(tmp_path / "q2k.gguf", tensor_shapes={}, q2k=True)
    # Q2_K sits in a tensor the model does not use: the file still loads...
    assert run_generate(p).returncode == 0
    # ...but one the model needs fails by name
    p2 = tmp_path / "q2k_used.gguf"
    _write_q2k_weight(p2)
    assert_one_line_error(run_generate(p2), str(p2), "blk.0.ffn_up.weight", "Q2_K")


def _write_q2k_weight(path):
    w = GGUFWriter(str(path), "llama")
    for k, v in [("context_length", 16), ("embedding_length", 256), ("block_count", 1),
                 ("feed_forward_length", 256), ("attention.head_count", 2)]:
        w.add_uint32(f"llama.{k}", v)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_token_list([f"t{i}" for i in range(N_VOCAB)])
    rng = np.random.default_rng(1)
    for name, shape in {"token_embd.weight": (N_VOCAB, 256), "output_norm.weight": (256,),
                        "blk.0.attn_norm.weight": (256,), "blk.0.attn_q.weight": (256, 256),
                        "blk.0.attn_k.weight": (256, 256), "blk.0.attn_v.weight": (256, 256),
                        "blk.0.attn_output.weight": (256, 256), "blk.0.ffn_norm.weight": (256,),
                        "blk.0.ffn_gate.weight": (256, 256), "blk.0.ffn_down.weight": (256, 256)}.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((256, 84), np.uint8), raw_dtype=GGMLQuantizationType.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_shape_mismatch(tmp_path):
    p = write_tiny(tmp_path / "shape.gguf", tensor_shapes={"blk.0.ffn_up.weight": (N_FF + 8, N_EMBD)})
    assert_one_line_error(run_generate(p), str(p), "blk.0.ffn_up.weight", f"[{N_EMBD}, {N_FF + 8}]",
                          f"[{N_EMBD}, {N_FF}]")


def test_prompt_longer_than_context(tmp_path):
    p = write_tiny(tmp_path / "ok.gguf")
    r = subprocess.run([sys.executable, "-m", "engine", "generate", str(p), "--prompt-ids",
                        ",".join(["1"] * 20), "-n", "2"], capture_output=True, text=True)
    assert_one_line_error(r, str(p), "20 tokens", "context of 16")


def test_token_outside_vocabulary(tmp_path):
    p = write_tiny(tmp_path / "ok.gguf")
    r = subprocess.run([sys.executable, "-m", "engine", "generate", str(p), "--prompt-ids", f"1,{N_VOCAB}", "-n", "2"],
                       capture_output=True, text=True)
    assert_one_line_error(r, str(p), f"token id {N_VOCAB}")


def test_bad_prompt_ids_option(tmp_path):
    p = write_tiny(tmp_path / "ok.gguf")
    r = subprocess.run([sys.executable, "-m", "engine", "generate", str(p), "--prompt-ids", "1,x"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--prompt-ids" in r.stderr


@pytest.mark.parametrize("cmd", [
    ["engine", "bench", "m.gguf", "-r", "0"],
    ["engine", "bench", "m.gguf", "-p", "-5"],
    ["harness.cli", "bench", "--pp-repetitions", "0"],
    ["harness.cli", "bench", "-n", "x"],
    ["harness.cli", "ab", "a.whl", "b.whl", "--rounds", "-1"],
])
def test_bad_counts_are_usage_errors(cmd):
    """Repetitions, rounds and test lengths are checked where they are typed,
    not in a benchmark child process minutes later."""
    r = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "expected a" in r.stderr


@pytest.mark.parametrize("key,add,value,says", [
    ("llama.attention.layer_norm_rms_epsilon", "add_float32", float("nan"), "must be finite and > 0, got nan"),
    ("llama.attention.layer_norm_rms_epsilon", "add_float32", -1.0, "must be finite and > 0, got -1.0"),
    ("llama.attention.layer_norm_rms_epsilon", "add_uint32", 5, "must be a float32, got 5 (int)"),
    ("llama.rope.freq_base", "add_float32", 0.0, "must be finite and > 0, got 0.0"),
    ("llama.rope.freq_base", "add_float32", float("inf"), "must be finite and > 0, got inf"),
    ("llama.rope.scaling.factor", "add_float32", -2.0, "must be finite and >= 0, got -2.0"),
])
def test_hyperparameters_out_of_range(tmp_path, key, add, value, says):
    """Values llama.cpp would read (or refuse) that make garbage, not an error, if trusted."""
    p = write_tiny(tmp_path / "bad.gguf", keys={key: (add, value)})
    assert_one_line_error(run_generate(p), str(p), f"key '{key}'", says)


@pytest.mark.parametrize("tensor,value", [("blk.0.attn_norm.weight", float("nan")),
                                          ("output_norm.weight", float("inf")),
                                          ("blk.0.ffn_norm.weight", float("-inf"))])
def test_non_finite_small_tensor(tmp_path, tensor, value):
    """A NaN in a norm weight made every logit NaN and argmax print token 0."""
    p = write_tiny(tmp_path / "nan.gguf", values={tensor: (3, value)})
    assert_one_line_error(run_generate(p), str(p), f"tensor '{tensor}'", "non-finite", "index 3")


# ---- the layout check: corrupt headers and tensor tables, byte by byte ---------

def _patch(good: bytes, marker: bytes, skip: int, fmt: str, value) -> bytes:
    """``good`` with ``struct.pack(fmt, value)`` written ``skip`` bytes after ``marker``."""
    import struct

    at = good.index(marker) + len(marker) + skip
    new = struct.pack(fmt, value)
    return good[:at] + new + good[at + len(new):]


def _tensor_field(name: str, field: str) -> tuple[bytes, int, str]:
    """(marker, skip, fmt) of a field of a tensor's info record (1-D or 2-D)."""
    n_dims = 1 if "norm" in name else 2
    skip = {"n_dims": 0, "ne0": 4, "type": 4 + 8 * n_dims, "offset": 8 + 8 * n_dims}[field]
    return name.encode(), skip, {"n_dims": "<I", "ne0": "<Q", "type": "<I", "offset": "<Q"}[field]


def _write(tmp_path, data: bytes):
    p = tmp_path / "bad.gguf"
    p.write_bytes(data)
    return p


LAYOUT_CASES = [
    # (case, marker, skip, fmt, value, what the one line says)
    ("token array 2^40 long", b"tokenizer.ggml.tokens", 8, "<Q", 1 << 40, "declares 1099511627776 items"),
    ("token array 2^62 long", b"tokenizer.ggml.tokens", 8, "<Q", 1 << 62, "more than the"),
    ("array of unknown type", b"tokenizer.ggml.tokens", 4, "<I", 99, "array of unknown value type 99"),
    ("key of unknown type", b"llama.block_count", 0, "<I", 77, "unknown value type 77"),
    ("non-UTF-8 architecture", b"general.architecture", 12, "<B", 0xFF, "not valid UTF-8"),
    ("key length past the end", b"general.architecture", -len(b"general.architecture") - 8, "<Q", 1 << 50,
     "truncated or corrupt"),
    ("string length past the end", b"general.architecture", 4, "<Q", 1 << 40, "truncated or corrupt"),
    ("huge key count", b"GGUF", 12, "<Q", 1 << 60, "keys"),
    ("huge tensor count", b"GGUF", 4, "<Q", 1 << 60, "tensors"),
    ("version 7", b"GGUF", 0, "<I", 7, "GGUF version 7"),
    ("alignment not a power of two", b"general.alignment", 4, "<I", 48, "power of two"),
]
for _name, _field, _value, _says in [
        ("blk.0.attn_q.weight", "n_dims", 5, "has 5 dimensions"),
        ("blk.0.attn_q.weight", "n_dims", 0, "has 0 dimensions"),
        ("blk.0.attn_q.weight", "ne0", 0, "every dimension must be"),
        ("blk.0.attn_q.weight", "ne0", 1 << 63, "every dimension must be"),
        ("blk.0.attn_q.weight", "type", 250, "unknown type id 250"),
        ("blk.0.attn_q.weight", "type", 12, "multiple of 256"),          # Q4_K: rows of 32 do not fit
        ("blk.0.attn_q.weight", "type", 8, "bytes before the next tensor"),  # Q8_0: a smaller type leaves a gap
        ("blk.0.attn_norm.weight", "type", 1, "bytes before the next tensor"),  # F32 -> F16 on a norm
        ("blk.0.attn_q.weight", "offset", 16, "not a multiple of the alignment"),
        ("blk.0.attn_q.weight", "offset", 0, "overlaps"),
        ("blk.0.attn_q.weight", "offset", (1 << 64) - 32, "truncated or corrupt"),  # wraps around 2^64
        ("blk.0.ffn_down.weight", "ne0", 128, "truncated or corrupt"),     # reads past the end
]:
    LAYOUT_CASES.append((f"{_name} {_field}={_value}", *_tensor_field(_name, _field), _value, _says))


@pytest.mark.parametrize("case,marker,skip,fmt,value,says", LAYOUT_CASES, ids=[c[0] for c in LAYOUT_CASES])
def test_corrupt_layout_is_one_clear_line(tmp_path, case, marker, skip, fmt, value, says):
    """Counts, lengths, types, UTF-8, offsets, alignment, overlaps and sizes are
    checked before anything is allocated: a clean error in well under a
    second, never a hang, a NumPy message or garbage."""
    import time

    good = write_tiny(tmp_path / "ok.gguf", keys={"general.alignment": ("add_uint32", 32)}).read_bytes()
    p = _write(tmp_path, _patch(good, marker, skip, fmt, value))
    t0 = time.perf_counter()
    r = run_generate(p)
    assert time.perf_counter() - t0 < 30
    assert_one_line_error(r, str(p), says)


@pytest.mark.parametrize("i,patch", [(2, {0: 0xFF}), (1, {-1: 0xC3, "next": 0xA9})],
                         ids=["bad byte", "a character split across two strings"])
def test_a_vocabulary_string_that_is_not_utf8_is_named(tmp_path, i, patch):
    """The vocabulary is UTF-8-checked all at once: a bad string, also one whose
    last byte starts a character the next string's first byte would finish,
    is still named."""
    import struct

    from engine.errors import GGUFError
    from engine.gguf_check import check_layout

    good = bytearray(write_tiny(tmp_path / "ok.gguf").read_bytes())
    at = good.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 4 + 4 + 8  # the first string
    starts = []
    for _ in range(i + 2):
        (n,) = struct.unpack_from("<Q", good, at)
        starts.append((at + 8, n))
        at += 8 + n
    (s0, n0), (s1, _) = starts[i], starts[i + 1]
    assert n0 >= 1
    for where, byte in patch.items():
        good[s1 if where == "next" else (s0 + where if where >= 0 else s0 + n0 + where)] = byte
    p = _write(tmp_path, bytes(good))
    with pytest.raises(GGUFError, match=rf"tokenizer\.ggml\.tokens'\[{i}\] is not valid UTF-8"):
        check_layout(p)


def test_layout_check_is_fast_on_a_real_vocabulary(gemma3_path):
    """262k tokenizer strings walked and UTF-8-checked in a fraction of a second."""
    import time

    from engine.gguf_check import check_layout

    t0 = time.perf_counter()
    check_layout(gemma3_path)
    assert time.perf_counter() - t0 < 2.0


def test_a_directory_is_not_a_model(tmp_path):
    assert_one_line_error(run_generate(tmp_path), str(tmp_path), "is a directory, not a GGUF file")


def test_models_dir_that_is_a_file(tmp_path):
    f = tmp_path / "models"
    f.write_text("not a directory")
    r = subprocess.run([sys.executable, "-m", "harness.cli", "models", "tiny-llama"], capture_output=True, text=True,
                       env={**__import__("os").environ, "ANVIL_MODELS_DIR": str(f)})
    assert_one_line_error(r, str(f), "ANVIL_MODELS_DIR", "not a directory")


def test_synth_into_a_path_that_cannot_be_written(tmp_path):
    f = tmp_path / "plain-file"
    f.write_text("x")
    r = subprocess.run([sys.executable, "-m", "harness.cli", "synth", "--preset", "tiny-llama", str(f / "out.gguf")],
                       capture_output=True, text=True)
    assert_one_line_error(r, str(f), "not a directory, so")
    assert f.read_text() == "x"  # nothing written, nothing left half-written


@pytest.mark.parametrize("extra,says", [(["--rounds", "3"], "at least 4 rounds"),
                                        (["--factor", "-1"], "a ratio above 1"),
                                        (["--factor", "1"], "a ratio above 1"),
                                        (["--factor", "nan"], "a ratio above 1")])
def test_ab_options_checked_first(tmp_path, extra, says):
    r = subprocess.run([sys.executable, "-m", "harness.cli", "ab", "a.whl", "b.whl", *extra],
                       capture_output=True, text=True)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr


def test_ab_missing_wheel_before_any_model_work(tmp_path):
    """The default model is a 5 GB generation: a wrong wheel must be said first."""
    r = subprocess.run([sys.executable, "-m", "harness.cli", "ab", str(tmp_path / "nope.whl"), "installed"],
                       capture_output=True, text=True, env={**__import__("os").environ,
                                                            "ANVIL_MODELS_DIR": str(tmp_path / "models")})
    assert_one_line_error(r, "nope.whl")
    assert not (tmp_path / "models" / "synth").exists()


@pytest.mark.parametrize("args,says", [
    (["diff", "nope", "--prompt", "x"], "unknown model 'nope'"),
    (["diff", "tiny-llama", "--prompt", "x"], "give 2 to 512"),
    (["diff", "tiny-llama", "--prompt", "hello world", "--mutant", "nope"], "unknown mutant nope"),
    (["mutants", "--mutant", "nope"], "unknown mutant(s) nope"),
    (["mutants", "--model", "nope"], "unknown model 'nope'"),
    (["reference", "--tier", "twin", "--model", "tiny-llama-f32"], "has no 'twin' reference set"),
    (["validate-catalog", "--model", "nope"], "unknown model 'nope'"),
    (["synth", "--preset", "nope", "x.gguf"], "unknown preset 'nope'"),
    (["report", "--results-dir", "/nonexistent-anvil-dir"], "no such results directory"),
    (["models", "nope"], "unknown model 'nope'"),
    (["bench", "--model", "/nonexistent-anvil.gguf"], "no such model file"),
    (["bench", "--model", "tiny-llama", "-p", "0", "-n", "0"], "nothing to measure"),
    (["ab", "a.whl", "b.whl", "-p", "0", "-n", "0"], "nothing to measure"),
    (["ab", "HEAD", "installed"], "'HEAD' is a git revision, not a build: pass --commits"),
    (["ab", "installed", "HEAD"], "harness ab --commits installed HEAD"),
])
def test_harness_subcommands_refuse_bad_arguments_in_one_line(model_path, args, says):
    if "tiny-llama" in args:
        model_path("tiny-llama")  # generated first: its progress lines are not this test's subject
    r = subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True)
    assert_one_line_error(r, says)


def test_non_finite_logits_name_the_step(tmp_path):
    """A NaN in a large weight (not checked at load) reaches the logits: the
    run stops with the step, never prints token 0 over and over."""
    from engine import load
    from engine.errors import NonFiniteLogits
    from engine.generate import greedy

    p = write_tiny(tmp_path / "nan-embd.gguf", tensor_shapes={"output.weight": (N_VOCAB, N_EMBD)},  # untied
                   values={"token_embd.weight": (7 * N_EMBD, float("nan"))})  # token 7's embedding
    r = subprocess.run([sys.executable, "-m", "engine", "generate", str(p), "--prompt-ids", "1,2,7", "-n", "3"],
                       capture_output=True, text=True)
    assert_one_line_error(r, str(p), "non-finite logits (NaN or Inf) at step 0 (position 2)")
    # the same token fed while decoding: the error names the decode step
    model = load(p)
    assert len(greedy(model, [1, 2, 3], 3).tokens) == 3  # the file is fine without token 7
    with pytest.raises(NonFiniteLogits, match=r"at step 2 \(position 4\)"):
        greedy(model, [1, 2, 3], 4, forced=[4, 7, 5])


@pytest.mark.parametrize("args,says", [
    ([], "the following arguments are required: command"),
    (["generate"], "the following arguments are required: model"),
    (["generate", "{m}"], "one of the arguments --prompt --prompt-ids is required"),
    (["generate", "{m}", "--prompt-ids", "a,b"], "--prompt-ids must be integers"),
    (["generate", "{m}", "--prompt-ids", ""], "--prompt-ids is empty"),
    (["generate", "{m}", "--prompt-ids", "1", "-n", "0"], "expected a positive integer, got '0'"),
    (["generate", "{m}", "--prompt-ids", "1", "--ctx", "-3"], "expected a positive integer, got '-3'"),
    (["generate", "{m}", "--prompt-ids", "1", "--ctx", "99999999"], "must be 1 to the model's trained context 16"),
    (["generate", "{m}", "--prompt-ids", "1", "--backend", "tpu"], "invalid choice: 'tpu'"),
    (["generate", "{m}", "--prompt-ids", "1", "--kv", "f8"], "invalid choice: 'f8'"),
    (["generate", "{m}", "--prompt-ids", "1", "--backend", "numpy", "--ubatch", "100"],
     "--ubatch 100: the numpy backend runs a prompt 512 tokens at a time"),
    (["generate", "{m}", "--prompt", "hi", "--prompt-ids", "1"], "not allowed with argument --prompt"),
    (["generate", "{m}", "--prompt-ids", "1", "-n", "99"], "exceeds the context of 16"),
    (["generate", "{m}", "--prompt-ids", "1,99999", "-n", "2"], "token id 99999 is outside the vocabulary"),
    (["generate", "{m}", "--prompt", "hi"], "no tokenizer (missing key 'tokenizer.ggml.model'): use --prompt-ids"),
    (["generate", "/nonexistent-anvil.gguf", "--prompt-ids", "1"], "no such file"),
    (["bench", "{m}", "-r", "0"], "expected a positive integer, got '0'"),
    (["bench", "{m}", "-p", "-1"], "expected a non-negative integer, got '-1'"),
    (["bench", "{m}", "-p", "0", "-n", "0"], "nothing to measure"),
    (["bench", "{m}", "-p", "0", "-n", "17"], "-n/--n-gen 17 exceeds the context of 16"),
    (["info", "--bogus"], "unrecognized arguments: --bogus"),
    (["serve", "{m}"], "invalid choice: 'serve'"),
])
def test_engine_subcommands_refuse_bad_arguments_in_one_line(tmp_path, args, says):
    """Every `python -m engine` mistake: exit status 1 or 2, the reason on the
    last line, no traceback (argparse prints its usage above its one error line)."""
    m = write_tiny(tmp_path / "ok.gguf")
    r = subprocess.run([sys.executable, "-m", "engine", *[a.replace("{m}", str(m)) for a in args]],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (1, 2) and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(("error: ", "python -m engine")) and says in last, last
    if r.returncode == 1:  # not a usage error: the one line is all there is
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---- benchmark children that fail, and files that are not what they claim ----------

def _harness(tmp_path, *args):
    env = {**__import__("os").environ, "ANVIL_LOG_DIR": str(tmp_path / "logs")}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.parametrize("args,says", [
    (["bench", "--model", "{fake}", "-p", "0", "-n", "4", "-r", "1"],
     ["engine bench (installed@", "failed (exit status 1): {fake}: not a GGUF file (magic b'hell'"]),
    (["ab", "installed", "installed", "--allow-same", "--model", "{fake}", "--rounds", "4", "-p", "0", "-n", "4",
      "-r", "1"], ["engine bench (installed@", "{fake}: not a GGUF file", "(no round was measured, nothing saved)"]),
    (["bench", "--engine", "{notwheel}", "--model", "{fake}"], ["{notwheel}: not a zip archive"]),
    (["ab", "{notwheel}", "installed", "--model", "{fake}"], ["{notwheel}: not a zip archive"]),
    (["bench", "--model", "{fake}", "--llamacpp", "llama-bench:/nonexistent-anvil/llama-bench"],
     ["llama-bench not found"]),
], ids=["bench", "ab", "bench-not-a-wheel", "ab-not-a-wheel", "bench-no-llama-bench"])
def test_a_failing_benchmark_is_one_line_with_its_log(tmp_path, args, says):
    """A child that fails says its own last error line and where its whole
    output went; none of the bootstrap's source, no traceback."""
    fake, notwheel = tmp_path / "fake.gguf", tmp_path / "x-1.0-py3-none-any.whl"
    fake.write_text("hello, I am not a model\n")
    notwheel.write_text("not a zip")
    r = _harness(tmp_path, *[a.format(fake=fake, notwheel=notwheel) for a in args])
    assert_one_line_error(r, *[f.format(fake=fake, notwheel=notwheel) for f in says])
    if "full log: " in r.stderr:
        log = Path(r.stderr.split("full log: ")[1].split(")")[0])
        assert log.parent == tmp_path / "logs" and "not a GGUF file" in log.read_text()
        assert "--json" in log.read_text()  # the child's whole command line is there, not on the terminal


def test_project_that_does_not_exist_is_an_error():
    r = subprocess.run([sys.executable, "-m", "harness.cli", "--project", "/nonexistent-anvil-dir", "doctor"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == ("harness: error: --project /nonexistent-anvil-dir: no such directory "
                                                 "(the project holds references/catalog.toml)")


def test_an_internal_error_is_one_line_with_its_traceback_in_a_log(tmp_path, monkeypatch, capsys):
    from engine.errors import run_command

    monkeypatch.setenv("ANVIL_LOG_DIR", str(tmp_path))
    monkeypatch.delenv("ANVIL_TRACEBACK", raising=False)

    def broken(args):
        return None.update()

    assert run_command(broken, None) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: internal error (a bug in Anvil): AttributeError: 'NoneType' object has no "
                           "attribute 'update' (traceback: ")
    (log,) = tmp_path.glob("*.log")
    assert str(log) in line and "Traceback" in log.read_text() and "None.update()" in log.read_text()
    monkeypatch.setenv("ANVIL_TRACEBACK", "1")
    with pytest.raises(AttributeError):
        run_command(broken, None)


def test_generate_errors_and_ctrl_c_start_on_a_fresh_line(model_path):
    """The streamed text ends its line before the error (or "interrupted") is said."""
    import os
    import signal
    import time

    m = model_path("tiny-llama")
    r = subprocess.run([sys.executable, "-m", "engine", "generate", str(m), "--prompt", "Hello", "--ctx", "2"],
                       capture_output=True, text=True)
    assert r.stdout == "Hello\n"
    assert_one_line_error(r, "exceeds the context of 2")
    proc = subprocess.Popen([sys.executable, "-m", "engine", "generate", str(m), "--prompt", "Hello", "-n", "4000",
                             "--backend", "numpy"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.read(5) == b"Hello"  # the prompt is out: generation has begun
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and out.endswith(b"\n") and err.decode().strip() == "interrupted", (out, err)
