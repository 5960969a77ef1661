"""sae.sweep's tables: results, seed means, the KL matching, the verdict at equal L0, the pages."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sweep_helpers import TINY, results, summary, write_yaml

from sae.sweep import aggregate, display, matching, render, spec
from sae.sweep import command as compare

# --------------------------------------------------------------------------- tables


def test_results_frame_has_documented_columns():
    frame = aggregate.results_frame([{"dataset": "mnist", "fvu": 0.2, "extra": 1}])
    assert list(frame.columns) == aggregate.RESULT_COLUMNS
    assert math.isnan(frame.loc[0, "probe_accuracy"])


def test_summarize_seeds_mean_and_sample_std():
    frame = results([
        ("mnist", "l1", "l1", "lambda", 0.1, 0, 0.2, 10, 0.90),
        ("mnist", "l1", "l1", "lambda", 0.1, 1, 0.4, 20, 0.92),
        ("mnist", "l1", "l1", "lambda", 0.1, 2, 0.3, 30, 0.94),
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.1, 50, 0.95),
        ("mnist", "topk", "topk", "k", 8, 0, 0.5, 8, 0.80),
    ])
    s = aggregate.summarize_seeds(frame)
    assert list(zip(s["model"], s["value"], strict=True)) == [("l1", 0.01), ("l1", 0.1),
                                                              ("topk", 8)]
    row = s[(s["model"] == "l1") & (s["value"] == 0.1)].iloc[0]
    assert row["n_seeds"] == 3
    assert row["fvu_mean"] == pytest.approx(0.3)
    assert row["fvu_std"] == pytest.approx(0.1)  # sample std (ddof = 1)
    assert row["l0_mean_std"] == pytest.approx(10.0)
    assert row["probe_accuracy_mean"] == pytest.approx(0.92)
    assert math.isnan(s.iloc[0]["fvu_std"])  # one seed: no spread measured
    assert aggregate.summarize_seeds(aggregate.results_frame([])).empty


def test_summarize_seeds_ignores_missing_probe():
    frame = results([("mnist", "l1", "l1", "lambda", 0.1, 0, 0.2, 10, 0.9),
                     ("mnist", "l1", "l1", "lambda", 0.1, 1, 0.2, 10, float("nan"))])
    assert aggregate.summarize_seeds(frame).loc[0, "probe_accuracy_mean"] == pytest.approx(0.9)


def test_match_kl_nearest_l0_and_deltas():
    s = summary([
        ("mnist", "kl", "kl", "lambda", 0.1, 0, 0.30, 10, 0.90),
        ("mnist", "kl", "kl", "lambda", 1.0, 0, 0.50, 50, 0.80),
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.20, 12, 0.95),
        ("mnist", "topk", "topk", "k", 32, 0, 0.10, 45, 0.85),
    ])
    m = aggregate.match_kl(s).set_index("model")
    assert len(m) == 2 and "kl" not in m.index
    assert m.loc["l1", "kl_value"] == 0.1 and m.loc["l1", "kl_l0"] == 10
    assert m.loc["l1", "d_fvu"] == pytest.approx(-0.1)
    assert m.loc["l1", "kl_fvu_at_l0"] == pytest.approx(0.8)
    assert m.loc["l1", "d_fvu_at_l0"] == pytest.approx(-0.6)
    assert m.loc["l1", "d_probe"] == pytest.approx(0.05)
    assert m.loc["topk", "kl_value"] == 1.0 and m.loc["topk", "d_fvu"] == pytest.approx(-0.4)


def test_match_kl_tie_goes_to_smaller_lambda():
    s = summary([
        ("mnist", "kl", "kl", "lambda", 1.0, 0, 0.5, 10, 0.8),
        ("mnist", "kl", "kl", "lambda", 0.1, 0, 0.3, 30, 0.9),
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.2, 20, 0.95),
    ])
    assert aggregate.match_kl(s).loc[0, "kl_value"] == 0.1


def test_match_kl_stays_within_dataset_and_handles_missing_kl():
    s = summary([
        ("mnist", "kl", "kl", "lambda", 0.1, 0, 0.3, 10, 0.9),
        ("fashion-mnist", "l1", "l1", "lambda", 0.01, 0, 0.2, 10, 0.8),
    ])
    m = aggregate.match_kl(s)
    assert len(m) == 1 and m.loc[0, "dataset"] == "fashion-mnist"
    assert math.isnan(m.loc[0, "kl_l0"]) and math.isnan(m.loc[0, "d_fvu"])
    assert "no KL-SAE run" in display.to_markdown(display.kl_display(m, "fashion-mnist"))
    only_kl = summary([("mnist", "kl", "kl", "lambda", 0.1, 0, 0.3, 10, 0.9)])
    assert aggregate.match_kl(only_kl).empty
    # the pages say it once instead of a table of "no KL-SAE run" rows
    from sae.sweep.render import _kl_missing

    assert _kl_missing(display.kl_display(m, "fashion-mnist")).startswith("No KL-SAE runs")
    assert _kl_missing(display.kl_display(aggregate.match_kl(only_kl), "mnist")) == \
        "No non-KL configurations."
    both = summary([("mnist", "kl", "kl", "lambda", 0.1, 0, 0.3, 10, 0.9),
                    ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.2, 10, 0.8)])
    assert _kl_missing(display.kl_display(aggregate.match_kl(both), "mnist")) is None


def test_summary_display_and_markdown():
    s = summary([
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.2, 10, 0.90),
        ("mnist", "l1", "l1", "lambda", 0.01, 1, 0.4, 14, 0.92),
        ("mnist", "topk", "topk", "k", 32, 0, 0.1, 32, 0.95),
    ])
    shown = display.summary_display(s, "mnist", raw_probe=0.926)
    assert list(shown["model"]) == ["l1", "topk", "raw input"]
    assert shown.loc[0, "λ / k"] == "λ = 0.01" and shown.loc[1, "λ / k"] == "k = 32"
    assert shown.loc[0, "FVU"] == "0.3000 ± 0.1414"
    assert shown.loc[1, "FVU"] == "0.1000"  # one seed: no ± part
    assert shown.loc[1, "FVU at L0"] == "0.1000"
    assert shown.loc[2, "probe acc. %"] == "92.60"
    md = display.to_markdown(shown).splitlines()
    assert md[0].startswith("| model | λ / k |") and set(md[1]) <= set("|-:")
    assert len(md) == 2 + 3
    assert "<td class=\"num\">92.60</td>" in display.to_html(shown)


def verdict_frame():
    return results([
        # dataset, model, kind, param, value, seed, fvu, l0, probe
        ("mnist", "kl", "kl", "lambda", 1.0, 0, 0.03, 14, 0.94),      # band <= 20
        ("mnist", "l1", "l1", "lambda", 0.03, 0, 0.28, 13, 0.96),
        ("mnist", "sparsemax", "sparsemax", "lambda", 0.03, 0, 0.20, 16, 0.97),
        ("mnist", "topk", "topk", "k", 16, 0, 0.17, 16, 0.965),
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.14, 37, 0.976),  # 20 < L0 <= 50
        ("mnist", "kl", "kl", "lambda", 0.1, 0, 0.02, 30, 0.93),
        ("mnist", "topk", "topk", "k", 32, 0, 0.11, 32, 0.973),
        ("mnist", "topk", "topk", "k", 64, 0, 0.07, 64, 0.97),       # > 50, alone
        ("fashion-mnist", "sparsemax", "sparsemax", "lambda", 0.03, 0, 0.16, 9, 0.85),
        ("fashion-mnist", "topk", "topk", "k", 16, 0, 0.12, 16, 0.86),
    ])


def winners(judged, dataset, band, criterion):
    row = judged[(judged["dataset"] == dataset) & (judged["band"] == band)
                 & (judged["criterion"] == criterion)]
    assert len(row) == 1
    return row.iloc[0]


def test_verdict_names_the_best_per_dataset_band_and_criterion():
    s = verdict_frame()
    judged = matching.verdict(s)
    assert list(dict.fromkeys(judged["band"])) == ["L0 ≤ 20", "20 < L0 ≤ 50", "L0 > 50"]
    # outcomes lead; the ground-truth criteria have no values on images, so no rows
    assert list(dict.fromkeys(judged["criterion"])) == ["FVU at L0", "probe accuracy",
                                                        "dead units"]
    # FVU at L0 is compared at L0 16 on every model's curve: topk and sparsemax sit there,
    # l1 is interpolated between L0 13 and 37, the KL-SAE (14 … 30) is out (no exact zeros)
    low = winners(judged, "mnist", "L0 ≤ 20", "FVU at L0")
    assert low["winner"] == "topk at L0 16.0 (k = 16)" and low["score"] == pytest.approx(0.17)
    assert low["runner_up"] == "sparsemax at L0 16.0 (λ = 0.03)"
    assert low["margin"] == pytest.approx(0.03)
    assert low["excluded"] == "kl at L0 16 (λ = 1 … 0.1)"  # said, not silently dropped
    assert low["n_candidates"] == 3 and low["models"] == ["topk"]
    l1 = matching.at_l0(s, [16.0]).set_index(["dataset", "model"]).loc[("mnist", "l1")]
    w = math.log(16 / 13) / math.log(37 / 13)
    assert l1["fvu_at_l0"] == pytest.approx(0.28 + w * (0.14 - 0.28))
    assert (l1["lo_value"], l1["hi_value"]) == (0.03, 0.01)
    assert winners(judged, "mnist", "L0 ≤ 20", "probe accuracy")["winner"].startswith(
        "sparsemax")
    assert winners(judged, "mnist", "20 < L0 ≤ 50", "FVU at L0")["winner"].startswith("topk")
    assert winners(judged, "mnist", "20 < L0 ≤ 50", "probe accuracy")["winner"].startswith("l1")
    alone = winners(judged, "mnist", "L0 > 50", "FVU at L0")
    assert alone["runner_up"] == "" and math.isnan(alone["margin"])
    assert not ((matching.at_l0(s)["model"] == "sparsemax")
                & (matching.at_l0(s)["target"] == 32)).any()  # never extrapolated
    # dead units are judged at L0 16 too: all 10 %, a four-way tie of the models reaching 16;
    # only the two taken as they are (sparsemax, topk) have a summary row to mark
    dead = winners(judged, "mnist", "L0 ≤ 20", "dead units")
    assert sorted(dead["models"]) == ["kl", "l1", "sparsemax", "topk"]
    assert sorted(dead["winners"]) == [("sparsemax", 0.03), ("topk", 16)]
    assert winners(judged, "fashion-mnist", "L0 ≤ 20", "FVU at L0")["winner"].startswith("topk")
    assert matching.l0_band(20.0) == "L0 ≤ 20" and matching.l0_band(20.01) == "20 < L0 ≤ 50"
    assert matching.l0_band(0.0) == "L0 ≤ 20" and matching.l0_band(float("nan")) is None


def test_probe_and_dead_units_are_judged_at_equal_l0():
    """In the band 20 < L0 ≤ 50, a setting at L0 48 would beat one at L0 32 on probe accuracy
    and dead units only by being less sparse: both criteria are judged at L0 32 on each
    model's curve, so the model that is better there wins."""
    s = results([
        ("mnist", "entmax", "entmax", "lambda", 0.03, 0, 0.20, 16, 0.950),
        ("mnist", "entmax", "entmax", "lambda", 0.003, 0, 0.12, 108, 0.990),  # best, at L0 108
        ("mnist", "topk", "topk", "k", 32, 0, 0.13, 32, 0.970),
        ("mnist", "topk", "topk", "k", 64, 0, 0.10, 64, 0.975),
    ])
    s.loc[s["value"] == 0.003, "dead_fraction"] = 0.0  # few dead units at L0 108 only
    judged = matching.verdict(s)
    probe = winners(judged, "mnist", "L0 > 50", "probe accuracy")
    at64 = matching.at_l0(s, [64.0]).set_index("model")
    assert probe["target"] == 64
    assert probe["winner"].startswith("entmax at L0 64 (λ = 0.03 … 0.003)")  # interpolated
    assert probe["score"] == pytest.approx(at64.loc["entmax", "probe_accuracy"])
    assert probe["score"] < 0.99  # not the L0 108 setting's own accuracy
    mid = winners(judged, "mnist", "20 < L0 ≤ 50", "probe accuracy")
    at32 = matching.at_l0(s, [32.0]).set_index("model")
    best = "topk" if at32.loc["topk", "probe_accuracy"] > at32.loc["entmax", "probe_accuracy"] \
        else "entmax"
    assert mid["models"] == [best] and mid["n_candidates"] == 2
    dead = winners(judged, "mnist", "20 < L0 ≤ 50", "dead units")
    assert dead["score"] == pytest.approx(min(at32["dead_fraction"]))
    assert dead["models"] == [at32["dead_fraction"].idxmin()]


