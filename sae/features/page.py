"""The feature browser's page: per-unit statistics and images in, one self-contained HTML string
out (:func:`render_features_page`).

No network and no external references: the atoms and the top inputs are two sprite-sheet PNGs
inlined once as ``data:`` URIs (each tile a CSS ``background-position``), histograms and class
bars are inline SVG, and sorting / filtering the index is a little inline JavaScript, so a
512-unit page stays a few MB and opens quickly.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence

import numpy as np
from markupsafe import escape as esc

from sae.pages import PAGE_CSS, inline_png

__all__ = ["render_features_page"]

_SCALE_ATOM = 3  # on-page pixels per image pixel
_SCALE_INPUT = 2
_SPRITE_COLS = 64  # tiles per row of a sprite sheet
_GREY_LEVELS = 16  # grey levels of the input sprite (4-bit PNG)




def _sprite_png(tiles: np.ndarray, palette: Sequence[int]) -> tuple[bytes, int]:
    """``[k, h, w]`` palette indices as one palette PNG, ``_SPRITE_COLS`` tiles per row.

    ``palette`` is RGB triples, flat; up to 16 colours are stored in 4 bits a pixel.
    Returns (PNG bytes, columns).
    """
    from PIL import Image

    k, th, tw = tiles.shape
    cols = max(1, min(_SPRITE_COLS, k))
    rows = max(1, math.ceil(k / cols))
    sheet = np.zeros((rows * th, cols * tw), dtype=np.uint8)
    for i in range(k):
        r, col = divmod(i, cols)
        sheet[r * th:(r + 1) * th, col * tw:(col + 1) * tw] = tiles[i]
    image = Image.fromarray(sheet)
    image.putpalette(list(palette))
    buf = io.BytesIO()
    # optimize=True saves another 4 % at 10x the time
    image.save(buf, format="PNG", bits=4 if len(palette) <= 48 else 8)
    return buf.getvalue(), cols


def _diverging_palette() -> list[int]:
    """256 RGB entries of ``RdBu_r`` (the decoder-atom colours of ``figures.decoder_atoms``)."""
    import matplotlib as mpl

    rgb = mpl.colormaps["RdBu_r"](np.linspace(0.0, 1.0, 256))[:, :3]
    return [int(round(255 * v)) for v in rgb.ravel()]


def _atom_tiles(atoms: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``[H, D]`` atoms -> ``[H, h, w]`` palette indices, each scaled to its own max |w|."""
    scale = np.abs(atoms).max(1, keepdims=True)
    unit = np.nan_to_num(atoms / np.where(scale > 0, scale, 1.0))
    return np.round((unit + 1.0) * 127.5).astype(np.uint8).reshape(len(atoms), *shape)


def _grey_palette() -> list[int]:
    """``_GREY_LEVELS`` greys from black to white."""
    return [round(v * 255 / (_GREY_LEVELS - 1)) for v in range(_GREY_LEVELS) for _ in range(3)]


def _input_tiles(images: np.ndarray) -> np.ndarray:
    """``[k, h, w]`` images (uint8, or floats in [0, 1]) -> ink-dark ``_grey_palette`` indices.

    Sixteen grey levels look the same as 256 on a 2x tile and halve the sprite of
    Fashion-MNIST inputs (2.7 -> 1.2 MB for 6 500 images).
    """
    if images.dtype == np.uint8:
        images = images / 255.0
    paper = 1.0 - np.clip(np.nan_to_num(images), 0.0, 1.0)
    return np.round(paper * (_GREY_LEVELS - 1)).astype(np.uint8)


def _sprite_css(selector: str, png: bytes, cols: int, rows: int, shape: tuple[int, int],
                scale: int) -> str:
    """CSS rule drawing tile ``(--x, --y)`` of a sprite sheet at ``scale``× on ``selector``."""
    th, tw = shape[0] * scale, shape[1] * scale
    data = base64.b64encode(png).decode("ascii")
    return (f"{selector}{{width:{tw}px;height:{th}px;background-image:url(data:image/png;base64,"
            f"{data});background-size:{cols * tw}px {rows * th}px;background-position:"
            f"calc(var(--x) * -{tw}px) calc(var(--y) * -{th}px)}}\n")


# --------------------------------------------------------------------------- page pieces


def _num(value: float) -> str:
    """Three significant digits; '–' for NaN."""
    value = float(value)
    if not math.isfinite(value):
        return "–"
    return f"{value:.3g}"


def _pct(share: float) -> str:
    """A share as a short percentage: 0.5 -> '50 %', 0.00012 -> '0.012 %'."""
    pct = 100 * float(share)
    if pct == 0:
        return "0 %"
    return f"{pct:.1f} %" if pct >= 10 else f"{pct:.2g} %"


