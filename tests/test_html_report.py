"""The compile report page (`dgps report SPEC -o DIR`, runtime/html_report.py).

The picture names every stage of the forward and the backward plan, the page is well-formed HTML with SVG
that parses as XML, every text is escaped, the CLI writes a page with the sm_90 kernel table and the verify
table, and the page renders in headless Chromium (a screenshot that is not blank, and the rendered DOM names
every stage inside the <svg>). Without Chromium the browser test skips, unless DGPS_REQUIRE_BROWSER=1 (CI).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch

import dgps
from dgps.compiler.plan import build_backward_plan, build_plan
from dgps.runtime.html_report import (
    NO_GPU_LINE,
    Box,
    Edge,
    KernelTime,
    ReportContent,
    Timings,
    VerifyTable,
    _columns,
    backward_boxes,
    collect,
    dag_svg,
    failures,
    forward_boxes,
    kept_buffers,
    label_lines,
    render_page,
    short_kernel_name,
    write_report,
)
from dgps.runtime.report import KernelReport
from dgps.runtime.verify import Row

ROOT = Path(__file__).resolve().parents[1]
DRAWN = ("gdn", "kda", "pgdn", "ccq_gdn", "simple_gla", "rwkv7_dplr", "exact_atq", "exact_atk")
NO_CHUNK_BACKWARD = ("dplr_scalar_decay",)  # tests/: no chunk form, so no backward plan (every spec in specs/ has one)
STAGE_FILL = (232, 240, 254)  # svg.plan rect.stage's fill in the page's CSS: a drawn stage box
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "wbr", "source", "track", "param", "embed"}


# --- helpers --------------------------------------------------------------------------------------
class _PageParser(HTMLParser):
    """Checks that every element is closed in order, and collects the text nodes inside each <svg>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.errors: list[str] = []
        self.svg_texts: list[list[str]] = []
        self.svg_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "svg":
            if self.svg_depth == 0:
                self.svg_texts.append([])
            self.svg_depth += 1
        if tag not in VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        pass  # <path .../> inside the SVG: opened and closed

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.open[-1] if self.open else '-'}> at {self.getpos()}")
            return
        self.open.pop()
        if tag == "svg":
            self.svg_depth -= 1

    def handle_data(self, data: str) -> None:
        if self.svg_depth and data.strip():
            self.svg_texts[-1].append(data.strip())


def parse_page(page: str) -> _PageParser:
    p = _PageParser()
    p.feed(page)
    p.close()
    assert not p.errors, p.errors[:5]
    assert p.open == [], f"unclosed elements: {p.open}"
    return p


def svg_elements(page: str) -> list[ET.Element]:
    """Each inline <svg> of the page parsed as XML (SVG is XML: a stray `&` or `<` would not parse)."""
    out, start = [], 0
    while (a := page.find("<svg", start)) >= 0:
        b = page.index("</svg>", a) + len("</svg>")
        out.append(ET.fromstring(page[a:b]))
        start = b
    return out


def plain_page(name: str) -> tuple[dgps.Recurrence, str]:
    """The page of specs/NAME.dgps (or tests/NAME.dgps) without the slow parts (no sm_90 compile, no verify run)."""
    where = "specs" if (ROOT / "specs" / f"{name}.dgps").exists() else "tests"
    rec = dgps.load(ROOT / where / f"{name}.dgps")
    return rec, render_page(collect(rec, f"{where}/{name}.dgps", kernel_dims=None, verify_sizes=None))


