"""The `dgps` command line: check, show (any stage), compile, verify.

Every spec problem is printed as a located error and exits 1; no input makes it print a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .dsl.errors import SpecError


def _load(path: str):  # noqa: ANN202 - returns dgps.Recurrence
    from .runtime.api import load

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(path)
    return load(p.read_text(), filename=str(path))


def cmd_check(args: argparse.Namespace) -> int:
    status = 0
    for path in args.specs:
        try:
            rec = _load(path)
        except SpecError as e:
            print(e.render(), file=sys.stderr)
            status = 1
            continue
        except (OSError, UnicodeDecodeError, ValueError) as e:
            print(f"{path}: error: cannot read spec: {e}", file=sys.stderr)
            status = 1
            continue
        if not args.quiet:
            print(f"{path}: ok ({rec.name})")
    return status


def cmd_show(args: argparse.Namespace) -> int:
    rec = _load(args.spec)
    if args.stage == "plan":
        from .compiler.plan import build_plan, format_plan, plan_to_dot

        plan = build_plan(rec.ir)
        print(plan_to_dot(plan) if args.format == "dot" else format_plan(plan))
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
    """Triton reads TRITON_INTERPRET when it is imported: decide before any kernel module loads."""
    import os

    import torch

    if torch.cuda.is_available():
        return "cuda"
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return "cpu"


def cmd_compile(args: argparse.Namespace) -> int:
    from .runtime.compile import write_package

    rec = _load(args.spec)
    written = write_package(rec, args.output)
    for path in written:
        print(path)
    if args.report:
        from .codegen.report import aot_report, format_report

        print(format_report(aot_report(rec, dims=tuple(args.report_dims))))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    import torch

    device = _use_interpreter_without_gpu()
    from .runtime.compile import compile as compile_spec
    from .runtime.verify import format_rows, verify

    rec = _load(args.spec)
    package = compile_spec(rec)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    print(f"{rec.name}: forward={package.METADATA['forward']} B={args.B} T={args.T} H={args.H} HV={args.HV or args.H} "
          f"dk={args.dk} dv={args.dv} dtype={args.dtype} device={device}"
          f"{' (TRITON_INTERPRET=1)' if device == 'cpu' else ''}")
    rows = verify(rec, package, B=args.B, T=args.T, H=args.H, dk=args.dk, dv=args.dv, HV=args.HV, dtype=dtype,
                  seed=args.seed, varlen=args.varlen, device=device)
    print(format_rows(rows))
    bad = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "check": cmd_check, "show": cmd_show, "compile": cmd_compile, "verify": cmd_verify,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dgps", description="Compile linear-attention recurrences from DGPS specs.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="parse and check spec files; located errors, exit 1 on any")
    c.add_argument("specs", nargs="+")
    c.add_argument("-q", "--quiet", action="store_true")
    s = sub.add_parser("show", help="print one pipeline stage of a spec")
    s.add_argument("spec")
    s.add_argument("--stage", default="ir", choices=["ast", "ir", "plan", "source"])
    s.add_argument("--format", default="text", choices=["text", "dot"], help="plan only: text or Graphviz dot")
    c = sub.add_parser("compile", help="write an importable Python package for a spec")
    c.add_argument("spec")
    c.add_argument("-o", "--output", required=True, help="package directory to write")
    c.add_argument("--report", action="store_true", help="compile every kernel for Hopper (sm_90) and list "
                   "registers, shared memory and spills")
    c.add_argument("--report-dims", type=int, nargs="+", default=[64, 128], metavar="D")
    v = sub.add_parser("verify", help="compile and check the kernels against the derived reference")
    v.add_argument("spec")
    v.add_argument("--B", type=int, default=2)
    v.add_argument("--T", type=int, default=45)
    v.add_argument("--H", type=int, default=2)
    v.add_argument("--HV", type=int, default=None)
    v.add_argument("--dk", type=int, default=32)
    v.add_argument("--dv", type=int, default=32)
    v.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--varlen", action="store_true", help="pack the batch into one sequence with cu_seqlens")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except SpecError as e:
        print(e.render(), file=sys.stderr)
        return 1
    except (OSError, UnicodeDecodeError) as e:
        print(f"dgps: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
