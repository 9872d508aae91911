"""Text <-> token ids with the GGUF's own tokenizer, exactly as llama.cpp does it.

``Tokenizer.encode`` returns what llama.cpp's ``llama_tokenize(text, add_special,
parse_special=false)`` returns (llama-cpp-python: ``Llama.tokenize(text.encode(),
add_bos=True, special=False)``); ``decode`` concatenates ``llama_token_to_piece``
pieces. The reference is llama.cpp as vendored by llama-cpp-python 0.3.36
(src/llama-vocab.cpp, src/unicode.cpp); the code below follows it step by step,
quirks included, rather than Hugging Face's tokenizers:

* ``tokenizer.ggml.model = "gpt2"``: byte-level BPE. The pre-tokenizer is chosen
  by ``tokenizer.ggml.pre`` (see ``_PRE``) and ports llama.cpp's hand-written
  splitters (``unicode_regex_split_custom_gpt2/llama3/qwen2``) and its
  "collapsed" std::regex fallback for the simple class patterns. Merges are
  applied lowest rank first, ties to the leftmost pair.
* ``tokenizer.ggml.model = "llama"``: SentencePiece BPE: pairs merge highest
  score first (ties leftmost), spaces become U+2581, an optional space prefix,
  and ``<0xXX>`` byte fallback for characters outside the vocabulary.
* ``tokenizer.ggml.model = "gemma4"``: BPE by merge rank as "gpt2", but over
  raw UTF-8 characters with spaces written as U+2581 (llama.cpp's "escaped
  whitespace"), words cut only at newline runs (a run that is a token stays
  one), ``<0xXX>`` byte fallback, and always a BOS.

In both, llama.cpp first cuts user-defined tokens out of the text, even with
parse_special=false (control tokens are then plain text). Token attributes are
derived from ``tokenizer.ggml.token_type`` plus llama.cpp's text-based fix-ups
(EOG/EOT/FIM-looking tokens become control tokens, and so on).

Pre-tokenizers and character classes live in ``pretokenize.py``.
"""

from __future__ import annotations

import heapq

from .errors import GGUFError
from .pretokenize import _BYTE_ENCODE, _PRE, _UNICODE_TO_BYTE, pre_tokenize

# ---------------------------------------------------------------------------
# Token attributes (llama_token_attr) and types (tokenizer.ggml.token_type)

ATTR_UNDEFINED, ATTR_UNKNOWN, ATTR_UNUSED, ATTR_NORMAL = 0, 1 << 0, 1 << 1, 1 << 2
ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_BYTE = 1 << 3, 1 << 4, 1 << 5
ATTR_LSTRIP, ATTR_RSTRIP = 1 << 7, 1 << 8
_TYPE_TO_ATTR = {1: ATTR_NORMAL, 2: ATTR_UNKNOWN, 3: ATTR_CONTROL, 4: ATTR_USER_DEFINED, 5: ATTR_UNUSED,
                 6: ATTR_BYTE}

