"""The documentation site and the wide tables in a real browser (headless Chromium, selenium;
skipped without them, as tests/test_browser.py says).

The site is built with ``mkdocs build --strict`` into a temporary folder and served from
localhost: every page loads with no console error and asks nothing of any other host (no font
server, no script from elsewhere). A wide table, on a comparison page and on the site's result
pages, keeps its header row and its first column (the model) in view after it is scrolled to
its far corner, at 1400 px and at 400 px; the comparison page's every-configuration table shows
its main columns and opens the others from the summary above it.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_browser import comparison, driver, open_page, severe_messages  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site, served from 127.0.0.1: its base address and its folder."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site") / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d",
                            str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    handler = functools.partial(_Quiet, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", out
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(out, ignore_errors=True)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the test's output is the assertions'
        pass


def open_url(chrome, url: str) -> None:
    """Open ``url`` and wait until it is loaded whole (as :func:`test_browser.open_page`)."""
    from selenium.webdriver.support.ui import WebDriverWait

    chrome.get("about:blank")
    chrome.get_log("browser")
    chrome.get_log("performance")
    chrome.get(url)
    WebDriverWait(chrome, 60).until(
        lambda d: d.execute_script("return document.readyState === 'complete'"))


def requests_elsewhere(chrome, base: str) -> list[str]:
    """Every address the page asked for that is not the local server, a file or inline."""
    import json

    urls = []
    for entry in chrome.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if not url.startswith((base, "file:", "data:", "about:", "blob:")):
                urls.append(url)
    return urls


def test_every_site_page_loads_offline_without_errors(driver, site):  # noqa: F811
    base, out = site
    pages = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html"))
    assert "index.html" in pages and "results/mnist/index.html" in pages
    failures = {}
    for page in pages:
        open_url(driver, base + page)
        driver.execute_script("return document.fonts.ready")  # fonts asked for, if any
        problems = requests_elsewhere(driver, base) + severe_messages(driver)
        if problems:
            failures[page] = problems
    assert failures == {}
    # the theme's stylesheet names no font server: the system's fonts
    html = (out / "index.html").read_text(encoding="utf-8")
    assert "fonts.googleapis" not in html and "fonts.gstatic" not in html


STICKY_CORNER = """
    var table = arguments[0], box = arguments[1];
    box.style.maxHeight = '160px';  // a table taller than its box: it scrolls down too
    box.scrollIntoView();
    box.scrollLeft = box.scrollWidth; box.scrollTop = box.scrollHeight;
    var b = box.getBoundingClientRect();
    var th = table.querySelector('th'), td = table.rows[table.rows.length - 1].cells[0];
    var h = th.getBoundingClientRect(), c = td.getBoundingClientRect();
    return {scrolled: [box.scrollLeft, box.scrollTop], header: h.top - b.top,
            first: c.left - b.left, fits: box.scrollWidth <= box.clientWidth,
            text: document.elementFromPoint(c.left + 3, c.top + 3) === td ||
                  td.contains(document.elementFromPoint(c.left + 3, c.top + 3))};"""


def corner_after_scroll(chrome, table, box) -> dict:
    """Where the header and the last row's first cell are, relative to the table's box, once the
    box is scrolled to its far corner (and whether that cell is on top, not covered)."""
    return chrome.execute_script(STICKY_CORNER, table, box)


@pytest.mark.parametrize("width", [1400, 400])
def test_a_wide_comparison_table_keeps_its_header_and_model_in_view(driver, comparison,  # noqa: F811
                                                                     width):
    from selenium.webdriver.common.by import By

    driver.set_window_size(width, 900)
    try:
        open_page(driver, comparison)
        box = driver.find_element(By.CSS_SELECTOR, ".scroll.wide")
        table = box.find_element(By.TAG_NAME, "table")
        heads = driver.execute_script(
            "return Array.from(arguments[0].querySelectorAll('th'),"
            " th => [th.textContent, th.offsetParent !== null]);", table)
        shown = [h for h, visible in heads if visible]
        assert shown[:5] == ["model", "λ / k", "seeds", "FVU at L0", "FVU"]
        assert len(shown) < len(heads)  # the others wait behind the summary
        toggle = driver.find_element(By.CSS_SELECTOR, "details.cols summary")
        assert f"{len(heads) - len(shown)} more columns" in toggle.text
        toggle.click()
        assert all(driver.execute_script(
            "return Array.from(arguments[0].querySelectorAll('th'),"
            " th => th.offsetParent !== null);", table))
        corner = corner_after_scroll(driver, table, box)
        assert corner["scrolled"][1] > 0  # it did scroll down ...
        assert width > 1000 or corner["scrolled"][0] > 0  # ... and, on a phone, sideways
        assert abs(corner["header"]) <= 1 and abs(corner["first"]) <= 1, corner
        assert corner["text"], corner  # the model's cell is on top of the cells scrolled under
        assert severe_messages(driver) == []
    finally:
        driver.set_window_size(1280, 1000)


@pytest.mark.parametrize("width", [1400, 400])
def test_a_wide_result_table_of_the_site_keeps_its_header_and_model_in_view(driver, site,  # noqa: F811
                                                                            width):
    base, _ = site
    driver.set_window_size(width, 900)
    try:
        open_url(driver, base + "results/mnist/")
        folded = driver.execute_script(
            "return Array.from(document.querySelectorAll('.md-typeset details'),"
            " d => [d.open, d.querySelector('summary').textContent]);")
        assert [False, "What the columns mean"] in [[o, s[:21]] for o, s in folded]
        assert any("more columns" in s for _, s in folded)
        # the definitions come after the verdict, not before it
        order = driver.execute_script(
            "var d = Array.from(document.querySelectorAll('details')).find("
            " e => e.querySelector('summary').textContent.startsWith('What the columns mean'));"
            "var t = document.querySelector('table');"
            "return t.compareDocumentPosition(d) & Node.DOCUMENT_POSITION_FOLLOWING;")
        assert order
        driver.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
        table = driver.execute_script(
            "return Array.from(document.querySelectorAll('.md-typeset table'))"
            ".sort((a, b) => b.scrollWidth - a.scrollWidth)[0];")
        assert driver.execute_script("return arguments[0].querySelectorAll('th').length",
                                     table) > 12
        corner = corner_after_scroll(driver, table, table)
        assert corner["scrolled"][0] > 0 and corner["scrolled"][1] > 0
        assert abs(corner["header"]) <= 1 and abs(corner["first"]) <= 1, corner
        assert corner["text"], corner
    finally:
        driver.set_window_size(1280, 1000)
