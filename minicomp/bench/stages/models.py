"""Stage 3, models: the model suite in float16 at batch 1 and a serving batch, minicomp against
eager and Inductor (default, and reduce-overhead for CUDA graphs), with compile times.

It is `minicomp bench` (minicomp/bench) one model configuration at a time, batch 1 of every
model before any serving batch, each row appended as it is measured, while the budget lasts.
Compile times are cold (a fresh cache per backend); the warm compile is left out to fit the
lease. A rehearsal runs the suite's small models on `cuda-emu`.
"""

from __future__ import annotations

import time

from minicomp.bench import chart, report, runner, suite
from minicomp.bench.options import Settings
from minicomp.bench.stages.stage import Stage

MODELS = ("resnet50-tv", "gpt2", "bert-base", "llama-1b", "vit-b16", "t5-encoder", "resnet50")
BATCHES = (1, 16)
BACKENDS = ("eager", "inductor", "inductor-reduce-overhead", "minicomp-ss0")
REHEARSAL_MODELS = ("gpt2", "resnet50-tv")
REHEARSAL_BATCHES = (1,)  # the mechanics, once: a second batch only compiles again
REHEARSAL_BACKENDS = ("eager", "inductor", "minicomp-ss0")
FIRST_CONFIG_GUESS_S = 90.0


def run(stage: Stage, models=None, batches=None, backends=None) -> None:
    """Every configuration, batch by batch, while the budget allows; then the chart."""
    rehearse = stage.rehearse
    settings = Settings(
        models=list(models or (REHEARSAL_MODELS if rehearse else MODELS)),
        dtypes=["float16"],
        batch=list(batches or (REHEARSAL_BATCHES if rehearse else BATCHES)),
        backends=list(backends or (REHEARSAL_BACKENDS if rehearse else BACKENDS)),
        device=stage.device,
        size="small" if rehearse else "full",
        repeats=3 if rehearse else 30,
        warmup=1 if rehearse else 5,
        progress=False,
        warm=False,
        options={"target": stage.target},
    )
    rows, spent = [], []
    configs = [(b, name) for b in settings.batch for name in settings.models]
    for i, (batch, name) in enumerate(configs):
        spec = suite.get(name)
        if spec.missing():
            stage.skip(f"{name} b{batch}", spec.missing(), model=name, batch=batch)
            continue
        guess = sum(spent) / len(spent) if spent else FIRST_CONFIG_GUESS_S
        if not stage.budget.allows(guess):
            for batch, name in configs[i:]:
                stage.skip(f"{name} b{batch}", "out of the stage's time budget")
            break
        start = time.monotonic()

        def emit(row: dict) -> None:
            stage.rows.write({"kind": "model", **row})

        rows += runner.measure_config(spec, settings, "float16", batch, on_row=emit)
        spent.append(time.monotonic() - start)
        print(f"{name} b{batch}: {spent[-1]:.0f} s", flush=True)
    if rows:
        print(report.table(rows), flush=True)
        if chart.missing():
            print(chart.missing(), flush=True)
        else:
            title = f"minicomp models, {stage.tag}: speed-up over eager (float16)"
            chart.write(stage.path(".png"), rows, settings.backends, title)
            print(f"chart: {stage.path('.png')}", flush=True)
