"""Feature browser: what makes each unit fire, one self-contained ``features.html`` per run.

Usage::

    python -m sae.features <run-folder> [--data-dir DIR] [--out FILE]

For every unit (dead ones included) the page shows its decoder atom, its top activating test
inputs with their activations and labels, a histogram of its activations, its firing frequency,
the classes it fires on and how selective it is for one of them. An index at the top lists all
units and sorts / filters them with a little inline JavaScript; a t-SNE of the test codes
(:mod:`sae.embedding`) opens the page.

Three layers, each usable alone:

- :func:`feature_stats`: pure numpy, codes and labels in, per-unit statistics out;
- :func:`render_features_page`: statistics and images in, one HTML string out. No network and no
  external references: the atoms and the top inputs are two sprite-sheet PNGs inlined once as
  ``data:`` URIs (each tile a CSS ``background-position``), histograms and class bars are inline
  SVG, so a 512-unit page stays a few MB and opens quickly;
- :func:`build_features`: a run folder in, ``features.html`` (and
  ``figures/code_embedding/epoch_<E>.png`` (E: the checkpoint's epoch)) out.
"""

from __future__ import annotations

import base64
import io
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml
from markupsafe import escape as esc

from sae.io import write_text
from sae.pages import PAGE_CSS, inline_png
from sae.report import RunFolderError

__all__ = ["DENSE_LIMIT", "HIST_BINS", "N_TOP", "build_features", "feature_stats", "main",
           "render_features_page"]

N_TOP = 16  # top activating inputs kept per unit
HIST_BINS = 20  # bins of each unit's activation histogram
DENSE_LIMIT = 0.5  # fires on more than this share of inputs: dense (as metrics.dense_fraction)
_SCALE_ATOM = 3  # on-page pixels per image pixel
_SCALE_INPUT = 2
_SPRITE_COLS = 64  # tiles per row of a sprite sheet
_GREY_LEVELS = 16  # grey levels of the input sprite (4-bit PNG)


# --------------------------------------------------------------------------- statistics


