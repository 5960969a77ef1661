"""What a comparison page folds, so that it opens with its verdict: the definitions of its
columns, and the every-configuration table's columns beyond the main ones.

:func:`main_first` orders that table's columns (the setting, then what the verdict judges),
for comparison.html (:func:`sae.pages.html.table` hides the others behind a summary) and for
comparison.md (:func:`fold_markdown`), which the documentation site also applies to pages
published before the folds existed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sae.settings.metric_defs import METRIC

__all__ = ["LEGEND_SUMMARY", "fold_markdown", "main_first"]

LEGEND_SUMMARY = "What the columns mean: mean ± std over seeds, on the test set (definitions)"

# the every-configuration table's columns shown first: the setting, then what the verdict
# judges; the others (about 15) open on demand
_KEY_COLUMNS = ("model", "λ / k", "seeds")
_MAIN_METRICS = ("fvu_at_l0", "fvu", "l0_mean", "dead_fraction", "probe_accuracy")


def main_first(headings: Sequence[str]) -> tuple[list[str], int]:
    """The every-configuration table's headings with the main ones first (the setting, then
    FVU at L0, FVU, L0, dead units, probe accuracy, as present), and how many those are."""
    wanted = [*_KEY_COLUMNS, *(METRIC[m].label for m in _MAIN_METRICS)]
    main = [h for h in wanted if h in headings]
    return main + [h for h in headings if h not in main], len(main)



_FINISHED_LEGEND = re.compile(r"(\d+ of \d+ runs finished\.) (Cells are mean ± std.*)")
_CELL_SEP = re.compile(r"(?<!\\)\|")  # a cell boundary: a "|" not escaped as "\|"
_WIDE_MD = 12  # a markdown table of more columns keeps only its main ones in view


def _md_cells(line: str) -> list[str]:
    return [c.strip() for c in _CELL_SEP.split(line.strip())[1:-1]]


def _md_table(heads: list[str], rows: list[list[str]], keep: Sequence[int]) -> list[str]:
    """The columns ``keep`` of a markdown table (``rows[0]``: its alignment row)."""
    return ["| " + " | ".join(heads[i] for i in keep) + " |",
            "|" + "|".join(rows[0][i] for i in keep) + "|",
            *("| " + " | ".join(r[i] for i in keep) + " |" for r in rows[1:])]


def _fold_table(block: list[str]) -> list[str]:
    """A markdown table of more than :data:`_WIDE_MD` columns as its main columns
    (:func:`main_first`), then the setting and the other columns in a ``<details>``."""
    heads = _md_cells(block[0])
    if len(heads) <= _WIDE_MD or "model" not in heads or len(block) < 2:
        return block
    rows = [_md_cells(line) for line in block[1:]]  # the alignment row first
    if any(len(r) != len(heads) for r in rows):
        return block
    order, n_main = main_first(heads)
    main = [heads.index(h) for h in order[:n_main]]
    rest = [heads.index(h) for h in order if h in _KEY_COLUMNS or h not in order[:n_main]]
    others = order[n_main:]
    return [*_md_table(heads, rows, main), "",
            f'<details markdown="1"><summary>{len(others)} more columns: '
            f"{', '.join(others)}</summary>", "", *_md_table(heads, rows, rest), "",
            "</details>"]


def fold_markdown(text: str) -> str:
    """comparison.md as a reader meets it: the verdict first, the definitions folded below it.

    The definitions (:func:`legend`, one paragraph of some 40 lines on a page) leave the
    "runs finished" line and follow the first verdict and its findings inside a ``<details>``
    (before the next heading); a table of
    more than :data:`_WIDE_MD` columns (every configuration's) shows its main columns, and the
    others under a ``<details>`` with the setting beside them. ``<details markdown="1">``
    renders its Markdown on the site (``md_in_html``) and on GitHub alike. Pages folded already
    come back unchanged, so earlier pages can be folded when they are shown. Only the tables
    under an "every configuration" heading are folded: the headline's columns all matter.
    """
    lines = text.split("\n")
    folded: list[str] = []
    legend_text, stage, in_details, every, i = None, "", False, False, 0
    while i < len(lines):
        line = lines[i]
        match = _FINISHED_LEGEND.fullmatch(line)
        if match:
            folded.append(match.group(1))
            legend_text = match.group(2)
            i += 1
            continue
        if line.startswith("#") and stage == "judged" and legend_text is not None:
            # the first verdict and its findings are over: the definitions come here
            folded += [f'<details markdown="1"><summary>{LEGEND_SUMMARY}</summary>', "",
                       legend_text, "", "</details>", ""]
            legend_text = None
        in_details = (in_details or line.startswith("<details")) and line != "</details>"
        if line.startswith("### ") and line.endswith(": verdict") and not stage:
            stage = "verdict"
        every = line.endswith(": every configuration") if line.startswith("### ") else every
        if not line.startswith("|"):
            folded.append(line)
            i += 1
            continue
        end = i
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        folded += _fold_table(lines[i:end]) if every and not in_details else lines[i:end]
        stage = "judged" if stage == "verdict" else stage
        i = end
    return "\n".join(folded)