@settings(max_examples=40, deadline=None)
@given(kl_fvu=st.floats(0.0, 1.0), kl_extra=st.floats(1e-3, 1.0),
       others=st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(1.0, 80.0)), min_size=1,
                       max_size=5))
def test_a_code_without_exact_zeros_never_wins_fvu_at_l0(kl_fvu, kl_extra, others):
    rows = [("mnist", "kl", "kl", "lambda", 1.0, 0, kl_fvu, 10.0, 0.9),  # its curve spans
            ("mnist", "kl", "kl", "lambda", 0.1, 0, kl_fvu, 90.0, 0.9)]  # every target L0
    rows += [("mnist", "l1", "l1", "lambda", 0.001 * (i + 1), 0, fvu, l0, 0.9)
             for i, (fvu, l0) in enumerate(others)]
    s = results(rows)  # the KL rows' FVU at L0 is their FVU + 0.5 (see results())
    judged = matching.verdict(s)
    fvu_rows = judged[judged["criterion"] == "FVU at L0"]
    assert not any("kl" in w for w in fvu_rows["winner"])
    assert not any("kl" in models for models in fvu_rows["models"])
    assert all(model != "kl" for ws in fvu_rows["winners"] for model, _ in ws)
    target = {"L0 ≤ 20": 16, "20 < L0 ≤ 50": 32, "L0 > 50": 64}
    assert all(r["excluded"].startswith(f"kl at L0 {target[r['band']]} ")
               for _, r in fvu_rows.iterrows())
    summary_ = aggregate.summarize_seeds(s)
    assert list(aggregate.exact_zeros(summary_)) == [k != "kl" for k in summary_["kind"]]


