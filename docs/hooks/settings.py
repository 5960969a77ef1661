"""MkDocs hook: the table of ``sae.train``'s settings in the API reference, made from the typed
settings (the dataclasses of ``sae.settings.config``), so the page never lists a setting that is
not there, nor misses one.

``api.md`` holds the marker ``<!-- sae.train settings -->``; the site shows in its place one table
per section (model, training, data, ...): each keyword as ``sae.train`` takes it, its flag of
``python -m sae.run``, its default, and its help.
"""

from __future__ import annotations

MARKER = "<!-- sae.train settings -->"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(s) -> str:
    if s.type == "bool":
        return "False"
    return "—" if s.default is None else f"`{s.default!r}`"


def settings_markdown() -> str:
    """The settings of ``sae.train`` as Markdown tables, a heading per section."""
    from sae.api.train import SYNONYMS  # the keywords Python's grammar forces a synonym for
    from sae.settings.cli import SETTINGS

    also = {name: synonym for synonym, name in SYNONYMS.items()}
    groups: dict[str, list[str]] = {}
    for s in SETTINGS.values():
        keyword = f"`{s.name}`" + (f" (or `{also[s.name]}`)" if s.name in also else "")
        what = s.help + (f"; one of {', '.join(map(str, s.choices))}"
                         if s.choices and len(s.choices) <= 12 else "")
        groups.setdefault(s.group, []).append(
            f"| {keyword} | `{s.flag}` | {_cell(_default(s))} | {_cell(what)} |")
    parts = []
    for group, rows in groups.items():
        parts.append(f"**{group[:1].upper() + group[1:]}**\n\n| keyword | flag | default | "
                     "what |\n|---|---|---|---|\n" + "\n".join(rows))
    return "\n\n".join(parts)


def on_page_markdown(markdown: str, page, config, files):
    if MARKER in markdown:
        return markdown.replace(MARKER, settings_markdown())
    return markdown
