"""The `minicomp` command: explain a script, show the options, manage the kernel cache."""

import argparse
import importlib
import os
import shutil
import sys
from collections.abc import Sequence

from minicomp import config


def _kernel_dir(args: argparse.Namespace) -> str:
    cache_dir = args.cache_dir if args.cache_dir is not None else config.get("cache_dir")
    return os.path.join(os.path.expanduser(cache_dir), "kernels")


def _scan(kernel_dir: str) -> tuple[int, int]:
    """Count compiled libraries and total bytes under the kernel cache directory."""
    libraries = total = 0
    for root, _dirs, files in os.walk(kernel_dir):
        for file in files:
            try:
                total += os.path.getsize(os.path.join(root, file))
            except OSError:
                continue  # removed by a concurrent clean-up
            if file.endswith(".so"):
                libraries += 1
    return libraries, total


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _cmd_cache_stats(args: argparse.Namespace) -> int:
    kernel_dir = _kernel_dir(args)
    libraries, total = _scan(kernel_dir)
    print(f"kernel cache: {kernel_dir}")
    print(f"libraries: {libraries}")
    print(f"size: {_human(total)} ({total} bytes)")
    return 0


def _cmd_cache_clear(args: argparse.Namespace) -> int:
    kernel_dir = _kernel_dir(args)
    libraries, total = _scan(kernel_dir)
    shutil.rmtree(kernel_dir, ignore_errors=True)
    print(f"removed {libraries} libraries ({_human(total)}) from {kernel_dir}")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    print(config.describe(markdown=args.markdown), end="")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    # Imported lazily: explaining pulls in torch and the whole compiler.
    explain_file = getattr(importlib.import_module("minicomp"), "explain_file", None)
    if explain_file is None:
        raise NotImplementedError(
            "`minicomp explain` is not available yet: minicomp.explain_file is missing"
        )
    report = explain_file(args.script, list(args.script_args))
    if report is not None:
        print(report)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minicomp", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    explain = commands.add_parser("explain", help="show what minicomp does to a script's models")
    explain.add_argument("script", metavar="SCRIPT.py")
    explain.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS")
    explain.set_defaults(func=_cmd_explain)

    show = commands.add_parser("config", help="list every option, its default and env variable")
    show.add_argument("--markdown", action="store_true", help="print a Markdown table")
    show.set_defaults(func=_cmd_config)

    cache = commands.add_parser("cache", help="inspect or clear the compiled-kernel cache")
    cache.add_argument(
        "--cache-dir", default=None, help="cache root (default: the cache_dir option)"
    )
    cache_commands = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    stats = cache_commands.add_parser("stats", help="count the cached libraries and their size")
    stats.set_defaults(func=_cmd_cache_stats)
    clear = cache_commands.add_parser("clear", help="delete every cached library")
    clear.set_defaults(func=_cmd_cache_clear)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `minicomp` command with ``argv`` (default: ``sys.argv[1:]``); return its status."""
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except NotImplementedError as err:
        print(f"minicomp: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
