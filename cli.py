"""The `dgps` command line: check, show (any stage), compile, verify, report, fuzz, tune.

Every spec problem is printed as a located error and exits 1; no input makes it print a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .dsl.errors import SpecError


class CannotRead(Exception):
    """A spec file that cannot be read as text: one line, `path[:line:col]: error: ...`."""


def _read(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise CannotRead(f"{path}: error: no such file")
    if not p.is_file():
        raise CannotRead(f"{path}: error: not a file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise CannotRead(f"{path}: error: cannot read: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = len(data[data.rfind(b"\n", 0, e.start) + 1: e.start].decode("utf-8")) + 1  # in characters
        raise CannotRead(
            f"{path}:{line}:{col}: error: not a UTF-8 text file (byte 0x{data[e.start]:02x}); a spec is UTF-8 text"
        ) from None


def _load(path: str):  # noqa: ANN202 - returns dgps.Recurrence
    from .compiler.lower import lower
    from .dsl.parser import parse
    from .runtime.api import Recurrence

    # parse + lower rather than dgps.load(text): load() takes a one-line text ending in `.dgps` for a path.
    tree = parse(_read(path), filename=str(path))
    return Recurrence(tree, lower(tree))


def _check(path: str):  # noqa: ANN202 - returns the IR
    """parse + check + lower, without the runtime (no torch): `dgps check` stays light."""
    from .compiler.lower import lower
    from .dsl.parser import parse

    return lower(parse(_read(path), filename=str(path)))


def cmd_check(args: argparse.Namespace) -> int:
    status = 0
    for path in args.specs:
        try:
            rec = _check(path)
        except SpecError as e:
            print(e.render(), file=sys.stderr)
            status = 1
            continue
        except CannotRead as e:
            print(e, file=sys.stderr)
            status = 1
            continue
        if not args.quiet:
            print(f"{path}: ok ({rec.name})")
    return status


def cmd_show(args: argparse.Namespace) -> int:
    rec = _load(args.spec)
    if getattr(args, "cp", False):
        if args.stage != "plan" or args.format == "dot":
            print("dgps show: --cp goes with --stage plan (text)", file=sys.stderr)
            return 2
        from .runtime.cp import cp_plan

        rc = cmd_show(argparse.Namespace(**{**vars(args), "cp": False}))
        print(cp_plan(rec.ir, stages=True).format())
        return rc
    if args.stage == "plan":
        from .codegen.chunk import launch_table, supports_chunk
        from .compiler.plan import build_plan, format_plan, plan_to_dot

        chunk_ok, why = supports_chunk(rec.ir)
        if not chunk_ok:  # the package never runs a chunk plan: say what it runs instead of printing one
            note = f"{rec.name}: the package runs the recurrent kernels (forward, decode and backward): {why}"
            quoted = note.replace("\\", "\\\\").replace('"', '\\"')
            print(f'digraph plan {{\n  label="{quoted}";\n}}' if args.format == "dot" else note)
            return 0
        plan = build_plan(rec.ir)
        print(plan_to_dot(plan) if args.format == "dot" else format_plan(plan))
        if args.format != "dot":
            print(launch_table(rec.ir))
    elif args.stage == "source":
        from .codegen.package import render_package

        files = render_package(rec)
        for name in sorted(files):
            if name.endswith(".py"):
                print(f"# ===== {name} =====\n{files[name]}")
    else:
        print(rec.show(args.stage))
    return 0


def _use_interpreter_without_gpu() -> str:
    """The device the kernels run on; importing the runtime selects Triton's interpreter without a GPU (it must
    happen before any kernel module loads)."""
    import torch

    from . import runtime  # noqa: F401

    return "cuda" if torch.cuda.is_available() else "cpu"


def cmd_compile(args: argparse.Namespace) -> int:
    from .runtime.compile import write_package

    rec = _load(args.spec)
    written = write_package(rec, args.output, cached=True)  # from the package cache when it holds the spec
    for path in written:
        print(path)
    if args.report:
        from .runtime.report import aot_report, format_report

        print(f"compiling every kernel for sm_90 at dk = dv = {', '.join(map(str, args.report_dims))} "
              "(tens of seconds) ...", file=sys.stderr, flush=True)
        print(format_report(aot_report(rec, dims=tuple(args.report_dims))))
    return 0


def _progress_lines() -> Callable[[str], None]:
    """A progress callback: one line per step on stderr, with the seconds since it was made (under the
    interpreter, and in the sm_90 compile, each step takes seconds)."""
    start = time.time()

    def progress(what: str) -> None:
        print(f"  [{time.time() - start:5.1f} s] {what} ...", file=sys.stderr, flush=True)

    return progress


def cmd_verify(args: argparse.Namespace) -> int:
    import torch

    device = _use_interpreter_without_gpu()
    from .runtime.compile import compile as compile_spec
    from .runtime.verify import format_rows, verify, verify_gradients

    rec = _load(args.spec)
    package = compile_spec(rec)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    print(f"{rec.name}: forward={package.METADATA['forward']} B={args.B} T={args.T} H={args.H} HV={args.HV or args.H} "
          f"dk={args.dk} dv={args.dv} dtype={args.dtype} device={device}"
          f"{' (TRITON_INTERPRET=1)' if device == 'cpu' else ''}")
    progress = _progress_lines()
    rows = verify(rec, package, B=args.B, T=args.T, H=args.H, dk=args.dk, dv=args.dv, HV=args.HV, dtype=dtype,
                  seed=args.seed, varlen=args.varlen, device=device, progress=progress)
    if not args.no_backward:
        rows += verify_gradients(rec, package, B=args.B, T=args.T, H=args.H, dk=args.dk, dv=args.dv, HV=args.HV,
                                 seed=args.seed, device=device, progress=progress)
    print(format_rows(rows))
    bad = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


def cmd_report(args: argparse.Namespace) -> int:
    device = _use_interpreter_without_gpu()
    from .runtime.html_report import VerifySizes, collect, failures, write_report

    rec = _load(args.spec)
    print(f"{rec.name}: compile report to {Path(args.output) / 'index.html'} (device={device}"
          f"{', TRITON_INTERPRET=1' if device == 'cpu' else ''})", file=sys.stderr, flush=True)
    sizes = None if args.no_verify else VerifySizes(args.B, args.T, args.H, args.HV, args.dk, args.dv)
    content = collect(rec, args.spec, kernel_dims=None if args.no_kernels else tuple(args.dims), verify_sizes=sizes,
                      time_shape=tuple(args.time_shape), time_dims=tuple(args.dims), progress=_progress_lines())
    path = write_report(content, args.output)
    print(path)
    bad = failures(content)
    if bad:  # the page is written either way; the status says whether everything on it passed
        print(f"{rec.name}: {'; '.join(bad)} (see the page)", file=sys.stderr)
        return 1
    return 0


def cmd_fuzz(args: argparse.Namespace) -> int:
    device = _use_interpreter_without_gpu()
    from .runtime.fuzz import fuzz

    result = fuzz(args.count, args.seed, args.out, device=device, T=args.T)
    if result.failure_error:
        print(f"FAILED after {result.count} specs (seed {args.seed}); minimal failing spec:", file=sys.stderr)
        print(result.failure_text or "(no spec: the failure was outside the kernels)", file=sys.stderr)
        print(result.failure_error, file=sys.stderr)
        if result.failure_path:
            print(f"written to {result.failure_path}; to repeat it: {result.repeat}", file=sys.stderr)
        return 1
    print(f"{result.count} specs passed (seed {args.seed})")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    device = _use_interpreter_without_gpu()
    from .runtime.autotune import TuneError, tune
    from .runtime.compile import compile as compile_spec

    rec = _load(args.spec)
    package = compile_spec(rec)
    configs = [tuple(c) for c in args.configs] if args.configs else None
    if device == "cpu":
        print(f"{rec.name}: no GPU: tuning under the Triton interpreter times the interpreter, not a GPU "
              "(what it records applies to CPU runs only)", file=sys.stderr)
    try:
        path, _ = tune(package, (args.B, args.T, args.H, args.dk, args.dv), HV=args.HV,
                    dtype={"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[args.dtype], device=device,
                    stages=args.stages, configs=configs, log=lambda s: print(s, flush=True))
    except TuneError as e:
        print(f"dgps tune: error: {e}", file=sys.stderr)
        return 1
    print(f"recorded in {path}")
    return 0


def _launch_setting(text: str) -> tuple[int, int, int, int]:
    """BK,BV,warps,stages: a one-line usage error otherwise."""
    try:
        cfg = tuple(int(v) for v in text.split(","))
    except ValueError:
        cfg = ()
    if len(cfg) != 4 or min(cfg) < 1:
        raise argparse.ArgumentTypeError(f"expected BK,BV,warps,stages (four positive integers), got {text!r}")
    return cfg  # type: ignore[return-value]


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "check": cmd_check, "show": cmd_show, "compile": cmd_compile, "verify": cmd_verify, "report": cmd_report,
    "fuzz": cmd_fuzz, "tune": cmd_tune,
}


def _count(text: str) -> int:
    """A positive integer argument (sizes, counts): a one-line usage error otherwise."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """--help lists every option's default: once (an option whose help already says it keeps its own words), and not
    for required options or those without one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.help and ("(default:" in action.help or action.required or action.default is None):
            return action.help
        return super()._get_help_string(action)


