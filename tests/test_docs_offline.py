"""The docs site works with no network: every script and stylesheet it loads is its own (mermaid
is served from docs/assets/mermaid/, material's fonts are off), and the diagram pages load that
mermaid, so material never falls back to its CDN. With a headless Chromium installed
(`chromium-headless-shell` or `chromium`), the built pages are also opened offline: the diagrams
are drawn, no table on a guide page is wider than the content column at 1280 pixels, every table
sits in its own scroll box, and no page scrolls sideways at 414 pixels."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

MERMAID = "assets/mermaid/mermaid.min.js"
DIAGRAM_PAGES = ("index.html", "method/index.html", "architecture/index.html")
GUIDE_PAGES = tuple(
    "index.html" if p.stem == "index" else f"{p.stem}/index.html"
    for p in sorted((REPO / "docs").glob("*.md"))
)
TAG = re.compile(r"<(script|link)\b[^>]*>", re.IGNORECASE)
ATTR = re.compile(r'\b(src|href|rel)="([^"]*)"', re.IGNORECASE)
REMOTE = re.compile(r"^(https?:)?//", re.IGNORECASE)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return out


def remote_assets(page: str) -> list[str]:
    """The scripts and stylesheets a page loads from another host."""
    found = []
    for tag in TAG.finditer(page):
        attrs = {k.lower(): v for k, v in ATTR.findall(tag.group())}
        url = attrs.get("src") if tag.group(1).lower() == "script" else attrs.get("href")
        loads = tag.group(1).lower() == "script" or "stylesheet" in attrs.get("rel", "").lower()
        if url and loads and REMOTE.match(url):
            found.append(url)
    return found


def test_remote_assets_are_found():
    page = (
        '<script src="https://unpkg.com/mermaid@11/dist/mermaid.min.js"></script>'
        '<link rel="stylesheet" href="//fonts.googleapis.com/css?family=Roboto">'
        '<script src="../assets/mermaid/mermaid.min.js"></script>'
        '<link rel="next" href="https://example.org/next/">'
        '<link rel="stylesheet" href="assets/extra.css">'
    )
    assert remote_assets(page) == [
        "https://unpkg.com/mermaid@11/dist/mermaid.min.js",
        "//fonts.googleapis.com/css?family=Roboto",
    ]


def test_no_page_loads_a_script_or_stylesheet_from_another_host(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    remote = {str(p.relative_to(site)): remote_assets(p.read_text()) for p in pages}
    assert not {p: urls for p, urls in remote.items() if urls}
    fonts = [str(p.relative_to(site)) for p in pages if "fonts.googleapis" in p.read_text()]
    assert not fonts, "material loads Google Fonts: keep `theme.font: false` in mkdocs.yml"


def test_the_diagram_pages_load_the_sites_own_mermaid(site):
    """Material loads mermaid from a CDN unless the page defines it first (extra_javascript)."""
    assert (site / MERMAID).stat().st_size > 1_000_000
    assert (site / MERMAID).with_name("LICENSE").read_text().startswith("The MIT License")
    for name in DIAGRAM_PAGES:
        page = (site / name).read_text()
        assert 'class="mermaid"' in page, f"{name} has no diagram"
        depth = name.count("/")
        assert f'<script src="{"../" * depth}{MERMAID}"' in page, name


def chromium() -> str | None:
    return shutil.which("chromium-headless-shell") or shutil.which("chromium")


# Appended to a copy of each page: once the page has loaded and material has drawn the diagrams
# and wrapped the tables, it writes what it measured into the page for --dump-dom to read.
MEASURE = """<script>
addEventListener("load", () => setTimeout(() => {
  const column = document.querySelector(".md-content__inner");
  const result = {
    column: column.clientWidth,
    pageWidth: document.documentElement.scrollWidth,
    viewport: innerWidth,
    tables: [...column.querySelectorAll("table:not([class])")].map(t => {
      const box = t.closest(".md-typeset__scrollwrap");
      return {scrollBox: box !== null, hidden: box ? box.scrollWidth - box.clientWidth : null,
              head: t.rows[0].innerText.slice(0, 60)};
    }),
    diagramHeights: [...document.querySelectorAll("div.mermaid")].map(
      d => d.getBoundingClientRect().height)};
  const out = document.createElement("pre");
  out.id = "measured";
  out.textContent = JSON.stringify(result);
  document.body.append(out);
}, 3000));
</script></body>"""


def measure(browser: str, page: Path, width: int) -> dict:
    """Open one built page offline (every host name unresolvable) at `width` pixels."""
    probe = page.with_name("measured.html")
    probe.write_text(page.read_text().replace("</body>", MEASURE, 1))
    dom = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--window-size={width},900",
            "--virtual-time-budget=10000",
            "--dump-dom",
            probe.as_uri(),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    probe.unlink()
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.DOTALL)
    assert found, f"{page}: the measuring script did not run"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.skipif(chromium() is None, reason="no headless Chromium installed")
def test_offline_in_a_browser_diagrams_are_drawn_and_tables_fit(site):
    browser = chromium()
    for name in DIAGRAM_PAGES:
        seen = measure(browser, site / name, 1280)
        # material draws each diagram into a div.mermaid; offline without mermaid none appears
        diagrams = (site / name).read_text().count('class="mermaid"')
        assert len(seen["diagramHeights"]) == diagrams, f"{name}: diagrams not drawn"
        assert all(h > 50 for h in seen["diagramHeights"]), name
    too_wide = []
    for name in GUIDE_PAGES:
        seen = measure(browser, site / name, 1280)
        assert all(t["scrollBox"] for t in seen["tables"]), name
        too_wide += [(name, t["head"], t["hidden"]) for t in seen["tables"] if t["hidden"] > 0]
    assert not too_wide, "tables wider than the content column at 1280 pixels"
    for name in ("index.html", "getting-started/index.html", "scaling/index.html"):
        seen = measure(browser, site / name, 414)
        assert seen["pageWidth"] <= seen["viewport"], f"{name} scrolls sideways at 414 pixels"
