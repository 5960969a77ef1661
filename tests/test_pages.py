"""sae.pages.html: one self-contained page skeleton; text is escaped, built fragments are not."""

import base64
import re

from sae.pages import html as pages

EVIL = '<script>alert("x")</script> & \'co\''
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16  # a signature is enough: the page does not decode it


def page_with(text: str) -> str:
    """A page that puts ``text`` in every place a page shows text."""
    body = pages.join([
        pages.table([text, "n"], [[text, 1.5]],
                    cell_class=lambda column, _: "num" if column else None),
        pages.figure(PNG, text, text),
        pages.missing(text),
        pages.code_block(text),
        pages.fragment("<p>{}</p>", text),
        text,
    ])
    return pages.render_page(title=text, heading=text, subtitle=text, intro=[text],
                             sections=[pages.Section("a", text, body, nav=text)])


def test_script_is_escaped_everywhere():
    page = page_with(EVIL)
    assert "<script" not in page.lower()
    escaped = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &#39;co&#39;"
    # title, h1, subtitle, intro, nav, h2, th, td, alt, caption, missing, code, fragment, text
    assert page.count(escaped) == 14


def test_fragments_are_kept_and_the_page_is_self_contained():
    page = page_with("plain")
    assert page.startswith("<!DOCTYPE html>")
    assert '<td>plain</td><td class="num">1.5</td>' in page
    assert '<p class="missing">plain</p>' in page and "<pre><code>plain</code></pre>" in page
    assert f'src="data:image/png;base64,{base64.b64encode(PNG).decode()}"' in page
    assert '<nav><a href="#a">plain</a></nav>' in page and '<h2 id="a">plain</h2>' in page
    assert pages.PAGE_CSS in page  # the CSS is inline and not escaped (its quotes stay)
    for needle in ("http://", "https://", "<link", "@import", "url("):
        assert needle not in page
    assert not re.search(r'href="(?!#)', page)


def test_fragment_escapes_its_arguments_but_not_other_fragments():
    inner = pages.fragment("<b>{}</b>", "<i>")
    assert pages.fragment("<p>{}{}</p>", inner, "&") == "<p><b>&lt;i&gt;</b>&amp;</p>"


def test_a_mean_and_std_cell_puts_its_std_on_a_second_line_of_the_same_text():
    html = pages.table(["FVU", "n"], [["0.1322 ± 0.0007", "3"], ["–", "± 1"]])
    assert '<td>0.1322 <span class="pm">± 0.0007</span></td><td>3</td>' in html
    assert "<td>–</td><td>± 1</td>" in html  # no mean: the text as it is
    wide = pages.table(["a"], [["1"]], wide=True)
    assert wide.startswith('<div class="scroll wide">')


def test_notes_fold_under_their_summary():
    page = pages.render_page("t", "h", "s", [], intro=["about"],
                             notes=[("What the columns mean", EVIL)])
    assert ('<details class="note"><summary>What the columns mean</summary><p>&lt;script&gt;'
            in page)
    assert page.index("<p>about</p>") < page.index("<details") < page.index("<nav>")


def test_nav_label_defaults_to_the_heading():
    page = pages.render_page("t", "h", "s", [pages.Section("x", "Long heading", "b"),
                                             pages.Section("y", "Other", "c", nav="Short")])
    assert '<a href="#x">Long heading</a><a href="#y">Short</a>' in page


def test_pages_do_not_import_figures():
    """Page helpers own their PNG encoding: importing sae.pages.html loads no plotting code."""
    import subprocess
    import sys

    code = ("import sys, sae.pages.html; "
            "print(sorted(m for m in sys.modules if m.startswith(('sae.figures', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    import ast
    import inspect

    from sae.pages import html as pages

    tree = ast.parse(inspect.getsource(pages))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.startswith("sae.figures") for m in imported)