def test_best_cells_are_marked_in_markdown_and_html():
    r = verdict_frame()
    s = aggregate.summarize_seeds(r)
    judged = matching.verdict(r)
    best = display.best_cells(s, "mnist", judged)
    shown = display.summary_display(s, "mnist")
    row = list(zip(shown["model"], shown["λ / k"], strict=True)).index(("topk", "k = 16"))
    assert (row, "FVU at L0") in best
    kl_row = list(shown["model"]).index("kl")
    assert (kl_row, "FVU at L0") not in best and (kl_row, "FVU") not in best
    md = display.to_markdown(shown, best).splitlines()
    assert "**0.1700**" in md[2 + row] and "**" not in md[2 + kl_row].split("|")[6]
    html = display.to_html(shown, best)
    assert html.count('class="num best"') == len(best)
    assert '<td class="num best">0.1700</td>' in html
    # a metric's column is shown where a row has a value, and left out where none has one
    assert not {"recon bias", "support FVU", "adaptive gain"} & set(shown.columns)
    r = r.assign(recon_bias=1.0, support_fvu=0.1, adaptive_gain=0.01, adaptivity=0.5)
    shown = display.summary_display(aggregate.summarize_seeds(r), "mnist")
    assert {"recon bias", "support FVU", "adaptive gain", "adaptivity"} <= set(shown.columns)


