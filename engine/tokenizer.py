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

In both, llama.cpp first cuts user-defined tokens out of the text, even with
parse_special=false (control tokens are then plain text). Token attributes are
derived from ``tokenizer.ggml.token_type`` plus llama.cpp's text-based fix-ups
(EOG/EOT/FIM-looking tokens become control tokens, and so on).

Character classes (\\p{L}, \\p{N}, whitespace, ...) come from llama.cpp's own
table (unicode-data.cpp), embedded below, not from Python's ``unicodedata``,
whose Unicode version differs (about 5k newer code points).
"""

from __future__ import annotations

import base64
import heapq
import zlib

import numpy as np

from .errors import GGUFError

# ---------------------------------------------------------------------------
# Unicode data: llama.cpp's unicode_ranges_flags (unicode-data.cpp, llama.cpp
# vendored by llama-cpp-python 0.3.36): per range, its start code point and
# category flags (UNDEFINED 0x01, NUMBER 0x02, LETTER 0x04, SEPARATOR 0x08,
# ACCENT_MARK 0x10, PUNCTUATION 0x20, SYMBOL 0x40, CONTROL 0x80).
# Encoding: for each range, the start minus the previous start as a LEB128
# varint, then the flags byte; zlib, then base85. tests/test_tokenizer.py
# checks it against the sdist's unicode-data.cpp and shows how to regenerate it.
_UNICODE_RANGES_B85 = (
    "c-oDZNr+}w6~}Y#J8$^rTXS`Hs_Is!yE@&~)$<f><27wsnwBVt9omHhM#TXPC<waw2x1m7q6A!I5pW<2L5Lf*T{WTz4iG_u3"
    "y~l=fD&9aSp@ZW&U-a<)F9NY_rCk?J@*X%^FQa_Gfj=8B1@_m8u}^ZA_d*=bCQKOY2T*njXg_7&~`?$hQJzOmjruCD3a(Bb8"
    "C#B7g=?f$6DrEO_=1F_&C2rg9KHUifAiN3$b6K^Njbf;wd)7TA#PM4Y4(q9!>1atc+VpBD-SfhDf6aM3EU}Fs;mpY-)u#NGO"
    "^L-HZ#Ery8Q@hwbE8Pwj|`8P-O=guWK8%~;sO3enYgfU|GL0lJO(z8-sOk_&z#iPekj6lNtd7fT6gg2ww|!JFwmkW!bir$T0"
    "sDmHp7E>9({>jmF2Yno^uD>xs$Vl+=QoN7K=<h^#!6dYr^vzjO0Y_~L6j^_L;Yz_^vIaIArqv>eUDqpiJE$j>=ifOH_L@D@P"
    "tNMv`Kr7@TN%}6QCvBYe$|*ao8sro{I9nzfT73*CNW{<W_y4eLuZ$hbq-NY@m!T(A=+UC2!XGA0d4>)-!QXAZ&><F;SYsNgY"
    "g9#x;3zjz#u6=BOO_aM=XB}T*U?Y*ePP=YseyNGdPD>HUJ3oXY}hNMYW>_vus4w*h}rh!Q9Qh7k7Wr);qy>;md~}=ao^2i*>"
    "V>L)2#M*sr%OA*hs}G!7@UIdMes^H5rDdV}tgjw;bN_SIJoJ-uu3`=Tggd&a^UVD3#EwNE0Ulw8~YOCu3xLB+%pjID{_qmXT"
    "V<0TK?0WDuIsFNaiS_47C5yqYeRR#>c_1%+vf#j2w?w9Es0#ta*-OX+%T;`Ltz4|?d5qJ2NwJ=g!sH%rC`y7wyvt<($ixH0B"
    "F!MVX~Wr?bPSF=uM8lyZz(e+e>0;_7BC6+y%V{70!OH_tBYUAhc=VCHGFv?WVIlN|ZsL~)7Q@4eqZX&6~GY4a9(N*c|8WIet"
    "LyM6V#sIqN5g6!kbl#7gffV_mE;+LVJs&|)TrsTeoKhP%GP5S9LH5ZwgVqK9t#d#2au2P|zpHWN40k+^rGW<zMcj}|B#<%8A"
    "3}N$9XC0@pei(m^0+{Jz@MX|aJ_F!%=-1vI?kEdo=xZS?Xkw(dCPET{We$Y>>Orj=53TMzuI{;YzEUZEjM9WQf5F`8Zm~AOh"
    "Mzc9~|$&dEKyMPj-&*&ALn?!x%4H{sirJXO_9@s!lsB4+ebKT=LCxEu6(CCFg5?H6+a|l#JIz_T_;rgv<Gnu$cd<X&hGbX}+"
    "wbetxD%i}|fAO-$Ueazw7>kL#a6xnns<Ng<{7+=bms#(}IHM`MhhL-Y*>h&svoMAi)DVBXIWH)WV#64{?)Td`4G(1!(>(Tf$"
    "}#SkDHtU@E^h7m!wV2ZvkSq78@SM>dsj6ri>Q$8dEB*naDsh(FugRDtTydU9tJLv7RIqTEk1)TXJYM;QYrvqq@R%v7&v{A*Q"
    ")vYzKebp)kSZwl=_Bi@ujLfmSjI&IAGfo%B6{yZUL2H$j961NkG{`v<XThlF5%sb1>~ikp)O%sFz|N6S*>y#XGfu{FvW&Exf"
    "Mdur7>%{1Gwc|}?Zl>IVFFEy(z4DO=WJu2;Mpmjoy%%C8^kgNXW_nMydAr-+r)Ka!;XH&*tL^h>9-$+6qcAiEjpb(q_0@Ad_"
    "p$ZG(@G+4>6FAIue#WCHYf%hC1*!ay>(UY`h@k5EMJaQ!$xGV!Drsam&WytynTGOw^MEa*DkFucw1LZj%1H##urZ8RHoJDa{"
    "ZwL&O3=o$EB5FgKQi`UQYakq%qz=!FOJOz_q$TT+Ug%v%KZ36Bttm=HVb&n$g=I*+<du-w>)=8#ph!m5W_l`7?!KG)HxPujS"
    "j2Jf7QeBe6lHV=3IzM?-cmR=-g4RM5P^q5!7huu7L_3^G(u)JKdlS2a@0u^^nn$VL|ovCFgb&;OK5@<ihVjFo(-tmVy;e@tT"
    "o0V3_x{AKy{fjjfuxT<zT?tlTRzg8ENH7qL`JqfTdR{<!jkW<D<~XsT#@A%QFx2vHy(Sm+tc)0Sz!lV?2B$n9!dh#V7kX=_t"
    "^?r}0B>#ZVjKibr7T+ELez#XAZ*@fhgIj}go8D#I;ERKdMLj|n+$G}C1ZbTGWS{g2iOXZ9UD6&YjcC2a9=cf6PI@?j)|%|4O"
    "n@xK!QGY%u~c>y%ip&wt$E{xTiL^QG+^&@<~cy>F4SHY!Rhvm9|^N?WV4@#1(6F3c&P~VB#z)mEP@m7ff7MQFPv@(F`yj3TK"
    "+EURqLXeh;!>#@qUV7uAu>(Ws1^w5`lu;Cd0_1Z9TKzO~!}NjOvFF&dRQQoHH;#imnv+50k6O<P_eT!r)ycGcG&aRutuWf*d"
    "R|9!pRW^iZYcN*d5ae|CD1}s6sHPF$QJ8cVi*qiRgKlQ_kH4xT5MEpj~uI>1414RmN5Umxc{jkQftLj#ySax5_w(*zm2Ra_>"
    "*XoWHjjRr~PEI2h+^{Y`EaVj#q5reBd^CJoOp}5BMC6zA`XM%t^o3>`y@Qy@ch>Z0Dz~oaEqY`1lH+XsE@?X?Q{A$xPbg~Z7"
    "VU-zmGrH14ra^(!Jd;BN*ulfvOl8NEzwZ#B5Kk)+J&@p<^XHP`szu1_)-r->B(OncF=7*<y(PEipWaW=7VCEez}k@&gv&Q1{"
    "U*nh;orV&!#HBKNL@(BZ-thE0^;fRLe*Bewi{>#A@2ah6`t%S7GkA$U=T78WVn=Oc>h8j}rWS@}%f{IsYB){j0rUc$Y0swbJ"
    "SMwytSyy5IM9NmF*WL7V%HZQKVM_jNb!H+llOa3)VRUZj$o@xFW<y)TEIE&LOCu^}vmir=<(k{M5{4j4G)L0QMOk1Lc9jB2O"
    "o_Rd190HeqZDM7^%uK4m|0n^!!KbNko?$i&_pBlaQkbP9&Zh#bRu^?Zo!kejjg;hRzXV|iSM1I_EKF|q}j>r3*(6;BSwEel;"
    "gBGt_|N620Z5tK3N1n-^!Q!Ix_>7#R7=9&W+VcDuv7`zz#K&PEI?CS=xn$YkOMnjR$J~6LmHa!qgUwJDtu%g)_YX*w+n#^o&"
    "r5VnWI(3KWwL;sk7Qyy%wvAoCKGqUt8&9!E8fO4=t^UD81H?l(U-X$CH+yt7k@Crp4bA`-+L1{e?{e+bNZah9|!u24eWY3$*"
    "+I73Dd7mKPcQ${vq<!*NW*s|3x;m|L^%X&z&Mq"
)

# unicode_set_whitespace (unicode-data.cpp): the code points \s matches.
_WHITESPACE = (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003,
               0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)

_MAX_CODEPOINT = 0x110000

# Per code point class bits used by the splitters. Every code point gets _ANY
# (llama.cpp's flags are never 0 inside the text; 0 means "past the chunk").
_L, _N, _W, _P, _M, _S, _ANY = 1, 2, 4, 8, 16, 32, 64
_LLAMA_FLAG_TO_BITS = {0x02: _N, 0x04: _L, 0x10: _M, 0x20: _P, 0x40: _S}

_class_table: np.ndarray | None = None


def unicode_ranges() -> list[tuple[int, int]]:
    """The embedded table as (start, llama.cpp flags) pairs, last one (0x110000, 0)."""
    raw = zlib.decompress(base64.b85decode("".join(_UNICODE_RANGES_B85)))
    out, start, i = [], 0, 0
    while i < len(raw):
        delta, shift = 0, 0
        while True:
            b = raw[i]
            i += 1
            delta |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        start += delta
        out.append((start, raw[i]))
        i += 1
    return out


def _classes() -> np.ndarray:
    """uint8 class bits for every code point (built once, ~10 ms)."""
    global _class_table
    if _class_table is None:
        table = np.full(_MAX_CODEPOINT, _ANY, dtype=np.uint8)
        ranges = unicode_ranges()
        for (start, flags), (end, _) in zip(ranges, ranges[1:]):
            table[start:end] = _ANY | _LLAMA_FLAG_TO_BITS.get(flags, 0)
        table[list(_WHITESPACE)] |= _W
        _class_table = table
    return _class_table


def _codepoints(text: str) -> tuple[list[int], list[int]]:
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return cps.tolist(), _classes()[cps].tolist()


# ---------------------------------------------------------------------------
# Pre-tokenizers. Each takes the code points, their class bits and the current
# chunks ((start, end) code point ranges) and returns finer chunks, exactly as
# the corresponding step of llama.cpp's unicode_regex_split.

def _split_gpt2(cps, fl, chunks):
    """unicode_regex_split_custom_gpt2:
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    out = []
    push = out.append
    for ini, end in chunks:
        pos = ini
        while pos < end:
            cpt = cps[pos]
            if cpt == 0x27 and pos + 1 < end:  # 's|'t|'re|'ve|'m|'ll|'d
                nxt = cps[pos + 1]
                if nxt in (0x73, 0x74, 0x6D, 0x64):
                    push((pos, pos + 2))
                    pos += 2
                    continue
                if pos + 2 < end and (nxt, cps[pos + 2]) in _CONTRACTIONS_2:
                    push((pos, pos + 3))
                    pos += 3
                    continue
            start = pos
            if cpt == 0x20:
                f2 = fl[pos + 1] if pos + 1 < end else 0
            else:
                f2 = fl[pos]
            if f2 & _L:  # ' ?\p{L}+'
                pos += cpt == 0x20
                while pos < end and fl[pos] & _L:
                    pos += 1
                push((start, pos))
                continue
            if f2 & _N:  # ' ?\p{N}+'
                pos += cpt == 0x20
                while pos < end and fl[pos] & _N:
                    pos += 1
                push((start, pos))
                continue
            if f2 and not f2 & (_W | _L | _N):  # ' ?[^\s\p{L}\p{N}]+'
                pos += cpt == 0x20
                while pos < end and not fl[pos] & (_W | _L | _N):
                    pos += 1
                push((start, pos))
                continue
            n = 0
            while pos + n < end and fl[pos + n] & _W:
                n += 1
            if n > 1 and pos + n < end:  # '\s+(?!\S)'
                pos += n - 1
            elif n > 0:  # '\s+'
                pos += n
            else:
                pos += 1
            push((start, pos))
    return out


