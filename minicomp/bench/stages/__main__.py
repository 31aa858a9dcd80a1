"""The staged GPU run's command (benchmarks/gpu_run.sh calls it):

    python -m minicomp.bench.stages STAGE [--rehearse] [--budget S] [--out DIR] ...

STAGE is check, kernels, models or train (see minicomp/bench/stages/__init__.py), `all` for
the four in turn (a rehearsal, or a machine without the 10-minute limit), or `report` to write
benchmarks/results/README.md from the committed results.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

import torch

from minicomp.bench.stages import STAGES, check, kernels, models, report, train
from minicomp.bench.stages.facts import device_facts
from minicomp.bench.stages.stage import BUDGETS, MAX_FILES, Budget, Stage, device_slug
from minicomp.dynamo.backend import ensure_registered

WORK_DIR = ".gpu-run"  # cache, carried bundles and default outputs (git-ignored)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_run.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("stage", choices=(*STAGES, "all", "report"))
    p.add_argument("--rehearse", action="store_true", help="run on the CPU (cuda-emu, tiny sizes)")
    p.add_argument("--budget", type=float, help="seconds for the stage (default: its own)")
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(WORK_DIR, "out"))
    p.add_argument(
        "--cache-dir",
        default=os.environ.get("MINICOMP_STAGE_CACHE_DIR") or os.path.join(WORK_DIR, "cache"),
        help="the stages' shared minicomp cache",
    )
    p.add_argument(
        "--carry",
        default=os.path.join(WORK_DIR, "carry"),
        help="folder of cache bundles from earlier stages to import first",
    )
    p.add_argument("--only", help="kernels: comma list of families (matmul,attention,conv)")
    p.add_argument("--tests", help="check: comma list of test paths (default: tests)")
    p.add_argument("--models", help="models, train: comma list of suite models")
    p.add_argument("--batch", help="models: comma list of batch sizes")
    p.add_argument(
        "--results", default="benchmarks/results", help="report: the folder of committed results"
    )
    p.add_argument("--include-rehearsals", action="store_true", help="report: rehearsals too")
    return p.parse_args(argv)


def _run_body(stage: Stage, args: argparse.Namespace) -> None:
    def split(text: str) -> list[str]:
        return [x.strip() for x in text.split(",") if x.strip()]

    if stage.name == "check":
        check.run(stage, split(args.tests) if args.tests else None)
    elif stage.name == "kernels":
        kernels.run(stage, split(args.only) if args.only else None)
    elif stage.name == "models":
        batches = [int(b) for b in split(args.batch)] if args.batch else None
        models.run(stage, split(args.models) if args.models else None, batches)
    elif stage.name == "train":
        chosen = None
        if args.models:
            defaults = train.REHEARSAL_MODELS if stage.rehearse else train.MODELS
            chosen = {m: defaults.get(m, 8) for m in split(args.models)}
        train.run(stage, chosen)


def run_stage(name: str, args: argparse.Namespace) -> int:
    """Run one stage; 0 when it ran to its end (failures it measured are results), 1 when the
    stage itself broke, 2 when it wrote more files than the device machine returns."""
    if not args.rehearse:
        if not torch.cuda.is_available():
            print(f"stage {name} needs a CUDA GPU; use --rehearse to run it on the CPU")
            return 1
    os.environ["MINICOMP_CACHE_DIR"] = os.path.abspath(args.cache_dir)
    ensure_registered()
    facts = device_facts(args.rehearse)
    slug = facts["slug"] or device_slug(facts["device"])
    budget = Budget(args.budget or BUDGETS[name])
    stage = Stage(
        name=name,
        out_dir=os.path.abspath(args.out),
        rehearse=args.rehearse,
        budget=budget,
        cache_dir=os.path.abspath(args.cache_dir),
        carry_dir=os.path.abspath(args.carry),
        tag=f"{slug}-{facts['date']}-{facts['commit']}",
    )
    status = 0
    with stage.logging():
        print(f"== stage {name} on {facts['device']}, {stage.tag}, budget {budget.seconds:.0f} s")
        stage.rows.write({**facts, "stage": name, "budget_s": budget.seconds})
        stage.import_carried()
        try:
            _run_body(stage, args)
        except Exception as err:  # the stage broke: say where, keep what it wrote
            traceback.print_exc()
            stage.rows.write({"kind": "error", "error": f"{type(err).__name__}: {err}"[:2000]})
            status = 1
        manifest = stage.export_cache()
        if manifest:
            print(
                f"cache bundle: {manifest['records']} tuning records, {manifest['cubins']} cubins"
            )
        stage.rows.write({"kind": "end", "seconds": round(budget.used(), 1), "status": status})
        files = stage.files()
        print(f"== stage {name} done in {budget.used():.0f} s; {len(files)} files:")
        for path in files:
            print(f"   {os.path.basename(path)} ({os.path.getsize(path)} bytes)")
    if len(files) > MAX_FILES:
        print(f"stage {name} wrote {len(files)} files, more than the {MAX_FILES} allowed")
        return 2
    return status


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stage == "report":
        path = report.write_page(args.results, include_rehearsals=args.include_rehearsals)
        print(f"wrote {path}")
        return 0
    names = STAGES if args.stage == "all" else (args.stage,)
    worst = 0
    for name in names:
        worst = max(worst, run_stage(name, args))
    return worst


if __name__ == "__main__":
    sys.exit(main())