def _hist_svg(counts: np.ndarray, lo: float, hi: float) -> str:
    """A step-shaped histogram as one SVG path (y grows down, so bars hang from y = 1)."""
    top = max(int(counts.max()), 1)
    steps = "".join(f"V{1 - c / top:.3g}H{i + 1}" for i, c in enumerate(counts))
    label = (f"activations in ({_num(lo)}, {_num(hi)}], {len(counts)} bins; counts "
             + " ".join(str(int(c)) for c in counts))
    return (f'<svg class="hist" viewBox="0 0 {len(counts)} 1" preserveAspectRatio="none" '
            f'role="img"><title>{esc(label)}</title><path d="M0 1{steps}V1Z"/></svg>')


def _class_svg(dist: np.ndarray, rate: np.ndarray, preferred: int,
               class_names: Sequence[str]) -> str:
    """Bars of the class distribution as one SVG path, the preferred class drawn darker.

    The tooltip lists each class's share of the firing and the unit's firing rate within it.
    """
    top = max(float(dist.max()), 1e-12)
    heights = dist / top
    bars = "".join(f"M{c + 0.12:g} 1V{1 - v:.3g}h0.76V1Z" for c, v in enumerate(heights) if v > 0)
    tip = "share of firing, classes weighted equally (firing rate within the class): " + \
        "; ".join(f"{class_names[c]} {_pct(share)} ({_pct(r)})"
                  for c, (share, r) in enumerate(zip(dist, rate, strict=True)))
    best = (f'<rect x="{preferred + 0.12:g}" y="{1 - heights[preferred]:.3g}" width="0.76" '
            f'height="{heights[preferred]:.3g}"/>')
    return (f'<svg class="cls" viewBox="0 0 {len(dist)} 1" preserveAspectRatio="none" '
            f'role="img"><title>{esc(tip)}</title><path d="{bars}"/>{best}</svg>')


def _short_names(class_names: Sequence[str]) -> list[str]:
    """Bar labels: the names when all are short (digits), else the class indices."""
    if all(len(name) <= 2 for name in class_names):
        return list(class_names)
    return [str(c) for c in range(len(class_names))]


def _state(stats: dict[str, np.ndarray], j: int) -> str:
    return "dead" if stats["dead"][j] else "dense" if stats["dense"][j] else "alive"


def _unit_card(stats: dict[str, np.ndarray], j: int, slot: dict[int, int],
               class_names: Sequence[str], short: Sequence[str]) -> str:
    """One unit's section: atom, facts, histogram, class bars, top inputs."""
    n = int(stats["n_inputs"])
    state = _state(stats, j)
    badge = "" if state == "alive" else f' <span class="badge {state}">{state}</span>'
    atom = (f'<div class="sa" style="--x:{j % _SPRITE_COLS};--y:{j // _SPRITE_COLS}" '
            f'role="img" aria-label="decoder atom of unit {j}"></div>')
    head = f'<h3><a href="#unit-{j}">Unit {j}</a>{badge}</h3>'
    count = int(stats["fire_count"][j])
    if state == "dead":
        body = (f'<div class="row">{atom}<p class="facts">Never fires on the {n:,} test inputs: '
                f'no top inputs, histogram or class distribution.</p></div>')
        return f'<section class="unit" id="unit-{j}" data-j="{j}">{head}{body}</section>'
    pref = int(stats["preferred_class"][j])
    facts = (f'<p class="facts">fires on <b>{_pct(stats["frequency"][j])}</b> ({count:,} of '
             f'{n:,})<br>activation mean {_num(stats["mean_activation"][j])}, max '
             f'{_num(stats["max_activation"][j])}<br>prefers <b>{esc(class_names[pref])}</b>, '
             f'selectivity {_num(stats["selectivity"][j])}<br>atom vs. top inputs: cos '
             f'{_num(stats["atom_cosine"][j])}</p>')
    edges = stats["hist_edges"][j]
    hist = (f'<figure>{_hist_svg(stats["hist_counts"][j], edges[0], edges[-1])}'
            f'<figcaption>activation {_num(edges[0])}–{_num(edges[-1])}</figcaption></figure>')
    labels_row = "".join(f"<i>{esc(s)}</i>" for s in short)
    svg = _class_svg(stats["class_dist"][j], stats["class_rate"][j], pref, class_names)
    bars = (f'<figure>{svg}'
            f'<div class="cl">{labels_row}</div><figcaption>class distribution</figcaption>'
            f'</figure>')
    tiles = []
    top = zip(stats["top_index"][j], stats["top_activation"][j], stats["top_label"][j],
              strict=True)
    for i, act, label in top:
        if i < 0:
            break
        s = slot[int(i)]
        name = class_names[int(label)]
        tip = f' title="{esc(name)}"' if len(name) > 6 else ""
        tiles.append(f'<div class="t"{tip}><i style="--x:{s % _SPRITE_COLS};'
                     f'--y:{s // _SPRITE_COLS}"></i><b>{_num(act)}</b>{esc(name)}</div>')
    tops = f'<div class="tops" aria-label="top activating test inputs">{"".join(tiles)}</div>'
    body = f'<div class="row">{atom}{facts}{hist}{bars}</div>{tops}'
    return f'<section class="unit" id="unit-{j}" data-j="{j}">{head}{body}</section>'