_CONTRACTIONS_2 = {(0x72, 0x65), (0x76, 0x65), (0x6C, 0x6C)}  # re ve ll


def _lower_ascii(c: int) -> int:
    # unicode_tolower: in llama.cpp's table only A-Z lower-case to the letters
    # the contraction rule looks for.
    return c | 0x20 if 0x41 <= c <= 0x5A else c


def _split_llama3_qwen2(cps, fl, chunks, max_digits):
    """unicode_regex_split_custom_llama3 (max_digits=3) and _qwen2 (max_digits=1):
    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"""
    out = []
    push = out.append
    for ini, end in chunks:
        pos = ini
        while pos < end:
            cpt = cps[pos]
            f = fl[pos]
            if cpt == 0x27 and pos + 1 < end:  # (?i:'s|'t|'re|'ve|'m|'ll|'d)
                nxt = _lower_ascii(cps[pos + 1])
                if nxt in (0x73, 0x74, 0x6D, 0x64):
                    push((pos, pos + 2))
                    pos += 2
                    continue
                if pos + 2 < end and (nxt, _lower_ascii(cps[pos + 2])) in _CONTRACTIONS_2:
                    push((pos, pos + 3))
                    pos += 3
                    continue
            start = pos
            if not (cpt == 0x0D or cpt == 0x0A or f & _N):  # [^\r\n\p{L}\p{N}]?\p{L}+
                if f & _L or (pos + 1 < end and fl[pos + 1] & _L):
                    pos += 1
                    while pos < end and fl[pos] & _L:
                        pos += 1
                    push((start, pos))
                    continue
            if f & _N:  # \p{N}{1,3} or \p{N}
                if max_digits == 1:
                    push((pos, pos + 1))
                    pos += 1
                    continue
                while pos < end and fl[pos] & _N:
                    pos += 1
                    if pos - start >= max_digits:
                        push((start, pos))
                        start = pos
                if pos > start:
                    push((start, pos))
                continue
            if cpt == 0x20:
                f2 = fl[pos + 1] if pos + 1 < end else 0
            else:
                f2 = f
            if not f2 & (_W | _L | _N):  # ' ?[^\s\p{L}\p{N}]+[\r\n]*' (f is never 0 here)
                pos += cpt == 0x20
                while pos < end and not fl[pos] & (_W | _L | _N):
                    pos += 1
                while pos < end and cps[pos] in (0x0D, 0x0A):
                    pos += 1
                push((start, pos))
                continue
            n = 0
            last_rn = 0
            while pos + n < end and fl[pos + n] & _W:
                if cps[pos + n] in (0x0D, 0x0A):
                    last_rn = pos + n + 1
                n += 1
            if last_rn > 0:  # \s*[\r\n]+
                pos = last_rn
            elif n > 1 and pos + n < end:  # \s+(?!\S)
                pos += n - 1
            elif n > 0:  # \s+
                pos += n
            else:
                pos += 1
            push((start, pos))
    return out


