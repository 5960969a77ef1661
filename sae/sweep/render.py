"""The comparison a sweep writes: results.csv, comparison.md, comparison.html and the plots.

:func:`write_outputs` gathers the finished runs (:mod:`sae.sweep.analysis`), averages them over
seeds and matches them with the KL-SAE (:mod:`sae.sweep.aggregate`), sets them at equal L0
(:mod:`sae.sweep.matching`), writes the tables (:mod:`sae.sweep.display`), draws the plots
(:mod:`sae.sweep.plots`) and writes every file of :data:`FIGURE_FILES`.

Both pages open with the verdict: per dataset and L0 band, the best model on FVU at L0, probe
accuracy and dead units, every criterion judged at the band's target L0 (each model's curve
interpolated there; only models with exact zeros compete on FVU:
:func:`sae.sweep.matching.verdict`), a
findings paragraph written from that same verdict (:func:`findings`), the headline table (every
model at L0 16 and 32, :func:`sae.sweep.matching.headline`), and the best cells of the tables
marked. They link to what lies beside them (:func:`related_links`): the other comparison pages
beside this one, the figure gallery and each run's report, each only where the file exists, so a
published copy without ``runs/`` names no run report (:func:`publish_page` renders that copy);
:func:`relink_page` brings an earlier page's links up to date when a page is published beside it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from sae.settings.config import DATASETS
from sae.settings.metric_defs import METRIC
from sae.sweep.analysis import DataCache, collect, raw_by_dataset, raw_probes, read_json
from sae.sweep.folds import LEGEND_SUMMARY, fold_markdown, main_first
from sae.sweep.launch import run_state
from sae.sweep.spec import Run, Sweep
from sae.system.io import read_text, write_bytes, write_text

__all__ = ["FIGURE_FILES", "comparison_html", "comparison_markdown", "findings", "legend",
           "prepare_outputs", "publish_page", "related_links", "relink_page", "see_also_html",
           "see_also_markdown", "write_outputs"]

FIGURE_FILES = {
    "fvu_vs_l0.png": "Reconstruction vs sparsity. Top: FVU against mean L0 of the models with "
                     "exact zeros (their FVU is their FVU at L0); the dashed grey line is their "
                     "Pareto frontier. Bottom: models without exact zeros (the KL-SAE), kept "
                     "apart: solid, their FVU, which also uses units their L0 does not count; "
                     "dashed, their FVU when only the units counted in L0 reconstruct.",
    "probe_vs_l0.png": "Linear-probe test accuracy of the codes against mean L0 (the probe the "
                       "sweep file's probe_loss names); the dashed line is the same probe on "
                       "the raw input (pixels, or the activation rows).",
    "l0_distributions.png": "Distribution of the number of active units per test input, one "
                            "panel per model, on one shared L0 axis.",
    "class_l0.png": "Mean L0 per class, relative to each configuration's mean.",
    "l0_ink_correlation.png": "Correlation between a test input's L0 and its ink: whether the "
                              "number of active units adapts to the input.",
    "truth_vs_l0.png": "Against the known features, by mean L0: the share of true features a "
                       "decoder atom recovers (cosine above 0.9), and the Spearman correlation "
                       "of each test input's L0 with its true number of features; the dashed "
                       "line is an L0 ranked by the input's energy alone.",
}



def legend() -> str:
    """What the summary table's cells are: its metrics' definitions
    (:mod:`sae.settings.metric_defs`)."""
    from sae.sweep.display import SUMMARY_COLUMNS  # pandas: not at sae.compare's start

    return ("Cells are mean ± std over seeds (sample std; none with one seed), on the test set. "
            + "; ".join(f"{METRIC[name].label}: {METRIC[name].definition}"
                        for name in SUMMARY_COLUMNS)
            + ". Bold: the best in its L0 band (see the verdict).")


_VERDICT_NOTE = ("Every criterion is compared at the same L0 for every model (the band's "
                 "target: 16, 32 or 64 active units unless the sweep file sets its own "
                 "targets), interpolated per seed on each model's own "
                 "curve (linear in log L0 between the two settings that bracket the target, or "
                 "a setting within 5 % of the target, whose own L0 is named), the runs placed "
                 "by their validation L0 and scored on the test set: outcomes first (FVU at L0, "
                 "the adaptive gain; on data with known features their recovery and how well L0 "
                 "tracks the true L0), then probe accuracy and dead units, so no model wins by "
                 "being less sparse. A model whose settings do not reach the target on both "
                 "sides is not compared there (nothing is extrapolated). Only models with exact "
                 "zeros (FVU at L0 = FVU) compete on FVU at L0: a code without them, the "
                 "KL-SAE's, reconstructs with units its L0 does not count. \"Within seed "
                 "std\": the margin to the runner-up is no larger than the seed spread.")


_HEADLINE_NOTE = ("Every model at the same mean L0 (the targets): for each "
                  "seed, its runs are placed by their validation L0 and the two settings that "
                  "bracket the target are interpolated (\"from\"; linear in log L0), or the "
                  "one setting within 5 % of it is taken as it is; cells are the mean ± std over "
                  "the seeds that reach the target (\"seeds\") of the test metrics (val FVU: "
                  "the validation split's) and L0 the test L0 the row stands for. A model whose "
                  "settings do not reach an L0 has no row there. Values lose: FVU at L0 − "
                  "support FVU, what the model's values lose against the best values on its own "
                  "supports. Partial adaptivity: the adaptivity with the input's energy held "
                  "fixed; energy baseline: what an L0 ranked by energy alone scores on "
                  "adaptivity.")

_TEST_PLACED = ("This results table predates validation metrics: runs are placed by their "
                "test L0.")


def headline_note(results) -> str:
    """The headline's note, saying so where runs are placed by test L0 (an earlier table)."""
    from sae.sweep.matching import choice_l0  # pandas: not at sae.compare's start

    _, on_val = choice_l0(results)
    return _HEADLINE_NOTE if on_val or results.empty else f"{_HEADLINE_NOTE} {_TEST_PLACED}"


