"""The compile report: one self-contained HTML page per spec (`dgps report SPEC -o DIR`).

The page shows, for a person to look at: the chunk plan drawn as an inline SVG (a box per stage in launch
order, arrows for the buffers between stages, each box with its stage's name, kind, output shapes and
dtypes), the backward plan drawn the same way with what it keeps from the forward and what it recomputes
(bytes per token), the sm_90 registers / spills / shared memory of every kernel (`runtime.report.aot_report`),
the verify table (`runtime.verify`), and, on a machine with a GPU, timings per kernel.

Rendering is pure: `render_page(ReportContent)` turns collected results into text, so it is tested without
compiling anything. `collect` runs the slow parts (the sm_90 compile, the verify run, the timings) and
`write_report` writes DIR/index.html. No external resources and no JavaScript: the page is one file that
renders the same offline, in CI's headless Chromium, and attached to an issue.
"""

from __future__ import annotations

import html
import statistics
import textwrap
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._version import __version__
from ..compiler.plan import (
    BackwardPlan,
    Plan,
    Stage,
    build_backward_plan,
    build_plan,
    bytes_per_token,
    format_plan,
    kept_outputs,
)
from .api import Recurrence
from .report import KernelReport
from .verify import Row

# Hopper's per-thread and per-block limits, against which the kernel table marks its numbers.
HOPPER_MAX_REGISTERS = 255
HOPPER_MAX_SHARED_BYTES = 227 * 1024
NO_GPU_LINE = "no GPU: timings not measured"


# --- what the page shows ---------------------------------------------------------------------------
@dataclass(frozen=True)
class VerifyTable:
    """The rows of a verify run (forward, decode, gradients) and the sizes it ran at, in words."""

    settings: str
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class KernelTime:
    """One kernel's CUDA time within one phase (an inference forward, or one backward), from torch.profiler."""

    phase: str
    kernel: str
    calls: int
    total_us: float


@dataclass(frozen=True)
class Timings:
    """Timings at one input shape: median wall times of whole phases (CUDA events) and the per-kernel split."""

    device_name: str
    shape: str
    phases_ms: tuple[tuple[str, float], ...]
    kernels: tuple[KernelTime, ...]


@dataclass(frozen=True)
class ReportContent:
    """Everything the page shows. None for a part that was not run (and the page says so)."""

    rec: Recurrence
    spec_label: str  # the spec's file name, as given on the command line
    metadata: Mapping[str, Any]  # the compiled package's METADATA: which forward / backward it runs, and why
    kernel_dims: tuple[int, ...]
    kernels: tuple[KernelReport, ...] | None
    verify: VerifyTable | None
    timings: tuple[Timings, ...] | None  # None: no GPU
    versions: tuple[tuple[str, str], ...] = ()


# --- the SVG drawing -------------------------------------------------------------------------------
# A monospace font at a fixed size (12 px, in CSS below) makes text widths predictable without measuring them
# (DejaVu Sans Mono's advance is 0.602 em); the layout reserves CHAR_W per character.
CHAR_W = 7.3
LINE_H = 16
TITLE_H = 20
PAD = 8
BOX_X = 16
BOX_W = 470
GAP = 46  # least vertical space between boxes: room for an arrow and a two-line label
LABEL_CHAR_W = 6.7  # edge labels are 11 px
LABEL_LINE_H = 13
LABEL_WRAP = {"straight": 34, "column": 22}  # characters per label line: beside a straight arrow, in a column
PORT_STEP = 12  # vertical distance between the ports of long arrows on a box's right edge
LEGEND_H = 30
WRAP = int((BOX_W - 2 * PAD - 8) / CHAR_W)
EDGE_COLOURS = ("#2563eb", "#c2410c", "#15803d", "#7c3aed", "#b91c1c", "#0e7490", "#a16207", "#be185d")


@dataclass(frozen=True)
class Box:
    """A box of the drawing: a stage (or the inputs / results), `style` picks its colours."""

    name: str
    kind: str  # shown after the name; "" for none
    lines: tuple[str, ...]
    style: str  # stage | fused | backward | io | rerun
    marks: tuple[str, ...] = ()  # kept | recomputed: a coloured bar on the box's left side
    tooltip: str = ""


@dataclass(frozen=True)
class Edge:
    """An arrow from box `src` to a later box `dst`, labelled with the buffers it carries."""

    src: int
    dst: int
    label: str


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, WRAP, subsequent_indent="  ", break_on_hyphens=False) or [""]


def _text_width(text: str) -> float:
    return len(text) * CHAR_W


def label_lines(label: str, width: int) -> list[str]:
    """An edge label (buffer names joined by ", ") split into lines of at most `width` characters, at the commas."""
    lines: list[str] = []
    for name in label.split(", "):
        if lines and len(lines[-1]) + 2 + len(name) <= width:
            lines[-1] += ", " + name
        else:
            if lines:
                lines[-1] += ","
            lines.append(name)
    return lines


