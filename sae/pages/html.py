"""The one HTML renderer of the project's pages: a run's ``report.html`` and a sweep's
``comparison.html``.

A page is self-contained: the CSS (:data:`PAGE_CSS`) is inline and images are inline PNG
``data:`` URIs (:func:`inline_png`), with no scripts and no external references, so it opens
anywhere, offline, and can be mailed or archived alone. It works on a phone: every table scrolls
sideways inside its own box rather than widening the page (or, where every column matters,
becomes a list of its rows on a narrow screen: :func:`table`'s ``stack``), and a tap on a
figure opens it at full size (a CSS-only toggle, :func:`figure`; tap again to close). Figures
are embedded in full colour: as palette PNGs only where that is lossless (:func:`palette_png`:
at most 256 colours, which roughly halves a flat figure's weight), otherwise as they came (RGB),
so a colour bar or an image keeps every shade. This module owns that encoding; it knows nothing
of how figures are drawn. :func:`render_page` owns the skeleton (title, subtitle, introduction,
a navigation bar, one ``<h2>`` section per :class:`Section` and a footer); :func:`table`,
:func:`figure`, :func:`missing`, :func:`code_block` and :func:`fragment` build the pieces that
go into a section.

Why jinja2 rather than f-strings: with ``autoescape`` on, every value placed in a page is
escaped unless it is a :class:`markupsafe.Markup` fragment built here, so text read from run
folders and sweep files (a config value such as ``<script>``) cannot inject markup, and no
caller escapes by hand. :func:`fragment` uses the same rule for small pieces
(``Markup.format`` escapes its arguments). jinja2 (with markupsafe) is already installed with
PyTorch, so it adds no new package to the environment.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

import jinja2
from markupsafe import Markup

__all__ = ["PAGE_CSS", "Section", "code_block", "figure", "fragment", "image_link",
           "inline_code", "inline_png", "join", "link", "missing", "palette_png", "render_page",
           "table", "timestamp"]

PAGE_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222;
       max-width: 1180px; margin: 2rem auto; padding: 0 1.2rem; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.25rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; margin-top: 2rem; }
h3 { font-size: 1.05rem; margin-bottom: 0.3rem; }
.sub { color: #666; margin-top: 0; }
body { overflow-wrap: anywhere; }
nav a { margin-right: 1rem; color: #2a5db0; }
a { color: #2a5db0; }
.scroll { overflow: auto; max-width: 100%; max-height: 85vh; margin: 0.6rem 0;
          /* shadows at an edge with more table beyond it: a wide table shows it scrolls */
          background: linear-gradient(to right, #fff 30%, rgba(255,255,255,0)),
                      linear-gradient(to left, #fff 30%, rgba(255,255,255,0)) 100% 0,
                      radial-gradient(farthest-side at 0 50%, rgba(0,0,0,.18), transparent),
                      radial-gradient(farthest-side at 100% 50%, rgba(0,0,0,.18), transparent)
                      100% 0;
          background-repeat: no-repeat; background-size: 40px 100%, 40px 100%, 12px 100%,
                                                         12px 100%;
          background-attachment: local, local, scroll, scroll; }
.scroll table { margin: 0; border-collapse: separate; border-spacing: 0; }
/* the header row and the first column (the model) stay in view while the table scrolls in its
   box, either way */
.scroll th { position: sticky; top: 0; z-index: 2; }
.scroll td:first-child, .scroll th:first-child { position: sticky; left: 0; z-index: 1;
                                                 background: #fff; }
.scroll th:first-child { z-index: 3; background: #f4f4f4; }
.scroll td.best:first-child { background: #e6f2e6; }
/* a table's further columns, hidden until its "more columns" summary is opened */
details.cols { margin: 0.4rem 0 0 0; }
details.cols summary { cursor: pointer; color: #2a5db0; }
details.cols:not([open]) + .scroll .more { display: none; }
/* a table with many columns takes the window's width where that is wider than the text's */
.scroll.wide { width: calc(100vw - 3rem); max-width: none;
               margin-left: calc(50% - 50vw + 1.5rem); }
.pm { display: block; color: #777; font-size: 0.85em; }
details.note { margin: 0.4rem 0 0.8rem 0; }
details.note summary { cursor: pointer; color: #2a5db0; }
details.note p { color: #444; font-size: 0.92rem; }
table { border-collapse: collapse; margin: 0.6rem 0; font-size: 0.92rem; overflow-wrap: normal; }
th, td { text-align: left; padding: 0.25rem 0.5rem; border-bottom: 1px solid #e6e6e6;
         vertical-align: top; }
th { background: #f4f4f4; }
td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
td.key { white-space: nowrap; }
td.note { color: #666; min-width: 14rem; }
td.best { font-weight: 700; background: #e6f2e6; }
/* a stacked table, on a narrow screen: each row a block, each cell a line under its column's
   name, so that no column hides behind a sideways scroll */
@media (max-width: 40rem) {
  table.stack, table.stack tbody, table.stack tr, table.stack td { display: block; }
  table.stack tr.head { display: none; }
  table.stack tr { border-bottom: 1px solid #ccc; padding: 0.3rem 0; }
  table.stack td { border: 0; padding: 0.05rem 0.3rem; white-space: normal; min-width: 0; }
  table.stack td::before { content: attr(data-label) ": "; color: #666; font-weight: 400; }
  table.stack td:first-child { font-weight: 600; position: static; }
  table.stack .pm { display: inline; }
}
figure { margin: 0.6rem 0 1.6rem 0; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
.zoom { display: block; cursor: zoom-in; }
.zoom input { display: none; }
.zoom input:checked + span { position: fixed; inset: 0; z-index: 10; overflow: auto;
                             background: #fff; cursor: zoom-out; }
.zoom input:checked + span img { max-width: none; }
pre { overflow-x: auto; }
figcaption { color: #555; font-size: 0.9rem; }
.missing { background: #fff6e5; border-left: 4px solid #f0a020; padding: 0.5rem 0.8rem; }
code { background: #f4f4f4; padding: 0 0.2rem; }
"""