def _split_llama3(cps, fl, chunks):
    return _split_llama3_qwen2(cps, fl, chunks, 3)


def _split_qwen2(cps, fl, chunks):
    return _split_llama3_qwen2(cps, fl, chunks, 1)


def _split_matches(chunks, matches_of):
    """unicode_regex_split_stl: within each chunk, every match and every gap
    between matches becomes a chunk of its own."""
    out = []
    for ini, end in chunks:
        prev = ini
        for s, e in matches_of(ini, end):
            if s > prev:
                out.append((prev, s))
            out.append((s, e))
            prev = e
        if prev < end:
            out.append((prev, end))
    return out


def _runs(pred, single=False):
    """Matches of '[class]+' (or '[class]' when single) for a per code point test."""
    def split(cps, fl, chunks):
        def matches(ini, end):
            pos = ini
            while pos < end:
                if pred(cps[pos], fl[pos]):
                    s = pos
                    pos += 1
                    if not single:
                        while pos < end and pred(cps[pos], fl[pos]):
                            pos += 1
                    yield s, pos
                else:
                    pos += 1
        return _split_matches(chunks, matches)
    return split


# llama.cpp runs these patterns with std::regex over a "collapsed" text: ASCII
# stays itself, other whitespace becomes \v, other code points one byte per
# category (\p{N} -> 0xD1, \p{P} -> 0xD3, ...), and \p{X} in the pattern becomes
# [0xDX + its ASCII members].
def _is_number(c, f):  # [\p{N}] collapsed: 0-9, or a non-ASCII non-space number
    return 0x30 <= c <= 0x39 if c < 0x80 else (f & (_N | _W)) == _N