def test_comparison_page_states_the_verdict_and_findings(tmp_path):
    sweep = spec.load_sweep(write_yaml(tmp_path / "s.yaml", TINY))
    r = verdict_frame()
    s = aggregate.summarize_seeds(r)
    (tmp_path / "runs").mkdir()
    raw = {"mnist": {"probe_accuracy": 0.926}}
    page = render.comparison_html(sweep, r, raw, {}, 9, 9)
    md = render.comparison_markdown(sweep, r, raw, 9, 9)
    for text in (page, md):
        assert "Only models with exact zeros (FVU at L0 = FVU) compete on FVU at L0" in text
        assert "Lowest FVU at equal L0, per L0 band: topk in 3 of 3" in text
        assert "Out of the FVU-at-L0 contest: kl (no exact zeros)" in text
    assert 'class="num best"' in page and "**0.1700**" in md
    lines = render.findings(s, matching.verdict(r), "mnist")
    assert any(line.startswith("Best probe accuracy: L0 ≤ 20: sparsemax") for line in lines)
    assert "This results table predates validation metrics" in md  # no val_l0 column


def test_headline_sets_every_model_at_l0_16_and_32():
    s = results([
        ("mnist", "l1", "l1", "lambda", 0.03, 0, 0.28, 13, 0.96),
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.14, 37, 0.976),
        ("mnist", "l1", "l1", "lambda", 0.01, 1, 0.16, 37, 0.976),
        ("mnist", "kl", "kl", "lambda", 1.0, 0, 0.03, 14, 0.94),     # never reaches 16
        ("mnist", "topk", "topk", "k", 16, 0, 0.17, 16, 0.965),
        ("mnist", "topk", "topk", "k", 32, 0, 0.11, 31.0, 0.973),   # within 5 % of 32
        ("fashion-mnist", "topk", "topk", "k", 16, 0, 0.12, 16, 0.86),
    ])
    head = matching.headline(s)
    assert list(zip(head["dataset"], head["target"], head["model"], strict=True)) == [
        ("mnist", 16, "l1"), ("mnist", 16, "topk"), ("mnist", 32, "l1"), ("mnist", 32, "topk"),
        ("fashion-mnist", 16, "topk")]
    shown = display.headline_display(s, "mnist")
    assert list(shown["target"]) == ["16", "16", "32", "32"]
    assert list(shown["L0"]) == ["16.0", "16.0", "32.0", "31.0"]  # the L0 each row stands for
    assert list(shown["from"]) == ["λ = 0.03 … 0.01", "k = 16", "λ = 0.03 … 0.01", "k = 32"]
    # per seed: only seed 0 of l1 brackets L0 16 (seed 1 has no run below it), so the row is
    # seed 0's interpolation, not one of seed means, and says one of two seeds
    w = math.log(16 / 13) / math.log(37 / 13)
    assert shown.loc[0, "FVU at L0"] == f"{0.28 + w * (0.14 - 0.28):.4f}"
    assert shown.loc[0, "seeds"] == "1 of 2"
    assert shown.loc[1, "FVU at L0"] == "0.1700" and shown.loc[3, "FVU at L0"] == "0.1100"
    assert matching.headline(s.iloc[:0]).empty


