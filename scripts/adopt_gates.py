"""Write gates of references/catalog.toml from the committed variation records,
by the rules of harness/gates.py (the tests re-derive every value the same
way: tests/test_gate_edges.py, tests/test_anchored.py).

    python scripts/adopt_gates.py                   every CUDA gate, gates.propose_measured with the
                                                    headroom the realisations measure held out: of
                                                    the CPU-made sets (gate.<cpu|twin|oracle|f16kv>-cuda)
                                                    from the faithful oracle's (`harness reference
                                                    --variation --faithful --save`), of llama.cpp's
                                                    CUDA sets (gate.<gpu|deep>-cuda) from llama.cpp's
                                                    own (`harness reference --variation --save`)
    python scripts/adopt_gates.py --llama-cpp M...  and the NumPy engine's gates of models M against
                                                    CPU-made sets, from llama.cpp's spread there
                                                    (gates.propose)

Each line names the measurement and its records in its comment. A gate line
is replaced where it stands (kept as it is where its values and records
are those derived); a new one goes after the model's last gate line
(or its n_steps). The catalog is written atomically."""
import argparse
import re
import tomllib

from engine.atomic import atomic_open
from engine.errors import AnvilError
from harness import catalog, fetch, gates, results


RECORD = re.compile(r"variation-\d{8}T\d{6}Z-[0-9a-f]+\.json")


def num(x: float) -> str:
    return re.sub(r"e([+-])0(\d)", r"e\1\2", f"{x:g}")  # 1e-6, as the catalog writes it


def gate_line(key: str, g: catalog.Gate, comment: str) -> str:
    values = [f"{c} = {num(getattr(g, c))}" for c in ("margin", "logit", "kl", "flips") if getattr(g, c) is not None]
    return f"gate.{key} = {{ {', '.join(values)} }}  # {comment}\n"


def same(old: str, new: str) -> bool:
    """Whether two gate lines hold the same values and name the same records
    (a line whose measurement did not change keeps its words)."""
    def parse(line):
        return tomllib.loads("g = " + line.split("=", 1)[1].split("#", 1)[0])["g"], set(RECORD.findall(line))
    return parse(old) == parse(new)


def records(spread) -> str:
    return ", ".join(sorted({r.record for r in spread}))


def each(spread) -> str:
    """Every variant's margin / logit / KL, as the comments give them."""
    return ", ".join(f"{r.variant} " + " / ".join(gates.spread_text(r, c) for c in ("margin", "logit", "kl"))
                     for r in spread)


def faithful_lines(cat) -> dict[tuple[str, str], str]:
    """(model, gate key) -> line, for every CUDA gate of a CPU-made set."""
    measured = gates.faithful_records(results.DEFAULT_DIR, cat)
    headroom = gates.held_out_headroom(cat, measured)
    order = list(gates.FAITHFUL_VARIANTS)
    out = {}
    for (name, rset), spread in measured.items():
        e = cat[name]
        b = gates.budget(e, rset)
        floor = "" if b is None else "; at least the gemma fp32 budget" if b == gates.GELU_F16_BUDGET else \
            "; at least the fp32 budget"
        ordered = sorted(spread, key=lambda r: order.index(r.variant))
        key = e.gate_key("cuda", rset)
        out[(name, key)] = gate_line(key, gates.propose_measured(e, rset, spread, headroom),
                                     f"faithful oracle {each(ordered)}{floor} ({records(spread)})")
    return out


def gpu_lines(cat) -> dict[tuple[str, str], str]:
    """(model, gate key) -> line, for every CUDA gate of a set llama.cpp made with CUDA (gpu, deep)."""
    measured = gates.gpu_records(results.DEFAULT_DIR, cat)
    headroom = gates.held_out_headroom(cat, measured)
    held = " / ".join(f"{headroom[c]:g}" for c in ("margin", "logit", "kl")) + f", +{headroom['flips']:g} flips"
    out = {}
    order = list(gates.GPU_VARIANTS)
    for (name, rset), spread in measured.items():
        e = cat[name]
        spread = sorted(spread, key=lambda r: order.index(r.variant))
        flips = ", ".join(f"{r.variant} {gates.spread_text(r, 'flips')}" for r in spread)
        key = e.gate_key("cuda", rset)
        out[(name, key)] = gate_line(key, gates.propose_measured(e, rset, spread, headroom),
                                     f"llama.cpp CUDA {each(spread)}; flips {flips}; held-out headroom {held} "
                                     f"({records(spread)})")
    return out


