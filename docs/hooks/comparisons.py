"""MkDocs hook: one site page per published comparison, made from its folder under figures/compare/.

Each folder holds what ``python -m sae.compare --publish`` wrote: ``comparison.md`` (the verdict
first, then the headline and every configuration), the figures, ``results.csv`` and the
``sweep.yaml`` it ran. The site shows ``comparison.md`` as the page ``results/<name>/``, the
figures under it, and links the CSV, the sweep file and the self-contained HTML page, so that a
published number is one click from the file it recomputes from.

The Markdown sources link the published files where they lie in the repository
(``../figures/compare/<name>/comparison.md``, ``../experiments/<name>.yaml``), which is what a
reader of the repository follows; the site rewrites those links to its own pages.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # mkdocs run from the repository without it on the path
    sys.path.insert(0, str(ROOT))

from sae.sweep.folds import fold_markdown  # noqa: E402 (the repository's, found above)

COMPARE = ROOT / "figures" / "compare"
GALLERY = ROOT / "figures" / "gallery"  # python -m sae.gallery's figures and their page
FILES = ("results.csv", "sweep.yaml", "comparison.html")  # linked from each page, as published
REPO_LINK = re.compile(r"\]\(\.\./(figures/compare/([\w.-]+)/([\w.-]+)|experiments/([\w.-]+)\.yaml"
                       r"|figures/gallery/([\w.-]+))(#[^)]*)?\)")


def published() -> list[str]:
    """The published comparisons, by folder name."""
    return sorted(p.parent.name for p in COMPARE.glob("*/comparison.md"))


def on_config(config):
    """The Results section of the navigation: the overview, then every published comparison."""
    pages = [{"Overview": "results.md"}] + [{name: f"results/{name}.md"} for name in published()]
    for i, entry in enumerate(config.nav):
        if isinstance(entry, dict) and entry.get("Results") == "results.md":
            config.nav[i] = {"Results": pages}
    return config


def page_markdown(name: str) -> str:
    """``comparison.md`` of one folder, its links made the site's, its figures and files added."""
    folder = COMPARE / name
    # pages published before the definitions were folded below the verdict are folded here
    text = fold_markdown(folder.joinpath("comparison.md").read_text(encoding="utf-8"))
    text = re.sub(r"\]\(\.\./([\w.-]+)/comparison\.html\)", r"](\1.md)", text)
    text = text.replace("](../../gallery/index.html)", "](../gallery.md)")
    files = " · ".join(f"[{f}]({name}/{f})" for f in FILES if (folder / f).is_file())
    figures = "".join(f"\n\n![{png.stem}]({name}/{png.name})"
                      for png in sorted(folder.glob("*.png")))
    return (f"{text.rstrip()}\n\n## Files and figures\n\nPublished with this page: {files}."
            f"{figures}\n")


NO_FAVICON = '<link rel="icon" href="data:,">'  # an empty icon, inline: nothing to fetch


def served(config, uri: str, path: Path) -> File:
    """A published file as the site serves it. A published HTML page (self-contained: it links
    nothing) gets an empty inline icon, so that a browser asks the site for no favicon.ico,
    which the site does not have."""
    if path.suffix != ".html":
        return File.generated(config, uri, abs_src_path=str(path))
    text = path.read_text(encoding="utf-8")
    if NO_FAVICON not in text:
        text = text.replace("<title>", f"{NO_FAVICON}\n<title>", 1)
    return File.generated(config, uri, content=text)


def on_files(files, config):
    for name in published():
        files.append(File.generated(config, f"results/{name}.md", content=page_markdown(name)))
        folder = COMPARE / name
        for path in [*sorted(folder.glob("*.png")), *(folder / f for f in FILES)]:
            if path.is_file():
                files.append(served(config, f"results/{name}/{path.name}", path))
    for path in [*sorted(GALLERY.glob("*.png")), GALLERY / "index.html"]:
        if path.is_file():  # index.html would be the folder's page: it is served as figures.html
            uri = "gallery/figures.html" if path.name == "index.html" else f"gallery/{path.name}"
            files.append(served(config, uri, path))
    return files


def on_page_markdown(markdown, page, config, files):
    """Links to a published folder's files, or to the preset a folder ran, go to the site's copy."""
    depth = page.file.src_uri.count("/")
    up = "../" * depth
    names = set(published())

    def site(match: re.Match) -> str:
        if match.group(5) is not None:  # the gallery: its page of every figure, or one figure
            shown = "figures.html" if match.group(5) in ("README.md", "index.html") \
                else match.group(5)
            return f"]({up}gallery/{shown})"
        name = match.group(2) or match.group(4)
        if name not in names:
            return match.group(0)
        anchor = match.group(6) or ""
        if match.group(4) is not None:
            return f"]({up}results/{name}/sweep.yaml)"
        target = match.group(3)
        if target in ("comparison.md", "comparison.html"):
            return f"]({up}results/{name}.md{anchor})"
        return f"]({up}results/{name}/{target}{anchor})"

    return REPO_LINK.sub(site, markdown)