def test_the_sweep_file_chooses_the_probe_the_verdict_judges(tmp_path):
    r = verdict_frame()
    s = aggregate.summarize_seeds(r)
    soft = winners(matching.verdict(r), "mnist", "L0 ≤ 20", "probe accuracy")
    judged = matching.verdict(r, "sparsemax")
    sparse = winners(judged, "mnist", "L0 ≤ 20", "probe accuracy")
    assert soft["winner"].startswith("sparsemax") and soft["metric"] == "probe_accuracy"
    assert sparse["winner"].startswith("kl at L0 16 (λ = 1 … 0.1)")
    assert sparse["metric"] == "probe_sparsemax_accuracy"
    kl16 = matching.at_l0(r, [16.0]).set_index(["dataset", "model"]).loc[("mnist", "kl")]
    assert sparse["score"] == pytest.approx(kl16["probe_sparsemax_accuracy"])
    assert 0.96 < sparse["score"] < 0.97  # between its settings at L0 14 (0.96) and 30 (0.97)
    raw = {"probe_accuracy": 0.926, "probe_sparsemax_accuracy": 0.91,
           "probe_sparsemax_classes": 1.7}
    shown = display.summary_display(s, "mnist", raw)
    kl_row = list(zip(shown["model"], shown["λ / k"], strict=True)).index(("kl", "λ = 1"))
    topk_row = list(zip(shown["model"], shown["λ / k"], strict=True)).index(("topk", "k = 32"))
    best = display.best_cells(s, "mnist", judged)
    # at L0 32 topk (taken as it is) has the best sparsemax probe; the softmax probe's winner
    # there is l1, interpolated; the KL-SAE's win at L0 16 is interpolated: no cell to mark
    assert (topk_row, "sparsemax probe %") in best and (topk_row, "probe acc. %") not in best
    assert (kl_row, "sparsemax probe %") not in best
    # both probes are tabled whichever one the verdict judges
    assert shown.loc[kl_row, "probe acc. %"] == "94.00"
    assert shown.loc[kl_row, "sparsemax probe %"] == "96.00"
    assert shown.loc[kl_row, "probe classes"] == "1.50"
    last = shown.iloc[-1]
    assert last["model"] == "raw input" and last["probe acc. %"] == "92.60"
    assert last["sparsemax probe %"] == "91.00" and last["probe classes"] == "1.70"
    lines = render.findings(s, judged, "mnist")
    assert any(line.startswith("Best sparsemax-probe accuracy: L0 ≤ 20: kl") for line in lines)
    sweep = spec.load_sweep(write_yaml(tmp_path / "s.yaml", {**TINY, "probe_loss": "sparsemax"}))
    assert sweep.probe_loss == "sparsemax"
    assert spec.load_sweep(write_yaml(tmp_path / "t.yaml", TINY)).probe_loss == "softmax"
    md = render.comparison_markdown(sweep, r, {"mnist": raw}, 9, 9)
    assert "Best sparsemax-probe accuracy" in md and "| 91.00 |" in md