def _label(x: float, y_mid: float, lines: Sequence[str], colour: str | None = None) -> str:
    """Label lines stacked around `y_mid`, left-aligned at `x`."""
    fill = f' fill="{colour}"' if colour else ""
    y0 = y_mid + 4 - (len(lines) - 1) * LABEL_LINE_H / 2
    return "\n".join(f'<text class="edge-label" x="{x:.0f}" y="{y0 + n * LABEL_LINE_H:.0f}"{fill}>{_esc(line)}</text>'
                     for n, line in enumerate(lines))


def _columns(long_edges: list[tuple[int, Edge]]) -> dict[int, int]:
    """Edge index -> column of its vertical segment: greedy interval partitioning, so that the segments of one
    column never overlap; nor touch: an arrow into box i and one out of it in the same column would read as one
    line passing the box."""
    column_of: dict[int, int] = {}
    column_end: list[int] = []
    for i, e in sorted(long_edges, key=lambda ie: (ie[1].src, ie[1].dst)):
        start, end = e.src, e.dst
        for c, last in enumerate(column_end):
            if last < start:
                column_of[i], column_end[c] = c, end
                break
        else:
            column_of[i] = len(column_end)
            column_end.append(end)
    return column_of


def dag_svg(boxes: Sequence[Box], edges: Sequence[Edge], *, figure_id: str, title: str,
            legend: Sequence[tuple[str, str]] = ()) -> str:
    """An SVG of boxes stacked top to bottom in the given order, arrows from earlier boxes to later ones.

    An arrow between neighbours runs straight down between them; a longer one leaves the source's right edge,
    runs down a column of its own to the right of the boxes and enters the destination's right edge, its label
    beside its vertical segment. `figure_id` prefixes the ids inside, so several SVGs can share one page."""
    for e in edges:
        if not 0 <= e.src < e.dst < len(boxes):
            raise ValueError(f"{figure_id}: an edge must point from a box to a later box, got {e.src} -> {e.dst}")
    long_edges = [(i, e) for i, e in enumerate(edges) if e.dst > e.src + 1]
    column_of = _columns(long_edges)
    outs: dict[int, list[int]] = {}
    ins: dict[int, list[int]] = {}
    for i, e in sorted(long_edges, key=lambda ie: column_of[ie[0]]):
        outs.setdefault(e.src, []).append(i)
        ins.setdefault(e.dst, []).append(i)

    wrapped = [[line for text in b.lines for line in _wrap(text)] for b in boxes]
    heights = []
    for k, lines in enumerate(wrapped):
        content = PAD + TITLE_H + LINE_H * len(lines) + PAD
        ports = 2 * PAD + PORT_STEP * (len(outs.get(k, ())) + len(ins.get(k, ())))
        heights.append(max(content, ports))
    labels = [label_lines(e.label, LABEL_WRAP["straight" if e.dst == e.src + 1 else "column"]) for e in edges]
    gaps = [GAP] * len(boxes)  # gaps[k]: below box k; a straight arrow's label may need more
    for e, lines in zip(edges, labels, strict=True):
        if e.dst == e.src + 1:
            gaps[e.src] = max(gaps[e.src], LABEL_LINE_H * len(lines) + 20)
    tops = []
    y = LEGEND_H + 12
    for h, gap in zip(heights, gaps, strict=True):
        tops.append(y)
        y += h + gap
    height = y - gaps[-1] + 16

    column_width: dict[int, float] = {}
    for i, _ in long_edges:
        c = column_of[i]
        column_width[c] = max(column_width.get(c, 0.0), max(map(len, labels[i])) * LABEL_CHAR_W + 22)
    column_x: dict[int, float] = {}
    x = BOX_X + BOX_W + 26
    for c in sorted(column_width):
        column_x[c] = x
        x += column_width[c]
    legend_width = BOX_X + sum(24 + _text_width(words) + 22 for _, words in legend)
    width = max(x + 10, BOX_X + BOX_W + 180, legend_width)

    p = figure_id
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="{_esc(p)}" class="plan" width="{width:.0f}" '
           f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{_esc(title)}">',
           f"<title>{_esc(title)}</title>", "<defs>"]
    for k, colour in enumerate(("#4b5563", *EDGE_COLOURS)):
        out.append(f'<marker id="{_esc(p)}-arrow{k}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
                   f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{colour}"/>'
                   "</marker>")
    out.append("</defs>")
    lx = BOX_X
    for style, words in legend:
        out.append(f'<rect class="box {_esc(style)}" x="{lx}" y="8" width="18" height="14" rx="3"/>')
        out.append(f'<text class="legend" x="{lx + 24}" y="19">{_esc(words)}</text>')
        lx += 24 + _text_width(words) + 22

    for k, (b, lines) in enumerate(zip(boxes, wrapped, strict=True)):
        top, h = tops[k], heights[k]
        out.append(f'<g class="stage" data-stage="{_esc(b.name)}">')
        if b.tooltip:
            out.append(f"<title>{_esc(b.tooltip)}</title>")
        out.append(f'<rect class="box {_esc(b.style)}" x="{BOX_X}" y="{top}" width="{BOX_W}" height="{h}" rx="6"/>')
        for m, mark in enumerate(b.marks):
            out.append(f'<rect class="mark {_esc(mark)}" x="{BOX_X + 1 + 5 * m}" y="{top + 1}" width="5" '
                       f'height="{h - 2}"/>')
        tx = BOX_X + PAD + 6
        kind = f'<tspan class="kind"> {_esc(b.kind)}</tspan>' if b.kind else ""
        out.append(f'<text x="{tx}" y="{top + PAD + 13}"><tspan class="name">{_esc(b.name)}</tspan>{kind}</text>')
        for n, line in enumerate(lines):
            out.append(f'<text class="line" x="{tx}" y="{top + PAD + TITLE_H + 12 + n * LINE_H}" '
                       f'xml:space="preserve">{_esc(line)}</text>')
        out.append("</g>")

    cx = BOX_X + BOX_W / 2
    right = BOX_X + BOX_W
    colour_of = {i: k % len(EDGE_COLOURS) for k, (i, _) in enumerate(long_edges)}
    for i, e in enumerate(edges):
        if e.dst == e.src + 1:  # neighbours: straight down through the gap
            y1, y2 = tops[e.src] + heights[e.src], tops[e.dst]
            out.append(f'<path class="edge" d="M{cx:.0f},{y1} V{y2 - 1}" stroke="#4b5563" '
                       f'marker-end="url(#{_esc(p)}-arrow0)"/>')
            out.append(_label(cx + 8, (y1 + y2) / 2, labels[i]))
            continue
        c = column_of[i]
        colour_index = colour_of[i]  # by arrow, not by column: arrows side by side differ
        colour = EDGE_COLOURS[colour_index]
        y1 = tops[e.src] + heights[e.src] - PAD - PORT_STEP * outs[e.src].index(i)
        y2 = tops[e.dst] + PAD + PORT_STEP * ins[e.dst].index(i)
        xc = column_x[c]
        out.append(f'<path class="edge" d="M{right},{y1} H{xc:.0f} V{y2} H{right + 1}" stroke="{colour}" '
                   f'marker-end="url(#{_esc(p)}-arrow{colour_index + 1})"/>')
        out.append(_label(xc + 5, (y1 + y2) / 2, labels[i], colour))
    out.append("</svg>")
    return "\n".join(out)


