"""Runs on the GPU host: does a decode fold (a norm into gate/up's GEMV, the
Q/K heads into V's) change what the CUDA engine computes? Each model is
validated against a set three ways: as shipped (both folds), without the
heads fold, and with no fold at all (the unfolded operators the ops check
judges), and the measures printed side by side.
Usage: python3 scripts/gpu/folds_check.py SET MODEL..."""
import sys

import engine
from engine.backends import cuda
from harness import catalog, refs, validate


class NoFold:
    """The unfolded operators where the engine expects Folded (settle: nothing pending)."""
    def __init__(self, ops):
        self._ops = ops

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def settle(self):
        pass


def main():
    rset, names = sys.argv[1], sys.argv[2:]
    cat = catalog.load()
    for name in names:
        e = catalog.entry(name, cat)
        ref = refs.for_entry(e, rset)
        for mode in ("folded", "no-heads-fold", "unfolded"):
            cuda.HEADS_IN_GEMV = mode == "folded"
            m = engine.load(catalog.model_path(name, catalog=cat), backend="cuda",
                            kv_f16=ref.settings.get("type_k") != "f32")
            if mode == "unfolded":
                m.backend.ops = m.ops = NoFold(m.backend.ops.unfolded)
            r = validate.validate_model(m, e, ref, "cuda", tier=rset, gate=catalog.Gate(margin=float("inf")))
            cases = " ".join(f"{c.max_margin_shift:.3f}/{c.max_logit_diff:.3f}/{len(c.flips)}" for c in r.cases)
            print(f"{name:14} {rset:6} {mode:14} margin {r.max_margin_shift:.3f} logit {r.max_logit_diff:.3f} "
                  f"| per prompt margin/logit/flips {cases}", flush=True)
            del m
        cuda.HEADS_IN_GEMV = True


if __name__ == "__main__":
    main()