# Text-based special token detection (llama_vocab::impl::load): key whose id,
# when not set in the GGUF, is looked up by these texts.
_AUTO_SPECIAL = [
    ("tokenizer.ggml.eot_token_id", ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                     "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
                                     "<end_of_utterance>")),
    ("tokenizer.ggml.eom_token_id", ("<|eom_id|>",)),
    ("tokenizer.ggml.fim_pre_token_id", ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                                         "▁<PRE>", "<|code_prefix|>", "<|prefix|>")),
    ("tokenizer.ggml.fim_suf_token_id", ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                                         "▁<SUF>", "<|code_suffix|>", "<|suffix|>")),
    ("tokenizer.ggml.fim_mid_token_id", ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                                         "▁<MID>", "<|code_middle|>", "<|middle|>")),
    ("tokenizer.ggml.fim_pad_token_id", ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    ("tokenizer.ggml.fim_rep_token_id", ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    ("tokenizer.ggml.fim_sep_token_id", ("<|file_sep|>",)),
]
_DEPRECATED_FIM = {"tokenizer.ggml.fim_pre_token_id": "tokenizer.ggml.prefix_token_id",
                   "tokenizer.ggml.fim_suf_token_id": "tokenizer.ggml.suffix_token_id",
                   "tokenizer.ggml.fim_mid_token_id": "tokenizer.ggml.middle_token_id"}
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<｜end▁of▁sentence｜>", "[e~[")
_ALWAYS_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")
_C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale

_SPM_SPACE = "\u2581"
_BPE_WORD_CACHE_MAX = 1 << 16


class Tokenizer:
    """The GGUF's tokenizer: ``encode`` equals llama.cpp's llama_tokenize
    (parse_special=false), ``decode`` its llama_token_to_piece pieces."""

    def __init__(self, *, kind: str, pre: str | None, tokens: list[str], types: list[int] | None,
                 scores: list[float] | None, merges: list[str] | None, meta: dict, path=None):
        self.path = path
        self.kind = kind  # "bpe" | "spm"
        self.pre = pre
        n = len(tokens)
        self.n_vocab = n
        self.tokens = tokens
        for i, t in enumerate(tokens):
            if not t:
                tokens[i] = f"[EMPTY_{i}]"
        self.token_to_id: dict[str, int] = dict(zip(tokens, range(n)))  # a later duplicate wins, as in llama.cpp
        self.scores = scores

        # gemma4: SentencePiece-style BPE (spaces as U+2581, raw UTF-8, <0xXX> bytes)
        self.escape_whitespace = pre == "gemma4"
        if kind == "bpe":
            self._splitters, self.ignore_merges, add_bos = _PRE[pre]
            # bpe_ranks keyed by the merge line itself: (first, second) -> first + " " + second.
            # The first occurrence of a line wins, as with std::unordered_map::emplace.
            merges = merges or []
            self._ranks = dict(zip(reversed(merges), range(len(merges) - 1, -1, -1)))
            add_space_prefix, add_eos = False, False
            bos, eos, unk = 11, 11, None
        else:
            self._splitters, self.ignore_merges = (), False
            add_bos, add_eos, add_space_prefix = True, False, True
            bos, eos, unk = 1, 2, 0
        self.add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", add_space_prefix))

        def special_id(key, default):
            if default is not None and default >= n:
                default = None
            v = meta.get(key)
            return int(v) if v is not None and 0 <= int(v) < n else default

        self.bos_id: int | None = special_id("tokenizer.ggml.bos_token_id", bos)
        self.eos_id: int | None = special_id("tokenizer.ggml.eos_token_id", eos)
        self.unk_id: int | None = special_id("tokenizer.ggml.unknown_token_id", unk)
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos)) or self.escape_whitespace  # llama.cpp
        # forces add_bos for gemma4 (its PR 21500)
        self.add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", add_eos))

        # ---- attributes, with llama.cpp's text-based fix-ups ----
        if types is None:
            attrs = [ATTR_NORMAL] * n
        else:
            attrs = [_TYPE_TO_ATTR.get(t, ATTR_UNDEFINED) for t in types[:n]]
        tid = self.token_to_id
        found: dict[str, int | None] = {}
        for key, texts in _AUTO_SPECIAL:
            given = special_id(key, None)
            if given is None and key in _DEPRECATED_FIM:
                given = special_id(_DEPRECATED_FIM[key], None)
            found[key] = given
            if given is not None:
                continue
            # llama.cpp takes the first match in unordered_map order; vocabularies
            # with several candidates for one role are not distinguished here.
            for t in texts:
                if t in tid:
                    i = tid[t]
                    found[key] = i if found[key] is None else found[key]
                    attrs[i] |= ATTR_CONTROL
        for i, a in enumerate(attrs):  # control tokens named "unused" are marked unused
            if a & ATTR_CONTROL and "unused" in tokens[i]:
                attrs[i] = a | ATTR_UNUSED
        eog = set()
        for key in ("tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id",
                    "tokenizer.ggml.fim_sep_token_id"):
            if found[key] is not None:
                eog.add(found[key])
        for t in _EOG_TEXTS:
            if t in tid:
                eog.add(tid[t])
                attrs[tid[t]] |= ATTR_CONTROL
        for t in _ALWAYS_USER_DEFINED:
            if t in tid:
                attrs[tid[t]] = ATTR_USER_DEFINED
        for i in (self.eos_id, found["tokenizer.ggml.eot_token_id"], found["tokenizer.ggml.eom_token_id"]):
            if i is not None:
                eog.add(i)
        texts = {tokens[i]: i for i in eog}
        if "<|end|>" in texts and ((("<|return|>" in texts) and ("<|call|>" in texts or "<|calls|>" in texts))
                                   or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)):
            eog.discard(texts["<|end|>"])
            attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            eog.discard(texts["</s>"])
            attrs[texts["</s>"]] = ATTR_NORMAL
        self.eog_ids = frozenset(eog)

        special = [i for i, a in enumerate(attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
        name = str(meta.get("general.name", "")).lower()
        pre_name, arch = str(meta.get("tokenizer.ggml.pre", "")), str(meta.get("general.architecture", ""))
        if any(s in pre_name for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
                any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
            if "<mask>" in tid:
                attrs[tid["<mask>"]] |= ATTR_LSTRIP
        elif "phi-3" in name or "phi3" in name:
            for i in special:
                attrs[i] |= ATTR_RSTRIP
            for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if t in tid:
                    attrs[tid[t]] = attrs[tid[t]] | ATTR_RSTRIP if on else attrs[tid[t]] & ~ATTR_RSTRIP
        elif "modern-bert" in name:
            if "[MASK]" in tid:
                attrs[tid["[MASK]"]] |= ATTR_LSTRIP
        self.attrs = attrs

        # tokenizer_st_partition with parse_special=false: only user-defined
        # tokens (not control or unknown) are cut out, longest (in bytes) first.
        special.sort(key=lambda i: -len(tokens[i].encode("utf-8", "surrogateescape")))
        self._partition = [(tokens[i], i, bool(attrs[i] & ATTR_LSTRIP), bool(attrs[i] & ATTR_RSTRIP))
                           for i in special if not attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN)]
        self._word_cache: dict[str, tuple[int, ...]] = {}
        self._pieces: dict[tuple[int, bool], bytes] = {}

    # ---- construction from a GGUF ----
    @classmethod
    def from_gguf(cls, gf) -> "Tokenizer":
        model = gf.get("tokenizer.ggml.model")
        if model == "gpt2":
            kind = "bpe"
            pre = gf.get("tokenizer.ggml.pre", None) or "default"  # llama.cpp: missing -> 'default'
            if pre not in _PRE:
                raise GGUFError(gf.path, f"unsupported tokenizer: tokenizer.ggml.pre = '{pre}' "
                                         f"(supported: {', '.join(sorted(_PRE))})")
        elif model == "llama":
            kind, pre = "spm", None
        elif model == "gemma4":
            kind, pre = "bpe", "gemma4"  # llama.cpp sets this pre-tokenizer for the model, whatever the key says
        else:
            raise GGUFError(gf.path, f"unsupported tokenizer: tokenizer.ggml.model = '{model}' "
                                     f"(supported: 'gpt2' (BPE), 'llama' (SentencePiece), 'gemma4')")

        def read(key, required=False):
            if not required and not gf.has_key(key):
                return None
            try:
                v = gf.get(key)
            except UnicodeDecodeError as e:
                raise GGUFError(gf.path, f"'{key}' holds a string that is not UTF-8 ({e.reason})") from None
            if not isinstance(v, list):
                raise GGUFError(gf.path, f"'{key}' is not an array")
            return v

        tokens = read("tokenizer.ggml.tokens", required=True)
        if not tokens or not all(isinstance(t, str) for t in tokens[:1]):
            raise GGUFError(gf.path, "'tokenizer.ggml.tokens' is empty or not an array of strings")
        types = read("tokenizer.ggml.token_type")
        scores = read("tokenizer.ggml.scores")
        if types is not None and len(types) < len(tokens):
            raise GGUFError(gf.path, f"'tokenizer.ggml.token_type' has {len(types)} entries for {len(tokens)} tokens")
        if scores is not None and len(scores) < len(tokens):
            raise GGUFError(gf.path, f"'tokenizer.ggml.scores' has {len(scores)} entries for {len(tokens)} tokens")
        merges = None
        if kind == "bpe":
            merges = read("tokenizer.ggml.merges")
            if merges is None:
                raise GGUFError(gf.path, "missing required key 'tokenizer.ggml.merges' (BPE tokenizer)")
        meta = {}
        for key in ("tokenizer.ggml.pre", "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.add_bos_token",
                    "tokenizer.ggml.add_eos_token", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                    "tokenizer.ggml.unknown_token_id", "general.name", "general.architecture",
                    *(k for k, _ in _AUTO_SPECIAL), *_DEPRECATED_FIM.values()):
            if gf.has_key(key):
                meta[key] = gf.get(key)
        return cls(kind=kind, pre=pre, tokens=tokens, types=types, scores=scores, merges=merges, meta=meta,
                   path=gf.path)

    # ---- encoding ----
    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """llama_tokenize(text, add_special=add_bos, parse_special=false): with
        add_bos, BOS (and EOS) are added where the vocabulary's add_bos_token
        (add_eos_token) says so."""
        out: list[int] = []
        if add_bos and self.add_bos:
            if self.bos_id is None:
                raise GGUFError(self.path, "the vocabulary asks for a BOS token but has none")
            out.append(self.bos_id)
        fragments = self._split_special(text) if text else []
        if self.kind == "spm":
            prev_special = True
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                self._spm(frag.replace(" ", _SPM_SPACE), out)
                prev_special = False
        else:
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    self._bpe_text(frag, out)
        if add_bos and self.add_eos:
            if self.eos_id is None:
                raise GGUFError(self.path, "the vocabulary asks for an EOS token but has none")
            out.append(self.eos_id)
        return out

    def _split_special(self, text: str) -> list:
        """tokenizer_st_partition: text pieces (str) and user-defined token ids (int)."""
        frags: list = [text]
        for ttext, tok, lstrip, rstrip in self._partition:
            if not any(type(f) is str and ttext in f for f in frags):
                continue
            new: list = []
            for f in frags:
                if type(f) is not str or ttext not in f:
                    new.append(f)
                    continue
                pos = 0
                while True:
                    m = f.find(ttext, pos)
                    if m < 0:
                        if pos < len(f):
                            new.append(f[pos:])
                        break
                    left = f[pos:m]
                    if lstrip:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        new.append(left)
                    new.append(tok)
                    pos = m + len(ttext)
                    if rstrip:
                        while pos < len(f) and f[pos] in _C_SPACE:
                            pos += 1
            frags = new
        return frags

    def _bpe_text(self, text: str, out: list[int]) -> None:
        cache = self._word_cache
        if self.escape_whitespace:
            text = text.replace(" ", _SPM_SPACE)
        for word in pre_tokenize(text, self._splitters):
            ids = cache.get(word)
            if ids is None:
                if self.escape_whitespace:  # raw characters; a newline run that is a token stays whole
                    ids = (self.token_to_id[word],) if word.strip("\n") == "" and word in self.token_to_id \
                        else self._bpe_word(word)
                else:
                    ids = self._bpe_word(word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_ENCODE))
                if len(cache) >= _BPE_WORD_CACHE_MAX:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)

    def _bpe_word(self, word: str) -> tuple[int, ...]:
        """llm_tokenizer_bpe_session::tokenize for one (byte-encoded) word."""
        tid = self.token_to_id
        if self.ignore_merges and word in tid:
            return (tid[word],)
        sym = list(word)
        n = len(sym)
        if n > 1:
            ranks = self._ranks
            nxt = list(range(1, n)) + [-1]
            prv = list(range(-1, n - 1))
            heap = []
            for i in range(n - 1):
                r = ranks.get(sym[i] + " " + sym[i + 1])
                if r is not None:
                    heap.append((r, i, i + 1, sym[i] + sym[i + 1]))
            heapq.heapify(heap)
            while heap:
                _, left, right, text = heapq.heappop(heap)
                ls, rs = sym[left], sym[right]
                if not ls or not rs or ls + rs != text:
                    continue  # outdated
                sym[left] = text
                sym[right] = ""
                nr = nxt[right]
                nxt[left] = nr
                if nr >= 0:
                    prv[nr] = left
                pl = prv[left]
                if pl >= 0:
                    r = ranks.get(sym[pl] + " " + text)
                    if r is not None:
                        heapq.heappush(heap, (r, pl, left, sym[pl] + text))
                if nr >= 0:
                    r = ranks.get(text + " " + sym[nr])
                    if r is not None:
                        heapq.heappush(heap, (r, left, nr, text + sym[nr]))
        ids = []
        for s in sym:
            if not s:
                continue
            i = tid.get(s)
            if i is not None:
                ids.append(i)
                continue
            # not a token: llama.cpp looks each byte up as a one-byte token text (byte-level
            # BPE) or as its <0xXX> token (gemma4)
            for b in s.encode("utf-8", "surrogatepass"):
                i = tid.get(f"<0x{b:02X}>" if self.escape_whitespace else bytes((b,)).decode("utf-8", "surrogateescape"))
                if i is not None:
                    ids.append(i)
        return tuple(ids)

    def _spm(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm_session::tokenize."""
        n = len(text)
        if n == 0:
            return
        tid = self.token_to_id
        scores = self.scores
        length = [1] * n  # symbol i spans text[i:i + length[i]]; 0 once merged away
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap = []

        def add(left, right):
            t = tid.get(text[left:right + length[right]])
            if t is not None:
                heapq.heappush(heap, (-(scores[t] if scores is not None else 0.0), left, right,
                                      length[left] + length[right]))

        for i in range(1, n):
            add(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue
            length[left] = size
            length[right] = 0
            nr = nxt[right]
            nxt[left] = nr
            if nr >= 0:
                prv[nr] = left
            if prv[left] >= 0:
                add(prv[left], left)
            if nr >= 0:
                add(left, nr)
        i = 0
        while i != -1:
            piece = text[i:i + length[i]]
            t = tid.get(piece)
            if t is not None:
                out.append(t)
            else:  # byte fallback
                for b in piece.encode("utf-8", "surrogatepass"):
                    out.append(self._byte_token(b))
            i = nxt[i]

    def _byte_token(self, b: int) -> int:
        """llama_vocab::byte_to_token for SentencePiece vocabularies."""
        t = self.token_to_id.get(f"<0x{b:02X}>")
        if t is None:
            t = self.token_to_id.get(bytes((b,)).decode("utf-8", "surrogateescape"))
        if t is None:
            raise GGUFError(self.path, f"the vocabulary has no byte-fallback token <0x{b:02X}>")
        return t

    # ---- decoding ----
    def piece(self, token: int, special: bool = False) -> bytes:
        """llama_token_to_piece(token, lstrip=0, special): the token's bytes.
        Control and unknown tokens are empty unless ``special``."""
        key = (token, special)
        p = self._pieces.get(key)
        if p is None:
            if not 0 <= token < self.n_vocab:
                raise ValueError(f"token id {token} out of range (vocabulary of {self.n_vocab})")
            attr = self.attrs[token]
            text = self.tokens[token]
            if not special and attr & (ATTR_UNKNOWN | ATTR_CONTROL):
                p = b""
            elif attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
                p = text.encode("utf-8", "surrogateescape")
            elif attr & ATTR_NORMAL:
                if self.kind == "spm" or self.escape_whitespace:
                    p = text.replace(_SPM_SPACE, " ").encode("utf-8", "surrogateescape")
                else:
                    p = _decode_byte_level(text)
            elif attr & ATTR_BYTE:
                p = bytes((int(text[3:5], 16),))
            else:
                p = b""
            self._pieces[key] = p
        return p

    def decode(self, ids, special: bool = False) -> str:
        """The pieces of ``ids`` joined and decoded as UTF-8 (invalid bytes,
        such as a character cut between tokens, become U+FFFD)."""
        return b"".join(self.piece(int(i), special) for i in ids).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return (f"Tokenizer({self.kind}{'/' + self.pre if self.pre else ''}, n_vocab={self.n_vocab}, "
                f"bos={self.bos_id}, eos={self.eos_id}, add_bos={self.add_bos})")


def _decode_byte_level(text: str) -> bytes:
    """llama_decode_text: each character back to its byte; a character outside
    the byte alphabet becomes llama.cpp's '[UNK_BYTE_0x..]' marker."""
    out = bytearray()
    for ch in text:
        b = _UNICODE_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            utf8 = ch.encode("utf-8", "surrogateescape")
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode("utf-8", "surrogateescape") + b"]"
    return bytes(out)