def _bind_text(st: Stage) -> str:
    pairs = st.attr("bind", ())
    if pairs:
        return ", ".join(o if r == o else f"{r}={o}" for r, o in pairs)
    return ", ".join(st.inputs)


def _launch_words(st: Stage) -> str:
    fused = st.attr("fused")
    if fused == "loads":
        return "no launch: evaluated in each consumer's tile loads"
    if fused:
        return f"runs inside the {fused} launch"
    return "own launch"


FORWARD_LEGEND = (("stage", "own launch"), ("fused", "fused into another launch"), ("kept", "kept for the backward"),
                  ("recomputed", "recomputed by the backward"), ("io", "plan inputs / results"))
BACKWARD_LEGEND = (("backward", "backward stage"), ("rerun", "forward stages rerun"),
                   ("io", "given adjoints / kept buffers / gradients"))


def forward_boxes(plan: Plan, backward: BackwardPlan | None) -> tuple[list[Box], list[Edge]]:
    """The forward plan as boxes (plan inputs, each stage in launch order, the results) and its buffers as edges."""
    stages = plan.stages()
    kept = set(backward.kept) if backward else set()
    recomputed = set(backward.recomputed) if backward else set()
    boxes = [Box("inputs", "", tuple(f"{o.name}: {o.shape} {o.dtype}" for o in plan.inputs), "io")]
    for st in stages:
        role = "kept for the backward" if st.kind in kept else "recomputed by the backward" if st.kind in recomputed \
            else ""
        lines = [_launch_words(st) + (f"; {role}" if role else ""), f"in: {_bind_text(st)}"]
        lines += [f"-> {o.name}: {o.shape} {o.dtype}" for o in st.outputs]
        for role_name, expr in st.attr("exprs", ()) or ():
            lines.append(f"{role_name} = {expr}")
        if st.attr("form"):
            lines.append(f"form: {st.attr('form')}")
        if st.attr("sequential"):
            lines.append(f"sequential over {st.attr('sequential')}")
        style = "fused" if st.attr("fused") else "stage"
        marks = ("kept",) if st.kind in kept else ("recomputed",) if st.kind in recomputed else ()
        tooltip = "; ".join(f"{k}={v}" for k, v in st.attributes if k != "bind" and v is not None)
        boxes.append(Box(st.name, st.kind if st.kind != st.name else "", tuple(lines), style, marks, tooltip))
    results = [f"{r} = {n}" for r, n in plan.outputs]
    boxes.append(Box("results", "", tuple(results), "io"))

    index = {st.name: 1 + k for k, st in enumerate(stages)}
    edges = []
    for st in stages:
        for src in sorted(plan.graph.predecessors(st), key=lambda s: index[s.name]):
            edges.append(Edge(index[src.name], index[st.name], ", ".join(plan.graph.edges[src, st]["operands"])))
    by_source: dict[int, list[str]] = {}
    for _, name in plan.outputs:
        producer = plan.producer(name)
        if producer is not None:
            by_source.setdefault(index[producer.name], []).append(name)
    edges += [Edge(src, len(boxes) - 1, ", ".join(names)) for src, names in sorted(by_source.items())]
    return boxes, edges