_DEFAULT_PUNCT_ASCII = frozenset(b"!\"#%&'()*,-./:;?@[\\]_{}" + b"$+<=>^~|")


def _is_default_punct(c, f):  # [\p{P}\$\+<=>\^~\|] collapsed
    return c in _DEFAULT_PUNCT_ASCII if c < 0x80 else (f & (_P | _W)) == _P


def _split_three_digits(cps, fl, chunks):
    """[0-9][0-9][0-9] (std::wregex): leftmost non-overlapping runs of 3 ASCII digits."""
    def matches(ini, end):
        pos = ini
        while pos + 3 <= end:
            if all(0x30 <= cps[pos + k] <= 0x39 for k in range(3)):
                yield pos, pos + 3
                pos += 3
            else:
                pos += 1
    return _split_matches(chunks, matches)


_SPLIT_DEFAULT = (_runs(_is_default_punct), _split_gpt2, _runs(_is_number), _split_three_digits)
_SPLIT_SMOLLM = (_runs(_is_number, single=True), _split_gpt2)

# tokenizer.ggml.pre -> (splitters, ignore_merges, default add_bos), for the
# pre-tokenizers whose llama.cpp code path is implemented here (llama-vocab.cpp:
# llama_vocab::impl::load and llm_tokenizer_bpe).
_PRE: dict[str, tuple[tuple, bool, bool]] = {}
for _names, _cfg in [
    (("default",), (_SPLIT_DEFAULT, False, False)),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano"), ((_split_llama3,), True, True)),
    (("dbrx", "smaug-bpe"), ((_split_llama3,), False, False)),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open",
      "grok-2"), ((_split_qwen2,), False, False)),
    (("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"),
     (_SPLIT_SMOLLM, False, False)),
    (("gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "exaone4", "mpt", "olmo", "jais", "trillion",
      "granite-docling"), ((_split_gpt2,), False, False)),
]:
    for _n in _names:
        _PRE[_n] = _cfg