# the one template environment of every page: autoescaped, a missing value an error; file
# templates (the feature browser's) are found in their package
ENV = jinja2.Environment(loader=jinja2.PackageLoader("sae.pages", "features/templates"),
                         autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                         lstrip_blocks=True, keep_trailing_newline=True)

_PAGE = ENV.from_string("""\
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>{{ css }}</style>
</head>
<body>
<h1>{{ heading }}</h1>
<p class="sub">{{ subtitle }}</p>
{% for text in intro %}
<p>{{ text }}</p>
{% endfor %}
{% for summary, text in notes %}
<details class="note"><summary>{{ summary }}</summary><p>{{ text }}</p></details>
{% endfor %}
<nav>{% for s in sections %}<a href="#{{ s.anchor }}">{{ s.nav or s.heading }}</a>{% endfor %}\
</nav>
{% for s in sections %}
<h2 id="{{ s.anchor }}">{{ s.heading }}</h2>
{{ s.body }}
{% endfor %}
{% for text in footer %}
<p>{{ text }}</p>
{% endfor %}
</body>
</html>
""")

_TABLE = ENV.from_string(
    '{% if more %}<details class="cols"><summary>{{ more|length }} more columns: '
    "{{ more|join(', ') }}</summary></details>{% endif %}"
    '<div class="scroll{% if wide %} wide{% endif %}">'
    '<table{% if stack %} class="stack"{% endif %}>'
    '<tr class="head">{% for h in head %}<th{% if loop.index0 >= shown %} class="more"'
    "{% endif %}>{{ h }}</th>{% endfor %}</tr>"
    "{% for row in rows %}<tr>{% for cls, text, spread in row %}"
    '<td{% if cls %} class="{{ cls }}"{% endif %}'
    '{% if stack %} data-label="{{ head[loop.index0] }}"{% endif %}>{{ text }}'
    '{% if spread %} <span class="pm">{{ spread }}</span>{% endif %}</td>'
    "{% endfor %}</tr>{% endfor %}</table></div>")


@dataclass(frozen=True)
class Section:
    """One ``<h2>`` part of a page, linked from the navigation bar.

    ``body`` is text (escaped) or a fragment built by this module; ``nav`` is the link's label
    when it should be shorter than the heading.
    """

    anchor: str
    heading: str
    body: str | Markup
    nav: str | None = None


