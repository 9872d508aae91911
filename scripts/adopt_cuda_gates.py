"""Write every gate.<cpu|twin|oracle|f16kv>-cuda of references/catalog.toml from the
committed faithful-oracle measurements (`harness reference --variation
--faithful --save`): gates.propose_faithful over every realisation with the
headroom they measure themselves (gates.faithful_headroom), the measurement
and the records named in the comment, as tests/test_anchored.py re-derives
them. Usage: python scripts/adopt_cuda_gates.py"""
import json
import re
from pathlib import Path

from harness import catalog, fetch, gates, results


def fmt(x: float) -> str:
    return f"{x:.3g}"


def main() -> None:
    cat = catalog.load()
    measured = gates.faithful_records(results.DEFAULT_DIR)
    headroom = gates.faithful_headroom(cat, measured)
    files: dict[tuple, dict[str, str]] = {}  # (model, set, variant) -> newest record file
    for f in sorted(Path(results.DEFAULT_DIR).glob("variation-*.json")):
        rec = json.loads(f.read_text())
        if rec.get("engine") == "anvil faithful oracle":
            for r in rec["results"]:
                files[(r["model"], r["tier"], r["variant"])] = f.name
    text = fetch.CATALOG.read_text()
    section = None
    out = []
    for line in text.splitlines(keepends=True):
        m = re.match(r"\[models\.([\w.-]+)\]", line)
        if m:
            section = m.group(1)
        g = re.match(r"gate\.(cpu|twin|oracle|f16kv)-cuda = ", line)
        if g and section in cat:
            rset, e = g.group(1), cat[section]
            spread = measured[(section, rset)]
            new = gates.propose_faithful(e, rset, spread, headroom)
            b = gates.budget(e, rset)
            floor = "" if b is None else "; at least the gemma fp32 budget" if b == gates.GELU_F16_BUDGET else \
                "; at least the fp32 budget"
            each = ", ".join(f"{r.variant} {fmt(r.max_margin_shift)} / {fmt(r.max_logit_diff)} / {fmt(r.max_kl)}"
                             for r in sorted(spread, key=lambda r: list(gates.FAITHFUL_VARIANTS).index(r.variant)))
            recs = ", ".join(sorted({files[(section, rset, r.variant)] for r in spread}))
            line = (f"gate.{rset}-cuda = {{ margin = {new.margin:g}, logit = {new.logit:g}, kl = {new.kl:g}, "
                    f"flips = {new.flips:g} }}  # faithful oracle {each}{floor} ({recs})\n")
        out.append(line)
    fetch.CATALOG.write_text("".join(out))


if __name__ == "__main__":
    main()
