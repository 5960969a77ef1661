"""The registry of metrics: every reported number's name, definition, table heading, number
format and which direction is better, declared once.

The report's definitions (:mod:`sae.pages.report`), the sweep tables' columns, headings and
formats and the verdict's directions (:mod:`sae.sweep.display`, :mod:`sae.sweep.matching`), the line
``python -m sae.run`` prints at the end and the metric tables of docs/metrics.md (checked by a
test) are all read from :data:`METRICS`. The functions that compute them live in
:mod:`sae.metrics`. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass

# when a run counts as converged (sae.training.convergence): the relative change over its last
# epoch of validation FVU and of validation mean L0 is below these
FVU_TOLERANCE = 0.01
L0_TOLERANCE = 0.02

__all__ = ["FVU_TOLERANCE", "L0_TOLERANCE", "METRIC", "METRICS", "TABLES", "TRUTH", "Metric",
           "markdown_table", "summary_line", "summary_metrics"]


@dataclass(frozen=True)
class Metric:
    name: str  # the key in metrics.json / analysis.json and the column in results.csv
    label: str  # the heading of its column in the sweep tables
    definition: str  # what it measures, as the report and the documentation state it
    fmt: str = ".4f"  # number format in tables (of the value times ``scale``)
    scale: float = 1.0  # 100 for a fraction shown in percent
    unit: str = ""
    better: str | None = None  # "lower", "higher", or None (neither: a description)
    # "run": a run's metrics.json (the test set); "sweep": a sweep's analysis of each run;
    # "truth": metrics.json on data whose features are known (sae.metrics.truth);
    # "validation": the validation split's, from metrics.csv;
    # "count": what the others are computed on, or a model's own extra number
    group: str = "run"
    printed: bool = False  # in the line python -m sae.run prints when training ends
    # "truth": measured only on data whose features are known (sae.metrics.truth), so its columns
    # and criteria exist only on those pages
    needs: str | None = None


METRICS: tuple[Metric, ...] = (
    Metric("mse", "MSE", "mean over inputs and their D values of (x − x̂)²", ".5f",
           better="lower", printed=True),
    Metric("fvu", "FVU", "fraction of variance unexplained: Σ‖x − x̂‖² / Σ‖x − x̄‖², x̄ the "
           "training split's mean input (1 = predicting x̄, 0 = perfect)", better="lower",
           printed=True),
    Metric("explained_variance", "explained variance", "1 − fvu", better="higher"),
    Metric("fvu_at_l0", "FVU at L0", "fvu of the reconstruction from only the units counted in "
           "L0 (equals fvu for codes with exact zeros; larger for sigmoid codes, whose units "
           "below the firing threshold still reconstruct)", better="lower"),
    Metric("recon_bias", "recon bias", "Σ‖x̂ − x̄‖² / Σ⟨x̂ − x̄, x − x̄⟩, the relative "
           "reconstruction bias (1 = unbiased; c for reconstructions shrunk by c towards the "
           "mean)", ".3f"),
    Metric("l0_mean", "L0 mean", "mean number of firing units per input (h_j > 0; sigmoid "
           "codes: h_j above the firing threshold, 0.1)", ".1f", printed=True),
    Metric("l0_std", "L0 std", "population standard deviation of the firing units per input",
           ".1f", printed=True),
    Metric("dead_fraction", "dead %", "share of units that fire on no test input", ".1f", 100.0,
           better="lower", printed=True),
    Metric("dense_fraction", "dense %", "share of units that fire on more than 50 % of test "
           "inputs", ".1f", 100.0, better="lower", printed=True),
    Metric("support_fvu", "support FVU", "fvu of the least-squares code on each input's own "
           "support: the best any code with those supports could do with this decoder; fvu − "
           "support_fvu is what the value map loses", better="lower"),
    Metric("support_fvu_const", "support FVU const", "support_fvu with a constant budget of "
           "round(mean L0) units per input (each input keeps its highest-scoring units)",
           better="lower"),
    Metric("adaptive_gain", "adaptive gain", "support_fvu_const − support_fvu: positive when "
           "letting L0 vary per input pays; a TopK code scores exactly 0 by construction (both "
           "supports are the same)", better="higher"),
    Metric("adaptivity", "adaptivity", "Spearman correlation over test inputs between an "
           "input's L0 and its difficulty, the energy left after projecting it onto the top-m "
           "principal components of the training set (m = round(mean L0), recorded as "
           "adaptivity_m)",
           ".2f", better="higher"),
    Metric("adaptivity_partial", "partial adaptivity", "partial Spearman correlation between "
           "an input's L0 and its difficulty (as adaptivity) with the input's energy ‖x − x̄‖² "
           "held fixed: what L0 follows of the difficulty beyond what the energy predicts (any "
           "shared threshold follows the energy for free)", ".2f", better="higher"),
    Metric("adaptivity_energy", "energy baseline", "the adaptivity an L0 ranked by the input's "
           "energy ‖x − x̄‖² alone would score: Spearman correlation of energy and difficulty on "
           "the same inputs (a property of the data and m, not of the model)", ".2f"),
    Metric("wall_time_s", "train time", "training wall-clock time in seconds", ".0f",
           unit=" s", printed=True),
    Metric("probe_accuracy", "probe acc. %", "test accuracy of a linear classifier fitted on "
           "the training split's codes with the softmax (cross-entropy) loss, log Σ_j exp z_j − "
           "z_y", ".2f", 100.0, better="higher", group="sweep"),
    Metric("probe_train_accuracy", "probe train %", "accuracy of the softmax probe on the "
           "training-split codes it was fitted on (beside probe_accuracy: how much it "
           "overfits)", ".2f", 100.0, group="sweep"),
    Metric("probe_sparsemax_accuracy", "sparsemax probe %", "test accuracy of the "
           "sparsemax-loss probe (Martins & Astudillo, 2016), ½ Σ_{j∈S} (z_j² − τ²) + ½ − z_y "
           "with S, τ the support and threshold of sparsemax(z): zero once the true class leads "
           "by a margin of 1", ".2f", 100.0, better="higher", group="sweep"),
    Metric("probe_sparsemax_classes", "probe classes", "mean number of classes to which the "
           "sparsemax probe gives non-zero probability on a test input (softmax: always all "
           "10)", ".2f", group="sweep"),
    Metric("l0_ink_corr", "L0–ink corr.", "Pearson correlation over test inputs between an "
           "input's L0 and its ink (the sum of its pixels)", ".2f", group="sweep"),
    Metric("gt_recovery", "recovered %", "share of the true features whose best-aligned "
           "decoder atom has cosine above 0.9", ".1f", 100.0, better="higher", group="truth",
           needs="truth"),
    Metric("gt_mcc", "MCC", "mean absolute cosine of true features and decoder atoms matched "
           "one to one (Hungarian assignment of the largest total): 1 when every true feature has "
           "an atom of its own", ".3f", better="higher", group="truth", needs="truth"),
    Metric("gt_mcc_pairs", "MCC (pairs)", "the same assignment's mean absolute cosine over "
           "its matched pairs only, SAELens' definition: equal to MCC when there are at least as "
           "many units as true features; with fewer, the quality of the atoms, not how many "
           "features they cover", ".3f", better="higher", group="truth", needs="truth"),
    Metric("gt_l0_spearman", "ρ(L0, true L0)", "Spearman correlation over test inputs between "
           "an input's L0 and its true number of active features", ".3f", better="higher",
           group="truth", needs="truth"),
    Metric("gt_l0_partial", "ρ(L0, true L0 | energy)", "partial Spearman correlation over "
           "test inputs between an input's L0 and its true L0 with its energy ‖x − x̄‖² held "
           "fixed: what the L0 follows of the true L0 beyond what an L0 ranked by energy gets "
           "for free", ".3f", better="higher", group="truth", needs="truth"),
    Metric("gt_l0_energy", "ρ(energy, true L0)", "Spearman correlation over test inputs "
           "between an input's energy ‖x − x̄‖² and its true L0: what an L0 ranked by energy "
           "alone would score on ρ(L0, true L0) (a property of the data)", ".3f",
           group="truth", needs="truth"),
    Metric("gt_l0_error", "L0 error %", "mean over test inputs of the absolute difference of "
           "L0 and true L0, relative to true L0", ".1f", 100.0, better="lower", group="truth",
           needs="truth"),
    Metric("gt_precision", "precision %", "per test input, the share of its firing units whose "
           "matched true feature (the MCC's assignment) is active in it, a unit matched to none "
           "counting as wrong; mean over inputs with a firing unit", ".1f", 100.0,
           better="higher", group="truth", needs="truth"),
    Metric("gt_recall", "recall %", "per test input, the share of its true features whose "
           "matched unit fires; mean over inputs", ".1f", 100.0, better="higher",
           group="truth", needs="truth"),
    Metric("val_fvu", "val FVU", "fvu on the validation split after the last epoch: what "
           "settings and designs are chosen by", better="lower", group="validation"),
    Metric("val_l0", "val L0", "mean L0 on the validation split after the last epoch: what "
           "places a run on its model's curve when models are set at equal L0", ".1f",
           group="validation"),
    Metric("val_fvu_change", "Δ val FVU %", "relative change of val_fvu over the last "
           "epoch, the size of (last − previous) / previous (none with fewer than two epochs)",
           ".1f", 100.0, group="validation"),
    Metric("val_l0_change", "Δ val L0 %", "relative change of val_l0 over the last "
           "epoch, the size of (last − previous) / previous (none with fewer than two epochs)",
           ".1f", 100.0, group="validation"),
    Metric("converged", "converged", f"whether the run had settled: val_fvu_change below "
           f"{100 * FVU_TOLERANCE:g} % and val_l0_change below {100 * L0_TOLERANCE:g} % (none "
           "with fewer than two epochs)", ".0f", group="validation"),
    Metric("val_gt_l0_spearman", "val ρ(L0, true L0)", "gt_l0_spearman on the validation "
           "split: what a design is chosen by on data with known features", ".3f",
           better="higher", group="validation", needs="truth"),
    Metric("n_samples", "test inputs", "test inputs these metrics are computed on", ".0f",
           group="count"),
    Metric("n_units", "units", "code units H", ".0f", group="count"),
    Metric("n_inputs", "inputs", "test inputs used for support_fvu, adaptive_gain and "
           "adaptivity (evenly spaced over the test set, the same for every model)", ".0f",
           group="count"),
    Metric("adaptivity_m", "m", "m = round(mean L0): the principal components adaptivity "
           "projects onto", ".0f", group="count"),
    Metric("alpha", "α", "entmax α at the end of training", ".3f", group="count"),
)

METRIC: dict[str, Metric] = {m.name: m for m in METRICS}  # by name

# Where the metrics appear. Every metric is a column of a sweep's results.csv, and every one but
# the counts is averaged over seeds in its summary (``sae.sweep.aggregate``); beyond those, each
# table's metrics in the order of its columns (``sae.sweep.display``, ``sae.sweep.matching``).
# A column without a value in any row (no probes without labels, no ground truth on images) is
# left out of the table it would be empty in.
TRUTH = ("gt_recovery", "gt_mcc", "gt_mcc_pairs", "gt_l0_spearman", "val_gt_l0_spearman",
         "gt_l0_partial", "gt_l0_energy", "gt_l0_error", "gt_precision", "gt_recall")
TABLES: dict[str, tuple[str, ...]] = {
    # a page's table of every configuration: mean ± std over seeds
    "summary": ("mse", "fvu", "fvu_at_l0", "val_fvu", "l0_mean", "l0_std", "val_l0",
                "dead_fraction", "dense_fraction", "probe_accuracy", "probe_sparsemax_accuracy",
                "probe_sparsemax_classes", "recon_bias", "support_fvu", "adaptive_gain",
                "adaptivity", "adaptivity_partial", "adaptivity_energy", *TRUTH, "wall_time_s"),
    # the metrics interpolated per seed to a target L0, where models are compared
    "matched": ("fvu_at_l0", "fvu", "val_fvu", "support_fvu", "adaptive_gain", "dead_fraction",
                "adaptivity", "adaptivity_partial", "adaptivity_energy", "probe_accuracy",
                "probe_sparsemax_accuracy", "probe_sparsemax_classes", *TRUTH),
    # the headline at each target L0: outcomes first (what is reconstructed, what varying L0
    # gains), then how (units, adaptivity, ground truth, probe)
    "headline": ("fvu_at_l0", "fvu", "val_fvu", "support_fvu", "adaptive_gain",
                 "dead_fraction", "adaptivity", "adaptivity_partial", "adaptivity_energy", *TRUTH,
                 "probe_accuracy"),
}


def _check_tables() -> None:
    unknown = {n for names in TABLES.values() for n in names} - set(METRIC)
    if unknown:
        raise ValueError(f"tables name metrics that are not registered: {sorted(unknown)}")
    if set(TABLES["headline"]) - set(TABLES["matched"]):
        raise ValueError("the headline shows only metrics interpolated to its L0")
    if {m.name for m in METRICS if m.needs == "truth"} != set(TRUTH):
        raise ValueError("TRUTH must name every metric that needs known features")


_check_tables()


def summary_metrics() -> tuple[str, ...]:
    """The metrics a sweep's summary averages over seeds: every one but the counts."""
    return tuple(m.name for m in METRICS if m.group != "count")


def summary_line(result: dict) -> str:
    """The line ``python -m sae.run`` prints when training ends: the printed metrics the
    result holds, ``name=value`` with 4 significant digits."""
    return " ".join(f"{m.name}={result[m.name]:.4g}" for m in METRICS
                    if m.printed and isinstance(result.get(m.name), int | float))


def markdown_table(group: str) -> str:
    """The documentation's table of the metrics of ``group``: name, definition, which way is
    better."""
    rows = [f"| `{m.name}` | {m.definition} | {m.better or '–'} |" for m in METRICS
            if m.group == group]
    return "\n".join(["| metric | definition | better |", "|---|---|---|", *rows])

