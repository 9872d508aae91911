"""On the GPU host: collect the model pieces carried with this call
(.gpu/parts/<name>/pNN/, cut by scripts/gpu/split-model.sh) in
/tmp/parts/<name>/, and once every piece of a catalog model is there (the
joined file has the sha256 the catalog pins), put the model where the harness
looks for it. Pieces live under /tmp, so only while the machine stays warm.
"""

import hashlib
import shutil
import sys
from pathlib import Path

STASH = Path("/tmp/parts")


def main() -> None:
    # first, before anything that could fail: this call's piece is gone with the call
    for piece in sorted(Path(".gpu/parts").glob("*/p*/piece.*")):
        dest = STASH / piece.parent.parent.name / piece.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists() or dest.stat().st_size != piece.stat().st_size:
            tmp = dest.with_name(".copying-" + dest.name)  # not matched by piece.*
            shutil.copyfile(piece, tmp)
            tmp.replace(dest)

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from harness import catalog, fetch

    cat = catalog.load()
    for d in sorted(p for p in STASH.glob("*") if p.is_dir() and p.name in cat):
        e = cat[d.name]
        final = fetch.models_dir() / d.name / e.raw["filename"]
        if final.exists():
            continue
        pieces = sorted(d.glob("piece.*"))
        tmp = final.with_name(final.name + ".joining")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        with open(tmp, "wb") as f:
            for p in pieces:
                data = p.read_bytes()
                h.update(data)
                f.write(data)
        if h.hexdigest() == e.sha256:
            tmp.replace(final)
            fetch.write_stamp(final, e.sha256)
            print(f"join_parts: {d.name} complete ({len(pieces)} pieces) -> {final}")
        else:
            tmp.unlink()
            print(f"join_parts: {d.name}: {len(pieces)} pieces here ({', '.join(p.name for p in pieces)}), "
                  "not the catalog's file yet (a piece missing, or a wrong one among them)")


if __name__ == "__main__":
    main()