def forward_svg(plan: Plan, backward: BackwardPlan | None, figure_id: str = "forward-plan") -> str:
    boxes, edges = forward_boxes(plan, backward)
    return dag_svg(boxes, edges, figure_id=figure_id, title=f"forward chunk plan of {plan.name}",
                   legend=FORWARD_LEGEND)


def kept_buffers(plan: Plan, backward: BackwardPlan) -> list[tuple[Stage, int]]:
    """(forward stage, bytes per token and head of its outputs at dk = dv = 128) for each stage the backward keeps;
    the bytes sum to `backward.kept_bytes`."""
    return [(st, sum(bytes_per_token(o) for o in outs)) for st, outs in kept_outputs(plan, backward)]


def backward_boxes(plan: Plan, backward: BackwardPlan) -> tuple[list[Box], list[Edge]]:
    """The backward plan as boxes: the given adjoints, the buffers kept from the forward, the forward stages it
    reruns, its stages in launch order and the gradients; edges for adjoints, kept and recomputed buffers."""
    produced = {o.name for st in backward.stages for o in st.outputs}
    given = list(dict.fromkeys(i for st in backward.stages for i in st.inputs if i not in produced))
    kept = kept_buffers(plan, backward)
    boxes = [Box("given adjoints", "", (", ".join(given),), "io"),
             Box("kept from the forward", "",
                 (f"saved inputs: {', '.join(backward.saved)}",
                  *(f"{st.name}: {', '.join(o.name for o in outs)} ({n} B)"
                    for (st, n), (_, outs) in zip(kept, kept_outputs(plan, backward), strict=True)),
                  f"{backward.kept_bytes} B per token and head at dk = dv = 128"),
                 "io", ("kept",))]
    rerun = [st for st in plan.stages() if st.kind in backward.recomputed]
    if rerun:
        boxes.append(Box("rerun " + ", ".join(st.name for st in rerun), "",
                         tuple(f"{st.name} -> {', '.join(f'{o.name}: {o.shape}' for o in st.outputs)}" for st in rerun),
                         "rerun", ("recomputed",)))
    first = len(boxes)
    index = {st.name: first + k for k, st in enumerate(backward.stages)}
    for st in backward.stages:
        lines = [f"in: {', '.join(st.inputs)}"] + [f"-> {o.name}: {o.shape} {o.dtype}" for o in st.outputs]
        if st.attr("reads"):
            lines.append(f"reads: {', '.join(st.attr('reads'))}")
        if st.attr("form"):
            lines.append(f"form: {st.attr('form')}")
        if st.attr("sequential"):
            lines.append(f"sequential over {st.attr('sequential')}")
        boxes.append(Box(st.name, st.kind if st.kind != st.name else "", tuple(lines), "backward"))
    consumed = {i for st in backward.stages for i in st.inputs}
    finals = [(st, o) for st in backward.stages for o in st.outputs if o.name not in consumed]
    boxes.append(Box("gradients", "", tuple(f"{o.name}: {o.shape} {o.dtype}" for _, o in finals), "io"))

    edges = []
    kept_kinds, rerun_kinds = set(backward.kept), set(backward.recomputed)
    producer = {o.name: st for st in backward.stages for o in st.outputs}
    for st in backward.stages:
        dst = index[st.name]
        if names := [i for i in st.inputs if i in given]:
            edges.append(Edge(0, dst, ", ".join(names)))
        reads = st.attr("reads", ()) or ()
        if names := [r for r in reads if r.split(".")[0] in kept_kinds]:
            edges.append(Edge(1, dst, ", ".join(names)))
        if rerun and (names := [r for r in reads if r.split(".")[0] in rerun_kinds]):
            edges.append(Edge(2, dst, ", ".join(names)))
        by_source: dict[int, list[str]] = {}
        for i in st.inputs:
            if i in producer:
                by_source.setdefault(index[producer[i].name], []).append(i)
        edges += [Edge(src, dst, ", ".join(names)) for src, names in sorted(by_source.items())]
    to_gradients: dict[int, list[str]] = {}
    for st, o in finals:
        to_gradients.setdefault(index[st.name], []).append(o.name)
    edges += [Edge(src, len(boxes) - 1, ", ".join(names)) for src, names in sorted(to_gradients.items())]
    return boxes, edges


