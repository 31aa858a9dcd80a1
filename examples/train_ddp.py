"""Elastic data-parallel training with minicomp: DDP over torchrun's workers, a checkpoint
with torch.distributed.checkpoint after every step, and a resumption that repeats exactly
the losses of an uninterrupted run.

    torchrun --standalone --nproc_per_node=2 --max-restarts=1 examples/train_ddp.py
    torchrun --standalone --nproc_per_node=2 --max-restarts=1 examples/train_ddp.py \\
        --fail-at-step 5      # rank 1 dies at step 5; torchrun restarts both, they resume

Each worker compiles its model with minicomp inside DDP (`DDP(torch.compile(model))`, see
docs/distributed.md); the ranks share minicomp's cache, so one compiles each graph and the
others load it, and a restarted worker finds every graph compiled. Gloo on CPU tensors,
NCCL when CUDA is there (a GPU per worker). Rank 0 prints `step N loss X` (the loss averaged
over the ranks) and, with `--losses FILE`, appends the same lines to FILE.

`--fail-at-step K` makes rank 1 exit abruptly (`os._exit`, as a crash would) during step K of
the first attempt (torchrun's TORCHELASTIC_RESTART_COUNT is 0): torchrun stops the other
worker and starts both again, which load the last complete checkpoint and go on from there.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SAMPLES, FEATURES, CLASSES = 256, 16, 4
CHECKPOINT = re.compile(r"^step-(\d+)$")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps in all")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per rank and step")
    parser.add_argument("--checkpoint-dir", default="checkpoints/train_ddp")
    parser.add_argument("--checkpoint-every", type=int, default=1, help="steps between saves")
    parser.add_argument("--keep", type=int, default=2, help="checkpoints kept, newest first")
    parser.add_argument("--fail-at-step", type=int, default=None, help="rank 1 dies there once")
    parser.add_argument("--losses", default=None, help="a file rank 0 appends its lines to")
    parser.add_argument("--target", default="auto", help="minicomp's target (auto, cpu...)")
    return parser.parse_args()


def dataset() -> TensorDataset:
    """The same synthetic classification data on every rank and every attempt."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    labels = (x[:, :CLASSES] + 0.3 * torch.randn(SAMPLES, CLASSES, generator=generator)).argmax(1)
    return TensorDataset(x, labels)


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.GELU(), torch.nn.Linear(32, CLASSES)
    )


def latest_checkpoint(folder: str) -> tuple[int, str] | None:
    """The newest complete checkpoint: DCP writes `.metadata` once every rank wrote its part."""
    found = []
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        m = CHECKPOINT.match(name)
        if m and os.path.exists(os.path.join(folder, name, ".metadata")):
            found.append((int(m.group(1)), os.path.join(folder, name)))
    return max(found) if found else None


def save(step: int, net, optimizer, args) -> None:
    """Every rank writes its part of the checkpoint that resumes at `step`; rank 0 then drops
    all but the newest `--keep`."""
    model_state, optim_state = get_state_dict(net, optimizer)
    path = os.path.join(args.checkpoint_dir, f"step-{step:06d}")
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
    if dist.get_rank() == 0:
        kept = sorted(
            (int(m.group(1)), name)
            for name in os.listdir(args.checkpoint_dir)
            if (m := CHECKPOINT.match(name))
        )
        for _, name in kept[: -args.keep]:
            shutil.rmtree(os.path.join(args.checkpoint_dir, name), ignore_errors=True)


def resume(net, optimizer, args) -> int:
    """Load the newest complete checkpoint, if any; the step to start at."""
    found = [latest_checkpoint(args.checkpoint_dir) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(found, src=0)  # every rank loads the one rank 0 chose
    if found[0] is None:
        return 0
    step, path = found[0]
    model_state, optim_state = get_state_dict(net, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(net, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return step


def report(line: str, args) -> None:
    if dist.get_rank() != 0:
        return
    print(line, flush=True)
    if args.losses:
        with open(args.losses, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def init_process_group(backend: str, attempt: int) -> None:
    """The default process group of this attempt.

    torchrun's agent hosts one TCP store for the whole run (TORCHELASTIC_USE_AGENT_STORE),
    and the workers of every attempt meet in it under the same keys: a restarted worker can
    read the dead attempt's addresses and fail to connect (pytorch/pytorch#135712). Each
    attempt's group gets its own key prefix."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend)
        return
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"train_ddp/attempt-{attempt}", store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    init_process_group("nccl" if cuda else "gloo", attempt)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if cuda else torch.device("cpu")

    net = DDP(
        torch.compile(model().to(device), backend="minicomp", options={"target": args.target}),
        device_ids=[device.index] if cuda else None,
    )
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    data = dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    per_epoch = len(loader)

    step = resume(net, optimizer, args)
    report(f"attempt {attempt}: starting at step {step} on {world} ranks", args)
    while step < args.steps:
        epoch, skip = divmod(step, per_epoch)
        sampler.set_epoch(epoch)  # the epoch's order, the same as an uninterrupted run's
        for x, labels in itertools.islice(loader, skip, None):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x.to(device)), labels.to(device))
            loss.backward()
            if rank == 1 and step == args.fail_at_step and attempt == 0:
                print(f"rank 1: failing at step {step} (--fail-at-step)", flush=True)
                os._exit(17)
            optimizer.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            report(f"step {step} loss {mean.item() / world:.8f}", args)
            step += 1
            if step % args.checkpoint_every == 0 or step == args.steps:
                save(step, net, optimizer, args)
            if step == args.steps:
                break
    # DDP's reducer holds the process group: let it go first, while every rank is here (a
    # gloo group torn down at interpreter exit can deadlock on the GIL).
    dist.barrier()
    del net, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
