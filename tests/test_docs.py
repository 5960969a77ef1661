"""The documentation site builds without a warning (mkdocs --strict: every page in the navigation,
every anchor it links, every docstring of the API reference parsed)."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (pip install -e '.[docs]')")
def test_the_site_builds_strictly(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    pages = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
    assert {"models", "metrics", "results", "api", "running"} <= pages
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert "partial_spearman" in api and "match_features" in api
    # sae.train's settings, from the typed settings, under the names users call
    assert "--val-size" in api and "lambda_" in api and "RunConfig" in api
    assert ">sae.load<" in api.replace(" ", "").replace("\n", "")
    # a page per published comparison, its verdict first, every figure and file it links served
    site = tmp_path / "site"
    for folder in sorted((REPO / "figures" / "compare").glob("*/comparison.md")):
        name = folder.parent.name
        page = (site / "results" / name / "index.html").read_text(encoding="utf-8")
        assert page.index("verdict") < page.index("headline"), name
        linked = re.findall(r'(?:src|href)="([^"#]+\.(?:png|csv|yaml|html))"', page)
        assert any(link.endswith("results.csv") for link in linked), name
        for link in linked:
            if not link.startswith(("http", "/")):
                assert (site / "results" / name / link).resolve().is_file(), (name, link)
    results = (site / "results" / "index.html").read_text(encoding="utf-8")
    assert not [h for h in re.findall(r'href="([^"]*)"', results) if "figures/compare" in h], \
        "the results page links the site's own pages of the comparisons"
