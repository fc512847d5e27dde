"""The `dgps` command line: check, show (any stage), and later compile/verify/fuzz.

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
    print(rec.show(args.stage))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"check": cmd_check, "show": cmd_show}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dgps", description="Compile linear-attention recurrences from DGPS specs.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="parse and check spec files; located errors, exit 1 on any")
    c.add_argument("specs", nargs="+")
    c.add_argument("-q", "--quiet", action="store_true")
    s = sub.add_parser("show", help="print one pipeline stage of a spec")
    s.add_argument("spec")
    s.add_argument("--stage", default="ir", choices=["ast", "ir"])
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