def dgps_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dgps.cli", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def read_png(data: bytes) -> np.ndarray:
    """Pixels [height, width, channels] of an 8-bit, non-interlaced PNG (what Chromium writes); pure Python and
    numpy, so the test needs no imaging library."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + n
    assert header is not None, "no IHDR chunk"
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and interlace == 0 and colour in (0, 2, 4, 6), header
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    rows = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(height, 1 + width * bpp)
    pixels = np.zeros((height, width * bpp), np.uint8)
    prev = np.zeros(width * bpp, np.uint8)
    for r in range(height):
        kind, line = int(rows[r, 0]), rows[r, 1:]
        if kind == 0:
            cur = line.copy()
        elif kind == 1:  # Sub: a running sum along the row, per channel
            cur = (np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.int64) % 256).astype(np.uint8).reshape(-1)
        elif kind == 2:  # Up
            cur = line + prev
        else:  # Average, Paeth: each byte depends on the one reconstructed before it
            out, up = bytearray(line.tobytes()), prev.tobytes()
            for i in range(len(out)):
                a = out[i - bpp] if i >= bpp else 0
                b = up[i]
                if kind == 3:
                    out[i] = (out[i] + ((a + b) >> 1)) & 255
                    continue
                c = up[i - bpp] if i >= bpp else 0
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                out[i] = (out[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            cur = np.frombuffer(bytes(out), np.uint8)
        pixels[r] = cur
        prev = cur
    return pixels.reshape(height, width, bpp)


# --- the picture ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", DRAWN)
def test_picture_names_every_stage(name: str) -> None:
    rec, page = plain_page(name)
    plan = build_plan(rec.ir)
    bp = build_backward_plan(plan)
    assert bp is not None
    forward, backward = parse_page(page).svg_texts
    for st in plan.stages():
        assert st.name in forward, f"{st.name} not drawn"  # the name is a text node of its own (a tspan)
        for o in st.outputs:
            assert f"-> {o.name}: {o.shape} {o.dtype}" in forward
    for st in bp.stages:
        assert st.name in backward, f"{st.name} not drawn"
    assert f"{bp.kept_bytes} B per token and head at dk = dv = 128" in backward
    for kind in bp.recomputed:
        assert any(t.startswith("rerun ") and s.name in t for t in backward for s in plan.find(kind))
    svgs = svg_elements(page)
    assert len(svgs) == 2
    ns = "{http://www.w3.org/2000/svg}"
    for svg, (boxes, edges) in zip(svgs, (forward_boxes(plan, bp), backward_boxes(plan, bp)), strict=True):
        assert len(svg.findall(f".//{ns}g[@class='stage']")) == len(boxes)
        assert len(svg.findall(f".//{ns}path[@class='edge']")) == len(edges)
    # every buffer between two stages is an arrow
    forward_edges = forward_boxes(plan, bp)[1]
    assert len([e for e in forward_edges if e.dst < len(plan.stages()) + 1]) == plan.graph.number_of_edges()


@pytest.mark.parametrize("name", DRAWN + NO_CHUNK_BACKWARD)
def test_page_is_well_formed(name: str) -> None:
    rec, page = plain_page(name)
    assert page.startswith("<!DOCTYPE html>")
    parsed = parse_page(page)
    assert len(svg_elements(page)) == len(parsed.svg_texts)
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert NO_GPU_LINE in page or torch.cuda.is_available()
    assert "not compiled (--no-kernels)" in page and "not run (--no-verify)" in page
    if name in NO_CHUNK_BACKWARD:
        assert len(parsed.svg_texts) == 1 and "recurrent: no chunked backward for this family" in page


@pytest.mark.parametrize("name", DRAWN)
def test_kept_bytes_add_up(name: str) -> None:
    plan = build_plan(dgps.load(ROOT / "specs" / f"{name}.dgps").ir)
    bp = build_backward_plan(plan)
    assert bp is not None
    assert sum(n for _, n in kept_buffers(plan, bp)) == bp.kept_bytes


def test_columns_of_long_arrows_never_touch() -> None:
    """Arrows that share a column of the drawing neither overlap nor meet at a box (they would read as one)."""
    edges = [Edge(0, 2, "a"), Edge(2, 5, "b"), Edge(1, 4, "c"), Edge(0, 6, "d"), Edge(5, 7, "e"), Edge(3, 6, "f")]
    column = _columns(list(enumerate(edges)))
    for i, e in enumerate(edges):
        for j, f in enumerate(edges):
            if i < j and column[i] == column[j]:
                assert e.dst < f.src or f.dst < e.src, (e, f)
    assert max(column.values()) < len(edges) - 1  # and columns are reused


def test_labels_wrap_at_commas() -> None:
    assert label_lines("dqp, dkw, dz, dke, dbeta, dg", 13) == ["dqp, dkw, dz,", "dke, dbeta,", "dg"]
    assert label_lines("a_very_long_buffer_name", 5) == ["a_very_long_buffer_name"]


def test_edges_must_point_forward() -> None:
    boxes = [Box("a", "", (), "stage"), Box("b", "", (), "stage")]
    with pytest.raises(ValueError, match="must point from a box to a later box"):
        dag_svg(boxes, [Edge(1, 0, "x")], figure_id="f", title="t")


# --- escaping and the tables ---------------------------------------------------------------------
HOSTILE = "<script>alert('x')</script> & \"quoted\""


def test_every_text_is_escaped() -> None:
    svg = dag_svg([Box(HOSTILE, "<k>", (HOSTILE,), "stage", tooltip=HOSTILE), Box("b", "", (), "io")],
                  [Edge(0, 1, HOSTILE)], figure_id="f<&>", title=HOSTILE)
    root = ET.fromstring(svg)  # parses: nothing unescaped
    texts = ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert f"{HOSTILE} <k>" in texts and HOSTILE in texts
    assert "<script>" not in svg

    base = dgps.load(ROOT / "specs" / "gdn.dgps")
    rec = dgps.load(base.source.replace("recurrence gdn", f"recurrence gdn\n# {HOSTILE}", 1), filename="<test>")
    kernels = (KernelReport("chunk", "k<1>", 64, 64, "warps=4 stages=1", 10, 0, 0, False, HOSTILE),)
    table = VerifyTable(f"sizes {HOSTILE}", (Row(HOSTILE, "o", 1e-7, 1e-5),))
    timings = (Timings(HOSTILE, "B=1", ((HOSTILE, 1.0),), (KernelTime("forward", HOSTILE, 1, 2.0),)),)
    page = render_page(ReportContent(rec, HOSTILE, {"forward": "chunk", "backward": HOSTILE}, (64,), kernels, table,
                                     timings, (("dgps", HOSTILE),)))
    parse_page(page)
    svg_elements(page)
    assert "<script>" not in page
    assert page.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;quoted&quot;") >= 7


def _content(kernels: tuple[KernelReport, ...] | None, rows: tuple[Row, ...] | None,
             timings: tuple[Timings, ...] | None) -> ReportContent:
    rec = dgps.load(ROOT / "specs" / "gdn.dgps")
    table = VerifyTable("B=1 T=8", rows) if rows is not None else None
    return ReportContent(rec, "specs/gdn.dgps", {"forward": "chunk", "backward": "chunk"}, (64,), kernels, table,
                         timings)


def test_kernel_and_verify_tables() -> None:
    kernels = (KernelReport("chunk", "chunk_output_kernel", 64, 64, "warps=4 stages=3", 129, 0, 24576, True),
               KernelReport("chunk", "chunk_output_kernel", 64, 64, "warps=4 stages=3", 129, 0, 24576, True),
               KernelReport("chunk", "chunk_bwd_grad_kernel", 64, 64, "warps=8 stages=1", 255, 152, 240000, True),
               KernelReport("chunk", "chunk_wy_kernel", 64, 64, "4", 0, 0, 0, False, "out of resources"))
    rows = (Row("forward (chunk)", "o", 1.9e-7, 1e-5), Row("backward (chunk)", "dq", 3e-4, 1e-4))
    content = _content(kernels, rows, None)
    page = render_page(content)
    parse_page(page)
    assert page.count("<td class=\"code\">chunk_output_kernel</td>") == 1  # exact repeats shown once
    assert '<td class="num warn">255</td>' in page and '<td class="num warn">152</td>' in page
    assert '<td class="num warn">240000</td>' in page
    assert "FAILED: out of resources" in page and "3 compiled, 1 failed" in page
    assert "1 passed, 1 failed" in page and '<td class="fail">FAIL</td>' in page
    assert page.count(NO_GPU_LINE) == 1
    assert failures(content) == ["1 verify row failed", "1 kernel failed to compile for sm_90"]
    assert failures(_content(kernels[:1], rows[:1], None)) == []


def test_timings_tables_when_measured() -> None:
    timings = (Timings("NVIDIA H200", "B=4 T=4096 H=16 dk=dv=128 bf16",
                       (("forward (inference)", 0.512), ("backward", 1.25)),
                       (KernelTime("forward", "chunk_output_kernel", 1, 80.5),
                        KernelTime("backward", "chunk_bwd_grad_kernel", 2, 300.0))),)
    page = render_page(_content(None, None, timings))
    parse_page(page)
    assert NO_GPU_LINE not in page
    assert "NVIDIA H200, B=4 T=4096 H=16 dk=dv=128 bf16" in page
    assert '<td class="num">0.512</td>' in page and '<td class="num">150.0</td>' in page


def test_profiler_kernel_names_are_shortened() -> None:
    fill = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
            "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
    assert short_kernel_name(fill, 200) == ("at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                                            "std::array<char*, 1ul> >")
    assert short_kernel_name(fill, 20) == "at::native::vectori…"
    assert short_kernel_name("chunk_output_kernel") == "chunk_output_kernel"


# --- the command line ----------------------------------------------------------------------------
SMALL = ("--B", "1", "--T", "8", "--H", "1", "--dk", "16", "--dv", "16", "--dims", "16")


def test_report_writes_the_full_page(tmp_path: Path) -> None:
    """Real parts: the sm_90 compile of every kernel and the verify run, at small sizes."""
    out = tmp_path / "report"
    r = dgps_cli("report", "specs/gdn.dgps", "-o", out, *SMALL)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == f"{out / 'index.html'}\n"
    steps = [line.split("] ", 1)[1] for line in r.stderr.splitlines() if line.startswith("  [")]
    assert steps[:2] == ["compiling the package ...",
                         "compiling every kernel for sm_90 at dk = dv = 16 (tens of seconds) ..."]
    assert "float64 reference ..." in steps
    page = (out / "index.html").read_text()
    parse_page(page)
    for kernel in ("chunk_l2norm_kernel", "chunk_interaction_kernel", "chunk_state_output_kernel", "chunk_state_pass_kernel",
                   "gdn_recurrent_fwd_kernel", "chunk_bwd_state_kernel", "chunk_bwd_grad_kernel"):
        assert f'<td class="code">{kernel}</td>' in page
    assert "0 failed.</p>" in page and "10 passed, 0 failed" in page
    assert (NO_GPU_LINE in page) != torch.cuda.is_available()


@pytest.mark.parametrize("args, message", [
    (["report", "specs", "-o", "x"], "argument spec: 'specs' is a directory; pass a spec file"),
    (["report", "specs/gdn.dgps", "-o", "README.md"], "argument -o/--output: names a directory for index.html, "
                                                      "got 'README.md'"),
    (["report", "specs/gdn.dgps", "-o", "specs/la.dgps"], "argument -o/--output: names a directory for index.html, "
                                                          "got 'specs/la.dgps'"),
    (["report", "specs/gdn.dgps", "-o", "x", "--dims", "0"], "argument --dims: expected a positive integer, got 0"),
    (["report", "specs/gdn.dgps", "-o", "x", "--HV", "3"], "argument --HV: must be a multiple of --H = 2, got 3"),
    (["report", "specs/gdn.dgps", "-o", "x", "--time-shape", "1", "2"], "argument --time-shape: expected 3 arguments"),
    (["report", "specs/gdn.dgps"], "the following arguments are required: -o/--output"),
])
def test_bad_arguments_are_one_line_usage_errors(args: list[str], message: str) -> None:
    r = dgps_cli(*args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.splitlines()[-1].endswith(message), r.stderr
    assert not (ROOT / "x").exists()


def test_missing_spec_is_a_located_error(tmp_path: Path) -> None:
    r = dgps_cli("report", tmp_path / "nope.dgps", "-o", tmp_path / "out", "--no-kernels", "--no-verify")
    assert r.returncode == 1 and r.stderr.splitlines() == [f"{tmp_path / 'nope.dgps'}: error: no such file"]
    assert not (tmp_path / "out").exists()


def test_write_report_creates_the_folder(tmp_path: Path) -> None:
    rec = dgps.load(ROOT / "specs" / "la.dgps")
    path = write_report(collect(rec, "la", kernel_dims=None, verify_sizes=None), tmp_path / "a" / "b")
    assert path == tmp_path / "a" / "b" / "index.html" and path.read_text().startswith("<!DOCTYPE html>")


# --- the browser ---------------------------------------------------------------------------------
def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    if os.environ.get("DGPS_REQUIRE_BROWSER") == "1":
        pytest.fail("DGPS_REQUIRE_BROWSER=1 but no Chromium on PATH (apt-get install chromium)")
    pytest.skip("needs Chromium (apt-get install chromium)")


def _headless(exe: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start; --disable-dev-shm-usage: a
    # container's small /dev/shm crashes the renderer; a profile of its own: parallel tests share no state.
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def test_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    exe = _chromium()
    out = tmp_path / "report"
    r = dgps_cli("report", "specs/simple_gla.dgps", "-o", out, *SMALL)
    assert r.returncode == 0, r.stderr[-3000:]
    url = (out / "index.html").resolve().as_uri()

    shot = tmp_path / "page.png"
    r = _headless(exe, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1400,2000", url)
    assert shot.exists(), r.stderr[-3000:]
    pixels = read_png(shot.read_bytes())
    assert pixels.shape[:2] == (2000, 1400)
    rgb = pixels[..., :3]
    not_white = np.any(rgb != 255, axis=-1).mean()
    stage_fill = np.all(rgb == np.array(STAGE_FILL, np.uint8), axis=-1).sum()
    assert not_white > 0.03, f"the screenshot is blank ({not_white:.2%} of it not white)"
    assert stage_fill > 20_000, f"no stage boxes drawn ({stage_fill} pixels of their fill)"

    r = _headless(exe, tmp_path / "profile-dom", "--dump-dom", url)
    assert r.returncode == 0, r.stderr[-3000:]
    texts = parse_page(r.stdout).svg_texts
    plan = build_plan(dgps.load(ROOT / "specs" / "simple_gla.dgps").ir)
    bp = build_backward_plan(plan)
    assert bp is not None and len(texts) == 2
    assert {st.name for st in plan.stages()} <= set(texts[0])
    assert {st.name for st in bp.stages} <= set(texts[1])