def feature_stats(codes: np.ndarray, labels: np.ndarray, x: np.ndarray, atoms: np.ndarray,
                  threshold: float = 0.0, n_top: int = N_TOP, n_classes: int | None = None,
                  bins: int = HIST_BINS) -> dict[str, np.ndarray]:
    """Per-unit statistics of a code over an evaluation set.

    A unit *fires* on an input when its code value is above ``threshold``
    (:func:`sae.metrics.active`: strict, NaN never fires).

    Args:
        codes: ``[N, H]`` code activations, N ≥ 1.
        labels: ``[N]`` integer classes in ``[0, n_classes)``.
        x: ``[N, D]`` the inputs (their mean is the reference of ``atom_cosine``).
        atoms: ``[D, H]`` what each unit draws (``model.atoms()``).
        threshold: firing threshold (``model.fire_threshold``).
        n_top: how many top activating inputs to keep per unit.
        n_classes: number of classes (default ``labels.max() + 1``).
        bins: bins of each unit's activation histogram.

    Returns:
        numpy arrays, H units, C classes, K = ``n_top``:

        - ``frequency`` [H]: share of inputs the unit fires on; ``fire_count`` [H] the count;
        - ``mean_activation``, ``max_activation`` [H]: over the inputs it fires on (0 if dead);
        - ``class_rate`` [H, C]: share of the inputs of each class that it fires on;
        - ``class_dist`` [H, C]: ``class_rate`` normalised to sum 1 per unit: the class
          distribution of its firing with every class weighted equally (so an unequal number of
          test inputs per class does not look like a preference); all 0 for a dead unit;
        - ``selectivity`` [H]: ``1 − H(class_dist) / log C'``, H the Shannon entropy and C' the
          number of classes present (:func:`sae.metrics.class_selectivity`): 1 for a unit that
          fires on one class only, 0 for one that fires at the same rate in every class. NaN for
          dead units and when C' < 2;
        - ``preferred_class`` [H]: argmax of ``class_rate``, -1 for dead units;
        - ``top_index``, ``top_activation``, ``top_label`` [H, K]: the inputs with the largest
          activation, largest first, and their classes; slots beyond the unit's firing count
          hold index -1, activation 0 and label -1;
        - ``hist_counts`` [H, bins], ``hist_edges`` [H, bins + 1]: histogram of the activations
          of the inputs it fires on, ``bins`` equal bins from ``threshold`` to its max
          activation; the counts sum to ``fire_count``;
        - ``dead`` [H]: fires on no input; ``dense`` [H]: fires on more than half of them;
        - ``atom_cosine`` [H]: cosine between the unit's atom and the mean of its top inputs
          minus the mean input: near 1 when the atom draws what makes the unit fire (NaN if
          dead);
        - ``atoms`` [H, D]: the atoms, one row per unit;
        - ``n_inputs``, ``threshold``: 0-d arrays.
    """
    import torch

    from sae.metrics import active, class_selectivity

    codes = np.asarray(codes, dtype=np.float32)
    labels = np.asarray(labels).astype(np.int64).ravel()
    if codes.ndim != 2 or len(codes) == 0:
        raise ValueError(f"codes must be [N >= 1, H], got shape {codes.shape}")
    n, h = codes.shape
    x = np.asarray(x, dtype=np.float32).reshape(n, -1)
    atoms = np.asarray(atoms, dtype=np.float32)
    if len(labels) != n:
        raise ValueError(f"{n} codes but {len(labels)} labels")
    if atoms.ndim != 2 or atoms.shape[1] != h:
        raise ValueError(f"atoms must be [D, {h}], got shape {atoms.shape}")
    c = int(n_classes) if n_classes is not None else int(labels.max()) + 1
    if labels.min() < 0 or labels.max() >= c:
        raise ValueError(f"labels must lie in [0, {c}), got [{labels.min()}, {labels.max()}]")
    if n_top < 1 or bins < 1:
        raise ValueError("n_top and bins must be >= 1")

    fires = active(torch.from_numpy(codes), threshold).numpy()  # [N, H]
    count = fires.sum(0)
    dead = count == 0
    live = np.where(fires, codes, 0.0)
    mean_act = np.where(dead, 0.0, live.sum(0, dtype=np.float64) / np.maximum(count, 1))
    max_act = np.where(dead, 0.0, np.where(fires, codes, -np.inf).max(0))

    onehot = np.zeros((n, c), dtype=np.float32)
    onehot[np.arange(n), labels] = 1.0
    class_total = onehot.sum(0)
    class_rate = (fires.T.astype(np.float32) @ onehot) / np.maximum(class_total, 1)  # [H, C]
    rate_sum = class_rate.sum(1, keepdims=True)
    class_dist = class_rate / np.where(rate_sum > 0, rate_sum, 1.0)
    preferred, selectivity = (t.numpy() for t in class_selectivity(
        torch.from_numpy(class_rate.T), torch.from_numpy(class_total > 0)))

    k = min(n_top, n)
    part = np.argpartition(-codes, k - 1, axis=0)[:k]  # [k, H], NaN sorts last
    vals = np.take_along_axis(codes, part, 0)
    order = np.argsort(-vals, axis=0, kind="stable")
    top_index = np.take_along_axis(part, order, 0).T  # [H, k]
    top_act = np.take_along_axis(vals, order, 0).T
    top_fired = np.take_along_axis(fires, top_index.T, 0).T
    top_index = np.where(top_fired, top_index, -1)
    top_act = np.where(top_fired, top_act, 0.0)
    if k < n_top:
        top_index = np.pad(top_index, ((0, 0), (0, n_top - k)), constant_values=-1)
        top_act = np.pad(top_act, ((0, 0), (0, n_top - k)))

    rows, units = np.nonzero(fires)
    width = (max_act - threshold) / bins
    width = np.where(width > 0, width, 1.0)
    which = np.floor((codes[rows, units] - threshold) / width[units]).astype(np.int64)
    which = np.clip(which, 0, bins - 1)
    hist = np.bincount(units * bins + which, minlength=h * bins).reshape(h, bins)
    edges = threshold + (max_act - threshold)[:, None] * np.linspace(0.0, 1.0, bins + 1)[None]

    valid = top_index >= 0
    gathered = x[np.where(valid, top_index, 0)] * valid[..., None]  # [H, K, D]
    top_mean = gathered.sum(1) / np.maximum(valid.sum(1), 1)[:, None] - x.mean(0)
    unit_atoms = atoms.T  # [H, D]
    norms = np.linalg.norm(top_mean, axis=1) * np.linalg.norm(unit_atoms, axis=1)
    cosine = (top_mean * unit_atoms).sum(1) / np.where(norms > 0, norms, 1.0)
    cosine = np.where(dead | (norms == 0), np.nan, cosine)

    return {
        "frequency": count / n,
        "fire_count": count.astype(np.int64),
        "mean_activation": mean_act,
        "max_activation": max_act,
        "class_rate": class_rate,
        "class_dist": class_dist,
        "selectivity": selectivity,
        "preferred_class": preferred.astype(np.int64),
        "top_index": top_index.astype(np.int64),
        "top_activation": top_act,
        "top_label": np.where(top_index >= 0, labels[np.maximum(top_index, 0)], -1),
        "hist_counts": hist.astype(np.int64),
        "hist_edges": edges,
        "dead": dead,
        "dense": count / n > DENSE_LIMIT,
        "atom_cosine": cosine,
        "atoms": unit_atoms,
        "n_inputs": np.asarray(n),
        "threshold": np.asarray(float(threshold)),
    }


# --------------------------------------------------------------------------- sprite sheets


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


# --------------------------------------------------------------------------- run folder


