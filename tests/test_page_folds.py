"""What a comparison page folds and how its text is shown: the definitions below the verdict, the
every-configuration table's main columns first with the others behind a summary, and Markdown's
code spans as ``<code>`` on an HTML page rather than literal backticks."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from sae.pages import html
from sae.sweep import folds, render

LEGEND = "Cells are mean ± std over seeds (sample std; none with one seed), on the test set. X."
HEADS = ["model", "λ / k", "seeds", "MSE", "FVU", "FVU at L0", "val FVU", "L0 mean", "L0 std",
         "val L0", "dead %", "dense %", "probe acc. %", "recon bias", "converged"]


def page(heads=HEADS) -> str:
    rows = [" | ".join([m, "λ = 0.1", "3", *(f"0.{i}" for i in range(len(heads) - 3))])
            for m in ("kl", "topk")]
    table = "\n".join(["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads)
                       + "|", *(f"| {r} |" for r in rows)])
    return "\n".join(["# Comparison: x.yaml", "", f"6 of 6 runs finished. {LEGEND}", "",
                      "## mnist", "", "### mnist: verdict", "", "note", "",
                      "| band | criterion |", "|---|---|", "| L0 16 | FVU at L0 |", "",
                      "- topk wins", "",
                      "### mnist: headline", "", table.replace("λ / k", "target"), "",
                      "### mnist: every configuration", "", table, ""])


def test_the_definitions_follow_the_verdict_folded():
    folded = folds.fold_markdown(page())
    lines = folded.split("\n")
    assert "6 of 6 runs finished." in lines and LEGEND not in lines[2]
    findings = lines.index("- topk wins")  # after the verdict's table and its findings ...
    details = lines.index(f'<details markdown="1"><summary>{folds.LEGEND_SUMMARY}</summary>')
    assert details == findings + 2 and lines[details + 2] == LEGEND
    assert lines[details + 4:details + 7] == ["</details>", "", "### mnist: headline"]


def test_the_every_configuration_table_shows_its_main_columns_first():
    folded = folds.fold_markdown(page())
    every = folded.split("### mnist: every configuration")[1]
    tables = [line for line in every.split("\n") if line.startswith("| model")]
    main = [c.strip() for c in tables[0].strip("|").split("|")]
    assert main == ["model", "λ / k", "seeds", "FVU at L0", "FVU", "L0 mean", "dead %",
                    "probe acc. %"]
    rest = [c.strip() for c in tables[1].strip("|").split("|")]
    assert rest[:3] == ["model", "λ / k", "seeds"]  # the setting beside the other columns
    assert sorted(main + rest[3:]) == sorted(HEADS)  # nothing is lost
    assert "<details markdown=\"1\"><summary>7 more columns: MSE, val FVU" in every
    headline = folded.split("### mnist: headline")[1].split("###")[0]
    assert "<details" not in headline  # the headline's columns all stay


def test_folding_twice_changes_nothing_and_rows_keep_their_cells():
    once = folds.fold_markdown(page())
    assert folds.fold_markdown(once) == once
    rows = [r for r in once.split("\n") if r.startswith("| topk")]
    assert rows[-2].split(" | ")[:3] == ["| topk", "λ = 0.1", "3"]


def test_the_html_table_hides_its_further_columns_behind_a_summary():
    out = str(html.table(["model", "a", "b", "c"], [["kl", 1, 2, 3]], wide=2))
    assert re.search(r'<details class="cols"><summary>2 more columns: b, c</summary>', out)
    assert re.findall(r'<t[hd] class="more">(\w+)<', out) == ["b", "c", "2", "3"]
    assert "<details" not in str(html.table(["model", "a"], [["kl", 1]], wide=True))


@given(st.lists(st.text(alphabet=st.characters(exclude_characters="`\n"), max_size=8),
                min_size=1, max_size=6))
def test_code_spans_become_code_and_nothing_else_changes(parts):
    text = "`".join(parts) if len(parts) % 2 else "`".join(parts) + "`"
    shown = str(html.inline_code(text))
    spans = re.findall(r"`([^`\n]+)`", text)
    assert shown.count("<code>") == len(spans)
    stripped = re.sub(r"</?code>", "", shown)
    assert stripped == str(html.join([re.sub(r"`([^`\n]+)`", r"\1", text)]))


def test_a_command_in_a_comparison_intro_is_code_not_backticks():
    note = render.build_note({"unbuilt": ["runs/mnist/kl/seed0"]})
    out = html.render_page("t", "t", "s", [], intro=[note])
    assert "`" not in out
    assert "<code>python -m sae.report runs/mnist/kl/seed0</code>" in out
