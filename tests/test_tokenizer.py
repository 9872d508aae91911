"""The tokenizer agrees exactly with llama.cpp's llama_tokenize (parse_special=false).

Checked against: llama.cpp's own tokenizer test vectors (tests/test-tokenizer-0:
ggml-vocab-<name>.gguf.inp/.out from the llama-cpp-python 0.3.36 sdist) for the
vocabularies Anvil runs and for the ones that exercise the same code paths
(llama-spm: SentencePiece like Gemma 3; starcoder: SmolLM2's pre-tokenizer);
every prompt of the committed references (the ids llama.cpp produced); and ids
recorded from llama-cpp-python for tricky strings on each of our vocabularies.
"""

from __future__ import annotations

import functools
import json
import re
import tarfile
import time
from pathlib import Path

import pytest

from engine.errors import GGUFError
from engine.gguf_file import GGUFFile
from engine import pretokenize as tokmod
from engine.tokenizer import Tokenizer
from harness import catalog, fetch

REFERENCES = Path(__file__).resolve().parents[1] / "references"


@functools.cache
def _tokenizer(path: str) -> Tokenizer:
    # built once per session; the GGUFFile it is read from is not kept (the
    # reader's views of a 262k-token vocabulary take ~350 MB)
    return Tokenizer.from_gguf(GGUFFile(path))


@pytest.fixture(scope="session")
def llama_bpe_vocab_path():
    return fetch.fetch_llamacpp_vocab("llama-bpe", progress=False)


@pytest.fixture(scope="session")
def vocab_paths(smollm2_path, gemma3_path, qwen2_vocab_path, llama_bpe_vocab_path):
    return {"smollm2": smollm2_path, "gemma3": gemma3_path, "qwen2": qwen2_vocab_path,
            "llama-bpe": llama_bpe_vocab_path}


@pytest.fixture(scope="session")
def tok(vocab_paths):
    """``tok(name)``: the Tokenizer of one of our vocabularies (built once)."""
    return lambda name: _tokenizer(str(vocab_paths[name]))


# ---------------------------------------------------------------------------
# llama.cpp's test vectors

def _read_vectors(gguf: Path) -> list[tuple[str, list[int]]]:
    """tests/test-tokenizer-0.cpp's format: inputs separated by a marker line,
    one line of space-separated ids per input."""
    raw = Path(f"{gguf}.inp").read_bytes().decode("utf-8")
    inputs = raw.split("\n__ggml_vocab_test__\n")
    if inputs and inputs[-1] == "":  # the file ends with the marker
        inputs.pop()
    outputs = Path(f"{gguf}.out").read_text(encoding="utf-8").split("\n")[:len(inputs)]
    assert len(outputs) == len(inputs), f"{gguf}: {len(inputs)} inputs, {len(outputs)} outputs"
    return [(s, [int(t) for t in o.split()]) for s, o in zip(inputs, outputs)]


# qwen2, qwen35 (Qwen3.5/3.6: letter runs take combining marks), llama-bpe,
# gemma-4 (tokenizer.ggml.model "gemma4": SentencePiece-style BPE): ours.
# llama-spm: the SentencePiece path Gemma 3 takes (with a space prefix; Gemma 3
# has none). starcoder: the pre-tokenizer SmolLM2's "smollm" selects. gpt-2: the
# plain GPT-2 splitter that "default" also uses.
@pytest.mark.parametrize("vocab", ["qwen2", "qwen35", "llama-bpe", "gemma-4", "llama-spm", "starcoder", "gpt-2"])
def test_llamacpp_vectors(vocab):
    path = fetch.fetch_llamacpp_vocab(vocab, progress=False)
    cases = _read_vectors(path)
    assert len(cases) >= 40
    t = _tokenizer(str(path))
    bad = [(s, t.encode(s, add_bos=False), ids) for s, ids in cases if t.encode(s, add_bos=False) != ids]
    assert not bad, f"{vocab}: {len(bad)}/{len(cases)} vectors differ, first: {bad[0]!r}"


# ---------------------------------------------------------------------------
# every committed reference prompt

def _reference_files() -> list[Path]:
    return sorted(REFERENCES.glob("*/*.json"))


def _vocab_of(model: str) -> Path:
    """The GGUF holding a catalog model's tokenizer, without generating synthetic
    models: they copy the tokenizer of their preset's vocab source verbatim."""
    e = catalog.entry(model)
    if e.source == "pypi":
        return catalog.model_path(model, progress=False)
    from engine import synth

    return catalog.vocab_source(synth.PRESETS[e.preset].vocab, progress=False)


