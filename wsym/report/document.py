"""A self-contained HTML document: headings, text, tables and embedded figures.

Figures are matplotlib figures stored as base64 PNG ``data:`` URIs, so the file
opens anywhere, offline, with nothing beside it. Every figure is an ``<img>``
with a ``data-figure`` attribute, which the browser check counts.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from typing import Any

from wsym.report.browser import COUNT_SCRIPT

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 980px; margin: 2em auto; color: #222;
       line-height: 1.45; padding: 0 1em; }
h1 { border-bottom: 2px solid #345; padding-bottom: .2em; }
h2 { margin-top: 2em; color: #234; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccd; padding: .3em .6em; text-align: left; }
th { background: #eef1f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; } img { max-width: 100%; }
figcaption { font-size: .9em; color: #555; }
.note { color: #555; font-size: .92em; }
"""


class Document:
    """An HTML report built section by section.

    Example:
        >>> doc = Document("demo")
        >>> doc.heading("Numbers")
        >>> doc.table(["a", "b"], [[1, 0.5]])
        >>> '<td class="num">0.5</td>' in doc.render()
        True
    """

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.figures = 0

    def heading(self, text: str, level: int = 2) -> None:
        """Add a heading."""
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def paragraph(self, text: str, note: bool = False) -> None:
        """Add a paragraph of plain text (escaped)."""
        cls = ' class="note"' if note else ""
        self.parts.append(f"<p{cls}>{html.escape(text)}</p>")

    def code(self, text: str) -> None:
        """Add preformatted text."""
        self.parts.append(f"<pre>{html.escape(text)}</pre>")

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Add a table; numbers are right-aligned and printed with 4 significant digits."""
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
        body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
        self.parts.append(f"<table><tr>{head}</tr>{body}</table>")

    def figure(self, fig: Any, caption: str) -> None:
        """Embed a matplotlib figure as a PNG and close it."""
        import matplotlib.pyplot as plt

        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        self.figures += 1
        self.parts.append(
            f'<figure><img data-figure="{self.figures}" alt="{html.escape(caption)}" '
            f'src="data:image/png;base64,{data}"><figcaption>{html.escape(caption)}'
            "</figcaption></figure>"
        )

    def render(self) -> str:
        """The whole document as one HTML string."""
        title = html.escape(self.title)
        return (
            f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{_STYLE}</style></head><body><h1>{title}</h1>"
            + "\n".join(self.parts)
            + COUNT_SCRIPT
            + "</body></html>\n"
        )


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f'<td class="num">{value:.4g}</td>'
    if isinstance(value, int) and not isinstance(value, bool):
        return f'<td class="num">{value}</td>'
    return f"<td>{html.escape(str(value))}</td>"
