"""llama.cpp's pre-tokenizers, ported: splitting text into words before BPE.

``tokenizer.ggml.pre`` picks one (llama-vocab.cpp); each is a hand-written
port of llama.cpp's ``unicode_regex_split_custom_*`` splitters or of its
"collapsed" std::regex fallback, including its quirks. Character classes
(\\p{L}, \\p{N}, whitespace, ...) come from llama.cpp's own table
(unicode-data.cpp), embedded below, not from Python's ``unicodedata``, whose
Unicode version differs (about 5k code points). Also the GPT-2 byte <-> unicode
map used by byte-level BPE.
"""

from __future__ import annotations

import base64
import zlib

import numpy as np

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


def _split_llama3_qwen2(cps, fl, chunks, max_digits, marks=False):
    """unicode_regex_split_custom_llama3 (max_digits=3), _qwen2 (max_digits=1) and
    _qwen35 (max_digits=1, marks: letter runs also take combining marks \\p{M}):
    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"""
    _LM = _L | _M if marks else _L
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
            if not (cpt == 0x0D or cpt == 0x0A or f & _N):  # [^\r\n\p{L}\p{N}]?\p{L}+ (qwen35: [\p{L}\p{M}]+)
                if f & _LM or (pos + 1 < end and fl[pos + 1] & _LM):
                    pos += 1
                    while pos < end and fl[pos] & _LM:
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
            if not f2 & (_W | _LM | _N):  # ' ?[^\s\p{L}\p{N}]+[\r\n]*' (f is never 0 here)
                pos += cpt == 0x20
                while pos < end and not fl[pos] & (_W | _LM | _N):
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


def _split_qwen35(cps, fl, chunks):
    return _split_llama3_qwen2(cps, fl, chunks, 1, marks=True)


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


def _split_newline_runs(cps, fl, chunks):
    """"[^\\n]+|[\\n]+" (Gemma 4): runs of newlines and runs of anything else."""
    out = []
    for s, e in chunks:
        i = s
        while i < e:
            nl, j = cps[i] == 0x0A, i + 1
            while j < e and (cps[j] == 0x0A) == nl:
                j += 1
            out.append((i, j))
            i = j
    return out


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
    (("qwen35",), ((_split_qwen35,), False, False)),
    (("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"),
     (_SPLIT_SMOLLM, False, False)),
    (("gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "exaone4", "mpt", "olmo", "jais", "trillion",
      "granite-docling"), ((_split_gpt2,), False, False)),
    (("gemma4",), ((_split_newline_runs,), False, True)),
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