def _shape_arguments(p: argparse.ArgumentParser, defaults: tuple[int, int, int, int, int], what: str = "") -> None:
    """--B --T --H --HV --dk --dv (`defaults`: B, T, H, dk, dv; HV defaults to H)."""
    B, T, H, dk, dv = defaults
    p.add_argument("--B", type=_count, default=B, help=f"{what}batch size")
    p.add_argument("--T", type=_count, default=T, help=f"{what}tokens per sequence")
    p.add_argument("--H", type=_count, default=H, help=f"{what}key heads")
    p.add_argument("--HV", type=_count, default=None, help=f"{what}value heads, a multiple of H (default: H)")
    p.add_argument("--dk", type=_count, default=dk, help=f"{what}key head size")
    p.add_argument("--dv", type=_count, default=dv, help=f"{what}value head size")


def build_parser() -> argparse.ArgumentParser:
    from ._version import __version__

    p = argparse.ArgumentParser(prog="dgps", description="Compile linear-attention recurrences from DGPS specs.",
                                formatter_class=_Help)
    p.add_argument("--version", action="version", version=f"dgps {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="parse and check spec files; located errors, exit 1 on any",
                       formatter_class=_Help)
    c.add_argument("specs", nargs="+")
    c.add_argument("-q", "--quiet", action="store_true")
    s = sub.add_parser("show", help="print one pipeline stage of a spec", formatter_class=_Help)
    s.add_argument("spec")
    s.add_argument("--stage", default="ir", choices=["ast", "ir", "plan", "source"])
    s.add_argument("--format", default="text", choices=["text", "dot"], help="plan only: text or Graphviz dot")
    s.add_argument("--cp", action="store_true", help="plan only: also what context parallelism adds (the state chains, "
                   "the exchanges, the calls per slice) or why it is refused")
    c = sub.add_parser("compile", help="write an importable Python package for a spec", formatter_class=_Help)
    c.add_argument("spec")
    c.add_argument("-o", "--output", required=True, help="package directory to write")
    c.add_argument("--report", action="store_true", help="compile every kernel for Hopper (sm_90) and list "
                   "registers, shared memory and spills")
    c.add_argument("--report-dims", type=_count, nargs="+", default=[64, 128], metavar="D")
    v = sub.add_parser("verify", help="compile and check the kernels against the derived reference",
                       formatter_class=_Help)
    v.add_argument("spec")
    _shape_arguments(v, (2, 45, 2, 32, 32))
    v.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="input dtype")
    v.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    v.add_argument("--varlen", action="store_true", help="pack the batch into one sequence with cu_seqlens")
    v.add_argument("--no-backward", action="store_true", help="skip the gradient check (fp32, vs float64 autograd)")
    r = sub.add_parser("report", help="write an HTML page: the plan drawn, sm_90 registers / spills / shared memory, "
                       "the verify table and (with a GPU) timings", formatter_class=_Help)
    r.add_argument("spec")
    r.add_argument("-o", "--output", required=True, metavar="DIR", help="directory to write index.html into")
    r.add_argument("--dims", type=_count, nargs="+", default=[64, 128], metavar="D",
                   help="head sizes dk = dv of the sm_90 kernel report and of the GPU timings")
    r.add_argument("--no-kernels", action="store_true", help="skip the sm_90 compile of every kernel (tens of seconds)")
    r.add_argument("--no-verify", action="store_true", help="skip the verify run (the interpreter takes seconds)")
    _shape_arguments(r, (2, 45, 2, 32, 32), "verify: ")
    r.add_argument("--time-shape", type=_count, nargs=3, default=[4, 4096, 16], metavar=("B", "T", "H"),
                   help="GPU only: batch, tokens and key heads of the timings (bf16)")
    f = sub.add_parser("fuzz", help="draw random specs, compile each and check its kernels against its reference",
                       formatter_class=_Help)
    f.add_argument("--count", type=_count, default=50, help="specs to draw")
    f.add_argument("--seed", type=int, default=0, help="seed of the spec draw")
    f.add_argument("--T", type=_count, default=20, help="tokens per sequence")
    f.add_argument("--out", default=".", metavar="DIR",
                   help="directory where a minimal failing spec is written (fuzz-failure-<id>.dgps)")
    t = sub.add_parser("tune", help="sweep each chunk stage's launch settings on this GPU, check every candidate's "
                       "results against the table's, record the fastest (used by later calls; DGPS_TUNED=0 ignores)",
                       formatter_class=_Help)
    t.add_argument("spec")
    _shape_arguments(t, (4, 4096, 16, 128, 128))
    t.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="input dtype")
    t.add_argument("--stages", nargs="+", default=None, metavar="STAGE", help="only these stages (default: every "
                   "stage the package launches at this shape; `dgps show --stage plan` lists them)")
    t.add_argument("--configs", nargs="+", type=_launch_setting, default=None, metavar="BK,BV,WARPS,STAGES",
                   help="only these candidates, for every stage swept (default: codegen/launch.py's per stage)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("verify", "report", "tune") and args.HV is not None and args.HV % args.H:
        parser.error(f"argument --HV: must be a multiple of --H = {args.H}, got {args.HV}")
    if args.command in ("show", "compile", "verify", "report", "tune") and Path(args.spec).is_dir():
        parser.error(f"argument spec: {args.spec!r} is a directory; pass a spec file")
    if args.command == "report" and (Path(args.output).suffix == ".dgps" or Path(args.output).is_file()):
        parser.error(f"argument -o/--output: names a directory for index.html, got {args.output!r}")
    if args.command == "fuzz" and (Path(args.out).suffix == ".dgps" or Path(args.out).is_file()):
        parser.error(f"argument --out: names a directory for failing specs, got {args.out!r}")
    try:
        return COMMANDS[args.command](args)
    except SpecError as e:
        print(e.render(), file=sys.stderr)
        return 1
    except CannotRead as e:
        print(e, file=sys.stderr)
        return 1
    except OSError as e:  # e.g. a closed stdout
        print(f"dgps: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