def render_page(title: str, heading: str, subtitle: str, sections: Sequence[Section],
                intro: Iterable[str | Markup] = (),
                notes: Iterable[tuple[str, str | Markup]] = (),
                footer: Iterable[str | Markup] = ()) -> str:
    """The complete HTML text of a page.

    Args:
        title: the browser tab's title.
        heading: the ``<h1>``.
        subtitle: one grey line under the heading (what, when).
        sections: the page's parts, in order; each also gets a link in the navigation bar.
        intro: paragraphs between the subtitle and the navigation bar.
        notes: (summary, text) pairs after the intro, each folded under its one-line summary
            until opened: reference text (definitions) a reader opens when needed.
        footer: paragraphs after the last section: links elsewhere (other pages), which
            would push the page's own content down a phone's screen if they came first.

    Text of ``intro``, ``notes`` and ``footer`` may be written as Markdown's `code spans`
    (the same sentence serves a comparison.md): they are shown as ``<code>``
    (:func:`inline_code`).
    """
    return _PAGE.render(title=title, heading=heading, subtitle=subtitle,
                        intro=[inline_code(t) for t in intro],
                        notes=[(s, inline_code(t)) for s, t in notes], sections=list(sections),
                        footer=[inline_code(t) for t in footer],
                        css=Markup(PAGE_CSS))


def fragment(template: str, *args: object, **kwargs: object) -> Markup:
    """``template`` (trusted markup written in the code) with its ``{}`` fields filled by
    ``args`` / ``kwargs``, each escaped unless it is itself a fragment."""
    return Markup(template).format(*args, **kwargs)


def join(parts: Iterable[str | Markup]) -> Markup:
    """Fragments (and escaped text) one after the other."""
    return Markup("").join(parts)


def table(head: Sequence[object], rows: Iterable[Sequence[object]],
          cell_class: Callable[[int, str], str | None] | None = None,
          best: Collection[tuple[int, int]] = (), wide: bool | int = False,
          stack: bool = False) -> Markup:
    """An HTML ``<table>``: a header row, then one row per item of ``rows``, in a box that
    scrolls sideways when the table is wider than the page (a phone).

    Cells are shown as ``str(value)``, escaped; a "mean ± std" cell shows its "± std" on a
    second, smaller line, so that a table of many such columns fits a page's width (its text
    is unchanged: the line break is styling). ``cell_class(column, text)`` gives a cell its CSS
    class (``"num"`` for numbers, ``"key"`` for a setting kept on one line, ``"note"`` for
    grey notes) or None; the cells ``(row,
    column)`` of ``best`` (positions counted from 0, header excluded) are also marked ``best``
    (bold, shaded). A ``wide`` table's box spans the window rather than the text column (less
    scrolling for a table of many columns on a large screen); ``wide`` a number n: only its first
    n columns show (put the main ones first) until the reader opens the summary above it that
    names the others (a ``<details>``: no script). In every table the header row and the first
    column stay in view while the table scrolls inside its box (sticky cells; the box is at most
    85 % of the window high, so a long table scrolls there too). A ``stack`` table is a table on a
    wide screen and, on a narrow one (a phone), a list of its rows, each cell a line under its
    column's name: every column stays in view, none behind a sideways scroll.
    """
    marked = set(best)
    head = [str(h) for h in head]
    # a bool is an int: True and False show every column
    shown = len(head) if isinstance(wide, bool) or wide >= len(head) else max(int(wide), 1)

    def cells(r: int, row: Sequence[object]) -> list[tuple[str | None, str]]:
        out = []
        for i, text in enumerate(str(v) for v in row):
            classes = [cell_class(i, text) if cell_class else None,
                       "best" if (r, i) in marked else None, "more" if i >= shown else None]
            mean, sep, spread = text.partition(" ± ")
            out.append((" ".join(c for c in classes if c) or None,
                        mean if sep else text, sep.strip() + " " + spread if sep else None))
        return out

    return Markup(_TABLE.render(head=head, rows=[cells(r, row) for r, row in enumerate(rows)],
                                wide=bool(wide), stack=stack, shown=shown, more=head[shown:]))


