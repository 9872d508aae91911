"""The noise band an A/B verdict is judged against: how far B/A strays from
1 when nothing changed, measured for the device, backend and test.

An A/A run (``harness ab --aa WHEEL``: one build against itself, in the
same interleaved rounds as any A/B) measures it: a test's band is the
farthest its B/A confidence interval reached from 1. Saved, it is an ``ab``
record with ``"aa": true`` and ``noise_band`` ({test: band, a fraction});
every later A/B on the same device and backend takes each test's band from
the newest such record (one of the same model first: a model's size moves
its noise).

Without one, each test falls back to DEFAULT_SDS standard deviations of the
run's own per-round B/A: that band knows how far one round scatters, not
whether two arms sit apart even when they are one build. The report says
which band judged each test, and where it came from.
"""

from __future__ import annotations

from pathlib import Path

from . import results, stats

DEFAULT_SDS = 2.0  # ~95% of one round's B/A lies within 2 sd of the middle
AA_HINT = "measure it: harness ab --aa WHEEL --save"


def aa_band(ci_low: float, ci_high: float) -> float:
    """An A/A test's band: the farthest its B/A confidence interval reached from 1."""
    return max(1 - ci_low, ci_high - 1, 0.0)


def default_band(a: list[float], b: list[float]) -> dict:
    """The fallback band from the run itself (``a``, ``b``: one value per round)."""
    return {"band": DEFAULT_SDS * stats.ratio_spread(zip(a, b)), "source": "default",
            "said": f"default: {DEFAULT_SDS:g} sd of this run's per-round B/A (no A/A record for this device, "
                    f"backend and test; {AA_HINT})"}


def find(store, *, device: str | None, backend: str | None, test: str, model: str | None = None) -> dict | None:
    """The band of ``test`` from the newest complete A/A record in ``store``
    on ``device`` with ``backend`` (one of ``model`` first), or None."""
    if not device or not backend:
        return None  # a run that did not say where it ran matches nothing
    recs = [r for r in results.load_all(store, kind="ab")
            if r.get("aa") and r.get("complete") and r.get("device") == device and r.get("backend") == backend
            and isinstance((r.get("noise_band") or {}).get(test), (int, float))]
    if not recs:
        return None
    rec = max([r for r in recs if model and r.get("model_name") == model] or recs, key=lambda r: r["date"])
    name = Path(rec["_path"]).name
    return {"band": float(rec["noise_band"][test]), "source": "aa", "record": name,
            "said": f"A/A record {name} ({rec.get('model_name') or rec.get('model')}, {rec['date'][:10]})"}


def band_for(store, record: dict, test: str, a: list[float], b: list[float]) -> dict:
    """The band that judges ``test`` of the A/B ``record``: measured (A/A), else the default."""
    return (find(store, device=record.get("device"), backend=record.get("backend"), test=test,
                 model=record.get("model_name"))
            or default_band(a, b))
