"""Process groups for tests: a one-process gloo group in the test process, and a few ranks
spawned on the CPU (gloo) that run a function and send back what it returns."""

import contextlib
import datetime
import os
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


@contextlib.contextmanager
def single_process_group():
    """A gloo process group of world size 1 in this process (its name for the functional
    collectives), destroyed on exit; one already there is used as it is."""
    if dist.is_initialized():
        yield dist.group.WORLD.group_name
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD.group_name
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world_size: int, folder, *args) -> list:
    """`fn(*args)` in `world_size` spawned processes joined in a gloo group (rendezvous through
    a file in `folder`), one thread each; what each rank returned, by rank. A rank's exception
    is raised here with its traceback."""
    store = os.path.join(str(folder), "rendezvous")
    mp.start_processes(
        _rank_main, args=(fn, world_size, store, str(folder), args), nprocs=world_size,
        start_method="spawn",
    )  # fmt: skip
    results = []
    for rank in range(world_size):
        outcome = torch.load(os.path.join(str(folder), f"rank{rank}.pt"), weights_only=False)
        if isinstance(outcome, str):
            raise AssertionError(f"rank {rank} failed:\n{outcome}")
        results.append(outcome["result"])
    return results


def _rank_main(rank: int, fn, world_size: int, store: str, folder: str, args: tuple) -> None:
    torch.set_num_threads(1)  # the ranks share the machine's cores
    # A rank that fails leaves the others waiting in a collective: not for gloo's 30 minutes.
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size, timeout=timeout
    )
    out = os.path.join(folder, f"rank{rank}.pt")
    try:
        torch.save({"result": fn(*args)}, out)
    except BaseException:
        torch.save(traceback.format_exc(), out)
    finally:
        dist.destroy_process_group()


# --- training runs compared with eager, for tests/dynamo/test_distributed.py -----------------
# They run in the spawned ranks (so they live in an importable module, not in the test file).

# Tiny, and every Linear of one shape: each distinct graph costs a compile (a C++ build on
# cuda-emu), and Linears of one shape share theirs.
DIM, BATCH = 8, 4


class Block(torch.nn.Module):
    """A residual MLP block: what FSDP shards as a unit in the per-block runs."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(DIM, DIM)
        self.down = torch.nn.Linear(DIM, DIM)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(DIM, DIM)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class TensorParallelNet(torch.nn.Module):
    """A replicated Linear, then an MLP whose `up` is column-wise and `down` row-wise
    parallel: the forward all-reduces `down`'s partial sums, the backward `up`'s input
    gradient."""

    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(DIM, DIM)
        self.up = torch.nn.Linear(DIM, DIM)
        self.down = torch.nn.Linear(DIM, DIM)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(torch.tanh(self.pre(x)))))


def _sharded_net(units: str, mixed: bool):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    net = Net()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs = {"mp_policy": policy} if mixed else {}
    for module in net.modules():
        if units == "blocks" and isinstance(module, Block):
            fully_shard(module, **kwargs)
        if units == "linears" and isinstance(module, torch.nn.Linear):
            fully_shard(module, **kwargs)
    fully_shard(net, **kwargs)
    return net


def _tensor_parallel_net():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    net = TensorParallelNet()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return parallelize_module(net, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})


def _train(net, run, steps: int, same_data: bool) -> dict:
    """`steps` SGD steps of `run` (the model, compiled or not) on fresh random inputs: the
    losses and each step's gradients (this rank's shards)."""
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    losses, grads = [], []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + (0 if same_data else dist.get_rank()))
        # An input that needs its gradient, as every later layer's does: the first layer's
        # graphs are then the others' (no compile of its own).
        x = torch.randn(BATCH, DIM, generator=g).requires_grad_()
        loss = run(x).float().square().mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append([_local(p.grad).clone() for p in net.parameters()])
        optimizer.step()
        optimizer.zero_grad()
    return {"losses": losses, "grads": grads}


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _compare(build, compile_fn, steps: int, same_data: bool = False) -> dict:
    """One model run eagerly and one compiled by `compile_fn(net)` (which returns what to
    call), both built by `build`; with what minicomp compiled meanwhile."""
    import time

    from minicomp.dynamo.backend import recording

    t0 = time.perf_counter()
    torch._dynamo.reset()
    eager_net = build()
    eager = _train(eager_net, eager_net, steps, same_data)
    net = build()
    records: list = []
    with recording(records):
        compiled = _train(net, compile_fn(net), steps, same_data)
    graphs = [(r.kind, sorted(r.aten_ops), r.target) for r in records]
    seconds = time.perf_counter() - t0
    return {"eager": eager, "compiled": compiled, "graphs": graphs, "seconds": seconds}


def distributed_runs(targets: list, steps: int) -> dict:
    """What tests/dynamo/test_distributed.py checks, run once per rank: for each target,
    FSDP2 with each block compiled (bf16 parameters, f32 reductions), FSDP2 over every Linear
    with the whole model compiled, and tensor parallelism; and what Dynamo alone captures of
    the second model."""
    import warnings

    import minicomp

    # As pyproject.toml makes them for the suite: a graph run eagerly fails the test.
    warnings.simplefilter("error", minicomp.FallbackWarning)
    warnings.simplefilter("error", minicomp.KernelFallbackWarning)
    out = {"dynamo_alone": _dynamo_graphs()}
    for target in targets:
        options = {"target": target, "fallback": "error"}

        def per_block(net, options=options):
            for block in net.blocks:
                block.compile(backend="minicomp", options=options)
            return net

        def whole_model(net, options=options):
            minicomp.compile_builtin_fsdp_modules(net, options=options)
            return torch.compile(net, backend="minicomp", options=options)

        def tensor_parallel(net, options=options):
            return torch.compile(net, backend="minicomp", options=options)

        out[target] = {
            "fsdp_per_block_mixed": _compare(
                lambda: _sharded_net("blocks", mixed=True), per_block, steps
            ),
            "fsdp_whole_model_linears": _compare(
                lambda: _sharded_net("linears", mixed=False), whole_model, steps
            ),
            "tensor_parallel": _compare(
                _tensor_parallel_net, tensor_parallel, steps, same_data=True
            ),
        }
    return out


def _dynamo_graphs() -> list:
    """The calls in the graphs Dynamo captures of a model with every Linear sharded, compiled
    whole (no minicomp: a backend that only looks)."""
    torch._dynamo.reset()
    captured: list = []

    def backend(gm, example_inputs):
        captured.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    net = _sharded_net("linears", mixed=False)
    torch.compile(net, backend=backend)(torch.randn(BATCH, DIM)).sum().backward()
    return sorted(set(captured))