def backward_svg(plan: Plan, backward: BackwardPlan, figure_id: str = "backward-plan") -> str:
    boxes, edges = backward_boxes(plan, backward)
    return dag_svg(boxes, edges, figure_id=figure_id, title=f"chunked backward plan of {plan.name}",
                   legend=BACKWARD_LEGEND)


# --- the page --------------------------------------------------------------------------------------
CSS = """
body { font: 14px/1.45 "DejaVu Sans", Helvetica, Arial, sans-serif; color: #111827; margin: 24px 32px; }
h1 { font-size: 22px; margin: 0 0 12px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #d1d5db; }
table { border-collapse: collapse; margin: 6px 0 10px; }
th, td { border: 1px solid #d1d5db; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f4f6; } td.num { text-align: right; font-family: "DejaVu Sans Mono", monospace; }
td.code, code, pre { font-family: "DejaVu Sans Mono", monospace; font-size: 12px; }
pre { background: #f9fafb; border: 1px solid #e5e7eb; padding: 8px; overflow-x: auto; }
tr.bad td { background: #fee2e2; } td.warn { background: #fef3c7; } td.ok { color: #15803d; } td.fail { color: #b91c1c; }
p.note { color: #4b5563; } .figure { overflow-x: auto; }
svg.plan text { font-family: "DejaVu Sans Mono", monospace; font-size: 12px; fill: #111827; }
svg.plan tspan.name { font-weight: bold; font-size: 13px; } svg.plan tspan.kind { fill: #6b7280; }
svg.plan text.legend { fill: #374151; } svg.plan text.edge-label { font-size: 11px; paint-order: stroke;
  stroke: #ffffff; stroke-width: 3px; }
svg.plan path.edge { fill: none; stroke-width: 1.5; }
svg.plan rect.box { stroke-width: 1.5; }
svg.plan rect.stage { fill: #e8f0fe; stroke: #3b6fd4; }
svg.plan rect.fused { fill: #f3f4f6; stroke: #6b7280; stroke-dasharray: 5 3; }
svg.plan rect.backward { fill: #fbe9f7; stroke: #a21caf; }
svg.plan rect.rerun { fill: #fff1e6; stroke: #c2410c; stroke-dasharray: 5 3; }
svg.plan rect.io { fill: #fffbeb; stroke: #b7791f; }
svg.plan rect.kept { fill: #16a34a; stroke: #16a34a; } svg.plan rect.recomputed { fill: #ea580c; stroke: #ea580c; }
svg.plan rect.mark { stroke: none; }
"""


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], row_classes: Sequence[str] = ()) -> str:
    """An HTML table; the cells are HTML already (callers escape text with `_cell`)."""
    out = ["<table>", "<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in header) + "</tr>"]
    for k, row in enumerate(rows):
        cls = row_classes[k] if k < len(row_classes) and row_classes[k] else ""
        out.append((f'<tr class="{cls}">' if cls else "<tr>") + "".join(row) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _cell(text: object, cls: str = "") -> str:
    return (f'<td class="{cls}">' if cls else "<td>") + _esc(text) + "</td>"


def kernel_rows(reports: Sequence[KernelReport]) -> list[KernelReport]:
    """The report's rows without exact repeats (the inference and the training forward compile the same
    specialisation of a kernel), in first-seen order."""
    return list(dict.fromkeys(reports))


def kernels_section(content: ReportContent) -> str:
    head = "<h2>Kernels for sm_90 (Hopper)</h2>"
    if content.kernels is None:
        return head + '<p class="note">not compiled (--no-kernels)</p>'
    dims = ", ".join(map(str, content.kernel_dims))
    rows, classes = [], []
    for r in kernel_rows(content.kernels):
        regs_cls = "num warn" if r.registers >= HOPPER_MAX_REGISTERS else "num"
        spill_cls = "num warn" if r.spill_bytes else "num"
        shared_cls = "num warn" if r.shared_bytes > HOPPER_MAX_SHARED_BYTES else "num"
        sass = [_cell(r.sass.get(k, 0), "num") for k in ("instructions", "mma", "ffma", "shared", "barriers")]
        rows.append([_cell(r.module), _cell(r.kernel, "code"), _cell(r.dk, "num"), _cell(r.config, "code"),
                     _cell(r.registers, regs_cls), _cell(r.spill_bytes, spill_cls), _cell(r.shared_bytes, shared_cls),
                     *sass, _cell("ok" if r.ok else f"FAILED: {r.error}", "ok" if r.ok else "fail")])
        classes.append("" if r.ok else "bad")
    failed = sum(not r.ok for r in content.kernels)
    note = (f'<p class="note">Every kernel the package launches (forward, decode, backward), compiled ahead of time '
            f"for sm_90 at dk = dv = {_esc(dims)} (runtime/report.py): registers per thread and spill bytes from "
            f"cuobjdump, shared memory per block from the compile metadata, static SASS counts (each instruction once: "
            f"all, tensor-core products, fp32 FMAs, shared-memory loads/stores, barriers). Marked: registers at "
            f"Hopper's cap of {HOPPER_MAX_REGISTERS}, any spill, shared memory over {HOPPER_MAX_SHARED_BYTES // 1024} KiB. "
            f"{len(content.kernels) - failed} compiled, {failed} failed.</p>")
    return head + note + _table(["module", "kernel", "dk = dv", "config", "registers", "spill B", "shared B",
                                 "SASS", "MMA", "FFMA", "LDS/STS", "BAR", "result"], rows, classes)


def verify_section(content: ReportContent) -> str:
    head = "<h2>Verify: kernels against the float64 reference</h2>"
    if content.verify is None:
        return head + '<p class="note">not run (--no-verify)</p>'
    rows, classes = [], []
    for r in content.verify.rows:
        rows.append([_cell(r.path), _cell(r.output, "code"), _cell(f"{r.error:.3e}", "num"),
                     _cell(f"{r.tolerance:.1e}", "num"), _cell("ok" if r.ok else "FAIL", "ok" if r.ok else "fail")])
        classes.append("" if r.ok else "bad")
    bad = sum(not r.ok for r in content.verify.rows)
    note = (f'<p class="note">{_esc(content.verify.settings)}. Relative norm ‖kernel − reference‖ / ‖reference‖; '
            f"{len(content.verify.rows) - bad} passed, {bad} failed.</p>")
    return head + note + _table(["path", "output", "rel error", "tolerance", "result"], rows, classes)


def short_kernel_name(name: str, width: int = 90) -> str:
    """A profiler kernel name without C++'s return type and parameter list (torch's own kernels have long
    ones), cut to `width` characters; the page keeps the full name as the cell's tooltip."""
    name = name.removeprefix("void ")
    if name.endswith(")") and "(" in name:
        depth = 0
        for i in range(len(name) - 1, -1, -1):  # the parameter list: the last balanced (...)
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    return name if len(name) <= width else name[:width - 1] + "…"


def timings_section(content: ReportContent) -> str:
    head = "<h2>Timings</h2>"
    if content.timings is None:
        return head + f'<p class="note">{_esc(NO_GPU_LINE)}</p>'
    parts = [head]
    for t in content.timings:
        parts.append(f'<p class="note">{_esc(t.device_name)}, {_esc(t.shape)}: medians of CUDA-event timings; the '
                     "kernels' split from torch.profiler over one inference forward and one backward (which reruns "
                     "the stages the backward plan recomputes).</p>")
        parts.append(_table(["phase", "median ms"], [[_cell(what), _cell(f"{ms:.3f}", "num")] for what, ms in t.phases_ms]))
        parts.append(_table(["phase", "kernel", "calls", "total µs", "µs per call"],
                            [[_cell(k.phase), f'<td class="code" title="{_esc(k.kernel)}">{_esc(short_kernel_name(k.kernel))}'
                              "</td>", _cell(k.calls, "num"),
                              _cell(f"{k.total_us:.1f}", "num"), _cell(f"{k.total_us / max(k.calls, 1):.1f}", "num")]
                             for k in t.kernels]))
    return "\n".join(parts)


def plan_section(plan: Plan, backward: BackwardPlan | None, metadata: Mapping[str, Any]) -> str:
    s = plan.structure
    parts = ["<h2>Forward plan</h2>"]
    if metadata.get("forward") == "recurrent":
        parts.append(f'<p class="note">This package runs the recurrent forward kernel '
                     f"({_esc(metadata.get('forward_reason', ''))}); the chunk plan below is what the compiler "
                     "derives, not what the package launches.</p>")
    parts.append(f'<p class="note">family {_esc(plan.family)}, decay {_esc(s.decay)}, chunk {plan.chunk_size}, '
                 f"sub-chunk {plan.sub_chunk}. Stages top to bottom in launch order; an arrow is a buffer one stage "
                 "hands to a later one.</p>")
    parts.append(f'<div class="figure">{forward_svg(plan, backward)}</div>')
    parts.append("<h2>Backward plan</h2>")
    if backward is None:
        parts.append('<p class="note">recurrent: no chunked backward for this family (the recurrent backward kernel '
                     "differentiates it).</p>")
    else:
        if metadata.get("backward") == "recurrent":
            parts.append(f'<p class="note">This package differentiates with the recurrent backward kernel '
                         f"({_esc(metadata.get('backward_reason', ''))}); the chunked backward below is the plan.</p>")
        parts.append(f'<p class="note">saves {_esc(", ".join(backward.saved))}; keeps from the forward '
                     f"{_esc(', '.join(backward.kept) or '-')} ({backward.kept_bytes} B per token and head at "
                     f"dk = dv = 128, bf16 inputs); recomputes {_esc(', '.join(backward.recomputed) or '-')}.</p>")
        parts.append(f'<div class="figure">{backward_svg(plan, backward)}</div>')
        rows = []
        kept_by_stage = {st.name: outs for st, outs in kept_outputs(plan, backward)}
        for st in plan.stages():
            if st.kind in backward.kept or st.kind in backward.recomputed:
                kept = st.kind in backward.kept
                nbytes = sum(bytes_per_token(o) for o in kept_by_stage.get(st.name, ())) if kept else 0
                rows.append([_cell(st.name, "code"), _cell(st.kind, "code"),
                             _cell("kept" if kept else "recomputed"),
                             _cell(", ".join(f"{o.name}: {o.shape} {o.dtype}" for o in st.outputs), "code"),
                             _cell(nbytes if kept else "-", "num")])
        rows.append([_cell("total kept"), _cell(""), _cell(""), _cell(""), _cell(backward.kept_bytes, "num")])
        parts.append(_table(["forward stage", "kind", "backward", "outputs", "B per token and head"], rows))
    text = format_plan(plan)
    parts.append(f"<details><summary>the plan as text (dgps show --stage plan)</summary><pre>{_esc(text)}</pre>"
                 "</details>")
    return "\n".join(parts)


def render_page(content: ReportContent) -> str:
    """The whole page: a self-contained HTML document (inline CSS and SVG; no scripts, no external resources)."""
    rec = content.rec
    plan = build_plan(rec.ir)
    backward = build_backward_plan(plan)
    meta = content.metadata
    summary = [("spec", content.spec_label), ("spec sha256 (16)", rec.spec_hash),
               ("package forward", meta.get("forward", "?") + (f" ({meta['forward_reason']})"
                                                                if meta.get("forward_reason") else "")),
               ("package backward", meta.get("backward", "?") + (f" ({meta['backward_reason']})"
                                                                  if meta.get("backward_reason") else "")),
               *content.versions]
    body = [f"<h1>dgps compile report: {_esc(rec.name)}</h1>",
            '<table class="summary">' + "".join(f"<tr><th>{_esc(k)}</th>{_cell(v, 'code')}</tr>" for k, v in summary)
            + "</table>",
            "<details><summary>spec source</summary>", f"<pre>{_esc(rec.source)}</pre>", "</details>",
            plan_section(plan, backward, meta), kernels_section(content), verify_section(content),
            timings_section(content)]
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>dgps report: {_esc(rec.name)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


# --- collecting the results (the slow parts) -------------------------------------------------------
def versions() -> tuple[tuple[str, str], ...]:
    import triton

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (TRITON_INTERPRET=1)"
    return (("dgps", __version__), ("triton", triton.__version__), ("torch", torch.__version__), ("device", device))


def _kernel_times(run: Callable[[], object], phase: str) -> list[KernelTime]:
    """CUDA time per kernel name of one call of `run`, from torch.profiler (the caller has warmed it up)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with warnings.catch_warnings():  # one profiling cycle: its "clears events at the end of each cycle" is noise
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
    out = []
    for ev in prof.key_averages():
        if ev.device_type != DeviceType.CUDA:
            continue
        total = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
        if total:
            out.append(KernelTime(phase, ev.key, int(ev.count), float(total)))
    return sorted(out, key=lambda k: -k.total_us)


def _event_ms(run: Callable[[], object]) -> float:
    """Milliseconds of one call of `run` between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def measure_timings(rec: Recurrence, package: Any, *, B: int, T: int, H: int, dims: Sequence[int],
                    repeats: int = 10) -> tuple[Timings, ...]:
    """`time_one_shape` at dk = dv = each of `dims`."""
    return tuple(time_one_shape(rec, package, B=B, T=T, H=H, d=d, repeats=repeats) for d in dims)


def time_one_shape(rec: Recurrence, package: Any, *, B: int, T: int, H: int, d: int, repeats: int = 10) -> Timings:
    """Median times of the forward (inference), a training step (forward + backward) and the backward alone on
    the GPU, bf16 inputs, after warm-up steps (Triton compiles and autotunes on the first); and the per-kernel
    split of one inference forward and of one backward."""
    x = rec.random_inputs(B, T, H, d, d, dtype=torch.bfloat16, seed=0, device="cuda")
    xg = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}

    def inference() -> None:
        with torch.no_grad():
            package.forward(**x, output_final_state=True)

    def training_forward() -> torch.Tensor:
        return package.forward(**xg, output_final_state=True).o

    do = torch.randn_like(training_forward())

    def step() -> None:
        training_forward().backward(do)

    for _ in range(3):
        inference()
        step()
    forward_ms = statistics.median(_event_ms(inference) for _ in range(repeats))
    step_ms = statistics.median(_event_ms(step) for _ in range(repeats))
    backward_ms = []
    for _ in range(repeats):  # the backward alone: its forward runs before the timed region
        o = training_forward()
        backward_ms.append(_event_ms(lambda o=o: o.backward(do)))
    kernels = _kernel_times(inference, "forward")
    o = training_forward()
    kernels += _kernel_times(lambda: o.backward(do), "backward")
    return Timings(torch.cuda.get_device_name(), f"B={B} T={T} H={H} dk=dv={d} bf16",
                   (("forward (inference)", forward_ms), ("forward + backward (training step)", step_ms),
                    ("backward", statistics.median(backward_ms))), tuple(kernels))


@dataclass(frozen=True)
class VerifySizes:
    B: int = 2
    T: int = 45
    H: int = 2
    HV: int | None = None
    dk: int = 32
    dv: int = 32


def collect(rec: Recurrence, spec_label: str, *, kernel_dims: Sequence[int] | None = (64, 128),
            verify_sizes: VerifySizes | None = VerifySizes(), time_shape: tuple[int, int, int] = (4, 4096, 16),
            time_dims: Sequence[int] = (64, 128), progress: Callable[[str], None] = lambda _: None) -> ReportContent:
    """Compile the package and run what the page shows: the sm_90 report at dk = dv = each of `kernel_dims`
    (None: skipped), the verify run at `verify_sizes` (None: skipped) and, with a GPU, timings at B, T, H =
    `time_shape` and dk = dv = each of `time_dims`."""
    from .compile import compile as compile_spec
    from .report import aot_report
    from .verify import verify, verify_gradients

    device = "cuda" if torch.cuda.is_available() else "cpu"
    progress("compiling the package")
    package = compile_spec(rec)
    kernels = None
    if kernel_dims is not None:
        progress(f"compiling every kernel for sm_90 at dk = dv = {', '.join(map(str, kernel_dims))} (tens of seconds)")
        kernels = tuple(aot_report(rec, dims=tuple(kernel_dims)))
    table = None
    if verify_sizes is not None:
        v = verify_sizes
        rows = verify(rec, package, B=v.B, T=v.T, H=v.H, HV=v.HV, dk=v.dk, dv=v.dv, dtype=torch.float32, device=device,
                      progress=progress)
        rows += verify_gradients(rec, package, B=v.B, T=v.T, H=v.H, HV=v.HV, dk=v.dk, dv=v.dv, device=device,
                                 progress=progress)
        settings = (f"B={v.B} T={v.T} H={v.H} HV={v.HV or v.H} dk={v.dk} dv={v.dv} fp32 inputs on {device}"
                    + (" (TRITON_INTERPRET=1)" if device == "cpu" else ""))
        table = VerifyTable(settings, tuple(rows))
    timings = None
    if device == "cuda":
        B, T, H = time_shape
        progress(f"timings at B={B} T={T} H={H}, dk = dv = {', '.join(map(str, time_dims))}")
        timings = measure_timings(rec, package, B=B, T=T, H=H, dims=time_dims)
    return ReportContent(rec, spec_label, dict(package.METADATA), tuple(kernel_dims or ()), kernels, table, timings,
                         versions())


def write_report(content: ReportContent, out_dir: str | Path) -> Path:
    """Write the page to OUT_DIR/index.html (the folder is created) and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    path.write_text(render_page(content), encoding="utf-8")
    return path


def failures(content: ReportContent) -> list[str]:
    """One phrase per failed part (verify rows, kernels that did not compile); empty when all passed."""
    out = []
    if content.verify is not None and (bad := sum(not r.ok for r in content.verify.rows)):
        out.append(f"{bad} verify row{'s' * (bad != 1)} failed")
    if content.kernels is not None and (bad := sum(not r.ok for r in content.kernels)):
        out.append(f"{bad} kernel{'s' * (bad != 1)} failed to compile for sm_90")
    return out
