"""The feature browser's page: per-unit statistics and images in, one self-contained HTML string
out (:func:`render_features_page`).

No network and no external references: the atoms, the shown inputs and their attributions are
three sprite-sheet PNGs inlined once as ``data:`` URIs (each tile a CSS ``background-position``),
histograms and class bars are inline SVG, and sorting / filtering the index is a little inline
JavaScript, so a 512-unit page stays a few MB and opens quickly.

The page is one jinja2 template (``templates/features.html.j2``, with its stylesheet and script
beside it) rendered with autoescape: class names and titles read from run folders are escaped
wherever they land; this module prepares plain values (numbers formatted, SVG paths) and marks
as markup only what it builds itself (the class-bar SVG, the sprite CSS, the embedding image).
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence

import numpy as np
from markupsafe import Markup
from markupsafe import escape as esc

from sae.pages.html import ENV, PAGE_CSS, inline_png

__all__ = ["ATTRIBUTION_BUDGET", "render_features_page"]

_SCALE_ATOM = 3  # on-page pixels per image pixel
_SCALE_INPUT = 2
_SPRITE_COLS = 64  # tiles per row of a sprite sheet
_GREY_LEVELS = 16  # grey levels of the input sprite (4-bit PNG)
_ATTR_LEVELS = 11  # colours of the attribution sprite (4-bit PNG; odd, so 0 is white)

# attribution tiles drawn on one page at most (each unit gets the same share, its strongest
# inputs first): the sprite's size grows with units x inputs, unlike the shared input sprite
ATTRIBUTION_BUDGET = 9_000


def _sprite_png(tiles: np.ndarray, palette: Sequence[int]) -> tuple[bytes, int]:
    """``[k, h, w]`` palette indices as one palette PNG, ``_SPRITE_COLS`` tiles per row.

    ``palette`` is RGB triples, flat; up to 16 colours are stored in 4 bits a pixel.
    Returns (PNG bytes, columns).
    """
    from PIL import Image  # only when the page is drawn

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


def _diverging_palette(levels: int = 256) -> list[int]:
    """``levels`` RGB entries of ``RdBu_r`` (the decoder-atom colours of
    ``figures.decoder_atoms``)."""
    import matplotlib as mpl  # for its colour map, only when the page is drawn

    rgb = mpl.colormaps["RdBu_r"](np.linspace(0.0, 1.0, levels))[:, :3]
    return [int(round(255 * v)) for v in rgb.ravel()]


def _atom_tiles(atoms: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``[H, D]`` atoms -> ``[H, h, w]`` palette indices, each scaled to its own max |w|."""
    scale = np.abs(atoms).max(1, keepdims=True)
    unit = np.nan_to_num(atoms / np.where(scale > 0, scale, 1.0))
    return np.round((unit + 1.0) * 127.5).astype(np.uint8).reshape(len(atoms), *shape)


