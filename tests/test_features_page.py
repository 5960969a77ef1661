"""The feature browser's words and numbers: what "prefers" means, one number format per index
column, and a page for data without labels that shows nothing of classes."""

from __future__ import annotations

import html
import re

import numpy as np

from sae.pages.features import feature_stats, render_features_page


def test_a_unit_prefers_the_class_of_most_of_its_top_inputs():
    """Unit 0 fires on every input of class 4, weakly, and on two of class 1, strongly: by
    firing rate it would 'prefer' 4 while its top inputs show 1s; it prefers 1, the class its
    strongest firings show. A tie of classes among the top inputs goes to the larger summed
    activation."""
    labels = np.repeat([1, 4], 10)
    codes = np.zeros((20, 3), np.float32)
    codes[10:, 0] = 0.1  # every 4, weakly
    codes[:2, 0] = 5.0  # two 1s, strongly
    codes[[0, 10], 1] = [1.0, 2.0]  # one of each: the tie goes to the stronger 4
    x = np.random.default_rng(0).random((20, 6)).astype(np.float32)
    s = feature_stats(codes, labels, x, np.ones((6, 3), np.float32), n_top=2, n_classes=5)
    assert s["class_rate"][0].argmax() == 4  # the firing rate says 4 ...
    assert list(s["preferred_class"]) == [1, 4, -1]  # ... the top inputs say 1; unit 2 is dead
    assert list(s["top_label"][0]) == [1, 1]


def _page(labelled=True, scale=1.0):
    rng = np.random.default_rng(2)
    n, h, side = 80, 6, 4
    labels = np.arange(n) % 3
    codes = np.where(rng.random((n, h)) < 0.4, rng.random((n, h)) * scale, 0)
    codes[:, 5] = 0  # dead
    codes[:30, 4] = np.linspace(0.001, 3.7, 30) * scale  # values of every size in one column
    images = rng.random((n, side, side))
    s = feature_stats(codes.astype(np.float32), labels, images.reshape(n, -1),
                      rng.normal(size=(side * side, h)).astype(np.float32), n_top=8)
    return s, render_features_page(s, images, "run", ["zero", "one", "two"], labelled=labelled)


def index_cells(page: str) -> list[list[str]]:
    body = page.split('<table id="index">')[1].split("</table>")[0]
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>",
                                                                          row)]
            for row in re.findall(r"<tr data-j.*?</tr>", body)]


def test_every_index_column_has_one_number_format():
    for scale in (1.0, 40.0, 0.01):  # whatever the size of the activations
        _, page = _page(scale=scale)
        rows = index_cells(page)
        assert len(rows) == 6
        for column in (1, 2, 3, 4):  # frequency, mean and max activation, selectivity
            texts = [r[column].replace(" rare", "") for r in rows]
            numbers = [t.removesuffix(" %") for t in texts if t != "–"]
            decimals = {len(t.partition(".")[2]) for t in numbers}
            assert len(decimals) == 1, (scale, column, texts)  # 3 % beside 3.7 %: never
            assert all(t.endswith(" %") for t in texts) == (column == 1)
        # the largest activation keeps three significant digits
        top = max(float(r[3]) for r in rows)
        assert len(f"{top:.3g}".replace(".", "").lstrip("0")) <= \
            len(max((r[3] for r in rows), key=float).replace(".", "").lstrip("0"))


def test_the_page_says_what_prefers_means_and_each_card_how_many_top_inputs_agree():
    s, page = _page()
    assert "Prefers: the class most of the unit's top 8 test inputs belong to" in page
    card = re.search(r'<section class="unit" id="unit-0".*?</section>', page, re.S)[0]
    pref = ["zero", "one", "two"][int(s["preferred_class"][0])]
    count = int((s["top_label"][0] == s["preferred_class"][0]).sum())
    assert f"prefers <b>{pref}</b> ({count} of its top {int((s['top_label'][0] >= 0).sum())})" \
        in card
    tiles = re.findall(r"<b>[^<]*</b>(zero|one|two)</div>", card)[:8]  # the top inputs' classes
    assert tiles.count(pref) == count == max(tiles.count(c) for c in set(tiles))


def visible_text(page: str) -> str:
    """The page's words as a reader sees them: no script, style or markup."""
    body = re.sub(r"<(script|style)>.*?</\1>", "", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def test_a_page_without_labels_shows_nothing_of_classes():
    _, page = _page(labelled=False)
    _, labelled = _page()
    for widget in ('id="f-class"', 'id="f-sel"', 'id="sort-cls"', 'id="sort-sel"',
                   '<svg class="cls"', '<div class="cl">'):
        assert widget in labelled and widget not in page, widget
    words = re.compile(r"\b(class(es)?|prefers?|selectivity|probe|labels?)\b", re.I)
    assert words.search(visible_text(labelled))
    assert words.findall(visible_text(page)) == []
    assert not re.search(r"<b>[^<]*</b>(zero|one|two)</div>", page)  # no tile labels
    assert [len(r) for r in index_cells(page)] == [5] * 6  # unit, frequency, acts, status
