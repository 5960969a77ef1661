"""The comparison a sweep writes: results.csv, comparison.md, comparison.html and the plots.

:func:`write_outputs` gathers the finished runs (:mod:`sae.sweep.analysis`), averages them over
seeds and matches them with the KL-SAE (:mod:`sae.sweep.tables`), draws the plots
(:mod:`sae.figures`) and writes every file of :data:`FIGURE_FILES` plus the tables.
"""

from __future__ import annotations

from pathlib import Path

from sae.io import write_text
from sae.sweep.analysis import DataCache, collect, raw_by_dataset, raw_probes
from sae.sweep.launch import run_state
from sae.sweep.spec import Run, Sweep

__all__ = ["FIGURE_FILES", "LEGEND", "comparison_html", "comparison_markdown", "write_outputs"]

FIGURE_FILES = {
    "fvu_vs_l0.png": "Reconstruction vs sparsity: FVU against mean L0 per model; hollow points: "
                     "the KL-SAE's FVU when only the units its L0 counts reconstruct; the "
                     "dashed grey line is the Pareto frontier of FVU at L0 over all "
                     "configurations.",
    "probe_vs_l0.png": "Linear-probe test accuracy of the codes against mean L0; the dashed "
                       "line is the same probe on raw pixels.",
    "l0_distributions.png": "Distribution of the number of active units per test input.",
    "class_l0.png": "Mean L0 per class, relative to each configuration's mean.",
    "l0_ink_correlation.png": "Correlation between a test input's L0 and its ink: whether the "
                              "number of active units adapts to the input.",
}


LEGEND = ("Cells are mean ± std over seeds (sample std; none with one seed). MSE and FVU "
          "(fraction of variance unexplained) on the test set; FVU at L0: the FVU when only the "
          "units counted in L0 reconstruct (differs from FVU only for the KL-SAE, whose sigmoid "
          "units below the firing threshold still reconstruct); L0: active units per test input; "
          "dead: units that never fire on the test set; probe: linear classifier trained on "
          "train-set codes, scored on test-set codes; train time: wall-clock seconds of "
          "training.")


def comparison_markdown(sweep: Sweep, summary, matched, raw: dict[str, float],
                        n_runs: int, n_done: int) -> str:
    """comparison.md: per dataset, the summary table and the "vs KL-SAE" table."""
    from sae.sweep.tables import kl_display, summary_display, to_markdown

    parts = [f"# Comparison: {sweep.path.name}", ""]
    if sweep.description:
        parts += [sweep.description.strip(), ""]
    parts += [f"{n_done} of {n_runs} runs finished. {LEGEND}", ""]
    for dataset in sweep.datasets:
        if dataset not in set(summary["dataset"]):
            continue
        parts += [f"## {dataset}", "", to_markdown(summary_display(summary, dataset,
                                                                   raw.get(dataset))), ""]
        kl = kl_display(matched, dataset)
        parts += [f"### {dataset}: vs KL-SAE at the nearest mean L0", "",
                  "Δ FVU < 0 and Δ probe > 0 favour the model over the KL-SAE. Δ FVU at L0 "
                  "compares the KL-SAE at the sparsity its L0 states.", "",
                  to_markdown(kl) if len(kl) else "No non-KL configurations.", ""]
    return "\n".join(parts)


def comparison_html(sweep: Sweep, summary, matched, raw: dict[str, float], pngs: dict[str, bytes],
                    n_runs: int, n_done: int) -> str:
    """comparison.html: the tables of comparison.md, the plots and the sweep file, one page."""
    from sae import pages
    from sae.sweep.tables import kl_display, summary_display, to_html

    sections = []
    for dataset in sweep.datasets:
        if dataset not in set(summary["dataset"]):
            continue
        kl = kl_display(matched, dataset)
        body = [to_html(summary_display(summary, dataset, raw.get(dataset))),
                pages.fragment('<h3>{}</h3><p class="sub">{}</p>',
                               "vs KL-SAE at the nearest mean L0",
                               "Δ FVU < 0 and Δ probe > 0 favour the model. Δ FVU at L0 compares "
                               "the KL-SAE at the sparsity its L0 states."),
                to_html(kl) if len(kl) else pages.fragment("<p>{}</p>",
                                                            "No non-KL configurations.")]
        sections.append(pages.Section(dataset, dataset, pages.join(body)))
    plots = [pages.figure(pngs[name], name, caption) for name, caption in FIGURE_FILES.items()
             if name in pngs]
    sections += [pages.Section("figures", "Figures", pages.join(plots)),
                 pages.Section("sweep", "Sweep file", pages.code_block(sweep.text))]
    description = sweep.description.strip()
    title = f"Comparison: {sweep.path.name}"
    return pages.render_page(
        title=title, heading=title,
        subtitle=f"{n_done} of {n_runs} runs finished · generated {pages.timestamp()}",
        intro=[description, LEGEND] if description else [LEGEND], sections=sections)


def write_outputs(sweep_dir: Path, sweep: Sweep, runs: list[Run],
                  analyses: dict[Path, dict]) -> list[Path]:
    """results.csv, comparison.md/html and the plots; returns the files written."""
    from sae import figures
    from sae.sweep.tables import match_kl, summarize_seeds

    done = [r for r in runs if run_state(sweep_dir / r.rel) == "done"]
    results, l0, per_class = collect(sweep_dir, done, analyses)
    raw = raw_by_dataset(raw_probes(sweep_dir, done, DataCache()) if done else [], runs)
    summary = summarize_seeds(results)
    matched = match_kl(summary)
    written = []
    csv = sweep_dir / "results.csv"
    write_text(csv, results.drop(columns="config").to_csv(index=False))
    made = {
        "fvu_vs_l0.png": lambda: figures.fvu_l0_pareto(summary),
        "probe_vs_l0.png": lambda: figures.probe_vs_l0(summary, raw),
        "l0_distributions.png": lambda: figures.l0_distributions(l0),
        "class_l0.png": lambda: figures.class_l0_heatmap(per_class),
        "l0_ink_correlation.png": lambda: figures.l0_ink_correlation(results),
    }
    pngs = {}
    for name, make in made.items():
        fig = make()
        pngs[name] = figures.figure_to_png_bytes(fig)
        written.append(figures.save_png(fig, sweep_dir / name))
    n_done = len(results)
    md = sweep_dir / "comparison.md"
    write_text(md, comparison_markdown(sweep, summary, matched, raw, len(runs), n_done))
    page = sweep_dir / "comparison.html"
    write_text(page, comparison_html(sweep, summary, matched, raw, pngs, len(runs), n_done))
    return [csv, md, page, *written]
