"""Scores against known features: on data built from a known dictionary (``python -m sae.synth``),
did the SAE find the features, and does each input's L0 follow its true number of features?

Shapes: ``atoms`` W [D, H] are the decoder's columns, ``features`` G [F, D] the true dictionary
(one unit-length row per feature), ``codes`` [N, H], ``true_active`` [N, F] bool (input n has
feature f). Cosines are of the directions (lengths do not matter).

- ``gt_recovery``: the share of true features whose best-aligned atom has cosine above
  :data:`RECOVERED_COSINE` (0.9; signed: an atom pointing the other way cannot draw a feature
  with a non-negative code);
- ``gt_mcc``: the mean correlation coefficient of the SAE literature and SAELens' synthetic
  benchmarks: features and atoms matched one to one by the Hungarian assignment of the largest
  total |cosine|, then the mean |cosine| over the F features (a feature left without an atom,
  when H < F, counts 0: how much of the true dictionary the SAE holds);
- ``gt_mcc_pairs``: the same assignment's mean |cosine| over its min(F, H) matched pairs, the
  definition of SAELens' synthetic benchmarks (equal to ``gt_mcc`` when H ≥ F; with fewer units
  than features it asks how good the atoms are, not how many features they cover);
- ``gt_l0_spearman``: Spearman correlation over inputs of L0 and true L0;
  ``gt_l0_partial``: the same with the input's energy held fixed (``partial_spearman``): what
  the L0 follows of the true L0 beyond what energy alone gives;
  ``gt_l0_error``: mean of |L0 − true L0| / true L0 over inputs with a true feature;
- ``gt_precision`` / ``gt_recall``: per input, through the same assignment, the share of its
  firing units whose feature is active in it (a unit matched to no feature counts as wrong),
  and the share of its true features whose unit fires; means over inputs (with a firing unit,
  with a true feature);
- ``gt_l0_energy``: Spearman correlation of the input's energy ‖x − x̄‖² with its true L0, the
  score an L0 ranked by energy alone would get on ``gt_l0_spearman`` (energy grows with the
  number of features in an additive model, so a shared threshold tracks the true L0 partly
  for free).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sae.metrics.basic import active
from sae.metrics.dynamic import adaptivity, input_energy, partial_spearman

__all__ = ["GROUND_TRUTH_KEYS", "RECOVERED_COSINE", "FeatureMatch", "ground_truth",
           "match_features"]

RECOVERED_COSINE = 0.9
GROUND_TRUTH_KEYS = ("gt_recovery", "gt_mcc", "gt_mcc_pairs", "gt_l0_spearman", "gt_l0_partial",
                     "gt_l0_error", "gt_precision", "gt_recall", "gt_l0_energy")


@dataclass
class FeatureMatch:
    """How the decoder's atoms line up with the true features."""

    cosine: torch.Tensor  # [F, H] float64, cosine of feature f and atom j
    unit_of: torch.Tensor  # [F] long: the atom assigned to feature f, −1 for none
    recovery: float
    mcc: float  # mean over the F features (unmatched: 0)
    mcc_pairs: float  # mean over the matched pairs (SAELens' definition)


def match_features(atoms: torch.Tensor, features: torch.Tensor) -> FeatureMatch:
    """Features against atoms: the best cosine of each feature, and the one-to-one assignment
    (Hungarian, scipy's ``linear_sum_assignment``) of the largest total |cosine|.

    Args:
        atoms: W [D, H], the decoder's columns.
        features: G [F, D], the true features.
    """
    from scipy.optimize import linear_sum_assignment  # only for data with known features

    if atoms.ndim != 2 or features.ndim != 2 or atoms.shape[0] != features.shape[1]:
        raise ValueError(f"atoms [D, H] {tuple(atoms.shape)} and features [F, D] "
                         f"{tuple(features.shape)} do not fit")
    w = torch.nn.functional.normalize(atoms.to(torch.float64), dim=0)
    g = torch.nn.functional.normalize(features.to(torch.float64), dim=1)
    cosine = g @ w  # [F, H]
    rows, cols = linear_sum_assignment(cosine.abs().numpy(), maximize=True)
    unit_of = torch.full((features.shape[0],), -1, dtype=torch.long)
    unit_of[torch.from_numpy(rows)] = torch.from_numpy(cols).long()
    matched = cosine.abs()[torch.from_numpy(rows), torch.from_numpy(cols)]
    return FeatureMatch(cosine=cosine, unit_of=unit_of,
                        recovery=float((cosine.max(dim=1).values > RECOVERED_COSINE)
                                       .double().mean()),
                        mcc=float(matched.sum() / features.shape[0]),
                        mcc_pairs=float(matched.mean()) if len(matched) else float("nan"))


def ground_truth(codes: torch.Tensor, true_active: torch.Tensor, atoms: torch.Tensor,
                 features: torch.Tensor, x: torch.Tensor, mean: torch.Tensor,
                 threshold: float = 0.0, match: FeatureMatch | None = None) -> dict[str, float]:
    """Every measure of ``GROUND_TRUTH_KEYS`` (see the module docstring) of one model.

    Args:
        codes: [N, H] the model's codes of the inputs x.
        true_active: [N, F] bool, each input's true features.
        atoms: W [D, H], the decoder's columns (a linear decoder).
        features: G [F, D], the true features.
        x: the inputs [N, D]; mean: x̄ [D] (for the energy baseline).
        threshold: a unit fires when its code is above it (``active``).
        match: :func:`match_features` of atoms and features, when already computed.

    Returns:
        The measures as floats (a Spearman correlation that is undefined, with L0 or true L0
        constant, is None).
    """
    if codes.shape[0] != true_active.shape[0] or true_active.shape[1] != features.shape[0]:
        raise ValueError(f"{codes.shape[0]} code rows and true features "
                         f"{tuple(true_active.shape)} for {features.shape[0]} features")
    match = match_features(atoms, features) if match is None else match
    fires = active(codes, threshold).cpu()
    truth = true_active.to(torch.bool).cpu()
    l0, true_l0 = fires.sum(1).double(), truth.sum(1).double()
    matched = match.unit_of >= 0
    mapped = torch.zeros_like(truth)  # [N, F]: the unit assigned to f fires
    mapped[:, matched] = fires[:, match.unit_of[matched]]
    hits = (mapped & truth).sum(1).double()
    some, present = l0 > 0, true_l0 > 0
    energy = input_energy(x, mean).cpu().double()
    return {
        "gt_recovery": match.recovery,
        "gt_mcc": match.mcc,
        "gt_mcc_pairs": match.mcc_pairs,
        "gt_l0_spearman": adaptivity(l0, true_l0),
        "gt_l0_partial": partial_spearman(l0, true_l0, energy),
        "gt_l0_error": float(((l0 - true_l0).abs()[present] / true_l0[present]).mean())
        if bool(present.any()) else float("nan"),
        "gt_precision": float((hits[some] / l0[some]).mean()) if bool(some.any())
        else float("nan"),
        "gt_recall": float((hits[present] / true_l0[present]).mean()) if bool(present.any())
        else float("nan"),
        "gt_l0_energy": adaptivity(energy, true_l0),
    }