def llama_cpp_lines(cat, names: list[str]) -> dict[tuple[str, str], str]:
    """(model, gate key) -> line, for the NumPy engine's gate of every CPU-made set of ``names``
    llama.cpp's own spread was measured on."""
    measured = gates.variation_records(results.DEFAULT_DIR, "llama.cpp", cat)
    out = {}
    for (name, rset), spread in measured.items():
        if name not in names:
            continue
        e = cat[name]
        if gates.judged_backend(rset) == "numpy":
            b = gates.budget(e, rset)
            floor = "" if b is None else "gemma fp32 budget (llama.cpp's f16 GELU table); " \
                if b == gates.GELU_F16_BUDGET else "fp32 budget; "
            flips = ", ".join(f"{r.variant} {gates.spread_text(r, 'flips')}" for r in spread)
            out[(name, e.gate_key("numpy", rset))] = gate_line(
                e.gate_key("numpy", rset), gates.propose(e, rset, spread),
                f"{floor}llama.cpp {each(spread)}; flips {flips} ({records(spread)})")
    missing = sorted(set(names) - {n for n, _ in measured})
    if missing:
        raise SystemExit(f"adopt_gates: no llama.cpp variation record of the catalog's file for {', '.join(missing)}")
    return out


def rewrite(text: str, lines: dict[tuple[str, str], str]) -> str:
    """``text`` with each (model, key)'s gate line replaced, or added to the model's section (after
    its last gate line, else after the last line of its body); a model with no section is an error."""
    out, section, pending, placed = [], None, {}, set()
    last_gate = last_body = None

    def flush():
        at = last_gate if last_gate is not None else last_body
        if pending and at is not None:
            out[at + 1:at + 1] = list(pending.values())
            placed.update((section, k) for k in pending)
        pending.clear()

    for line in text.splitlines(keepends=True):
        m = re.match(r"\[models\.([\w.-]+)\]", line)
        if m:
            flush()
            section, last_gate, last_body = m.group(1), None, None
            pending = {k: v for (s, k), v in lines.items() if s == section}
        g = re.match(r"gate\.([\w-]+) = ", line)
        if section is not None and g:
            placed.add((section, g.group(1)))
            if g.group(1) in pending:
                new = pending.pop(g.group(1))
                line = line if same(line, new) else new
            last_gate = len(out)
        if section is not None and line.strip() and not line.lstrip().startswith("#"):
            last_body = len(out)  # a multi-line array's closing bracket too
        out.append(line)
    flush()
    if missing := sorted(set(lines) - placed):
        (model, key), *_ = missing
        raise SystemExit(f"adopt_gates: {fetch.CATALOG} has no [models.{model}] section for gate.{key}")
    return "".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", nargs="+", metavar="MODEL",
                    help="also the NumPy engine's gates llama.cpp's spread sets, for these models")
    args = ap.parse_args()
    cat = catalog.load()
    try:
        for name in args.llama_cpp or ():
            catalog.entry(name, cat)
    except AnvilError as e:
        raise SystemExit(f"adopt_gates: {e}") from None
    lines = faithful_lines(cat) | gpu_lines(cat) | (llama_cpp_lines(cat, args.llama_cpp) if args.llama_cpp else {})
    text = rewrite(fetch.CATALOG.read_text(), lines)
    with atomic_open(fetch.CATALOG, "w") as f:
        f.write(text)
    for (name, _), line in sorted(lines.items()):
        print(f"{name}: {line}", end="")


if __name__ == "__main__":
    main()
