"""Stage 4, train: one training step (forward, backward, AdamW) of GPT-2 and ResNet-50 in
float32, minicomp against eager and Inductor.

Every backend trains its own copy of the same initial model on the same batch and labels
(dropout off, so the steps are deterministic); the first step's gradients and loss are checked
against eager's (‖g - g_eager‖ / ‖g_eager‖ over all parameters), then the backends take steps
in turn, each timed (CUDA events on a GPU), and the row holds the median step, the first step
(compile included) and the peak memory. A rehearsal trains the small models on `cuda-emu`.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F

from minicomp.bench import suite
from minicomp.bench.kernels.timing import Timing
from minicomp.bench.stages.stage import Stage
from minicomp.dynamo.backend import recording

MODELS = {"gpt2": 8, "resnet50": 32}  # model: batch
REHEARSAL_MODELS = {"gpt2": 2, "resnet50": 2}
BACKENDS = ("eager", "inductor", "minicomp-ss0")
GRAD_TOLERANCE = 2e-3  # float32 gradients through different summation orders
FIRST_MODEL_GUESS_S = 120.0


def _without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model.train()


def _compiled(model: torch.nn.Module, backend: str, stage: Stage):
    if backend == "eager":
        return model
    if backend == "inductor":
        return torch.compile(model, dynamic=False)
    options = {"target": stage.target, "cache_dir": stage.cache_dir}
    return torch.compile(model, backend="minicomp", options=options, dynamic=False)


class Trainer:
    """One backend's copy of the model, its optimizer and its training step."""

    def __init__(self, model, backend: str, stage: Stage, inputs: tuple, labels):
        self.model = copy.deepcopy(model)
        self.fn = _compiled(self.model, backend, stage)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.inputs, self.labels = inputs, labels

    def step(self) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        out = self.fn(*self.inputs)
        loss = F.cross_entropy(out.flatten(0, -2).float(), self.labels.flatten())
        loss.backward()
        self.opt.step()
        return loss.detach()

    def grads(self) -> torch.Tensor:
        return torch.cat([p.grad.flatten() for p in self.model.parameters() if p.grad is not None])


def _timed(fn, device: str) -> tuple:
    """fn()'s result and the seconds it took (CUDA events around it on a GPU)."""
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        value = fn()
        end.record()
        end.synchronize()
        return value, start.elapsed_time(end) * 1e-3
    start_s = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start_s


def train_model(stage: Stage, name: str, batch: int, backends, steps: int) -> list[dict]:
    """Each backend's row for one model: check the first step against eager's, then time."""
    spec = suite.get(name)
    size = "small" if stage.rehearse else "full"
    built = spec.build(size, torch.float32, batch, stage.device)
    model = _without_dropout(built.model)
    with torch.no_grad():
        out = model(*built.inputs)
    generator = torch.Generator().manual_seed(2)
    labels = torch.randint(0, out.shape[-1], out.shape[:-1], generator=generator).to(stage.device)
    base = {"kind": "train", "model": name, "batch": batch, "dtype": "float32", "size": size}
    trainers, rows, reference, reference_loss = {}, {}, None, None
    for backend in backends:
        row = {**base, "backend": backend, "passed": False}
        rows[backend] = row
        try:
            trainer = Trainer(model, backend, stage, built.inputs, labels)
            records: list = []
            with recording(records):
                loss, row["first_step_s"] = _timed(trainer.step, stage.device)
            row["loss"] = float(loss)
            grads = trainer.grads()
            if reference is None and backend == "eager":
                reference, reference_loss = grads, row["loss"]
            if reference is not None:
                row["grad_rel_err"] = float((grads - reference).norm() / reference.norm())
                row["loss_rel_err"] = abs(row["loss"] - reference_loss) / abs(reference_loss)
                row["passed"] = max(row["grad_rel_err"], row["loss_rel_err"]) <= GRAD_TOLERANCE
            if records:
                row["graphs"] = len(records)
                row["kernels"] = sum(len(r.kernels) for r in records)
                row["graphs_run_eagerly"] = sum(bool(r.error) for r in records)
            trainers[backend] = trainer
        except Exception as err:  # a backend that cannot train is a result, not a crash
            row["error"] = f"{type(err).__name__}: {err}"[:600]
    samples = {b: [] for b in trainers}
    if stage.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        for backend, trainer in trainers.items():
            samples[backend].append(_timed(trainer.step, stage.device)[1])
    for backend, values in samples.items():
        timing = Timing.of(values)
        rows[backend].update(
            step_ms=timing.median * 1e3, step_ms_q1=timing.q1 * 1e3, step_ms_q3=timing.q3 * 1e3
        )
    for row in rows.values():
        for other in ("eager", "inductor"):
            if row.get("step_ms") and rows.get(other, {}).get("step_ms"):
                row[f"speedup_vs_{other}"] = rows[other]["step_ms"] / row["step_ms"]
    if stage.device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
        for row in rows.values():
            row["peak_mib_all_backends"] = round(peak, 1)
    return list(rows.values())


def run(stage: Stage, models: dict | None = None, backends=BACKENDS) -> None:
    """Each model in turn while the budget allows."""
    chosen = models or (REHEARSAL_MODELS if stage.rehearse else MODELS)
    steps = 3 if stage.rehearse else 20
    spent: list[float] = []
    print(
        f"{'model':10} {'backend':14} {'step ms':>9} {'vs eager':>9} {'vs ind.':>8} "
        f"{'first s':>8} {'grad err':>9}",
        flush=True,
    )
    for i, (name, batch) in enumerate(chosen.items()):
        guess = sum(spent) / len(spent) if spent else FIRST_MODEL_GUESS_S
        if not stage.budget.allows(guess):
            for rest in list(chosen)[i:]:
                stage.skip(rest, "out of the stage's time budget")
            break
        start = time.monotonic()
        try:
            rows = train_model(stage, name, batch, backends, steps)
        except Exception as err:
            rows = [{"kind": "train", "model": name, "error": f"{type(err).__name__}: {err}"[:600]}]
        spent.append(time.monotonic() - start)
        for row in rows:
            stage.rows.write(row)
            print(_line(row), flush=True)
        if stage.device == "cuda":
            torch.cuda.empty_cache()


def _line(row: dict) -> str:
    def num(key, fmt):
        value = row.get(key)
        return "-" if value is None else format(value, fmt)

    error = f"  {row['error'][:100]}" if row.get("error") else ""
    flag = "" if row.get("passed") or row.get("error") else "  MISMATCH"
    return (
        f"{row['model']:10} {row.get('backend', '-'):14} {num('step_ms', '9.2f')} "
        f"{num('speedup_vs_eager', '8.2f')}x {num('speedup_vs_inductor', '7.2f')}x "
        f"{num('first_step_s', '8.1f')} {num('grad_rel_err', '9.1e')}{flag}{error}"
    )