def pre_tokenize(text: str, splitters) -> list[str]:
    """unicode_regex_split without the byte encoding: the words of ``text``."""
    if not text:
        return []
    cps, fl = _codepoints(text)
    chunks = [(0, len(cps))]
    for split in splitters:
        chunks = split(cps, fl, chunks)
    return [text[s:e] for s, e in chunks]


# ---------------------------------------------------------------------------
# GPT-2 byte <-> unicode mapping (unicode_byte_to_utf8_map)

def _byte_to_unicode() -> list[str]:
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = [""] * 256, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


_BYTE_TO_UNICODE = _byte_to_unicode()
_BYTE_ENCODE = str.maketrans({chr(b): u for b, u in enumerate(_BYTE_TO_UNICODE)})
_UNICODE_TO_BYTE = {u: b for b, u in enumerate(_BYTE_TO_UNICODE)}

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
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos))
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
        else:
            raise GGUFError(gf.path, f"unsupported tokenizer: tokenizer.ggml.model = '{model}' "
                                     f"(supported: 'gpt2' (BPE), 'llama' (SentencePiece))")

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
        for word in pre_tokenize(text, self._splitters):
            ids = cache.get(word)
            if ids is None:
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
            # not a token: llama.cpp looks each byte up as a one-byte token text
            for b in s.encode("utf-8", "surrogatepass"):
                i = tid.get(bytes((b,)).decode("utf-8", "surrogateescape"))
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
                if self.kind == "spm":
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