def _index_row(stats: dict[str, np.ndarray], j: int, class_names: Sequence[str]) -> str:
    """One row of the index; the data-* attributes are what the script sorts and filters by."""
    state = _state(stats, j)
    pref = int(stats["preferred_class"][j])
    sel = float(stats["selectivity"][j])
    data = (f'data-j="{j}" data-freq="{float(stats["frequency"][j]):.6g}" '
            f'data-max="{float(stats["max_activation"][j]):.6g}" '
            f'data-sel="{f"{sel:.4f}" if math.isfinite(sel) else ""}" '
            f'data-cls="{pref if pref >= 0 else ""}" data-state="{state}"')  # empty: sorts last
    name = esc(class_names[pref]) if pref >= 0 else "–"
    return (f'<tr {data}><td><a href="#unit-{j}">{j}</a></td>'
            f'<td class="num">{_pct(stats["frequency"][j])}</td>'
            f'<td class="num">{_num(stats["mean_activation"][j])}</td>'
            f'<td class="num">{_num(stats["max_activation"][j])}</td>'
            f'<td class="num">{_num(sel)}</td><td>{name}</td><td>{state}</td></tr>')


def _controls(class_names: Sequence[str]) -> str:
    """Sort buttons and filter fields above the index."""
    options = "".join(f'<option value="{c}">{esc(name)}</option>'
                      for c, name in enumerate(class_names))
    return f"""<div class="controls">
<span>Sort:</span>
<button type="button" id="sort-unit" data-sort="j">unit</button>
<button type="button" id="sort-freq" data-sort="freq">frequency</button>
<button type="button" id="sort-sel" data-sort="sel">selectivity</button>
<button type="button" id="sort-max" data-sort="max">max activation</button>
<button type="button" id="sort-cls" data-sort="cls">preferred class</button>
</div>
<div class="controls">
<span>Filter:</span>
<label>status <select id="f-state"><option value="">all</option><option value="alive">alive
</option><option value="dead">dead</option><option value="dense">dense</option>
<option value="live">not dead</option></select></label>
<label>prefers <select id="f-class"><option value="">any class</option>{options}</select></label>
<label>frequency ≥ <input id="f-freq" type="number" min="0" max="100" step="any"
 placeholder="%"></label>
<label>selectivity ≥ <input id="f-sel" type="number" min="0" max="1" step="0.05"></label>
<label>max activation ≥ <input id="f-max" type="number" step="any"></label>
<output id="shown" aria-live="polite"></output>
</div>"""


_FEATURES_CSS = """
.controls { display: flex; flex-wrap: wrap; gap: 0.35rem 0.7rem; align-items: center;
            margin: 0.4rem 0; font-size: 0.9rem; }
.controls button { font: inherit; padding: 0.1rem 0.5rem; cursor: pointer; }
.controls button[aria-pressed="true"] { background: #2a5db0; color: #fff; border-color: #2a5db0; }
.controls input { width: 5rem; font: inherit; }
.controls select { font: inherit; max-width: 10rem; }
#shown { color: #555; }
.index-box { max-height: 55vh; overflow: auto; border: 1px solid #ddd; }
#index { margin: 0; width: 100%; }
#index th { position: sticky; top: 0; z-index: 1; }
#units { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 520px), 1fr));
         gap: 0.9rem; }
.unit { border: 1px solid #e3e3e3; border-radius: 6px; padding: 0.2rem 0.7rem 0.6rem;
        min-width: 0; content-visibility: auto; contain-intrinsic-size: auto 330px; }
.unit h3 { margin: 0.3rem 0; }
.unit h3 a { color: inherit; text-decoration: none; }
.badge { font-size: 0.75rem; padding: 0 0.4rem; border-radius: 3px; vertical-align: middle;
         color: #fff; }
.badge.dead { background: #d62728; }
.badge.dense { background: #8c564b; }
.row { display: flex; flex-wrap: wrap; gap: 0.6rem; align-items: flex-start; }
.facts { margin: 0; font-size: 0.82rem; line-height: 1.35; flex: 1 1 9rem; }
.row figure { margin: 0; width: 7.5rem; }
.row figcaption { font-size: 0.72rem; color: #666; }
svg.hist, svg.cls { display: block; width: 7.5rem; height: 2.6rem; background: #fafafa;
                    border-bottom: 1px solid #999; }
svg.hist path { fill: #4c72b0; }
svg.cls path { fill: #9db4d8; }
svg.cls rect { fill: #2a5db0; }
.cl { display: flex; font-size: 0.62rem; color: #555; }
.cl i { flex: 1; text-align: center; overflow: hidden; font-style: normal; }
.sa, .t i { display: block; image-rendering: pixelated; background-repeat: no-repeat;
           border: 1px solid #ddd; flex: none; }
.tops { display: flex; flex-wrap: wrap; gap: 0.3rem; margin-top: 0.5rem; }
.t { font-size: 0.68rem; line-height: 1.2; text-align: center; max-width: 58px;
      overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.t b { display: block; font-weight: 600; font-variant-numeric: tabular-nums; }
[hidden] { display: none !important; }
"""

