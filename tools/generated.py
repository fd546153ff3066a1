# Ref: issue 19 item 3 (one source for each fact: files generated from the tables).
"""Keeping a generated file in step with its source: write it, or check that it is current."""

import argparse
import pathlib
import sys

__all__ = ["update", "main"]


def update(path, old, new, *, check, stale):
    """Write ``new`` to ``path`` where it differs from ``old`` (the file's text, ``None`` if it
    does not exist) and return 0; with ``check``, write nothing and return 1 (after printing
    ``path: stale`` to standard error) if the file is not current."""
    if check:
        if new != old:
            print(f"{path}: {stale}", file=sys.stderr)
            return 1
        return 0
    if new != old:
        path.write_text(new)
    return 0


def main(argv, *, description, option, default, check_help, make, stale):
    """The command line of a generator: ``--check`` and the path ``option`` (``default``);
    ``make(path)`` gives the file's text now (``None`` if absent) and what it should be."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true", help=check_help)
    ap.add_argument(option, dest="path", type=pathlib.Path, default=default)
    args = ap.parse_args(argv)
    old, new = make(args.path)
    return update(args.path, old, new, check=args.check, stale=stale)