def inline_png(png: bytes, alt: str) -> Markup:
    """An ``<img>`` whose source is the PNG itself, as a base64 ``data:`` URI."""
    data = base64.b64encode(png).decode("ascii")
    return fragment('<img src="data:image/png;base64,{}" alt="{}">', data, alt)


def figure(png: bytes, alt: str, caption: str | Markup) -> Markup:
    """An inline PNG with its caption; a tap (click) shows it at full size, another closes it.

    The toggle is a hidden checkbox in the image's label, so it needs no script and the image is
    embedded once. The PNG is embedded as a palette PNG where that is lossless
    (:func:`palette_png`).
    """
    return fragment('<figure><label class="zoom" title="tap: full size"><input type="checkbox">'
                    "<span>{}</span></label><figcaption>{}</figcaption></figure>",
                    inline_png(palette_png(png), alt), caption)


def image_link(href: str, alt: str) -> Markup:
    """An image read from a file beside the page (not embedded), captioned with its name and
    linked to the file itself, for pages that show many figures (a gallery)."""
    link(href, alt)  # the same rule: a relative path only
    return fragment('<figure><a href="{0}"><img src="{0}" alt="{1}" loading="lazy"></a>'
                    "<figcaption>{1}</figcaption></figure>", href, alt)


def palette_png(png: bytes, colours: int = 256) -> bytes:
    """``png`` re-encoded as a palette PNG when that is lossless and smaller, else unchanged.

    Lossless means: no transparency and at most ``colours`` distinct colours, so every pixel
    keeps its exact RGB value. Figures of flat colours and a few anti-aliased edges often
    qualify, and one byte per pixel instead of three or four halves the weight of a page that
    embeds a dozen of them as base64. A figure with more colours (a colour bar, a heatmap, an
    image) is kept as it came: quantising it would band its gradients. Bytes that are not a
    readable PNG come back unchanged too.
    """
    from PIL import Image, UnidentifiedImageError  # only when a figure is embedded

    try:
        with Image.open(io.BytesIO(png)) as image:
            image.load()
            if image.mode == "P" or image.format != "PNG":
                return png
            rgba = image.convert("RGBA")
    except (OSError, ValueError, UnidentifiedImageError, Image.DecompressionBombError):
        return png
    if rgba.getextrema()[3][0] != 255:  # transparency: keep the original
        return png
    rgb = rgba.convert("RGB")
    found = rgb.getcolors(maxcolors=colours)
    if found is None:  # more colours than a palette holds: lossy, keep RGB
        return png
    palette = Image.new("P", (1, 1))
    flat = [channel for _, colour in found for channel in colour]
    palette.putpalette(flat + [0] * (768 - len(flat)))
    exact = rgb.quantize(palette=palette, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    exact.save(buf, format="PNG", optimize=False, compress_level=9)
    out = buf.getvalue()
    return out if len(out) < len(png) else png


def link(href: str, text: str) -> Markup:
    """A link to a file beside the page (a relative path, never an external address)."""
    if "://" in href or href.startswith(("//", "/")):
        raise ValueError(f"pages link only to files beside them: {href}")
    return fragment('<a href="{}">{}</a>', href, text)


def missing(text: str) -> Markup:
    """A highlighted note saying what a page cannot show yet, and why."""
    return fragment('<p class="missing">{}</p>', text)


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def inline_code(text: str | Markup) -> Markup:
    """``text`` as written in Markdown with its `code spans` shown as ``<code>``: the one rule
    for text that serves both a comparison.md and an HTML page, so no backtick reaches a reader
    of the page. Everything else is escaped; a fragment comes back unchanged."""
    if isinstance(text, Markup):
        return text
    parts = _CODE_SPAN.split(text)  # text, code, text, code, ..., text
    return join(fragment("<code>{}</code>", part) if i % 2 else part
                for i, part in enumerate(parts))


def code_block(text: str) -> Markup:
    """Text shown as written (a config or sweep file)."""
    return fragment("<pre><code>{}</code></pre>", text)


def timestamp() -> str:
    """Now, in UTC, as pages state when they were generated: '2026-11-29 10:15 UTC'."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