def test_related_links_exist_or_are_left_out(tmp_path):
    sweeps = tmp_path / "sweeps"
    here = sweeps / "mnist"
    (sweeps / "fashion-mnist").mkdir(parents=True)
    (sweeps / "fashion-mnist" / "comparison.html").write_text("x")
    (sweeps / "wide").mkdir()
    (sweeps / "wide" / "comparison.html").write_text("x")  # another preset on the same dataset
    (sweeps / "empty").mkdir()  # no page: no link
    (tmp_path / "figures" / "gallery").mkdir(parents=True)
    (tmp_path / "figures" / "gallery" / "README.md").write_text("x")  # raw text: not linked
    (tmp_path / "figures" / "gallery" / "index.html").write_text("x")
    frame = aggregate.results_frame([
        {"dataset": "mnist", "model": "l1", "param": "lambda", "value": 0.01, "seed": 0,
         "run": "runs/mnist/l1/lambda0.01/seed0"},
        {"dataset": "mnist", "model": "l1", "param": "lambda", "value": 0.01, "seed": 1,
         "run": "runs/mnist/l1/lambda0.01/seed1"}])
    (here / frame.loc[0, "run"]).mkdir(parents=True)
    (here / frame.loc[0, "run"] / "report.html").write_text("x")
    links = render.related_links(here, ["mnist"], frame)
    assert links["pages"] == [("fashion-mnist comparison", "../fashion-mnist/comparison.html"),
                              ("wide comparison", "../wide/comparison.html"),
                              ("figure gallery", "../../figures/gallery/index.html")]
    assert links["runs"] == {"mnist": [("l1 λ = 0.01 seed 0",
                                        "runs/mnist/l1/lambda0.01/seed0/report.html")]}
    assert links["unbuilt"] == [] and render.build_note(links) is None
    (here / frame.loc[1, "run"]).mkdir(parents=True)  # a sweep run: no report until asked for
    links = render.related_links(here, ["mnist"], frame)
    assert links["unbuilt"] == [(here / frame.loc[1, "run"]).as_posix()]
    assert f"python -m sae.report {links['unbuilt'][0]}" in render.build_note(links)
    # a published copy beside the gallery, without runs/
    published = tmp_path / "figures" / "compare" / "mnist"
    published.mkdir(parents=True)
    links = render.related_links(published, ["mnist"], frame)
    assert links == {"pages": [("figure gallery", "../../gallery/index.html")], "runs": {},
                     "unbuilt": []}
    (tmp_path / "figures" / "gallery" / "index.html").unlink()  # a README alone is no page
    assert render.related_links(published, ["mnist"], frame)["pages"] == []