@pytest.mark.parametrize("ref", _reference_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_reference_prompts(ref):
    data = json.loads(ref.read_text())
    t = _tokenizer(str(_vocab_of(data["model"])))
    assert data["cases"]
    for case in data["cases"]:
        assert t.encode(case["prompt"]) == case["prompt_ids"], case["prompt"]


# ---------------------------------------------------------------------------
# strings recorded from llama-cpp-python: unicode, emoji, digit and whitespace
# runs, contractions, CJK, and special-token text (plain text with
# parse_special=false, except user-defined tokens such as Qwen's <tool_call>,
# which llama.cpp still cuts out). gpt-neox has no tokenizer.ggml.pre: the
# "default" pre-tokenizer.

def _recorded_vocab_path(name: str, vocab_paths) -> Path:
    return vocab_paths[name] if name in vocab_paths else fetch.fetch_llamacpp_vocab(name, progress=False)


@pytest.mark.parametrize("vocab", ["smollm2", "gemma3", "qwen2", "llama-bpe", "gpt-neox"])
def test_recorded_strings(vocab, vocab_paths):
    t = _tokenizer(str(_recorded_vocab_path(vocab, vocab_paths)))
    for s, ids in zip(_RECORDED_STRINGS, _RECORDED_IDS[vocab], strict=True):
        assert t.encode(s) == ids, s
    # add_bos=False drops exactly the BOS that add_bos_token asks for
    for s, ids in zip(_RECORDED_STRINGS, _RECORDED_IDS[vocab]):
        expect = ids[1:] if t.add_bos else ids
        assert t.encode(s, add_bos=False) == expect, s


def test_gemma4_spaces_newline_runs_and_byte_fallback():
    """Gemma 4's tokenizer: spaces are U+2581 inside tokens (and spaces again
    when decoded), a run of newlines that is a token stays one token, a
    character outside the vocabulary falls back to its <0xXX> byte tokens,
    and BOS is always added; every string decodes back to itself."""
    t = _tokenizer(str(fetch.fetch_llamacpp_vocab("gemma-4", progress=False)))
    assert t.add_bos and t.encode("hi")[0] == t.bos_id == 2
    ids = t.encode("a  b", add_bos=False)
    assert "".join(t.tokens[i] for i in ids) == "a\u2581\u2581b"
    nl = "\n" * 3
    assert nl in t.token_to_id and t.encode(nl, add_bos=False) == [t.token_to_id[nl]]
    rare = "\U0001F9EC\U0001FAE8"  # the first is a token, the second falls back to its four bytes
    assert [t.tokens[i] for i in t.encode(rare, add_bos=False)] == ["\U0001F9EC", "<0xF0>", "<0x9F>", "<0xAB>", "<0xA8>"]
    for s in ("Hello world", "  leading and trailing  ", "x\n\n\ny", rare, "日本語のテキスト", ""):
        assert t.decode(t.encode(s, add_bos=False)) == s, s


def test_qwen35_letter_runs_take_combining_marks():
    """Qwen3.5's pre-tokenizer: letter runs also consume combining marks
    (\\p{M}), so Thai vowel signs, Arabic harakat and decomposed Vietnamese
    accents stay inside their words; with qwen2's runs each of these strings
    tokenizes differently. Ids recorded from llama-cpp-python 0.3.36."""
    t = _tokenizer(str(fetch.fetch_llamacpp_vocab("qwen35", progress=False)))
    cases = {
        "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a":
            [127382, 125451, 129328, 124294, 35648, 124311, 125459],
        "\u0627\u0644\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u064e\u0651\u0629 \u0644\u064f\u063a\u064e\u0629":
            [31382, 131319, 131082, 130750, 14558, 27910, 73771, 25871, 56794, 64604, 81778, 27910, 25871],
        "Tie\u0302\u0301ng Vie\u0302\u0323t": [51, 645, 136, 224, 53839, 968, 59302, 136, 224, 136, 96, 83],
    }
    for text, ids in cases.items():
        assert t.encode(text, add_bos=False) == ids, text


def test_special_tokens_are_text(tok):
    qwen = tok("qwen2")
    # control tokens are plain text with parse_special=false ...
    assert qwen.encode("<|im_start|>", add_bos=False) != [qwen.token_to_id["<|im_start|>"]]
    # ... user-defined ones are still cut out first, as llama.cpp does
    assert qwen.encode("a[PAD151646]b", add_bos=False) == [64, qwen.token_to_id["[PAD151646]"], 65]
    gemma = tok("gemma3")
    # (Gemma 3's user-defined tokens are runs of spaces, tabs and newlines)
    assert gemma.encode("x" + " " * 31 + "x", add_bos=False) == [236781, gemma.token_to_id[" " * 31], 236781]
    assert gemma.encode("") == [gemma.bos_id] == [2]
    assert gemma.encode("", add_bos=False) == []
    assert gemma.encode("<start_of_turn>", add_bos=False) != [gemma.token_to_id["<start_of_turn>"]]


# ---------------------------------------------------------------------------
# decoding

_PLAIN = [
    "The capital of France is Paris.",
    "  Two leading spaces, two trailing  ",
    "line one\nline two\n\n\tindented\r\nwindows",
    "don't stop: it's 3.14159, not 22/7 (≈3.142857)!",
    "Ünïcödé, Ελληνικά, Русский, 中文, 日本語, 한국어, العربية, हिन्दी",
    "emoji 🦙🔥 👨‍👩‍👧 and math 𝔘𝔫𝔦 ∑∫√",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "1234567890 " * 3 + " " * 17 + "\n" * 5,
    "rare: \U0001F9A9 \u0E3F \u2603 \U0010FFFD \uE000",
]


@pytest.mark.parametrize("vocab", ["smollm2", "gemma3", "qwen2", "llama-bpe"])
def test_round_trip(vocab, tok):
    t = tok(vocab)
    for s in _PLAIN:
        assert t.decode(t.encode(s, add_bos=False)) == s
        assert t.decode(t.encode(s)) == s  # BOS is a control token: no text unless special
        # a character split across byte tokens decodes piece by piece to the same bytes
        assert b"".join(t.piece(i) for i in t.encode(s)).decode("utf-8") == s


def test_decode_special(tok):
    gemma, qwen = tok("gemma3"), tok("qwen2")
    assert gemma.decode([gemma.bos_id]) == ""
    assert gemma.decode([gemma.bos_id], special=True) == "<bos>"
    im_end = qwen.token_to_id["<|im_end|>"]
    assert qwen.decode([im_end]) == "" and qwen.decode([im_end], special=True) == "<|im_end|>"
    assert im_end in qwen.eog_ids
    # a byte-fallback token alone is half a character: replaced, not raised
    assert gemma.decode([gemma.token_to_id["<0xE2>"]]) == "\ufffd"
    with pytest.raises(ValueError):
        gemma.decode([gemma.n_vocab])


# ---------------------------------------------------------------------------
# metadata

def test_special_ids(tok):
    assert (tok("smollm2").bos_id, tok("smollm2").eos_id, tok("smollm2").add_bos) == (1, 2, False)
    assert (tok("gemma3").bos_id, tok("gemma3").eos_id, tok("gemma3").add_bos) == (2, 1, True)
    assert tok("gemma3").add_space_prefix is False
    assert (tok("qwen2").bos_id, tok("qwen2").add_bos) == (151643, False)
    assert (tok("llama-bpe").bos_id, tok("llama-bpe").eos_id, tok("llama-bpe").add_bos) == (128000, 128001, True)


def test_construction_is_fast(gemma3_path):
    gf = GGUFFile(gemma3_path)
    t0 = time.perf_counter()
    t = Tokenizer.from_gguf(gf)
    elapsed = time.perf_counter() - t0
    assert t.n_vocab == 262144
    assert elapsed < 3.0, f"building the 262k-token gemma3 tokenizer took {elapsed:.2f} s"


def _write_gguf(path: Path, model: str, pre: str | None = None) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("tokenizer.ggml.model", model)
    if pre is not None:
        w.add_string("tokenizer.ggml.pre", pre)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ab"])
    w.add_array("tokenizer.ggml.merges", ["a b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_model_type(tmp_path):
    gf = GGUFFile(_write_gguf(tmp_path / "bert.gguf", "bert"))
    with pytest.raises(GGUFError, match=r"tokenizer\.ggml\.model = 'bert'"):
        Tokenizer.from_gguf(gf)


def test_unsupported_pre_tokenizer(tmp_path):
    gf = GGUFFile(_write_gguf(tmp_path / "dsc.gguf", "gpt2", pre="deepseek-coder"))
    with pytest.raises(GGUFError, match=r"tokenizer\.ggml\.pre = 'deepseek-coder'"):
        Tokenizer.from_gguf(gf)


def test_minimal_bpe(tmp_path):
    """A hand-made vocabulary: no pre key (llama.cpp's 'default'), one merge."""
    t = Tokenizer.from_gguf(GGUFFile(_write_gguf(tmp_path / "tiny.gguf", "gpt2")))
    assert t.pre == "default"
    assert t.encode("abba", add_bos=False) == [2, 1, 0]  # "ab" merged, then "b", "a"
    assert t.encode("a c", add_bos=False) == [0]  # no token for " " or "c": dropped, as llama.cpp does
    assert t.decode([2, 1, 0]) == "abba"


# ---------------------------------------------------------------------------
# the embedded Unicode table is llama.cpp's

def _unicode_data_cpp() -> str:
    tarball = fetch.models_dir() / "llamacpp-sdist" / fetch._SDIST_FILE
    if not tarball.exists():
        pytest.skip(f"no llama-cpp-python sdist at {tarball} (fetch a llama.cpp vocab first)")
    with tarfile.open(tarball, "r:gz") as tf:
        for m in tf:
            if m.name.endswith("vendor/llama.cpp/src/unicode-data.cpp"):
                return tf.extractfile(m).read().decode("utf-8")
    pytest.fail(f"{tarball} has no unicode-data.cpp")


def _block(src: str, name: str) -> str:
    start = src.index(name)
    return src[start:src.index("};", start)]


def encode_unicode_ranges(ranges: list[tuple[int, int]]) -> str:
    """How engine/pretokenize.py's _UNICODE_RANGES_B85 is made (LEB128 start
    deltas + flag bytes, zlib, base85), e.g. after a llama.cpp update:
    encode_unicode_ranges(_parse_ranges(unicode_data_cpp_text))."""
    import base64
    import zlib

    out, prev = bytearray(), 0
    for start, flags in ranges:
        d, prev = start - prev, start
        while d >= 0x80:
            out.append((d & 0x7F) | 0x80)
            d >>= 7
        out += bytes((d, flags))
    return base64.b85encode(zlib.compress(bytes(out), 9)).decode()


def _parse_ranges(src: str) -> list[tuple[int, int]]:
    block = _block(src, "unicode_ranges_flags = {")
    return [(int(a, 16), int(b, 16)) for a, b in re.findall(r"\{0x([0-9A-Fa-f]+), 0x([0-9A-Fa-f]+)\}", block)]


def test_unicode_table_matches_llamacpp():
    src = _unicode_data_cpp()
    ranges = _parse_ranges(src)
    assert len(ranges) > 2000
    assert tokmod.unicode_ranges() == ranges
    assert encode_unicode_ranges(ranges) == "".join(tokmod._UNICODE_RANGES_B85)
    ws = [int(x, 16) for x in re.findall(r"0x([0-9A-Fa-f]+)", _block(src, "unicode_set_whitespace = {"))]
    assert sorted(ws) == sorted(tokmod._WHITESPACE)


# ---------------------------------------------------------------------------
_RECORDED_STRINGS = [
    'Hello world',
    ' Hello  world  ',
    '   leading spaces\n\n\n',
    'tabs\t\there\t\r\n\r end',
    "don't I'll we've THEY'RE it'S 'll 'Ve 'LL",
    '123 4567 89012345 1,234.56 \xbd \xb2\xb3 \u0663\u0664\u0665 \u2460\u2461',
    'emoji \U0001f999\U0001f525\U0001f468\u200d\U0001f469\u200d\U0001f467 test',
    '\u4e2d\u6587\u5b57\u7b26\u6d4b\u8bd5\uff0c\u4f60\u597d\uff01\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4',
    '\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0420\u0443\u0441\u0441\u043a\u0438\u0439 I\xf1t\xebrn\xe2ti\xf4n\xe0liz\xe6ti\xf8n',
    '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n',
    '<start_of_turn>user\nhi<end_of_turn>\n<bos><eos></s>',
    '<|endoftext|><|fim_prefix|>x<|fim_suffix|>y<|fim_middle|><|repo_name|>',
    '<tool_call>{"a": 1}</tool_call><think>\n\n</think>',
    '<|begin_of_text|><|eot_id|><|start_header_id|>',
    'a\xa0b\u2009c\u3000d\x85e\u200bf\ufeff',
    'combining e\u0301 n\u0303 \x00\x01\x7f',
    'def f(x):\n    return x**2  # comment\n\n\tpass\n',
    '$100 + 5% = <x> ^ ~ | ` @ # ........!!!!!????',
    '\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522 \U0001f600 \U00010000 \U0010fffd \ue000',
    '\u01c5ungla \u01c8 \u216b \u2177 \ufb01 \ufb02 \u24b6\u24d1 \u3251 \u3007',
    '\u0600 \u0661\u0662\u0663 \u0639\u0631\u0628\u0649 \u0926\u0947\u0935\u0928\u093e\u0917\u0930\u0940 \u0e44\u0e17\u0e22',
    '<unused0> [multimodal] <start_of_image> <table><tr><td>x</td></tr></table>',
    '                    x\n\n\n\n\n\n\n\n\n1111111111111',
]
_RECORDED_IDS = {
    'smollm2': [
        [19556, 905],
        [38699, 216, 905, 256],
        [256, 2899, 5600, 16506],
        [100, 7366, 197, 197, 1531, 197, 7209, 1112],
        [12420, 982, 339, 3060, 392, 3543, 6462, 73, 23, 3256, 357, 23, 67, 637, 764, 637, 25917, 637, 16421],
        [33, 34, 35, 216, 36, 37, 38, 39, 216, 40, 41, 32, 33, 34, 35, 36, 37, 216, 33, 28, 34, 35, 36, 30, 37,
         38, 216, 16738, 216, 19133, 39050, 216, 164, 113, 164, 114, 164, 115, 216, 173, 235, 250, 173, 235, 111],
        [391, 33777, 15107, 116, 243, 10813, 238, 115, 10813, 235, 118, 321, 231, 10813, 235, 119, 321, 231,
         10813, 235, 117, 1028],
        [28589, 29184, 36518, 40562, 116, 43222, 229, 16313, 239, 12831, 18645, 250, 48392, 138, 8083, 219, 23274,
         115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226, 216, 33085, 246, 181,
         130, 251, 183, 240, 129],
        [153, 239, 17162, 17162, 25723, 11517, 12001, 21118, 26112, 5470, 250, 14714, 9382, 39511, 7872, 24958,
         339, 10214, 100, 26547, 36793, 9612, 14981, 21637, 94, 16739, 92, 463, 16467, 14981, 21817, 94],
        [44, 108, 306, 79, 3738, 108, 46, 4093, 198, 6004, 44, 108, 306, 79, 486, 108, 46, 198, 44, 108, 306, 79,
         3738, 108, 46, 520, 9531, 198],
        [44, 3738, 79, 1714, 79, 20589, 46, 4093, 198, 6004, 44, 486, 79, 1714, 79, 20589, 46, 198, 44, 34761,
         21198, 85, 395, 29299, 99, 46],
        [44, 108, 486, 1714, 2692, 108, 21198, 108, 86, 306, 79, 12821, 108, 46, 104, 44, 108, 86, 306, 79, 30370,
         108, 46, 105, 44, 108, 86, 306, 79, 22876, 108, 21198, 108, 22139, 79, 1245, 108, 46],
        [44, 19324, 79, 4350, 46, 39428, 81, 1799, 216, 33, 109, 9617, 19324, 79, 4350, 21198, 17400, 46, 198,
         198, 9617, 17400, 46],
        [44, 108, 21083, 79, 1714, 79, 2692, 108, 21198, 108, 85, 320, 79, 311, 108, 21198, 108, 3738, 79, 12476,
         79, 311, 108, 46],
        [81, 15442, 82, 321, 227, 83, 12109, 218, 84, 141, 223, 85, 321, 229, 86, 186, 136, 140],
        [14558, 1294, 297, 151, 219, 304, 151, 221, 216, 190, 191, 217],
        [1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 216, 907, 5189, 1116, 197, 5467, 198],
        [20, 33, 32, 32, 1232, 216, 37, 21, 446, 2067, 104, 46, 13481, 11417, 2504, 2179, 3394, 907, 216, 13548,
         10095, 29646, 16693, 16693],
        [23159, 238, 242, 23159, 238, 121, 23159, 238, 116, 23159, 238, 250, 23159, 238, 122, 23159, 238, 111,
         23159, 238, 112, 40303, 218, 216, 187, 234, 218, 218, 216, 189, 233, 140, 138, 216, 185, 218, 218],
        [146, 223, 2280, 5825, 216, 146, 226, 216, 173, 223, 121, 216, 173, 223, 132, 40367, 216, 20755, 220,
         4636, 236, 131, 173, 237, 235, 216, 174, 227, 235, 216, 12109, 225],
        [163, 218, 216, 164, 111, 164, 112, 164, 113, 45704, 20602, 31462, 164, 227, 12335, 116, 30581, 38050,
         30658, 18075, 4300, 241, 21891, 37189, 216, 31933, 222, 10283, 241, 10283, 112],
        [44, 419, 3447, 32, 46, 933, 10593, 306, 32058, 77, 2067, 3738, 79, 1714, 79, 5028, 46, 2067, 6413, 21198,
         8489, 21198, 11474, 46, 104, 9617, 11474, 29299, 8489, 29299, 6413, 46],
        [42185, 1792, 22342, 1116, 16506, 33, 33, 33, 33, 33, 33, 33, 33, 33, 33, 33, 33, 33],
    ],
    'gemma3': [
        [2, 9259, 1902],
        [2, 26352, 138, 12392, 138],
        [2, 139, 26016, 9952, 109],
        [2, 39218, 255969, 8472, 255968, 251, 107, 251, 1345],
        [2, 13246, 236789, 236745, 564, 236789, 859, 692, 236789, 560, 98321, 236789, 1357, 625, 236789, 236773,
         756, 859, 756, 32541, 756, 2182],
        [2, 236770, 236778, 236800, 236743, 236812, 236810, 236825, 236832, 236743, 236828, 236819, 236771,
         236770, 236778, 236800, 236812, 236810, 236743, 236770, 236764, 236778, 236800, 236812, 236761, 236810,
         236825, 47041, 145191, 239158, 223766, 242090, 242323, 85761, 240567],
        [2, 67906, 236743, 478, 397, 404, 391, 240785, 243874, 237243, 243767, 237243, 244814, 1594],
        [2, 237103, 31818, 238741, 30203, 236900, 144626, 237354, 94951, 236945, 95830, 50413, 237430],
        [2, 238600, 109959, 42220, 214089, 564, 237168, 236745, 35227, 236749, 237130, 3916, 13003, 236937, 94260,
         237543, 3916, 84093],
        [2, 236820, 236909, 548, 236779, 3041, 111038, 2364, 107, 2202, 236820, 236909, 548, 236779, 643, 111038,
         107, 236820, 236909, 548, 236779, 3041, 111038, 111457, 107],
        [2, 236820, 3041, 236779, 1340, 236779, 887, 236813, 2364, 107, 2202, 236820, 643, 236779, 1340, 236779,
         887, 236813, 107, 236820, 46757, 1798, 211827, 2588, 236751, 236813],
        [2, 236820, 236909, 643, 1340, 1005, 236909, 1798, 236909, 155937, 236779, 20836, 111038, 236781, 236820,
         236909, 155937, 236779, 52202, 111038, 236762, 236820, 236909, 155937, 236779, 16599, 236909, 1798,
         236909, 30050, 236779, 1201, 111038],
        [2, 236820, 13205, 236779, 6639, 236813, 14937, 236746, 1083, 236743, 236770, 17001, 13205, 236779, 6639,
         1798, 36345, 236813, 108, 954, 36345, 236813],
        [2, 236820, 236909, 1906, 236779, 1340, 236779, 1005, 236909, 1798, 236909, 236744, 557, 236779, 547,
         236909, 1798, 236909, 3041, 236779, 5653, 236779, 547, 111038],
        [2, 236746, 432, 398, 236763, 464, 366, 375, 236755, 465, 366, 366, 236753, 432, 371, 236744, 237141,
         236760, 237922],
        [2, 20024, 4049, 545, 238288, 538, 240810, 236743, 238, 249732, 251541],
        [2, 2063, 517, 236769, 236781, 1473, 107, 140, 2060, 1123, 1018, 236778, 138, 236865, 5739, 108, 255968,
         4373, 107],
        [2, 236795, 236770, 236771, 236771, 900, 236743, 236810, 236908, 578, 655, 236781, 236813, 8201, 2578,
         1109, 2165, 1392, 997, 151784, 73211, 38950],
        [2, 478, 395, 386, 390, 478, 395, 386, 409, 254865, 478, 395, 386, 398, 255458, 478, 395, 386, 399, 478,
         395, 386, 400, 163543, 236743, 478, 382, 366, 366, 236743, 482, 381, 429, 427, 236743, 245863],
        [2, 437, 371, 1228, 2149, 236743, 437, 374, 236743, 464, 371, 409, 236743, 464, 371, 421, 97940, 236743,
         243272, 236743, 252423, 255682, 236743, 465, 375, 383, 236743, 242354],
        [2, 454, 366, 115241, 241303, 242044, 57212, 237150, 28038, 1238, 39085, 127604],
        [2, 236820, 63634, 236771, 236813, 236743, 5, 236743, 255999, 236743, 168, 173, 175, 236781, 183, 181,
         176],
        [2, 156, 236781, 115, 236770, 236770, 236770, 236770, 236770, 236770, 236770, 236770, 236770, 236770,
         236770, 236770, 236770],
    ],
    'qwen2': [
        [9707, 1879],
        [21927, 220, 1879, 256],
        [256, 6388, 12621, 1406],
        [30993, 197, 197, 6739, 4474, 201, 835],
        [15007, 944, 358, 3278, 582, 3003, 62493, 94153, 432, 13272, 364, 654, 364, 42612, 364, 4086],
        [16, 17, 18, 220, 19, 20, 21, 22, 220, 23, 24, 15, 16, 17, 18, 19, 20, 220, 16, 11, 17, 18, 19, 13, 20,
         21, 220, 26062, 220, 29456, 43201, 220, 149, 96, 149, 97, 149, 98, 220, 48312, 254, 48312, 94],
        [37523, 11162, 99, 247, 144670, 145367, 378, 235, 145233, 378, 235, 145665, 1273],
        [104811, 48391, 81705, 3837, 108386, 6313, 101059, 102819, 15767, 56833, 61803, 70534, 130092, 31079],
        [144674, 33486, 33486, 41424, 33269, 29762, 67337, 74134, 140869, 126302, 358, 5653, 83, 12179, 35622,
         8835, 10251, 61452, 6362, 75, 449, 9191, 10251, 6151, 77],
        [27, 91, 318, 4906, 91, 29, 872, 198, 6023, 27, 91, 318, 6213, 91, 397, 27, 91, 318, 4906, 91, 29, 77091,
         198],
        [27, 2468, 3575, 37274, 29, 872, 198, 6023, 27, 408, 3575, 37274, 397, 33177, 436, 1784, 84399, 1472, 82,
         29],
        [27, 91, 8691, 723, 427, 91, 1784, 91, 69, 318, 13974, 91, 29, 87, 27, 91, 69, 318, 37151, 91, 29, 88, 27,
         91, 69, 318, 62580, 91, 1784, 91, 23476, 1269, 91, 29],
        [27, 14172, 13429, 88863, 64, 788, 220, 16, 5361, 14172, 13429, 1784, 26865, 1339, 522, 26865, 29],
        [27, 91, 7265, 3575, 4326, 91, 1784, 91, 68, 354, 842, 91, 1784, 91, 2468, 8757, 842, 91, 29],
        [64, 4102, 65, 378, 231, 66, 22441, 67, 126, 227, 68, 15692, 69, 3225],
        [21873, 5740, 384, 53839, 308, 136, 225, 220, 188, 189, 221],
        [750, 282, 2075, 982, 262, 470, 856, 334, 17, 220, 671, 3980, 271, 41431, 198],
        [3, 16, 15, 15, 488, 220, 20, 4, 284, 366, 87, 29, 6306, 3968, 760, 1565, 569, 671, 45096, 69800, 26610],
        [124026, 246, 124026, 104, 149880, 124026, 254, 149881, 124026, 94, 149879, 90316, 220, 123934, 222, 222,
         220, 176, 237, 123, 121, 220, 170, 222, 222],
        [131, 227, 2185, 4260, 220, 131, 230, 220, 70467, 104, 220, 70467, 115, 32495, 70731, 32495, 105, 224,
         2858, 240, 114, 146910, 220, 124054, 239, 220, 1277, 229],
        [148, 222, 220, 149, 94, 149, 95, 149, 96, 43982, 124011, 55057, 14925, 99, 54784, 113, 60096, 31411, 245,
         44179, 43647, 220, 125451],
        [27, 24713, 15, 29, 508, 25875, 318, 57597, 60, 366, 2468, 3575, 4954, 29, 366, 2005, 1784, 376, 1784,
         1296, 28257, 522, 1296, 1472, 376, 1472, 2005, 29],
        [503, 856, 54060, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16],
    ],
    'llama-bpe': [
        [128000, 9906, 1917],
        [128000, 22691, 220, 1917, 256],
        [128000, 256, 6522, 12908, 1432],
        [128000, 32093, 197, 197, 6881, 4574, 201, 842],
        [128000, 15357, 956, 358, 3358, 584, 3077, 63593, 95253, 433, 13575, 364, 657, 364, 43712, 364, 4178],
        [128000, 4513, 220, 10961, 22, 220, 21381, 4513, 1774, 220, 16, 11, 11727, 13, 3487, 220, 27154, 220,
         30556, 44301, 220, 117413, 124079, 124043, 220, 118075, 119560],
        [128000, 38623, 11410, 99, 247, 9468, 242, 98, 9468, 239, 101, 102470, 9468, 239, 102, 102470, 9468, 239,
         100, 1296],
        [128000, 108891, 49491, 82805, 104660, 53901, 6447, 102433, 102158, 16144, 57933, 62903, 71634, 104008,
         32179],
        [128000, 100477, 109164, 102434, 121258, 101591, 358, 5771, 83, 12456, 36722, 9011, 10462, 62552, 6496,
         75, 450, 9371, 10462, 6282, 77],
        [128000, 27, 91, 318, 5011, 91, 29, 882, 198, 6151, 27, 91, 318, 6345, 91, 397, 27, 91, 318, 5011, 91, 29,
         78191, 198],
        [128000, 27, 2527, 3659, 38374, 29, 882, 198, 6151, 27, 408, 3659, 38374, 397, 34277, 437, 1822, 85499,
         1500, 82, 29],
        [128000, 27, 91, 8862, 728, 428, 91, 1822, 91, 69, 318, 14301, 91, 29, 87, 27, 91, 69, 318, 38251, 91, 29,
         88, 27, 91, 69, 318, 63680, 91, 1822, 91, 24373, 1292, 91, 29],
        [128000, 27, 14506, 13735, 89963, 64, 794, 220, 16, 5474, 14506, 13735, 1822, 27963, 1363, 524, 27963,
         29],
        [128000, 27, 91, 7413, 3659, 4424, 91, 1822, 91, 68, 354, 851, 91, 1822, 91, 2527, 8932, 851, 91, 29],
        [128000, 64, 115648, 105584, 66, 23249, 67, 116360, 68, 16067, 69, 3305],
        [128000, 22631, 5859, 384, 54939, 308, 119074, 220, 188, 189, 221],
        [128000, 755, 282, 2120, 997, 262, 471, 865, 334, 17, 220, 674, 4068, 271, 42531, 198],
        [128000, 3, 1041, 489, 220, 20, 4, 284, 366, 87, 29, 6440, 4056, 765, 1595, 571, 674, 46196, 70900,
         27708],
        [128000, 57352, 242, 246, 57352, 242, 104, 57352, 242, 99, 57352, 242, 254, 57352, 242, 105, 57352, 242,
         94, 57352, 242, 95, 91416, 109697, 238, 222, 222, 220, 176, 237, 123, 121, 101274, 222, 222],
        [128000, 131, 227, 2234, 4355, 220, 131, 230, 220, 71567, 104, 220, 71567, 115, 33595, 71831, 33595,
         120912, 2928, 240, 114, 158, 241, 239, 220, 159, 231, 239, 220, 115412],
        [128000, 148, 222, 220, 109610, 110546, 117413, 113775, 56157, 100291, 101993, 61196, 112539, 44747,
         124554],
        [128000, 27, 25743, 15, 29, 510, 26961, 318, 58697, 60, 366, 2527, 3659, 5060, 29, 366, 2048, 1822, 376,
         1822, 1320, 29357, 524, 1320, 1500, 376, 1500, 2048, 29],
        [128000, 504, 865, 55160, 5037, 5037, 5037, 5037, 16],
    ],
    'gpt-neox': [
        [12092, 1533],
        [24387, 50276, 10186, 50276],
        [50275, 16378, 8470, 2756],
        [33754, 186, 186, 1568, 186, 4888, 990],
        [9903, 8, 85, 309, 8, 620, 359, 8, 306, 35460, 8, 1848, 352, 8, 52, 209, 8, 620, 209, 8, 31516, 209, 8,
         2293],
        [10683, 209, 25133, 24, 209, 25, 2270, 10683, 1857, 209, 18, 13, 20210, 15, 3208, 209, 8313, 209, 15818,
         19281, 209, 149, 98, 149, 99, 149, 100, 209, 158, 228, 243, 158, 228, 96],
        [43208, 8020, 22692, 101, 236, 14931, 231, 100, 14931, 228, 103, 325, 224, 14931, 228, 104, 325, 224,
         14931, 228, 102, 1071],
        [13609, 20855, 30886, 18947, 101, 21998, 222, 11894, 232, 6238, 24553, 34439, 26680, 49868, 19119, 241,
         3917, 28656, 33548, 38206, 209, 39742, 166, 115, 244, 39907],
        [138, 232, 29704, 4992, 3147, 12388, 8348, 32082, 46640, 10453, 18664, 309, 6621, 85, 10093, 30930, 6457,
         6811, 9837, 79, 5991, 77, 478, 5507, 6811, 7256, 79],
        [29, 93, 303, 64, 5478, 49651, 4537, 187, 5801, 29, 93, 303, 64, 423, 49651, 187, 29, 93, 303, 64, 5478,
         49651, 515, 5567, 187],
        [29, 5478, 64, 1171, 64, 14077, 31, 4537, 187, 5801, 29, 423, 64, 1171, 64, 14077, 31, 187, 29, 37298,
         2730, 70, 375, 3073, 84, 31],
        [29, 93, 423, 1171, 1156, 93, 2730, 93, 71, 303, 64, 15445, 49651, 89, 29, 93, 71, 303, 64, 49959, 49651,
         90, 29, 93, 71, 303, 64, 16389, 93, 2730, 93, 38589, 64, 1590, 49651],
        [29, 19210, 64, 4065, 31, 9819, 66, 1381, 209, 18, 28379, 19210, 64, 4065, 2730, 18959, 31, 535, 870,
         18959, 31],
        [29, 93, 2043, 64, 1171, 64, 1156, 93, 2730, 93, 70, 302, 64, 301, 93, 2730, 93, 5478, 64, 10146, 64, 301,
         49651],
        [66, 575, 67, 1186, 68, 19409, 69, 16643, 70, 12882, 71, 41497],
        [17890, 1699, 299, 136, 212, 295, 136, 214, 209, 177, 178, 210],
        [1545, 269, 9, 89, 2262, 187, 50274, 2309, 1269, 424, 19, 50276, 4, 4385, 535, 186, 5858, 187],
        [5, 2313, 209, 12, 209, 22, 6, 209, 30, 209, 29, 89, 31, 209, 63, 209, 95, 209, 93, 2634, 209, 33, 209, 4,
         209, 5638, 4672, 15844, 25561],
        [172, 240, 231, 235, 172, 240, 231, 106, 172, 240, 231, 101, 172, 240, 231, 243, 172, 240, 231, 107, 172,
         240, 231, 96, 172, 240, 231, 97, 49042, 211, 209, 172, 227, 211, 211, 209, 176, 226, 19675, 209, 170,
         211, 211],
        [131, 216, 1947, 4123, 209, 131, 219, 209, 158, 216, 106, 209, 158, 216, 117, 16141, 107, 212, 16141, 107,
         213, 3384, 229, 116, 158, 230, 228, 209, 159, 220, 228, 209, 2155, 218],
        [148, 211, 209, 149, 96, 149, 97, 149, 98, 25849, 6900, 13621, 25378, 6280, 101, 15472, 40808, 23068,
         12001, 46069, 15754, 22224, 209, 40366, 37948, 34816],
        [29, 328, 3197, 17, 31, 209, 60, 9961, 303, 26306, 62, 209, 29, 5478, 64, 1171, 64, 5695, 31, 209, 29,
         2420, 2730, 1206, 2730, 2851, 31, 89, 870, 2851, 3073, 1206, 3073, 2420, 31],
        [50258, 89, 25330, 187, 10768, 10768, 10768, 10768, 18],
    ],
}