# Sorting and filtering of the index (and, in the same order, of the unit sections). Numbers
# come from the rows' data-* attributes; an empty value (selectivity of a dead unit) sorts last.
_FEATURES_JS = """
(function () {
  'use strict';
  var tbody = document.querySelector('#index tbody');
  var grid = document.getElementById('units');
  var rows = Array.prototype.slice.call(tbody.rows);
  var cards = {};
  Array.prototype.forEach.call(grid.children, function (c) { cards[c.dataset.j] = c; });
  var key = 'j', dir = 1;
  function num(row, k) {
    var v = row.dataset[k];
    return v === '' ? NaN : parseFloat(v);
  }
  function field(id) {
    var v = document.getElementById(id).value;
    return v === '' ? NaN : parseFloat(v);
  }
  function apply() {
    var state = document.getElementById('f-state').value;
    var cls = document.getElementById('f-class').value;
    var minFreq = field('f-freq') / 100, minSel = field('f-sel'), minMax = field('f-max');
    var order = rows.slice().sort(function (a, b) {
      var x = num(a, key), y = num(b, key);
      if (isNaN(x) !== isNaN(y)) { return isNaN(x) ? 1 : -1; }
      return (x === y || isNaN(x)) ? num(a, 'j') - num(b, 'j') : dir * (x - y);
    });
    var shown = 0;
    order.forEach(function (row) {
      var s = row.dataset.state, ok = true;
      if (state === 'live') { ok = s !== 'dead'; } else if (state) { ok = s === state; }
      if (ok && cls !== '') { ok = row.dataset.cls === cls; }
      if (ok && !isNaN(minFreq)) { ok = num(row, 'freq') >= minFreq; }
      if (ok && !isNaN(minSel)) { ok = num(row, 'sel') >= minSel; }
      if (ok && !isNaN(minMax)) { ok = num(row, 'max') >= minMax; }
      row.hidden = !ok;
      cards[row.dataset.j].hidden = !ok;
      tbody.appendChild(row);
      grid.appendChild(cards[row.dataset.j]);
      if (ok) { shown += 1; }
    });
    document.getElementById('shown').textContent =
      shown + ' of ' + rows.length + ' units shown';
    document.querySelectorAll('button[data-sort]').forEach(function (b) {
      var on = b.dataset.sort === key;
      b.setAttribute('aria-pressed', on ? 'true' : 'false');
      b.textContent = b.textContent.replace(/ [\\u2191\\u2193]$/, '') +
        (on ? (dir > 0 ? ' \\u2191' : ' \\u2193') : '');
    });
  }
  document.querySelectorAll('button[data-sort]').forEach(function (b) {
    b.addEventListener('click', function () {
      var k = b.dataset.sort;
      if (k === key) { dir = -dir; } else { key = k; dir = (k === 'j' || k === 'cls') ? 1 : -1; }
      apply();
    });
  });
  ['f-state', 'f-class', 'f-freq', 'f-sel', 'f-max'].forEach(function (id) {
    document.getElementById(id).addEventListener('input', apply);
    document.getElementById(id).addEventListener('change', apply);
  });
  apply();
})();
"""