def _attribution_tiles(values: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``[k, D]`` int8 attributions in [-127, 127] -> ``[k, h, w]`` indices of
    ``_diverging_palette(_ATTR_LEVELS)``, 0 on its white middle entry."""
    half = _ATTR_LEVELS // 2
    scaled = np.round(values.astype(np.float32) * (half / 127.0)) + half
    return scaled.astype(np.uint8).reshape(len(values), *shape)


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


def _num(value: float, fmt: str = ".3g") -> str:
    """``value`` in format ``fmt`` (three significant digits by default); '–' for NaN."""
    value = float(value)
    if not math.isfinite(value):
        return "–"
    return format(value, fmt)


def _pct(share: float) -> str:
    """A share as a percentage at two decimals, one format for every unit: 0.5 -> '50.00 %',
    0.00012 -> '0.01 %' (one firing in 10 000 test inputs is 0.01 %)."""
    return f"{100 * float(share):.2f} %"


def _decimals_fmt(values: np.ndarray) -> str:
    """One fixed-decimal format for a column of values: as many decimals as give its largest
    value three significant digits (0 to 4), so that the column's numbers line up."""
    values = np.abs(np.asarray(values, dtype=float))
    top = float(values[np.isfinite(values)].max(initial=0.0))
    decimals = 2 - math.floor(math.log10(top)) if top > 0 else 2
    return f".{min(max(decimals, 0), 4)}f"


_SHARE = ".2f"  # selectivity and cosines: numbers in [-1, 1], two decimals


def _class_svg(dist: np.ndarray, rate: np.ndarray, preferred: int,
               class_names: Sequence[str]) -> Markup:
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
    return Markup(f'<svg class="cls" viewBox="0 0 {len(dist)} 1" preserveAspectRatio="none" '
                  f'role="img"><title>{esc(tip)}</title><path d="{bars}"/>{best}</svg>')


def _short_names(class_names: Sequence[str]) -> list[str]:
    """Bar labels: the names when all are short (digits), else the class indices."""
    if all(len(name) <= 2 for name in class_names):
        return list(class_names)
    return [str(c) for c in range(len(class_names))]


def _state(stats: dict[str, np.ndarray], j: int) -> str:
    return "dead" if stats["dead"][j] else "dense" if stats["dense"][j] else "alive"


_STATE_ORDER = {"alive": 0, "dense": 1, "dead": 2}  # the index's status column sorts this way

# the histogram's plot box in its 162 x 84 viewBox: left, top, width, height
_HX, _HY, _HW, _HH = 30, 6, 118, 54


def _hist(counts: np.ndarray, lo: float, hi: float, fmt: str = ".3g") -> dict:
    """What the template's histogram draws: a step path of the counts in the plot box, the
    activation ticks (both ends and the middle, in format ``fmt``), the count ticks (0 and the
    tallest bin)."""
    top = max(int(counts.max()), 1)
    bins = len(counts)
    base = _HY + _HH
    steps = "".join(f"V{base - _HH * c / top:.1f}h{_HW / bins:.4g}" for c in counts)
    label = (f"activations in ({_num(lo, fmt)}, {_num(hi, fmt)}], {bins} bins; counts "
             + " ".join(str(int(c)) for c in counts))
    xticks = [(_HX + _HW * f, _num(lo + f * (hi - lo), fmt)) for f in (0.0, 0.5, 1.0)]
    yticks = [(base, "0"), (_HY, f"{top:,}")]
    axes = (f"M{_HX} {_HY}V{base}H{_HX + _HW}" + "".join(f"M{x:g} {base}v3" for x, _ in xticks)
            + "".join(f"M{_HX} {y}h-3" for y, _ in yticks))
    return {"path": f"M{_HX} {base}{steps}V{base}Z", "axes": axes, "label": label,
            "xticks": [(f"{x:g}", t) for x, t in xticks], "yticks": yticks}


class _Sprites:
    """Slots of the inputs (shared by all units) and of the attribution tiles (one per shown
    input of a unit) in their sprite sheets."""

    def __init__(self, stats: dict[str, np.ndarray], per_unit: int):
        shown = np.concatenate([stats["top_index"].ravel(), stats["band_index"].ravel()])
        self.used = np.unique(shown[shown >= 0])
        self.slot = {int(i): s for s, i in enumerate(self.used)}
        self.attributions: list[np.ndarray] = []
        self.per_unit = per_unit  # attribution tiles a unit may draw
        self.left = 0
        self.texts: list[str] | None = None  # shown instead of image tiles, when given

    def tile(self, i: int, attribution: np.ndarray | None) -> dict:
        s = self.slot[i]
        tile = {"x": s % _SPRITE_COLS, "y": s // _SPRITE_COLS, "ax": None, "ay": None,
                "text": self.texts[i] if self.texts is not None else None}
        if attribution is not None and self.left > 0:
            self.left -= 1
            a = len(self.attributions)
            self.attributions.append(attribution)
            tile.update(ax=a % _SPRITE_COLS, ay=a // _SPRITE_COLS)
        return tile


def _group(title: str, span: str, index, activation, labels, attribution, sprites: _Sprites,
           class_names: Sequence[str] | None, act_fmt: str) -> dict:
    """One row of example tiles (the top inputs, or a band) as the template's ``tiles`` draws;
    each tile labelled with its class unless ``class_names`` is None (data without labels)."""
    tiles = []
    for slot, (i, act) in enumerate(zip(index, activation, strict=True)):
        if i < 0:
            continue
        name = class_names[int(labels[slot])] if class_names is not None else ""
        tile = sprites.tile(int(i), None if attribution is None else attribution[slot])
        tile.update(act=_num(act, act_fmt), label=name, tip=name if len(name) > 6 else "")
        tiles.append(tile)
    return {"title": title, "range": span, "tiles": tiles}


def _unit(stats: dict[str, np.ndarray], j: int, sprites: _Sprites,
          names: Sequence[str] | None, act_fmt: str) -> dict:
    """What the template shows of unit ``j`` (``names`` None: data without labels)."""
    sprites.left = sprites.per_unit
    state = _state(stats, j)
    unit = {"j": j, "state": state, "ax": j % _SPRITE_COLS, "ay": j // _SPRITE_COLS,
            "nearest": [(int(k), _num(c, _SHARE)) for k, c in zip(
                stats["nearest_index"][j], stats["nearest_cosine"][j], strict=True)],
            "votes": None, "against": None, "groups": []}
    if "probe_weight" in stats:
        w = stats["probe_weight"][j]
        order = np.argsort(-w, kind="stable")
        unit["votes"] = [(names[c], f"+{w[c]:.2f}") for c in order[:3] if w[c] > 0]
        if w[order[-1]] < 0:
            unit["against"] = (names[order[-1]], f"−{-w[order[-1]]:.2f}")
    if state == "dead":
        return unit
    edges = stats["hist_edges"][j]
    unit.update(freq=_pct(stats["frequency"][j]), count=f"{int(stats['fire_count'][j]):,}",
                mean=_num(stats["mean_activation"][j], act_fmt),
                max=_num(stats["max_activation"][j], act_fmt),
                rare=not bool(stats["ranked"][j]), cos=_num(stats["atom_cosine"][j], _SHARE),
                hist=_hist(stats["hist_counts"][j], edges[0], edges[-1], act_fmt))
    if names is not None:
        pref = int(stats["preferred_class"][j])
        top = stats["top_label"][j]
        unit.update(pref=names[pref], sel=_num(stats["selectivity"][j], _SHARE),
                    pref_count=int((top == pref).sum()), top_count=int((top >= 0).sum()),
                    class_svg=_class_svg(stats["class_dist"][j], stats["class_rate"][j], pref,
                                         names))
    top_attr = stats["top_attribution"][j] if "top_attribution" in stats else None
    groups = [_group("Top activations", "", stats["top_index"][j], stats["top_activation"][j],
                     stats["top_label"][j], top_attr, sprites, names, act_fmt)]
    n_bands = stats["band_index"].shape[1]
    for b in range(n_bands):
        if stats["band_index"][j, b, 0] < 0:
            continue
        attr = stats["band_attribution"][j, b] if "band_attribution" in stats else None
        span = (f"activation {_num(stats['band_low'][j, b], act_fmt)}–"
                f"{_num(stats['band_high'][j, b], act_fmt)}")
        groups.append(_group(f"Band {b + 1} of {n_bands}", span, stats["band_index"][j, b],
                             stats["band_activation"][j, b], stats["band_label"][j, b], attr,
                             sprites, names, act_fmt))
    unit["groups"] = groups
    return unit


def _row(stats: dict[str, np.ndarray], j: int, names: Sequence[str] | None,
         act_fmt: str) -> dict:
    """One row of the index; the data-* values are what the script sorts and filters by
    (an empty one sorts last). Every column has one number format (``act_fmt`` for the
    activations)."""
    state = _state(stats, j)
    pref = int(stats["preferred_class"][j])
    sel = float(stats["selectivity"][j])
    ranked = bool(stats["ranked"][j]) and math.isfinite(sel)
    return {"j": j, "freq": f"{float(stats['frequency'][j]):.6g}",
            "mean": f"{float(stats['mean_activation'][j]):.6g}",
            "max": f"{float(stats['max_activation'][j]):.6g}",
            "sel": f"{sel:.4f}" if ranked else "", "cls": pref if pref >= 0 else "",
            "st": _STATE_ORDER[state], "state": state,
            "freq_text": _pct(stats["frequency"][j]),
            "mean_text": _num(stats["mean_activation"][j], act_fmt),
            "max_text": _num(stats["max_activation"][j], act_fmt),
            "sel_text": _num(sel, _SHARE), "rare": math.isfinite(sel) and not ranked,
            "cls_name": names[pref] if names is not None and pref >= 0 else "–"}


def _grid(atoms: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
    """``[H, D]`` atoms on a near-square grid (w = ⌈√D⌉ columns, values row by row, the last
    row padded with zeros) for drawing."""
    d = atoms.shape[1]
    w = max(1, math.isqrt(d - 1) + 1) if d > 1 else 1
    rows = math.ceil(d / w)
    padded = np.zeros((len(atoms), rows * w), dtype=float)
    padded[:, :d] = atoms
    return padded, (rows, w)


_COLUMNS = [("j", "unit"), ("freq", "frequency"), ("mean", "mean act."), ("max", "max act."),
            ("sel", "selectivity"), ("cls", "prefers"), ("st", "status")]
_CLASS_COLUMNS = ("sel", "cls")  # not shown for data without labels


def render_features_page(stats: dict[str, np.ndarray], images: np.ndarray, title: str,
                         class_names: Sequence[str] | None = None, subtitle: str = "",
                         embedding_png: bytes | None = None,
                         embedding_beside_pixels: bool = True,
                         report: tuple[str, bool] | None = None,
                         texts: Sequence[str] | None = None, labelled: bool = True) -> str:
    """The complete, self-contained HTML text of a feature browser.

    Args:
        stats: :func:`feature_stats` output, optionally with ``probe_weight`` [H, C] and
            ``probe_accuracy`` (:func:`sae.pages.features.stats.probe_weights`) and
            ``probe_train_inputs`` (the number of training codes it was fitted on).
        images: ``[N, h, w]`` the evaluated inputs, uint8 or floats in [0, 1]; row ``i`` is the
            input ``stats["top_index"]`` calls ``i``. Atoms are drawn at the same ``h × w``.
        title: page heading (the run's name).
        class_names: name of each class (default: the class index).
        subtitle: one line under the heading (model, dataset, ...).
        embedding_png: a code-embedding figure shown at the end, if given.
        embedding_beside_pixels: whether that figure has the inputs' pixel embedding beside
            the codes' (a run on images; a run on activations embeds only its codes).
        report: (relative href of the run's ``report.html``, whether it exists now), or None
            for no link.
        texts: a text per input, shown instead of images (``images`` may then be None).
        labelled: whether the inputs have classes; without them the page shows nothing of
            classes (no class columns, filter, chart or tile labels).

    Atoms whose length is not the images' pixel count (activations of a network's layer, shown
    by their source images) are drawn on their own grid, D values row by row.

    Raises:
        ValueError: images and atoms do not have the same number of pixels.
    """
    atoms = np.asarray(stats["atoms"])
    h = len(atoms)
    if texts is not None:
        images = np.zeros((1, 1, 1))
    images = np.asarray(images)
    if images.ndim != 3:
        raise ValueError(f"images must be [N, h, w], got shape {images.shape}")
    shape = (int(images.shape[1]), int(images.shape[2]))
    atom_shape = shape
    if atoms.shape[1] != shape[0] * shape[1]:
        if "top_attribution" in stats:
            raise ValueError(f"atoms have {atoms.shape[1]} values, images {shape[0]}x{shape[1]}")
        atoms, atom_shape = _grid(atoms)
    labels_needed = stats["class_rate"].shape[1]
    names = [str(s) for s in (class_names or [])]
    names += [str(c) for c in range(len(names), labels_needed)]
    names = names[:labels_needed]
    short = _short_names(names)

    shown = stats["top_index"].shape[1] + stats["band_index"][0].size
    per_unit = min(shown, ATTRIBUTION_BUDGET // max(h, 1))
    sprites = _Sprites(stats, per_unit)
    sprites.texts = None if texts is None else list(texts)
    act_fmt = _decimals_fmt(stats["max_activation"])  # mean and max activations alike
    shown_names = names if labelled else None
    units = [_unit(stats, j, sprites, shown_names, act_fmt) for j in range(h)]
    css = _page_sprites(sprites, atoms, atom_shape, images if texts is None else None, shape)
    embedding = inline_png(embedding_png, "code embedding by class") if embedding_png else None
    return ENV.get_template("features.html.j2").render(
        title=title, subtitle=subtitle, summary=_summary(stats), base_css=Markup(PAGE_CSS),
        sprite_css=Markup(css), report=None if report is None else
        {"href": report[0], "exists": report[1]},
        min_firings=int(stats["min_firings"]), class_names=names, labelled=labelled,
        columns=[c for c in _COLUMNS if labelled or c[0] not in _CLASS_COLUMNS],
        rows=[_row(stats, j, shown_names, act_fmt) for j in range(h)], units=units,
        short=short, legend=list(enumerate(names)) if labelled and short != names else [],
        n_inputs=f"{int(stats['n_inputs']):,}", n_top=stats["top_index"].shape[1],
        n_bands=stats["band_index"].shape[1], per_band=stats["band_index"].shape[2],
        has_attribution="top_attribution" in stats, images_in=embedding_beside_pixels,
        embedding=embedding,
        embedding_beside_pixels=embedding_beside_pixels,
        attribution_cut=per_unit if per_unit < shown else None)


def _page_sprites(sprites: _Sprites, atoms: np.ndarray, atom_shape: tuple[int, int],
                  images: np.ndarray | None, shape: tuple[int, int]) -> str:
    """The CSS of the page's three sprite sheets: the atoms, the inputs the units show
    (``images``; None for inputs shown as text) and their attributions."""
    h = len(atoms)
    atom_png, atom_cols = _sprite_png(_atom_tiles(atoms, atom_shape), _diverging_palette())
    scale = max(1, min(_SCALE_ATOM, 96 // max(atom_shape)))  # large grids drawn smaller
    css = _sprite_css(".sa", atom_png, atom_cols, math.ceil(h / atom_cols), atom_shape, scale)
    used = sprites.used
    if images is not None:
        input_png, input_cols = _sprite_png(_input_tiles(images[used] if len(used) else
                                                         np.zeros((1, *shape))), _grey_palette())
        css += _sprite_css(".t i", input_png, input_cols,
                           math.ceil(max(len(used), 1) / input_cols), shape, _SCALE_INPUT)
    if sprites.attributions:
        tiles = _attribution_tiles(np.stack(sprites.attributions), shape)
        attr_png, attr_cols = _sprite_png(tiles, _diverging_palette(_ATTR_LEVELS))
        css += _sprite_css(".t i.a", attr_png, attr_cols, math.ceil(len(tiles) / attr_cols),
                           shape, _SCALE_INPUT)
    return css


def _summary(stats: dict[str, np.ndarray]) -> str:
    """The page's opening paragraph: units, inputs, the firing rule, L0, dead and dense units,
    and the linear probe's accuracy when it was fitted."""
    h, n = len(stats["atoms"]), int(stats["n_inputs"])
    dead, dense = int(stats["dead"].sum()), int(stats["dense"].sum())
    summary = (f"{h:,} units, {n:,} test inputs; a unit fires when its code is above "
               f"{float(stats['threshold']):g}. Mean L0 {float(stats['frequency'].sum()):.3g}; "
               f"{dead:,} dead (never fire), {dense:,} dense (fire on more than half of the "
               "inputs).")
    if "probe_accuracy" in stats:
        fitted = (f"the codes of {int(stats['probe_train_inputs']):,} training inputs"
                  if "probe_train_inputs" in stats else "training codes")
        summary += (f" A softmax linear probe fitted on {fitted} classifies "
                    f"{100 * float(stats['probe_accuracy']):.1f} % of these test inputs "
                    f"correctly; each unit lists the classes its weights favour (per standard "
                    f"deviation of the unit).")
    return summary
