"""A trained run's report.html and features.html in a real browser (headless Chromium, selenium).

One short real run (300 steps, 128 units) is trained, its feature page built with
``python -m sae.features``, and both pages are opened from file:// URLs: no console errors, every
image and sprite decodes, every unit has its anchor, nothing points outside the page, the
sortable headers and filters work, every unit shows its quantile bands, the report link and the
nearest-unit links land on what exists, and the page fits a 400 px wide window.

Needs ``selenium`` (the ``test`` extra) and Debian's ``chromium`` + ``chromium-driver``; the tests
skip, saying which is missing, without them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
HIDDEN = 128
CHROME_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def driver():
    """A headless Chromium with a fresh profile that keeps the page's console messages."""
    pytest.importorskip("selenium", reason="selenium is not installed (pip install -e '.[test]')")
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not found (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        options = Options()
        options.binary_location = str(CHROMIUM)
        for flag in (*CHROME_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        # the performance log holds every request the page makes (external_requests)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        chrome = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        try:
            chrome.set_window_size(1280, 1000)
            yield chrome
        finally:
            chrome.quit()


@pytest.fixture(scope="module")
def run(driver, tmp_path_factory, data_dir) -> Path:
    """A 300-step sparsemax run with its report.html and features.html."""
    root = tmp_path_factory.mktemp("browser")
    out = root / "run"
    # one OpenMP thread: on a busy 2-core machine, threads that wait for each other turned
    # these 300 steps from ~3 s into over a minute
    env = dict(os.environ, SAE_DATA_DIR=str(data_dir), SAE_OFFLINE="1", OMP_NUM_THREADS="1")
    train = subprocess.run(
        [sys.executable, "-m", "sae.run", "--model", "sparsemax", "--max-steps", "300",
         "--limit-train", "4000", "--val-size", "500", "--limit-test", "1000", "--hidden",
         str(HIDDEN), "--batch-size", "128", "--out", str(out)],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stderr
    # a run writes its feature browser, and its report links to it
    assert (out / "features.html").is_file()
    assert 'href="features.html"' in (out / "report.html").read_text()
    return out


def open_page(driver, path: Path) -> None:
    """Open a page and wait until it is parsed whole. Under load chromedriver has returned from
    a reload of the same page while it was still parsing (88 of 128 unit cards in the DOM), so
    the page is left for a blank one first and its own readyState is awaited."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get("about:blank")
    driver.get_log("browser")  # drop messages of earlier pages
    driver.get_log("performance")  # and their requests
    driver.get(path.as_uri())
    WebDriverWait(driver, 60).until(
        lambda d: d.execute_script("return location.href === arguments[0] && "
                                   "document.readyState === 'complete'", path.as_uri()))


def external_requests(driver) -> list[str]:
    """Every address the page asked for since :func:`open_page` other than its own file and
    inline ``data:`` URIs (read from the browser's network log)."""
    import json

    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if not url.startswith(("file:", "data:", "about:")):
                urls.append(url)
    return urls


def severe_messages(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


@pytest.mark.parametrize("page", ["report.html", "features.html"])
def test_page_loads_cleanly(driver, run, page):
    open_page(driver, run / page)
    assert driver.execute_script("return document.readyState") == "complete"
    assert severe_messages(driver) == []
    broken = driver.execute_script(
        "return Array.from(document.images)"
        ".filter(function (i) { return !(i.complete && i.naturalWidth > 0); })"
        ".map(function (i) { return i.alt; });")
    assert broken == []
    assert driver.execute_script("return document.images.length") >= 1
    source = driver.page_source
    assert "http://" not in source and "https://" not in source
    assert external_requests(driver) == []


def test_every_unit_has_an_anchor_and_sprites_load(driver, run):
    open_page(driver, run / "features.html")
    ids = driver.execute_script(
        "return Array.from(document.querySelectorAll('[id^=\"unit-\"]'), e => e.id);")
    assert sorted(ids) == sorted(f"unit-{j}" for j in range(HIDDEN))
    # every sprite tile's background, decoded once per distinct sheet
    sheets = driver.execute_async_script("""
        var done = arguments[arguments.length - 1];
        var urls = new Set();
        document.querySelectorAll('.sa, .t i, .t i.a').forEach(function (e) {
          urls.add(getComputedStyle(e).backgroundImage.slice(5, -2));
        });
        Promise.all(Array.from(urls, function (url) {
          var img = new Image();
          img.src = url;
          return img.decode().then(function () { return [url.slice(0, 22), img.naturalWidth]; },
                                   function () { return [url.slice(0, 22), 0]; });
        })).then(done);
    """)
    assert len(sheets) == 3  # one sheet of atoms, one of shown inputs, one of attributions
    for prefix, width in sheets:
        assert prefix == "data:image/png;base64,"
        assert width > 0
    tiles = driver.execute_script("return document.querySelectorAll('.sa').length")
    assert tiles == HIDDEN


def index_order(driver) -> list[int]:
    return [int(j) for j in driver.execute_script(
        "return Array.from(document.querySelectorAll('#index tbody tr'), r => r.dataset.j);")]


def test_sort_and_filter_the_index(driver, run):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    open_page(driver, run / "features.html")
    before = index_order(driver)
    assert before == list(range(HIDDEN))
    driver.find_element(By.ID, "sort-freq").click()
    after = index_order(driver)
    assert after != before and sorted(after) == before
    freq = driver.execute_script(
        "return Array.from(document.querySelectorAll('#index tbody tr'),"
        " r => parseFloat(r.dataset.freq));")
    assert freq == sorted(freq, reverse=True)
    assert freq[0] > freq[-1]
    cards = driver.execute_script(
        "return Array.from(document.getElementById('units').children, c => +c.dataset.j);")
    assert cards == after  # the unit sections follow the index
    driver.find_element(By.ID, "sort-freq").click()  # again: ascending
    rows = {j: f for j, f in zip(after, freq, strict=True)}
    ascending = [rows[j] for j in index_order(driver)]
    assert ascending == sorted(freq)

    Select(driver.find_element(By.ID, "f-class")).select_by_value("1")
    shown = driver.execute_script(
        "return Array.from(document.querySelectorAll('#index tbody tr'))"
        ".filter(r => !r.hidden).map(r => r.dataset.cls);")
    assert shown and set(shown) == {"1"}
    assert driver.find_element(By.ID, "shown").text == f"{len(shown)} of {HIDDEN} units shown"
    assert severe_messages(driver) == []


def column(driver, key: str) -> list[float]:
    """The index rows' data-``key`` values, top to bottom (NaN for empty)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#index tbody tr'),"
        " r => r.dataset[arguments[0]] === '' ? null : parseFloat(r.dataset[arguments[0]]));",
        key)


@pytest.mark.parametrize("key", ["mean", "st", "sel"])
def test_a_header_click_sorts_the_index_and_another_reverses_it(driver, run, key):
    from selenium.webdriver.common.by import By

    open_page(driver, run / "features.html")
    header = driver.find_element(By.ID, f"sort-{key}")
    assert header.find_element(By.XPATH, "..").tag_name == "th"
    header.click()
    first = column(driver, key)
    ranked = [v for v in first if v is not None]
    assert ranked and first[:len(ranked)] == ranked  # empty values (rare units) sort last
    assert ranked == sorted(ranked, reverse=key != "st")
    header.click()
    again = [v for v in column(driver, key) if v is not None]
    assert again == sorted(ranked, reverse=key == "st")
    if key == "sel":  # rare and dead units sort last in either direction
        assert column(driver, key)[len(again):] == [None] * (HIDDEN - len(again))
    state = driver.execute_script(
        "return arguments[0].parentElement.getAttribute('aria-sort')", header)
    assert state == ("descending" if key == "st" else "ascending")
    assert severe_messages(driver) == []


def test_every_live_unit_shows_its_quantile_bands(driver, run):
    open_page(driver, run / "features.html")
    cards = driver.execute_script("""
        return Array.from(document.querySelectorAll('#units > section'), function (c) {
          return [c.querySelector('.badge.dead') !== null,
                  Array.from(c.querySelectorAll('.group h4'), h => h.firstChild.textContent),
                  c.querySelectorAll('.group .t').length, c.querySelectorAll('.t i.a').length];
        });""")
    assert len(cards) == HIDDEN
    live = [c for c in cards if not c[0]]
    assert live
    for dead, groups, tiles, attributions in cards:
        if dead:
            assert groups == [] and tiles == 0
            continue
        assert groups[0] == "Top activations" and groups[1].startswith("Band 1 of ")
        assert tiles == attributions  # every shown input has its attribution
    assert any(len(groups) == 4 for _, groups, _, _ in live)  # top + 3 bands


def test_report_and_nearest_unit_links_land_on_what_exists(driver, run):
    from selenium.webdriver.common.by import By

    open_page(driver, run / "features.html")
    href = driver.find_element(By.ID, "report-link").get_attribute("href")
    assert href.startswith("file://") and Path(href[len("file://"):]) == run / "report.html"
    assert (run / "report.html").is_file()
    targets = driver.execute_script(
        "return Array.from(document.querySelectorAll('a.near'), a => a.getAttribute('href'));")
    assert len(targets) == 5 * HIDDEN
    missing = driver.execute_script(
        "return arguments[0].filter(h => !document.getElementById(h.slice(1)));", targets)
    assert missing == []
    link = driver.find_element(By.CSS_SELECTOR, "#unit-0 a.near")
    target = link.get_attribute("href").split("#")[1]
    link.click()
    assert driver.execute_script("return location.hash") == f"#{target}"
    top = driver.execute_script(
        "return document.getElementById(arguments[0]).getBoundingClientRect().top", target)
    assert abs(top) < 5  # scrolled to the card
    assert severe_messages(driver) == []


def test_features_page_fits_a_narrow_window(driver, run):
    driver.set_window_size(400, 900)
    try:
        open_page(driver, run / "features.html")
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0
        box = driver.execute_script(
            "var b = document.querySelector('.index-box'); return [b.scrollWidth, b.clientWidth]")
        assert box[1] <= 400  # the index scrolls inside its own box ...
        assert box[0] <= box[1]  # ... but needs not: every column is in view
        # the code embedding, shrunk to the window, opens at full size on a tap
        from selenium.webdriver.common.by import By

        img = driver.find_element(By.CSS_SELECTOR, "#embedding-figure img")
        driver.execute_script("arguments[0].scrollIntoView()", img)
        natural = driver.execute_script("return arguments[0].naturalWidth", img)
        assert img.size["width"] <= 400 < natural
        img.click()
        assert abs(img.size["width"] - natural) <= 2
        img.click()
        assert img.size["width"] <= 400
    finally:
        driver.set_window_size(1280, 1000)


@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> Path:
    """comparison.html of a small constructed sweep (two datasets' results, no training), with
    a run folder that has a report, so the page links to it."""
    from sae import figures
    from sae.sweep import aggregate, plots, render, spec

    # a folder of its own: pages of other tests' sweeps beside it would be linked as siblings
    root = tmp_path_factory.mktemp("comparison") / "sweep"
    root.mkdir()
    sweep_file = root / "small.yaml"
    sweep_file.write_text("datasets: [mnist]\nseeds: [0, 1]\ncommon: {hidden: 32}\n"
                          "models:\n  kl: {lambda: [0.1]}\n  sparsemax: {lambda: [0.01, 0.03]}\n"
                          "  topk: {k: [16, 32]}\n")
    sweep = spec.load_sweep(sweep_file)
    rows = []
    for model, kind, param, value, fvu, l0 in [
            ("kl", "kl", "lambda", 0.1, 0.04, 14.0), ("sparsemax", "sparsemax", "lambda", 0.03,
                                                      0.20, 15.0),
            ("sparsemax", "sparsemax", "lambda", 0.01, 0.13, 34.0),
            ("topk", "topk", "k", 16, 0.17, 16.0), ("topk", "topk", "k", 32, 0.11, 32.0)]:
        for seed in (0, 1):
            rows.append({"dataset": "mnist", "model": model, "kind": kind, "param": param,
                         "value": value, "seed": seed, "fvu": fvu + 0.001 * seed,
                         "fvu_at_l0": (0.6 if kind == "kl" else fvu) + 0.001 * seed,
                         "l0_mean": l0, "l0_std": 5.0, "dead_fraction": 0.01 * seed,
                         "probe_accuracy": 0.95 + fvu / 10, "mse": fvu / 15,
                         "recon_bias": 0.97, "support_fvu": fvu * 0.8, "adaptive_gain": 0.004,
                         "adaptivity": 0.3, "wall_time_s": 60.0,
                         "run": f"runs/mnist/{model}/{param}{value}/seed{seed}"})
    results = aggregate.results_frame(rows)
    run = root / results.loc[0, "run"]
    run.mkdir(parents=True)
    (run / "report.html").write_text("<!DOCTYPE html><title>run</title>")
    summary = aggregate.summarize_seeds(results)
    pngs = {"fvu_vs_l0.png": figures.figure_to_png_bytes(plots.fvu_l0_pareto(summary))}
    links = render.related_links(root, sweep.datasets, results)
    page = root / "comparison.html"
    page.write_text(render.comparison_html(sweep, results, {"mnist": 0.926}, pngs, 10,
                                           len(results), links),
                    encoding="utf-8")
    return page


def overflow_at(driver, page: Path, width: int = 400) -> int:
    """How far the page reaches past the right edge of a ``width``-pixel window."""
    driver.set_window_size(width, 900)
    open_page(driver, page)
    return driver.execute_script("return document.documentElement.scrollWidth") - width


@pytest.mark.parametrize("which", ["report", "comparison"])
def test_report_and_comparison_fit_a_400_px_window(driver, run, comparison, which):
    page = run / "report.html" if which == "report" else comparison
    try:
        assert overflow_at(driver, page) <= 4  # a few pixels of rounding
        boxes = driver.execute_script(
            "return Array.from(document.querySelectorAll('table'),"
            " t => [t.parentElement.className, t.parentElement.clientWidth]);")
        assert boxes and all(cls.split()[0] == "scroll" and w <= 400 for cls, w in boxes)
        assert severe_messages(driver) == []
        assert external_requests(driver) == []
    finally:
        driver.set_window_size(1280, 1000)


def test_comparison_tables_fit_a_1400_px_window_and_the_definitions_are_folded(driver,
                                                                              comparison):
    driver.set_window_size(1400, 900)
    try:
        open_page(driver, comparison)
        assert overflow_at(driver, comparison, 1400) <= 4
        boxes = driver.execute_script(
            "return Array.from(document.querySelectorAll('.scroll'),"
            " b => [b.className, b.scrollWidth, b.clientWidth]);")
        # every table shows all its columns, the wide one (every configuration) by taking the
        # window's width rather than the text column's
        assert all(scroll <= client + 1 for _, scroll, client in boxes), boxes
        widest = max(client for _, _, client in boxes)
        assert ["scroll wide", widest] in [[c, w] for c, _, w in boxes] and widest > 1200
        note = "return document.querySelector('details.note')"
        assert driver.execute_script(note + ".open") is False
        assert "mean ± std" in driver.execute_script(note + ".querySelector('summary')"
                                                     ".textContent")
        assert "FVU at L0" in driver.execute_script(note + ".textContent")
    finally:
        driver.set_window_size(1280, 1000)


def test_a_tap_opens_a_figure_at_full_size_and_another_closes_it(driver, comparison):
    from selenium.webdriver.common.by import By

    driver.set_window_size(400, 900)
    try:
        open_page(driver, comparison)
        img = driver.find_element(By.CSS_SELECTOR, "figure img")
        frame = "return getComputedStyle(document.querySelector('.zoom span')).position"
        assert driver.execute_script(frame) == "static"
        assert img.size["width"] <= 400
        img.click()
        assert driver.execute_script(frame) == "fixed"
        natural = driver.execute_script("return arguments[0].naturalWidth", img)
        assert natural > 400  # the figure is wider than the window ...
        assert abs(img.size["width"] - natural) <= 2  # ... and shown at full size (+ border)
        img.click()
        assert driver.execute_script(frame) == "static"
    finally:
        driver.set_window_size(1280, 1000)


def test_comparison_marks_the_best_cells_and_links_the_run_reports(driver, comparison):
    open_page(driver, comparison)
    best = driver.execute_script(
        "return Array.from(document.querySelectorAll('td.best'), td => td.textContent);")
    # topk has the lowest FVU at L0 in both bands; the KL-SAE (no exact zeros) is left out
    assert {"0.1705 ± 0.0007", "0.1105 ± 0.0007"} <= set(best)
    assert "0.6005 ± 0.0007" not in best
    hrefs = driver.execute_script(
        "return Array.from(document.querySelectorAll('a[href]'), a => a.getAttribute('href'))"
        ".filter(h => !h.startsWith('#'));")
    assert hrefs == ["runs/mnist/kl/lambda0.1/seed0/report.html"]
