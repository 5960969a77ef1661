"""Per-unit statistics of a code matrix: what each unit of an SAE fires on (pure numpy in/out).

:func:`feature_stats` is the feature browser's first layer (:mod:`sae.features`): codes, labels,
inputs and decoder atoms in, one array per statistic out.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DENSE_LIMIT", "HIST_BINS", "N_TOP", "feature_stats"]

N_TOP = 16  # top activating inputs kept per unit
HIST_BINS = 20  # bins of each unit's activation histogram
DENSE_LIMIT = 0.5  # fires on more than this share of inputs: dense (as metrics.dense_fraction)



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
