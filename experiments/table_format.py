"""A small table model (blocks of rows of cells) and its Markdown and LaTeX renderings.

Numbers stay numbers until rendering, so the best value of each column can be marked (bold)
within each block, as in the paper's tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

MISSING = "–"


@dataclass
class Cell:
    """A mean ± std over test sets, a plain number, or text (σ's, costs, labels)."""

    mean: float | None = None
    std: float | None = None
    text: str | None = None
    bold: bool = False

    def render(self, digits: int) -> str:
        if self.text is not None:
            return self.text
        if self.mean is None:
            return MISSING
        value = f"{self.mean:.{digits}f}"
        return value if self.std is None else f"{value} ± {self.std:.{digits}f}"


@dataclass
class Row:
    label: str
    cells: list[Cell]
    shaded: bool = False  # the paper's default configuration, shaded in LaTeX


@dataclass
class Block:
    rows: list[Row]
    title: str | None = None  # a group label: a model size, "Sampled sequences N (B=3)"


@dataclass
class Table:
    name: str
    caption: str
    header: list[str]  # the row-label column first
    blocks: list[Block] = field(default_factory=list)
    best: Literal["max", "min"] | None = "max"
    digits: int = 3
    notes: list[str] = field(default_factory=list)  # shown under the Markdown table

    def mark_best(self) -> Table:
        """Bold the best mean of each column within each block (ties all bold)."""
        if self.best is None:
            return self
        pick = max if self.best == "max" else min
        for block in self.blocks:
            for col in range(len(self.header) - 1):
                cells = [row.cells[col] for row in block.rows if col < len(row.cells)]
                means = [
                    round(c.mean, self.digits)
                    for c in cells
                    if c.mean is not None and c.text is None
                ]
                if len(means) < 2:
                    continue
                best = pick(means)
                for cell in cells:
                    if cell.mean is not None and cell.text is None:
                        cell.bold = round(cell.mean, self.digits) == best
        return self

    def rows(self) -> list[Row]:
        return [row for block in self.blocks for row in block.rows]


def to_markdown(table: Table) -> str:
    """A GitHub Markdown table; block titles become bold separator rows."""
    width = len(table.header)
    lines = [
        f"**{table.caption}**",
        "",
        "| " + " | ".join(table.header) + " |",
        "|" + "|".join(["---"] + [":-:"] * (width - 1)) + "|",
    ]
    for block in table.blocks:
        if block.title:
            lines.append(f"| **{block.title}** |" + " |" * (width - 1))
        for row in block.rows:
            cells = [_md_cell(c, table.digits) for c in row.cells]
            lines.append("| " + " | ".join([row.label, *cells]) + " |")
    lines.extend(["", *table.notes] if table.notes else [])
    return "\n".join(lines) + "\n"


def _md_cell(cell: Cell, digits: int) -> str:
    text = cell.render(digits)
    return f"**{text}**" if cell.bold else text


def to_latex(table: Table) -> str:
    """A booktabs table (needs \\usepackage{booktabs}; shaded rows need xcolor[table])."""
    width = len(table.header)
    lines = [
        "\\begin{table}[t]",
        "\\centering",
        f"\\caption{{{_tex(table.caption)}}}",
        f"\\label{{tab:{table.name.replace('_', '-')}}}",
        "\\footnotesize",
        "\\begin{tabular}{l" + "c" * (width - 1) + "}",
        "\\toprule",
        " & ".join(_tex(h) for h in table.header) + " \\\\",
        "\\midrule",
    ]
    for index, block in enumerate(table.blocks):
        if index:
            lines.append("\\midrule")
        if block.title:
            lines.append(f"\\multicolumn{{{width}}}{{l}}{{\\textit{{{_tex(block.title)}}}}} \\\\")
        for row in block.rows:
            cells = [_tex_cell(c, table.digits) for c in row.cells]
            prefix = "\\rowcolor{gray!12}\n" if row.shaded else ""
            lines.append(prefix + " & ".join([_tex(row.label), *cells]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(lines) + "\n"


def _tex_cell(cell: Cell, digits: int) -> str:
    if cell.text is not None:
        return _tex(cell.text)
    if cell.mean is None:
        return "--"
    text = f"{cell.mean:.{digits}f}"
    if cell.std is not None:
        text += f" $\\pm$ {cell.std:.{digits}f}"
    return f"\\textbf{{{text}}}" if cell.bold else text


_TEX_ESCAPES = {
    "_": "\\_",
    "%": "\\%",
    "&": "\\&",
    "#": "\\#",
    "±": "$\\pm$",
    "λ": "$\\lambda$",
    "σ": "$\\sigma$",
    "≈": "${\\approx}$",
    "×": "$\\times$",
    "–": "--",
    "Φ": "$\\Phi$",
}


def _tex(text: str) -> str:
    return "".join(_TEX_ESCAPES.get(ch, ch) for ch in text)