def test_publish_page_renders_without_runs(tmp_path):
    sweep = spec.load_sweep(write_yaml(tmp_path / "s.yaml", TINY))
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    render.write_outputs(out, sweep, spec.plan(sweep), {})
    pub = tmp_path / "pub"
    pub.mkdir()
    written = render.publish_page(out, sweep, spec.plan(sweep), pub)
    assert [p.name for p in written] == ["comparison.md", "comparison.html"]
    assert "0 of 2 runs finished" in (pub / "comparison.md").read_text()
    assert "runs/" not in (pub / "comparison.html").read_text()


def test_publishing_a_page_adds_it_to_the_see_also_line_of_the_pages_published_before(
        tmp_path, monkeypatch):
    from sae.pages import html as pages

    monkeypatch.setattr(pages, "timestamp", lambda: "2026-01-01 00:00 UTC")
    sweep = spec.load_sweep(write_yaml(tmp_path / "s.yaml", TINY))
    runs = spec.plan(sweep)
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "sweep.yaml").write_text(sweep.text)
    render.write_outputs(out, sweep, runs, {})
    compare_dir = tmp_path / "figures" / "compare"
    first, second, third = (compare_dir / n for n in ("first", "second", "third"))
    compare.publish(out, first, sweep, runs)
    assert "See also" not in (first / "comparison.md").read_text()  # alone: nothing to link
    assert "See also" not in (first / "comparison.html").read_text()
    mine = compare_dir / "notes"  # not a publication: never touched
    mine.mkdir()
    (mine / "comparison.md").write_text("See also: mine\n\n")
    (mine / "comparison.html").write_text("x")
    compare.publish(out, second, sweep, runs)
    compare.publish(out, third, sweep, runs)
    for page in (first, second, third):
        md, html = ((page / n).read_text() for n in ("comparison.md", "comparison.html"))
        others = [p.name for p in (first, second, third, mine) if p != page]
        for name in others:
            assert f"[{name} comparison](../{name}/comparison.html)" in md
            assert f'<a href="../{name}/comparison.html">{name} comparison</a>' in html
        # at the foot of the page, so that on a phone the verdict is not below a list of links
        assert html.index("<p>See also: ") > html.rindex("<h2")
        # the line is the one a page rendered now would have, and nothing else moved
        render.publish_page(out, sweep, runs, page)
        assert (page / "comparison.md").read_text() == md
        assert (page / "comparison.html").read_text() == html
    assert (mine / "comparison.md").read_text() == "See also: mine\n\n"
    # a page that goes away leaves the lines of the others
    for name in ("comparison.md", "comparison.html"):
        (third / name).unlink()
    compare.publish(out, second, sweep, runs)
    assert "third" not in (first / "comparison.md").read_text()
    assert "third" not in (first / "comparison.html").read_text()
