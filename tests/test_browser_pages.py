"""The pages on a phone and on data without classes or images, in a real browser (headless
Chromium, selenium; skipped without them, as tests/test_browser.py says).

At 400 px the comparison's verdict and the report's metrics become lists of their rows, so
that no column (a verdict's value, its runner-up) hides behind a sideways scroll; at 1400 px
they are tables. The feature browser and the report of a run on an unlabelled activation matrix
show no class widget and no word of images, pixels or classes; no page has a console error or
asks for anything outside itself.
"""

from __future__ import annotations

import json
import re

import pytest
from test_browser import (  # noqa: F401 (fixtures)
    comparison,
    driver,
    external_requests,
    open_page,
    severe_messages,
)
from test_owndata import plain_run  # noqa: F401 (fixture: a short run on unlabelled rows)

from sae.pages import report

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    """report.html of a run folder whose metrics.json holds every registered run metric."""
    from sae.settings.metric_defs import METRICS

    run = tmp_path_factory.mktemp("report") / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: sparsemax\nlambda: 0.01\ndataset: mnist\n")
    values = {m.name: 0.123456 for m in METRICS if m.group in ("run", "validation", "count")}
    (run / "metrics.json").write_text(json.dumps({**values, "model": "sparsemax"}))
    return report.write_report(run)


def cells_outside(chrome, selector: str) -> list[str]:
    """The cells of the tables ``selector`` that are not wholly inside the window: hidden
    behind a sideways scroll, or wider than the screen."""
    return chrome.execute_script("""
        var out = [];
        document.querySelectorAll(arguments[0]).forEach(function (table) {
          table.querySelectorAll('td').forEach(function (td) {
            var r = td.getBoundingClientRect();
            if (r.width <= 0 || r.left < 0 || r.right > window.innerWidth + 0.5)
              out.push((td.dataset.label || '') + ': ' + td.textContent);
          });
        });
        return out;""", selector)


@pytest.mark.parametrize("which", ["comparison", "report"])
def test_every_column_of_the_verdict_and_the_metrics_is_in_view_at_400_px(
        driver, comparison, report_page, which):  # noqa: F811
    page = comparison if which == "comparison" else report_page
    stacked = "table.stack"
    try:
        driver.set_window_size(400, 900)
        open_page(driver, page)
        assert driver.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth") <= 0
        labels = driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0] + ' td'),"
            " td => td.dataset.label)", stacked)
        expected = ({"L0 band", "criterion", "best", "value", "runner-up", "runner-up value",
                     "margin"} if which == "comparison" else {"metric", "value", "definition"})
        assert set(labels) == expected
        assert cells_outside(driver, stacked) == []
        boxes = driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]),"
            " t => [t.parentElement.scrollWidth, t.parentElement.clientWidth])", stacked)
        assert boxes and all(scroll <= client for scroll, client in boxes)  # nothing to scroll
        # each cell says which column it is
        before = driver.execute_script(
            "return getComputedStyle(document.querySelector(arguments[0] + ' td'), '::before')"
            ".content", stacked)
        assert before.strip('"').endswith(": ")
        assert severe_messages(driver) == [] and external_requests(driver) == []

        driver.set_window_size(1400, 900)  # a table again, its header row shown
        open_page(driver, page)
        shown = driver.execute_script(
            "var t = document.querySelector(arguments[0]);"
            "return [getComputedStyle(t).display, t.querySelector('tr.head').offsetHeight]",
            stacked)
        assert shown[0] == "table" and shown[1] > 0
        assert cells_outside(driver, stacked) == []
    finally:
        driver.set_window_size(1280, 1000)


IMAGE_OR_CLASS_WORDS = re.compile(r"\b(images?|pixels?|class(es)?|prefers?|probe)\b", re.I)


@pytest.mark.parametrize("page", ["features.html", "report.html"])
def test_pages_of_unlabelled_activations_show_no_classes_and_no_image_words(
        driver, plain_run, page):  # noqa: F811
    open_page(driver, plain_run / page)
    assert severe_messages(driver) == [] and external_requests(driver) == []
    # every word of the page but its config table, which names the run's settings as given
    text = driver.execute_script("""
        var body = document.body.cloneNode(true), config = body.querySelector('#config');
        while (config && config.nextSibling) config.parentNode.removeChild(config.nextSibling);
        body.querySelectorAll('script, style').forEach(function (e) { e.remove(); });
        return body.textContent;""")
    assert "test inputs" in text
    assert IMAGE_OR_CLASS_WORDS.findall(text) == []
    widgets = driver.execute_script(
        "return document.querySelectorAll('#f-class, #sort-cls, #sort-sel, svg.cls, .cl')"
        ".length")
    assert widgets == 0
    if page == "features.html":
        titles = driver.execute_script(
            "return Array.from(document.querySelectorAll('#index th'), th => th.textContent)")
        assert titles == ["unit", "frequency", "mean act.", "max act.", "status"]
