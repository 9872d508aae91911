"""The generated scoreboard in a real browser (headless Chromium).

How a broken page is caught: the page carries a small self-check script
(harness/report/html.py) that records script errors, console.error calls
and failed resource loads from the start, and after the load event marks
every inline figure that drew nothing (no size, or no drawing element in
its SVG) and whether the page is wider than the window - all into the
attributes of ``#selfcheck``. ``chromium --dump-dom`` prints the DOM after
load in a 1400-pixel window, so this test reads the verdict from there; it
also requires every section id in the DOM, the figure count to equal the
figures written, no <img> (the page is one self-contained file), and no
"Uncaught" console line in Chromium's log (``--enable-logging=stderr``),
which would catch a self-check that itself failed. A second test breaks a
page on purpose (an empty figure, an image that fails to load, something
too wide, a thrown error, console.error, a missing section) to show each
check bites. Screenshots (1400 pixels wide, the summary table at the top)
are saved in the test's tmp dir, and copied to $ANVIL_SCREENSHOT_DIR when
it is set.

Without Chromium these tests SKIP (``scripts/install-browser.sh`` installs it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness import results
from harness.report import build_report, write_html
from test_report import store  # noqa: F401  (the fake results store fixture)

SECTIONS = ("summary", "scoreboard", "figures", "history", "parity", "ab", "diagnosis", "provenance")
WIDTH = 1400  # a laptop's browser window: the page must fit it (the summary table first)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--mute-audio", "--enable-logging=stderr", "--v=0")
TIMEOUT_S = 120


def _find_chromium() -> str | None:
    for c in (os.environ.get("ANVIL_CHROMIUM"), "chromium", "chromium-browser", "/usr/bin/chromium"):
        path = c and (shutil.which(c) or (c if os.access(c, os.X_OK) else None))
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    exe = _find_chromium()
    if exe is None:
        pytest.skip("chromium not found: scripts/install-browser.sh installs it when you say yes in a terminal "
                    "(or with ANVIL_INSTALL_BROWSER=1); or set ANVIL_CHROMIUM to one")
    return exe


def _run(exe: str, page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [exe, *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-3000:]}"
    return p


class _DomScan(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.selfcheck: dict | None = None
        self.images = self.figures = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if a.get("id") == "selfcheck":
            self.selfcheck = a
        self.images += tag == "img"
        self.figures += tag == "figure" and "fig" in (a.get("class") or "").split()


def check_page(exe: str, page: Path, work: Path) -> list[str]:
    """Load ``page`` in Chromium; return what is wrong with it (empty: nothing)."""
    p = _run(exe, page, work / "profile", "--virtual-time-budget=10000", f"--window-size={WIDTH},2000", "--dump-dom")
    dom = _DomScan()
    dom.feed(p.stdout)
    written = _DomScan()
    written.feed(page.read_text())
    problems = [f"section #{s} missing" for s in SECTIONS if s not in dom.ids]
    sc = dom.selfcheck
    if sc is None:
        problems.append("no #selfcheck element in the DOM")
    elif sc.get("data-status") == "pending":
        problems.append("the page's self-check never ran")
    else:
        problems += [f"empty figure {name}" for name in (sc.get("data-empty") or "").split()]
        problems += [f"page error: {e}" for e in (sc.get("data-errors") or "").split(" | ") if e]
        if sc.get("data-figures") != str(written.figures):
            problems.append(f"{sc.get('data-figures')} figures in the DOM, {written.figures} written")
        if sc.get("data-images") != "0":
            problems.append(f"{sc.get('data-images')} images: the page is to be self-contained")
        if sc.get("data-overflow"):
            problems.append(f"wider than a {WIDTH}-pixel window: {sc['data-overflow']}")
    console = re.findall(r'CONSOLE[^\]]*\] "(.*)", source:', p.stderr)
    problems += [f"console: {c}" for c in console if "Uncaught" in c]
    return problems


def screenshot(exe: str, page: Path, work: Path, name: str) -> Path:
    out = work / name
    _run(exe, page, work / "profile-shot", f"--window-size={WIDTH},2000", f"--screenshot={out}")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("ANVIL_SCREENSHOT_DIR"):
        d = Path(os.environ["ANVIL_SCREENSHOT_DIR"])
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, d / name)
    return out


def _not_blank(png: Path) -> float:
    """Fraction of pixels that are not near-white: a blank or error page has ~none."""
    from matplotlib.image import imread

    img = imread(png)
    assert img.shape[:2] == (2000, WIDTH)
    return float((img[..., :3].min(axis=-1) < 0.9).mean())


def test_fake_store_page_renders_clean(chromium, store, tmp_path):  # noqa: F811
    page = write_html(build_report(results.load_all(store)), tmp_path / "site")
    assert page.read_text().count('<figure class="fig"') >= 4  # ratios, history, two NVML traces
    assert check_page(chromium, page, tmp_path) == []
    assert _not_blank(screenshot(chromium, page, tmp_path, "report-fake.png")) > 0.02


def test_committed_records_page_renders_clean(chromium, tmp_path):
    """The committed scoreboard itself (test_report checks it is what
    `harness report` renders from the committed records)."""
    from harness.report import DEFAULT_OUT

    page = DEFAULT_OUT
    assert check_page(chromium, page, tmp_path) == []
    assert _not_blank(screenshot(chromium, page, tmp_path, "report-committed.png")) > 0.02


def test_checks_catch_a_broken_page(chromium, store, tmp_path):  # noqa: F811
    from harness.report.html import FIGURE_RE

    page = write_html(build_report(results.load_all(store)), tmp_path / "site")
    html = page.read_text()
    first = FIGURE_RE.search(html)
    html = html.replace(first[0], f"{first[1]}<svg></svg>{first[3]}")  # a figure that draws nothing
    html = html.replace('<section id="history">', '<section id="hist0ry">')
    html = html.replace("</body>", '<img src="gone.png"><div style="width: 3000px">wide</div>'
                        "<script>console.error('boom'); undefinedFunction();</script></body>")
    page.write_text(html)
    problems = check_page(chromium, page, tmp_path)
    assert "section #history missing" in problems
    assert f"empty figure {first[2]}" in problems
    assert any("failed to load img gone.png" in p for p in problems)
    assert "1 images: the page is to be self-contained" in problems
    assert any(p.startswith(f"wider than a {WIDTH}-pixel window: ") for p in problems)
    assert "page error: console.error: boom" in problems
    assert any(p.startswith("page error: error: Uncaught ReferenceError: undefinedFunction") for p in problems)
    assert any(p.startswith("console: Uncaught ReferenceError") for p in problems)

    page.write_text(page.read_text().replace("window.addEventListener(\"load\"", "window.addEventListener(\"nope\""))
    assert "the page's self-check never ran" in check_page(chromium, page, tmp_path)