# --------------------------------------------------------------------------- findings


def _span(values: Sequence[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else \
        f"{format(lo, fmt)}–{format(hi, fmt)}"


def findings(summary, judged, dataset: str) -> list[str]:
    """What the verdict of one dataset says, as sentences (the page's findings paragraph).

    Written from :func:`sae.sweep.matching.verdict` (``judged``) and the seed means of
    ``summary``: which model wins FVU at L0 in how many bands (and why a model without exact
    zeros is out of it), then per band the best on every other criterion that was judged
    (adaptive gain; on data with known features, recovery and L0 tracking; probe; dead
    units), each with its margin when it is within the seed spread.
    """
    # pandas: not at sae.compare's start
    from sae.sweep.aggregate import exact_zeros
    from sae.sweep.display import format_criterion  # pandas

    part = judged[judged["dataset"] == dataset]
    rows = summary[summary["dataset"] == dataset]
    if part.empty:
        return []
    out = []
    fvu = part[part["criterion"] == "FVU at L0"]
    if len(fvu):
        wins: dict[str, list[str]] = {}
        for _, r in fvu.iterrows():
            for model in r["models"]:
                wins.setdefault(model, []).append(r["band"])
        text = "; ".join(f"{m} in {len(b)} of {len(fvu)} ({', '.join(b)})"
                         for m, b in sorted(wins.items(), key=lambda kv: -len(kv[1])))
        details = "; ".join(
            f"{r['band']}: {r['winner']} {format_criterion('fvu_at_l0', r['score'])}"
            + (f" against {r['runner_up']} {format_criterion('fvu_at_l0', r['runner_up_score'])}"
               if r["runner_up"] else "")
            for _, r in fvu.iterrows())
        out.append(f"Lowest FVU at equal L0, per L0 band: {text}. {details}.")
    loose = rows[~exact_zeros(rows) & rows["fvu_at_l0_mean"].notna()]
    if len(loose):
        models = ", ".join(dict.fromkeys(loose["model"].astype(str)))
        out.append(f"Out of the FVU-at-L0 contest: {models} (no exact zeros). Its FVU "
                   f"{_span(list(loose['fvu_mean']), '.3f')} looks best, but reconstructing from "
                   f"only the units its L0 counts gives "
                   f"{_span(list(loose['fvu_at_l0_mean']), '.3f')}.")
    for criterion, verb in (("adaptive gain", "Largest adaptive gain (what letting L0 vary "
                                              "per input pays, on least-squares values)"),
                            ("feature recovery", "Most true features recovered"),
                            ("L0 tracks true L0", "L0 closest in rank to each input's true "
                                                  "number of features"),
                            ("probe accuracy", "Best probe accuracy"),
                            ("dead units", "Fewest dead units")):
        sub = part[part["criterion"] == criterion]
        if sub.empty:
            continue
        if (sub["metric"] == "probe_sparsemax_accuracy").all():
            verb = "Best sparsemax-probe accuracy"
        items = []
        for _, r in sub.iterrows():
            text = f"{r['band']}: {r['winner']} ({format_criterion(r['metric'], r['score'])})"
            if r["clear"] is False:
                text += f", within seed std of {r['runner_up']}"
            items.append(text)
        out.append(f"{verb}: {'; '.join(items)}.")
    return out


# --------------------------------------------------------------------------- links


def _gallery(page_dir: Path) -> str | None:
    """A relative link from a page in ``page_dir`` to the figure gallery's index.html (the page
    a browser shows; its README.md would open as raw text): ``../../gallery`` (a page published
    to figures/compare/<preset>/), else ``figures/gallery`` in a folder above the page (a sweep
    folder in the project); None when there is no gallery page."""
    if (page_dir / ".." / ".." / "gallery" / "index.html").is_file():
        return "../../gallery/index.html"
    here = page_dir.resolve()
    for parent in here.parents:
        candidate = parent / "figures" / "gallery" / "index.html"
        if candidate.is_file():
            return Path(os.path.relpath(candidate, here)).as_posix()
    return None


def related_links(page_dir: Path, datasets: Sequence[str], results=None) -> dict:
    """Relative links from a comparison page in ``page_dir`` to what exists beside it.

    Returns ``{"pages": [(text, href)], "runs": {dataset: [(text, href)]}}``: every other
    comparison page beside this one (``../<folder>/comparison.html``: the other presets of
    figures/compare/, or the other sweeps of sweeps/; the other datasets first, in their usual
    order, then by name), the gallery, and the report of each run of ``results`` (its ``run``
    column, relative to the page) whose ``report.html`` exists. Missing files get no link, so a
    copy without ``runs/`` names none. ``datasets`` are the page's own datasets.
    """
    page_dir = Path(page_dir)
    here = page_dir.resolve()
    siblings = [p.parent.name for p in page_dir.parent.glob("*/comparison.html")
                if p.parent.resolve() != here]
    order = {name: i for i, name in enumerate(d for d in DATASETS if d not in datasets)}
    siblings.sort(key=lambda name: (order.get(name, len(order)), name))
    pages = [(f"{name} comparison", f"../{name}/comparison.html") for name in siblings]
    gallery = _gallery(page_dir)
    if gallery is not None:
        pages.append(("figure gallery", gallery))
    runs: dict[str, list[tuple[str, str]]] = {}
    unbuilt: list[str] = []
    if results is not None and len(results):
        from sae.sweep.aggregate import config_label  # pandas: not at sae.compare's start

        for _, r in results.iterrows():
            rel = str(r.get("run", ""))
            if not rel or rel == "nan" or not (page_dir / rel).is_dir():
                continue
            if (page_dir / rel / "report.html").is_file():
                text = f"{r['model']} {config_label(r['param'], r['value'])} seed {r['seed']}"
                runs.setdefault(str(r["dataset"]), []).append(
                    (text, Path(rel, "report.html").as_posix()))
            else:
                unbuilt.append((page_dir / rel).as_posix())
    return {"pages": pages, "runs": runs, "unbuilt": unbuilt}


def see_also_markdown(pages: Sequence[tuple[str, str]]) -> str | None:
    """comparison.md's "See also" line of ``related_links(...)["pages"]``; None without pages."""
    return "See also: " + " · ".join(f"[{t}]({h})" for t, h in pages) if pages else None


def see_also_html(pages: Sequence[tuple[str, str]]):
    """comparison.html's "See also" paragraph text (a fragment); None without pages."""
    from sae.pages import html  # jinja2: only for the HTML page

    if not pages:
        return None
    return html.fragment("See also: {}", html.join(html.join([html.link(h, t), " "])
                                                    for t, h in pages))


_SEE_ALSO_HTML = re.compile(r"<p>See also: .*?</p>\n", re.S)
_END_HTML = "</body>"  # the line is the page's footer (earlier pages had it in the intro)
_FINISHED_MD = re.compile(r"\d+ of \d+ runs finished\.( |$)")  # the paragraph before the line


def relink_page(page_dir: Path, datasets: Sequence[str]) -> list[Path]:
    """Rewrite the "See also" line of the comparison.md and comparison.html in ``page_dir`` to
    the pages that exist beside it now; nothing else in them changes.

    A page links the pages that existed when it was rendered, so a page published later was
    missing from every earlier one; :func:`sae.sweep.command.publish` calls this for each earlier
    publication beside the one it writes. The line becomes what :func:`publish_page` would
    write now (the tests hold the two equal). ``datasets`` are the page's own (the link order).
    Returns the files rewritten (those whose line changed); a page that cannot be read as
    text is left as it is.
    """
    links = related_links(page_dir, datasets)["pages"]
    written = []

    def text_of(path: Path) -> str | None:
        try:
            return read_text(path) if path.is_file() else None
        except (OSError, UnicodeDecodeError):
            return None

    md, page = page_dir / "comparison.md", page_dir / "comparison.html"
    text = text_of(md)
    if text is not None:
        parts = text.split("\n")  # comparison_markdown's parts: a paragraph, then ""
        parts = [p for i, p in enumerate(parts) if not (
            p.startswith("See also: ") or (i and parts[i - 1].startswith("See also: ")))]
        finished = next((i for i, p in enumerate(parts) if _FINISHED_MD.match(p)), None)
        line = see_also_markdown(links)
        if line is not None and finished is not None:
            parts[finished + 2:finished + 2] = [line, ""]
        if "\n".join(parts) != text:
            written.append(write_text(md, "\n".join(parts)))
    text = text_of(page)
    if text is not None:
        changed = _SEE_ALSO_HTML.sub("", text, count=1)
        line = see_also_html(links)
        if line is not None and _END_HTML in changed:
            at = changed.rindex(_END_HTML)
            changed = f"{changed[:at]}<p>{line}</p>\n{changed[at:]}"
        if changed != text:
            written.append(write_text(page, changed))
    return written


def build_note(links: dict) -> str | None:
    """How to build the pages of the runs that have none (sweeps skip them while training)."""
    unbuilt = links.get("unbuilt") or []
    if not unbuilt:
        return None
    return (f"{len(unbuilt)} runs have no report yet (a sweep writes none while it trains): "
            f"`python -m sae.report {unbuilt[0]}` draws a run's figures and writes its report, "
            f"`python -m sae.features {unbuilt[0]}` its feature browser.")


# --------------------------------------------------------------------------- pages


def _datasets(sweep: Sweep, summary) -> list[str]:
    present = set(summary["dataset"])
    return [d for d in sweep.datasets if d in present]


def _kl_missing(kl) -> str | None:
    """What stands instead of the "vs KL-SAE" table when it would compare nothing (a row per
    model saying "no KL-SAE run" tells a reader less than one line)."""
    if not len(kl):
        return "No non-KL configurations."
    if (kl["KL-SAE"] == "no KL-SAE run").all():
        return "No KL-SAE runs on this dataset: nothing to compare with."
    return None


def comparison_markdown(sweep: Sweep, results, raw: dict[str, dict[str, float]],
                        n_runs: int, n_done: int, links: dict | None = None) -> str:
    """comparison.md of the runs ``results``: per dataset the verdict, its findings, the
    headline, the summary table (best cells bold) and the "vs KL-SAE" table; links to related
    pages when ``links`` names any."""
    # pandas: not at sae.compare's start
    from sae.sweep.aggregate import match_kl, summarize_seeds
    from sae.sweep.display import (  # pandas
        best_cells,
        headline_display,
        kl_display,
        summary_display,
        to_markdown,
        verdict_display,
    )
    from sae.sweep.matching import verdict  # pandas

    links = links or {"pages": [], "runs": {}, "unbuilt": []}
    summary = summarize_seeds(results)
    matched = match_kl(summary)
    judged = verdict(results, sweep.probe_loss, sweep.targets)
    parts = [f"# Comparison: {sweep.path.name}", ""]
    if sweep.description:
        parts += [sweep.description.strip(), ""]
    parts += [f"{n_done} of {n_runs} runs finished. {legend()}", ""]
    if links["pages"]:
        parts += [see_also_markdown(links["pages"]), ""]
    if build_note(links):
        parts += [build_note(links), ""]
    for dataset in _datasets(sweep, summary):
        parts += [f"## {dataset}", "", f"### {dataset}: verdict", "", _VERDICT_NOTE, "",
                  to_markdown(verdict_display(judged, dataset)), ""]
        parts += [f"- {line}" for line in findings(summary, judged, dataset)] + [""]
        parts += [f"### {dataset}: headline", "", headline_note(results), "",
                  to_markdown(headline_display(results, dataset, sweep.targets)), ""]
        parts += [f"### {dataset}: every configuration", "",
                  to_markdown(summary_display(summary, dataset, raw.get(dataset)),
                              best_cells(summary, dataset, judged)), ""]
        kl = kl_display(matched, dataset)
        parts += [f"### {dataset}: vs KL-SAE at the nearest mean L0", "",
                  "Δ FVU < 0 and Δ probe > 0 favour the model over the KL-SAE. Δ FVU at L0 "
                  "compares the KL-SAE at the sparsity its L0 states.", "",
                  _kl_missing(kl) or to_markdown(kl), ""]
        runs = links["runs"].get(dataset, [])
        if runs:
            parts += ["Run reports: " + ", ".join(f"[{t}]({h})" for t, h in runs), ""]
    return fold_markdown("\n".join(parts))


def comparison_html(sweep: Sweep, results, raw: dict[str, dict[str, float]],
                    pngs: dict[str, bytes],
                    n_runs: int, n_done: int, links: dict | None = None) -> str:
    """comparison.html of the runs ``results``: the verdict, findings and tables of
    comparison.md, the plots, the links of ``links`` (:func:`related_links`) and the sweep
    file, one page."""
    # jinja2 and pandas: not at sae.compare's start
    from sae.pages import html as pages
    from sae.sweep.aggregate import match_kl, summarize_seeds  # pandas
    from sae.sweep.display import (  # pandas
        best_cells,
        headline_display,
        kl_display,
        summary_display,
        to_html,
        verdict_display,
    )
    from sae.sweep.matching import verdict  # pandas

    links = links or {"pages": [], "runs": {}, "unbuilt": []}
    summary = summarize_seeds(results)
    matched = match_kl(summary)
    judged = verdict(results, sweep.probe_loss, sweep.targets)
    sections = []
    for dataset in _datasets(sweep, summary):
        kl = kl_display(matched, dataset)
        missing = _kl_missing(kl)
        lines = findings(summary, judged, dataset)
        every = summary_display(summary, dataset, raw.get(dataset))
        order, n_main = main_first([str(c) for c in every.columns])
        body = [pages.fragment('<h3>{}</h3><p class="sub">{}</p>', "Verdict", _VERDICT_NOTE),
                # every column of the verdict in view on a phone: a list of its rows there
                to_html(verdict_display(judged, dataset), stack=True),
                pages.fragment("<ul>{}</ul>", pages.join(
                    pages.fragment("<li>{}</li>", line) for line in lines)) if lines else "",
                # the definitions, folded, once: below the first verdict, not above it
                "" if sections else pages.fragment(
                    '<details class="note"><summary>{}</summary><p>{}</p></details>',
                    LEGEND_SUMMARY, legend()),
                pages.fragment('<h3>{}</h3><p class="sub">{}</p>', "Headline",
                               headline_note(results)),
                to_html(headline_display(results, dataset, sweep.targets)),
                pages.fragment("<h3>{}</h3>", "Every configuration"),
                # the main columns first, the others behind a summary that opens them
                to_html(every[order], best_cells(summary, dataset, judged), wide=n_main),
                pages.fragment('<h3>{}</h3><p class="sub">{}</p>',
                               "vs KL-SAE at the nearest mean L0",
                               "Δ FVU < 0 and Δ probe > 0 favour the model. Δ FVU at L0 compares "
                               "the KL-SAE at the sparsity its L0 states."),
                pages.fragment("<p>{}</p>", missing) if missing else to_html(kl)]
        runs = links["runs"].get(dataset, [])
        if runs:
            body.append(pages.fragment(
                "<details><summary>Run reports ({})</summary><p>{}</p></details>", len(runs),
                pages.join(pages.join([pages.link(h, t), " "]) for t, h in runs)))
        sections.append(pages.Section(dataset, dataset, pages.join(body)))
    plots = [pages.figure(pngs[name], name, caption) for name, caption in FIGURE_FILES.items()
             if name in pngs]
    sections += [pages.Section("figures", "Figures", pages.join(plots)),
                 pages.Section("sweep", "Sweep file", pages.code_block(sweep.text))]
    description = sweep.description.strip()
    title = f"Comparison: {sweep.path.name}"
    intro = [description] if description else []
    if build_note(links):
        intro.append(build_note(links))
    # the other pages at the foot: on a phone a long list of them first hides the verdict
    footer = [see_also_html(links["pages"])] if links["pages"] else []
    return pages.render_page(
        title=title, heading=title,
        subtitle=f"{n_done} of {n_runs} runs finished · generated {pages.timestamp()}",
        intro=intro, notes=[] if sections else [(LEGEND_SUMMARY, legend())],
        sections=sections, footer=footer)


def prepare_outputs(sweep_dir: Path, finished: list[Run], data: DataCache) -> None:
    """What :func:`write_outputs` needs before its first table, done ahead of it: the
    plotting libraries imported and the raw-pixel probes of the finished runs' data splits
    (raw_probe.json, with their data in ``data``). A sweep calls it while its last runs train,
    so that the outputs follow the last run within seconds."""
    from sae import figures  # noqa: F401 (imported for its cost, now)
    from sae.sweep import plots  # noqa: F401 (matplotlib, likewise)

    if finished:
        raw_probes(sweep_dir, finished, data)


def write_outputs(sweep_dir: Path, sweep: Sweep, runs: list[Run],
                  analyses: dict[Path, dict], data: DataCache | None = None) -> list[Path]:
    """results.csv, comparison.md/html and the plots; returns the files written. ``data``:
    the data splits already loaded (for the raw-pixel probes), if any."""
    # matplotlib and pandas: not at sae.compare's start
    from sae import figures
    from sae.sweep import plots  # matplotlib
    from sae.sweep.aggregate import PROBE_METRICS, summarize_seeds  # pandas

    done = [r for r in runs if run_state(sweep_dir / r.rel) == "done"]
    results, l0, per_class = collect(sweep_dir, done, analyses)
    data = DataCache() if data is None else data
    raw = raw_by_dataset(raw_probes(sweep_dir, done, data) if done else [], runs)
    summary = summarize_seeds(results)
    written = []
    csv = sweep_dir / "results.csv"
    write_text(csv, results.drop(columns="config").to_csv(index=False))
    made = {
        "fvu_vs_l0.png": lambda: plots.fvu_l0_pareto(summary),
        "probe_vs_l0.png": lambda: plots.probe_vs_l0(
            summary, {d: r.get(PROBE_METRICS[sweep.probe_loss][0]) for d, r in raw.items()},
            sweep.probe_loss),
        "l0_distributions.png": lambda: plots.l0_distributions(l0),
        "class_l0.png": lambda: plots.class_l0_heatmap(per_class),
        "l0_ink_correlation.png": lambda: plots.l0_ink_correlation(results),
        "truth_vs_l0.png": lambda: plots.truth_vs_l0(summary),
    }
    # a figure of what the data has: probes and classes need labels, ink images, the truth
    # data with known features; one left from an earlier render of the folder goes
    images = any(not r.settings.get("data") for r in done)  # --data rows have no ink
    has = {"probe_vs_l0.png": _measured(results, PROBE_METRICS[sweep.probe_loss][0]),
           "class_l0.png": per_class["class"].nunique() > 1,
           "l0_ink_correlation.png": images and _measured(results, "l0_ink_corr"),
           "truth_vs_l0.png": _measured(results, "gt_recovery")}
    for name in [n for n, shown in has.items() if not shown] if done else []:
        made.pop(name)
        (sweep_dir / name).unlink(missing_ok=True)
    pngs = {}
    for name, make in made.items():  # drawn once: the page embeds the bytes the file holds
        fig = make()
        try:
            pngs[name] = figures.figure_to_png_bytes(fig)
        finally:
            fig.clear()
        written.append(write_bytes(sweep_dir / name, pngs[name]))
    n_done = len(results)
    links = related_links(sweep_dir, sweep.datasets, results)
    md = sweep_dir / "comparison.md"
    write_text(md, comparison_markdown(sweep, results, raw, len(runs), n_done, links))
    page = sweep_dir / "comparison.html"
    write_text(page, comparison_html(sweep, results, raw, pngs, len(runs), n_done, links))
    return [csv, md, page, *written]


def _measured(results, metric: str) -> bool:
    """Whether any run of ``results`` has a finite value of ``metric``."""
    import pandas as pd  # not at sae.compare's start

    return metric in results and bool(pd.to_numeric(results[metric], errors="coerce")
                                      .notna().any())


def publish_page(sweep_dir: Path, sweep: Sweep, runs: list[Run], folder: Path) -> list[Path]:
    """comparison.md and comparison.html for a published copy in ``folder``.

    Rendered from the sweep folder's results.csv, raw_probe.json and plots (no run is read),
    with the links that exist from ``folder``: no run reports when ``folder`` has no runs, the
    gallery and the other dataset's page where they lie beside it.
    """
    import pandas as pd  # not at sae.compare's start

    results = pd.read_csv(sweep_dir / "results.csv")
    raw = raw_by_dataset(read_json(sweep_dir / "raw_probe.json", list) or [], runs)
    pngs = {name: (sweep_dir / name).read_bytes() for name in FIGURE_FILES
            if (sweep_dir / name).is_file()}
    links = related_links(folder, sweep.datasets, results)
    n_done = len(results)
    md, page = folder / "comparison.md", folder / "comparison.html"
    write_text(md, comparison_markdown(sweep, results, raw, len(runs), n_done, links))
    write_text(page, comparison_html(sweep, results, raw, pngs, len(runs), n_done, links))
    return [md, page]