def render_features_page(stats: dict[str, np.ndarray], images: np.ndarray, title: str,
                         class_names: Sequence[str] | None = None, subtitle: str = "",
                         embedding_png: bytes | None = None) -> str:
    """The complete, self-contained HTML text of a feature browser.

    Args:
        stats: :func:`feature_stats` output.
        images: ``[N, h, w]`` the evaluated inputs, uint8 or floats in [0, 1]; row ``i`` is the
            input ``stats["top_index"]`` calls ``i``. Atoms are drawn at the same ``h × w``.
        title: page heading (the run's name).
        class_names: name of each class (default: the class index).
        subtitle: one line under the heading (model, dataset, ...).
        embedding_png: a code-embedding figure shown at the top, if given.

    Raises:
        ValueError: images and atoms do not have the same number of pixels.
    """
    images = np.asarray(images)
    if images.ndim != 3:
        raise ValueError(f"images must be [N, h, w], got shape {images.shape}")
    shape = (int(images.shape[1]), int(images.shape[2]))
    atoms = np.asarray(stats["atoms"])
    h = len(atoms)
    if atoms.shape[1] != shape[0] * shape[1]:
        raise ValueError(f"atoms have {atoms.shape[1]} pixels, images {shape[0]}x{shape[1]}")
    labels_needed = stats["class_rate"].shape[1]
    names = [str(s) for s in (class_names or [])]
    names += [str(c) for c in range(len(names), labels_needed)]
    short = _short_names(names[:labels_needed])
    n = int(stats["n_inputs"])

    atom_png, atom_cols = _sprite_png(_atom_tiles(atoms, shape), _diverging_palette())
    top = stats["top_index"]
    used = np.unique(top[top >= 0])
    slot = {int(i): s for s, i in enumerate(used)}
    input_png, input_cols = _sprite_png(_input_tiles(images[used] if len(used)
                                                     else np.zeros((1, *shape))), _grey_palette())
    css = (_sprite_css(".sa", atom_png, atom_cols, math.ceil(h / atom_cols), shape, _SCALE_ATOM)
           + _sprite_css(".t i", input_png, input_cols, math.ceil(max(len(used), 1) / input_cols),
                         shape, _SCALE_INPUT))

    dead = int(stats["dead"].sum())
    dense = int(stats["dense"].sum())
    l0 = float(stats["frequency"].sum())
    threshold = float(stats["threshold"])
    summary = (f"{h:,} units, {n:,} test inputs; a unit fires when its code is above "
               f"{threshold:g}. Mean L0 {l0:.3g}; {dead:,} dead (never fire), {dense:,} dense "
               f"(fire on more than half of the inputs).")
    legend = ""
    if short != names[:labels_needed]:
        legend = "<p class=\"sub\">Class bars, left to right: " + ", ".join(
            f"{c} = {esc(name)}" for c, name in enumerate(names[:labels_needed])) + ".</p>"
    if embedding_png is not None:
        embedding = (f"<figure>{inline_png(embedding_png, 'code embedding by class')}"
                     "<figcaption>Test-set codes embedded in 2-D with t-SNE and coloured by "
                     "class: islands of one colour mean the code separates that class without "
                     "having seen labels.</figcaption></figure>")
    else:
        embedding = '<p class="missing">No code embedding was given.</p>'
    rows = "".join(_index_row(stats, j, names) for j in range(h))
    cards = "".join(_unit_card(stats, j, slot, names, short) for j in range(h))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}: features</title>
<style>{PAGE_CSS}{_FEATURES_CSS}{css}</style>
</head>
<body>
<h1>{esc(title)}: what each unit responds to</h1>
<p class="sub">{esc(subtitle)}</p>
<p>{esc(summary)}</p>
<nav><a href="#embedding">Code embedding</a><a href="#index-section">Index</a>\
<a href="#units">Units</a></nav>
<h2 id="embedding">Code embedding</h2>
{embedding}
<h2 id="index-section">Index</h2>
<p class="sub">Selectivity: 1 − normalised entropy of the unit's class distribution (classes
weighted equally): 1 = fires on one class only, 0 = fires equally on all. Click a unit to jump to
it.</p>
{_controls(names[:labels_needed])}
<div class="index-box"><table id="index"><thead><tr><th>unit</th><th>frequency</th>
<th>mean act.</th><th>max act.</th><th>selectivity</th><th>prefers</th><th>status</th></tr>
</thead><tbody>{rows}</tbody></table></div>
<h2>Units</h2>
<p class="sub">Each unit: its decoder atom (red positive, blue negative, scaled to its own max
|w|), firing facts, the histogram of its activations where it fires, its class distribution, and
its top {stats["top_index"].shape[1]} test inputs (activation above, label below).</p>
{legend}
<div id="units">{cards}</div>
<script>{_FEATURES_JS}</script>
</body>
</html>
"""