def _checked_run(run_dir: Path) -> tuple[dict, Path]:
    """The run's settings (``config.yaml``) and checkpoint path, checked without heavy imports.

    Raises:
        RunFolderError: missing folder, no readable ``config.yaml``, or no ``last.ckpt``.
    """
    if not run_dir.exists():
        raise RunFolderError(f"run folder not found: {run_dir}")
    if not run_dir.is_dir():
        raise RunFolderError(f"not a folder: {run_dir}")
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise RunFolderError(f"not a run folder (no config.yaml): {run_dir}")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise RunFolderError(f"cannot read {path}: {exc}") from None
    if not isinstance(config, dict):
        raise RunFolderError(f"{path} does not hold a mapping of settings")
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        raise RunFolderError(f"no checkpoint: {ckpt} does not exist (has the run trained?)")
    return config, ckpt


def build_features(run_dir: str | Path, data_dir: str | Path | None = None,
                   max_inputs: int | None = None, out: str | Path | None = None) -> Path:
    """Write a run's feature browser (default ``<run_dir>/features.html``) and return its path.

    Loads ``checkpoints/last.ckpt``, reads the test split the run used (its ``dataset`` and
    ``limit_test`` from ``config.yaml``; ``data_dir`` overrides the run's ``data_dir``, which
    falls back to ``$SAE_DATA_DIR`` as in :func:`sae.data.load_arrays`), encodes it, computes
    :func:`feature_stats` with the model's ``fire_threshold``, saves the code embedding as
    ``figures/code_embedding/epoch_<E>.png`` (E: the checkpoint's epoch) and writes the page
    atomically.

    Args:
        run_dir: a run folder written by ``python -m sae.run``.
        data_dir: folder of the IDX files, if not the run's.
        max_inputs: use only the first this many test inputs (after ``limit_test``).
        out: where to write the page instead of ``<run_dir>/features.html``.

    Raises:
        RunFolderError: not a run folder, or no readable checkpoint.
        sae.data.DataSourceError: the test split cannot be found.
    """
    run_dir = Path(run_dir)
    config, ckpt = _checked_run(run_dir)

    from sae.checkpoints import CheckpointError, read_checkpoint
    from sae.data import CLASS_NAMES, load_arrays, to_float
    from sae.embedding import embedding_figure
    from sae.figures import save_png
    from sae.models import encode_dataset, model_from_checkpoint

    dataset = str(config.get("dataset", "mnist"))
    arrays = load_arrays(dataset, data_dir if data_dir is not None else config.get("data_dir"))
    images, labels = arrays.test_images, arrays.test_labels
    for limit in (config.get("limit_test"), max_inputs):
        if limit:
            images, labels = images[:int(limit)], labels[:int(limit)]
    try:
        state = read_checkpoint(ckpt)
        model, epoch = model_from_checkpoint(state), int(state.get("epoch", 0))
    except (CheckpointError, OSError, RuntimeError, KeyError) as exc:
        raise RunFolderError(f"cannot load {ckpt}: {exc}") from None
    x = to_float(images)
    _, codes = encode_dataset(model, x)
    class_names = CLASS_NAMES.get(dataset, [str(c) for c in range(int(labels.max()) + 1)])
    stats = feature_stats(codes.numpy(), labels, x.numpy(), model.atoms().cpu().numpy(),
                          model.fire_threshold, n_classes=len(class_names))
    figure = save_png(embedding_figure(codes.numpy(), labels, class_names),
                      run_dir / "figures" / "code_embedding" / f"epoch_{epoch}.png")
    name = str(config.get("name") or run_dir.resolve().name)
    subtitle = (f"{model.config.model} on {dataset}, {model.config.hidden:,} units, "
                f"checkpoint {ckpt.relative_to(run_dir)}")
    page = render_features_page(stats, images, name, class_names, subtitle,
                                embedding_png=figure.read_bytes())
    target = Path(out) if out is not None else run_dir / "features.html"
    write_text(target, page)
    return target


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    from sae.cli import OneLineParser, UsageError  # light: no torch, no Lightning

    parser = OneLineParser(prog="python -m sae.features",
                           description="Write <run-folder>/features.html: what each unit of a "
                                       "trained SAE responds to.")
    parser.add_argument("run", type=Path, help="run folder (holds config.yaml, checkpoints/)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="folder with the IDX files (default: the run's, $SAE_DATA_DIR)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the page here (default: <run-folder>/features.html)")
    parser.add_argument("--max-inputs", type=int, default=None,
                        help="use only the first N test inputs")
    try:
        args = parser.parse_args(argv)
        if args.max_inputs is not None and args.max_inputs < 1:
            raise UsageError(f"--max-inputs must be >= 1, got {args.max_inputs}")
        if args.out is not None and not args.out.parent.is_dir():
            raise UsageError(f"--out: folder {args.out.parent} does not exist")
        _checked_run(args.run)  # answer a wrong folder before importing torch
    except (UsageError, RunFolderError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from sae.data import DataSourceError

    try:
        path = build_features(args.run, args.data_dir, args.max_inputs, args.out)
    except (RunFolderError, DataSourceError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
