"""Per-unit statistics of a code matrix: what each unit of an SAE fires on (pure numpy in/out).

:func:`feature_stats` is the feature browser's first layer (:mod:`sae.pages.features`): codes,
labels, inputs and decoder atoms in, one array per statistic out. Its numpy arrays, for H units,
C classes and K = ``n_top``:

- ``frequency`` [H]: share of inputs the unit fires on; ``fire_count`` [H] the count;
- ``mean_activation``, ``max_activation`` [H]: over the inputs it fires on (0 if dead);
- ``class_rate`` [H, C]: share of the inputs of each class that it fires on;
- ``class_dist`` [H, C]: ``class_rate`` normalised to sum 1 per unit: the class distribution of
  its firing with every class weighted equally (so an unequal number of test inputs per class
  does not look like a preference); all 0 for a dead unit;
- ``selectivity`` [H]: ``1 − H(class_dist) / log C'``, H the Shannon entropy and C' the number
  of classes present (:func:`sae.metrics.class_selectivity`): 1 for a unit that fires on one
  class only, 0 for one that fires at the same rate in every class. NaN for dead units and when
  C' < 2;
- ``preferred_class`` [H]: the class the unit *prefers*: the class most of its top inputs
  belong to (``top_label``; a tie goes to the class whose inputs among them have the larger
  summed activation), so that it is what its strongest firings show; -1 for dead units;
- ``top_index``, ``top_activation``, ``top_label`` [H, K]: the inputs with the largest
  activation, largest first, and their classes; slots beyond the unit's firing count hold index
  -1, activation 0 and label -1;
- ``hist_counts`` [H, bins], ``hist_edges`` [H, bins + 1]: histogram of the activations of the
  inputs it fires on, ``bins`` equal bins from ``threshold`` to its max activation; the counts
  sum to ``fire_count``;
- ``band_index``, ``band_activation`` [H, B, P], ``band_low``, ``band_high`` [H, B]:
  :func:`band_examples` (B = ``n_bands``, P = ``per_band``), strongest band first;
  ``band_label`` [H, B, P] their classes (-1 for empty slots);
- ``nearest_index``, ``nearest_cosine`` [H, M]: :func:`nearest_units` (M = ``n_nearest``);
- ``ranked`` [H]: fires on at least ``min_firings`` inputs, so its selectivity is more than the
  chance pattern of a handful of firings; ``min_firings``: 0-d array;
- with ``encoder``: ``top_attribution`` [H, K, D] and ``band_attribution`` [H, B, P, D], int8
  in [-127, 127]: :func:`attributions` of each shown input divided by ``attribution_scale`` [H]
  (the largest |value| among the unit's shown inputs) times 127, so a unit's tiles share one
  colour scale; 0 for empty slots;
- ``dead`` [H]: fires on no input; ``dense`` [H]: fires on more than half of them;
- ``atom_cosine`` [H]: cosine between the unit's atom and the mean of its top inputs minus the
  mean input: near 1 when the atom draws what makes the unit fire (NaN if dead);
- ``atoms`` [H, D]: the atoms, one row per unit;
- ``n_inputs``, ``threshold``: 0-d arrays.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DENSE_LIMIT", "HIST_BINS", "MIN_FIRINGS", "N_BANDS", "N_NEAREST", "N_PER_BAND",
           "N_TOP", "attributions", "band_examples", "feature_stats", "nearest_units",
           "probe_weights"]

N_TOP = 8  # top activating inputs kept per unit
N_BANDS = 3  # quantile bands of a unit's firing activations shown below its top inputs
N_PER_BAND = 3  # inputs shown from each band
N_NEAREST = 5  # nearest units by decoder cosine
HIST_BINS = 20  # bins of each unit's activation histogram
DENSE_LIMIT = 0.5  # fires on more than this share of inputs: dense (as metrics.dense_fraction)
MIN_FIRINGS = 20  # a unit's selectivity ranks only when it fires on at least this many inputs


def feature_stats(codes: np.ndarray, labels: np.ndarray, x: np.ndarray, atoms: np.ndarray,
                  threshold: float = 0.0, n_top: int = N_TOP, n_classes: int | None = None,
                  bins: int = HIST_BINS, encoder: np.ndarray | None = None,
                  centre: np.ndarray | None = None, n_bands: int = N_BANDS,
                  per_band: int = N_PER_BAND, n_nearest: int = N_NEAREST,
                  min_firings: int = MIN_FIRINGS) -> dict[str, np.ndarray]:
    """Per-unit statistics of a code over an evaluation set: the arrays the module's docstring
    lists (H units, C classes, K = ``n_top``).

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
        encoder: ``[H, D]`` encoder rows (``W_enc``), for the attributions; None: no
            attributions (a unit's pre-activation is not linear in the pixels).
        centre: ``[D]`` what the encoder subtracts from an input first (``b_dec``).
        n_bands, per_band: quantile bands and inputs per band (:func:`band_examples`).
        n_nearest: nearest units by decoder cosine kept per unit (:func:`nearest_units`).
        min_firings: a unit's selectivity ranks only with at least this many firings.
    """
    import torch  # the firing rule and the selectivity are the metrics' own (torch)

    from sae.metrics import active  # torch

    codes, labels, x, atoms, c = _checked(codes, labels, x, atoms, n_classes, n_top, bins,
                                          n_bands, per_band, n_nearest)
    n, h = codes.shape
    fires = active(torch.from_numpy(codes), threshold).numpy()  # [N, H]
    count = fires.sum(0)
    dead = count == 0
    mean_act = np.where(dead, 0.0, np.where(fires, codes, 0.0).sum(0, dtype=np.float64)
                        / np.maximum(count, 1))
    max_act = np.where(dead, 0.0, np.where(fires, codes, -np.inf).max(0))
    top_index, top_act = _top_inputs(codes, fires, n_top)
    band_index, band_act, band_low, band_high = band_examples(codes, fires, n_bands, per_band)
    unit_atoms = atoms.T  # [H, D]
    nearest, nearest_cos = nearest_units(unit_atoms, n_nearest)
    hist, edges = _histograms(codes, fires, max_act, threshold, bins)
    extra = {} if encoder is None else _attribution_tiles(
        x, encoder, centre, np.concatenate([top_index, band_index.reshape(h, -1)], axis=1),
        n_top, n_bands, per_band)
    return {
        **extra,
        "band_index": band_index,
        "band_activation": band_act,
        "band_label": _labels_at(labels, band_index),
        "band_low": band_low,
        "band_high": band_high,
        "nearest_index": nearest,
        "nearest_cosine": nearest_cos,
        "ranked": count >= min_firings,
        "min_firings": np.asarray(int(min_firings)),
        "frequency": count / n,
        "fire_count": count.astype(np.int64),
        "mean_activation": mean_act,
        "max_activation": max_act,
        **_class_stats(fires, labels, c),
        "preferred_class": _preferred(top_index, top_act, labels, c).astype(np.int64),
        "top_index": top_index.astype(np.int64),
        "top_activation": top_act,
        "top_label": _labels_at(labels, top_index),
        "hist_counts": hist.astype(np.int64),
        "hist_edges": edges,
        "dead": dead,
        "dense": count / n > DENSE_LIMIT,
        "atom_cosine": _atom_cosine(x, top_index, unit_atoms, dead),
        "atoms": unit_atoms,
        "n_inputs": np.asarray(n),
        "threshold": np.asarray(float(threshold)),
    }


def _labels_at(labels: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The classes of the inputs ``index`` (any shape), -1 where an index is -1 (no input)."""
    return np.where(index >= 0, labels[np.maximum(index, 0)], -1)


def _checked(codes, labels, x, atoms, n_classes, n_top, bins, n_bands, per_band, n_nearest):
    """The inputs of :func:`feature_stats` as arrays of the right dtypes and shapes, and the
    number of classes; ValueError for anything else."""
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
    if min(n_top, bins, n_bands, per_band) < 1 or n_nearest < 0:
        raise ValueError("n_top, bins, n_bands and per_band must be >= 1, n_nearest >= 0")
    return codes, labels, x, atoms, c


def _class_stats(fires: np.ndarray, labels: np.ndarray, c: int) -> dict[str, np.ndarray]:
    """``class_rate``, ``class_dist`` and ``selectivity`` of the firings ``fires`` [N, H]."""
    import torch  # sae.metrics.class_selectivity is torch's

    from sae.metrics import class_selectivity  # torch

    onehot = np.zeros((len(labels), c), dtype=np.float32)
    onehot[np.arange(len(labels)), labels] = 1.0
    class_total = onehot.sum(0)
    class_rate = (fires.T.astype(np.float32) @ onehot) / np.maximum(class_total, 1)  # [H, C]
    rate_sum = class_rate.sum(1, keepdims=True)
    _, selectivity = (t.numpy() for t in class_selectivity(
        torch.from_numpy(class_rate.T), torch.from_numpy(class_total > 0)))
    return {"class_rate": class_rate,
            "class_dist": class_rate / np.where(rate_sum > 0, rate_sum, 1.0),
            "selectivity": selectivity}


def _top_inputs(codes: np.ndarray, fires: np.ndarray, n_top: int):
    """(``top_index``, ``top_activation``) [H, n_top]: each unit's largest firing inputs."""
    n = len(codes)
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
    return top_index, top_act


def _histograms(codes, fires, max_act, threshold: float, bins: int):
    """(``hist_counts`` [H, bins], ``hist_edges`` [H, bins + 1]) of each unit's firings."""
    h = codes.shape[1]
    rows, units = np.nonzero(fires)
    width = (max_act - threshold) / bins
    width = np.where(width > 0, width, 1.0)
    which = np.floor((codes[rows, units] - threshold) / width[units]).astype(np.int64)
    which = np.clip(which, 0, bins - 1)
    hist = np.bincount(units * bins + which, minlength=h * bins).reshape(h, bins)
    edges = threshold + (max_act - threshold)[:, None] * np.linspace(0.0, 1.0, bins + 1)[None]
    return hist, edges


def _atom_cosine(x, top_index, unit_atoms, dead) -> np.ndarray:
    """``atom_cosine`` [H]: each atom against the mean of its unit's top inputs less the mean
    input (NaN for dead units and zero vectors)."""
    valid = top_index >= 0
    gathered = x[np.where(valid, top_index, 0)] * valid[..., None]  # [H, K, D]
    top_mean = gathered.sum(1) / np.maximum(valid.sum(1), 1)[:, None] - x.mean(0)
    norms = np.linalg.norm(top_mean, axis=1) * np.linalg.norm(unit_atoms, axis=1)
    cosine = (top_mean * unit_atoms).sum(1) / np.where(norms > 0, norms, 1.0)
    return np.where(dead | (norms == 0), np.nan, cosine)


def _attribution_tiles(x, encoder, centre, shown, n_top: int, n_bands: int,
                       per_band: int) -> dict[str, np.ndarray]:
    """``top_attribution``, ``band_attribution`` and ``attribution_scale`` of the inputs
    ``shown`` [H, K + B·P] (:func:`attributions`, quantised by :func:`_quantised`)."""
    h = len(shown)
    encoder = np.asarray(encoder, dtype=np.float32)
    if encoder.shape != (h, x.shape[1]):
        raise ValueError(f"encoder must be [{h}, {x.shape[1]}], got shape {encoder.shape}")
    centred = x - (0.0 if centre is None else np.asarray(centre, dtype=np.float32))
    quantised = np.zeros((h, shown.shape[1], x.shape[1]), dtype=np.int8)
    scale = np.zeros(h, dtype=np.float32)
    for s in range(0, h, 256):  # bounded float temporaries
        quantised[s:s + 256], scale[s:s + 256] = _quantised(
            attributions(centred, encoder[s:s + 256], shown[s:s + 256]))
    return {"top_attribution": quantised[:, :n_top],
            "band_attribution": quantised[:, n_top:].reshape(h, n_bands, per_band, -1),
            "attribution_scale": scale}


def _preferred(top_index: np.ndarray, top_act: np.ndarray, labels: np.ndarray,
               n_classes: int) -> np.ndarray:
    """``[H]`` the class most of each unit's top inputs (``top_index`` [H, K], -1 for an empty
    slot) belong to; a tie goes to the class of the larger summed activation among them; -1
    for a unit with no top input (dead)."""
    h = len(top_index)
    valid = top_index >= 0
    unit = np.repeat(np.arange(h), top_index.shape[1])[valid.ravel()]
    cls = labels[top_index[valid]]
    votes = np.zeros((h, n_classes))
    np.add.at(votes, (unit, cls), 1.0)
    mass = np.zeros((h, n_classes))
    np.add.at(mass, (unit, cls), top_act[valid].astype(np.float64))
    tied = np.where(votes == votes.max(1, keepdims=True), mass, -np.inf)
    return np.where(valid.any(1), tied.argmax(1), -1)


def band_examples(codes: np.ndarray, fires: np.ndarray, n_bands: int = N_BANDS,
                  per_band: int = N_PER_BAND
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Inputs from quantile bands of each unit's firing activations, strongest band first.

    The top inputs alone show what a unit does at its extreme; what it does most of the time
    shows in weaker firings (the activation intervals of Anthropic's *Towards Monosemanticity*
    browser). A unit's m firings, sorted by activation, are cut into ``n_bands`` bands of
    (nearly) equal count: band 0 the strongest m / n_bands, the last the weakest. From each band
    ``per_band`` inputs at evenly spaced ranks are taken, each the middle of its share of the
    band (so the strongest band does not repeat the top input), strongest first; all of them
    when the band holds fewer.

    Args:
        codes: ``[N, H]`` activations.
        fires: ``[N, H]`` whether each unit fires on each input.

    Returns:
        ``index`` [H, B, P] (-1: empty slot), ``activation`` [H, B, P] (0 when empty),
        ``low``, ``high`` [H, B]: the smallest and largest activation in each band (NaN for an
        empty band).
    """
    codes = np.asarray(codes, dtype=np.float32)
    h = codes.shape[1]
    index = np.full((h, n_bands, per_band), -1, dtype=np.int64)
    activation = np.zeros((h, n_bands, per_band), dtype=np.float32)
    low = np.full((h, n_bands), np.nan, dtype=np.float32)
    high = np.full((h, n_bands), np.nan, dtype=np.float32)
    by_unit, fires_by_unit = np.ascontiguousarray(codes.T), np.ascontiguousarray(fires.T)
    for j in range(h):
        rows = np.flatnonzero(fires_by_unit[j])
        m = len(rows)
        ranked = rows[np.argsort(-by_unit[j, rows], kind="stable")]  # strongest first
        for b in range(n_bands):
            lo, hi = b * m // n_bands, (b + 1) * m // n_bands
            if hi == lo:
                continue
            k = min(per_band, hi - lo)
            picks = ranked[lo + (2 * np.arange(k) + 1) * (hi - lo) // (2 * k)]
            index[j, b, :k] = picks
            activation[j, b, :k] = by_unit[j, picks]
            high[j, b], low[j, b] = by_unit[j, ranked[lo]], by_unit[j, ranked[hi - 1]]
    return index, activation, low, high


def nearest_units(atoms: np.ndarray, k: int = N_NEAREST) -> tuple[np.ndarray, np.ndarray]:
    """Each unit's ``k`` nearest other units by the cosine of their decoder atoms.

    Units that draw nearly the same atom split (or duplicate) one feature; a reader compares
    them side by side. A zero atom has cosine 0 with every other.

    Args:
        atoms: ``[H, D]`` one atom per row.

    Returns:
        ``index`` [H, k'] and ``cosine`` [H, k'], nearest first, k' = min(k, H - 1).
    """
    atoms = np.asarray(atoms, dtype=np.float32)
    h = len(atoms)
    k = min(k, h - 1)
    if k <= 0:
        return np.zeros((h, 0), np.int64), np.zeros((h, 0), np.float32)
    norms = np.linalg.norm(atoms, axis=1, keepdims=True)
    unit = np.nan_to_num(atoms / np.where(norms > 0, norms, 1.0))
    cosine = unit @ unit.T
    np.fill_diagonal(cosine, -np.inf)
    part = np.argpartition(-cosine, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(cosine, part, 1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(part, order, 1).astype(np.int64), np.take_along_axis(vals, order, 1)


def attributions(centred: np.ndarray, encoder: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Which pixels drive a unit on an input: ``(x − b_dec) ⊙ w_j``, the encoder row times the
    centred input, pixel by pixel.

    The terms sum to the unit's pre-activation minus its encoder bias (for the one-layer SAE,
    ``a_j = w_j · (x − b_dec) + b_j``), so positive pixels push the unit to fire and negative
    ones hold it back.

    Args:
        centred: ``[N, D]`` inputs minus what the encoder subtracts (``b_dec``).
        encoder: ``[H, D]`` encoder rows.
        index: ``[H, E]`` input indices per unit; -1 slots give zeros.

    Returns:
        ``[H, E, D]`` float32.
    """
    valid = index >= 0
    return centred[np.where(valid, index, 0)] * encoder[:, None, :] * valid[..., None]


def _quantised(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[H, ...]`` floats -> (int8 in [-127, 127] scaled per unit to its max |value|, scales)."""
    scale = np.abs(values.reshape(len(values), -1)).max(1)
    safe = np.where(scale > 0, scale, 1.0).reshape(-1, *[1] * (values.ndim - 1))
    return np.round(values / safe * 127).astype(np.int8), scale


def probe_weights(train_codes: np.ndarray, train_labels: np.ndarray, test_codes: np.ndarray,
                  test_labels: np.ndarray, n_classes: int) -> tuple[np.ndarray, float]:
    """How each unit votes in a softmax linear probe on the codes: ``[H, C]`` weights and the
    probe's test accuracy.

    The probe (:func:`sae.metrics.linear_probes`) is fitted on codes of training inputs and
    scored on the test codes, so its accuracy is what it is for a probe (not a fit to the very
    inputs it is scored on). Its weights are those of the standardised codes (the raw weight
    times the unit's standard deviation over the training codes) so that units of different
    scales compare: a weight is how much one standard deviation of the unit raises that class's
    logit. A unit that never varies gets 0.
    """
    import torch  # the probe is the metrics' own (torch)

    from sae.metrics import linear_probes  # torch

    train_codes = np.asarray(train_codes, dtype=np.float32)
    probe = linear_probes(torch.from_numpy(train_codes),
                          torch.from_numpy(np.asarray(train_labels, np.int64)),
                          torch.from_numpy(np.asarray(test_codes, dtype=np.float32)),
                          torch.from_numpy(np.asarray(test_labels, np.int64)),
                          losses=("softmax",), n_classes=n_classes)["softmax"]
    weights = probe.weight.double().numpy() * train_codes.std(0, dtype=np.float64)[:, None]
    return weights.astype(np.float32), float(probe.test_accuracy)
