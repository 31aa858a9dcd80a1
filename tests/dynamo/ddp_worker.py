"""One rank of tests/dynamo/test_ddp.py: DDP over gloo with the model compiled by minicomp,
in both forms, against eager DDP on the same data; writes what it saw to a JSON file.

Run as `python ddp_worker.py RANK WORLD STORE TARGET OUT` (STORE: a file the ranks rendezvous
through, OUT: the result file of this rank).
"""

import json
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import minicomp
from minicomp.dynamo import backend

STEPS = 3
BUCKET_MB = 1  # Dynamo's DDP optimizer wants buckets of at least its first one, 1 MiB
VOCAB, WIDTH, BATCH = 8192, 32, 8


class Net(torch.nn.Module):
    """Two parameters of about 1 MiB (the embedding, the head) at either end: two buckets."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.hidden = torch.nn.Linear(WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        return self.head(torch.tanh(self.hidden(self.embed(tokens))))


def train(model, reference, rank):
    """Losses and the largest gradient and weight differences from eager DDP, step by step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses, ref_losses, grad_diffs = [], [], []
    for _ in range(STEPS):
        tokens = torch.randint(0, VOCAB, (BATCH,), generator=generator)
        labels = torch.randint(0, VOCAB, (BATCH,), generator=generator)
        for net, o, out in ((model, opt, losses), (reference, ref_opt, ref_losses)):
            o.zero_grad()
            loss = F.cross_entropy(net(tokens), labels)
            loss.backward()
            out.append(loss.item())
        grads = zip(model.parameters(), reference.parameters())
        grad_diffs.append(max((p.grad - q.grad).abs().max().item() for p, q in grads))
        opt.step()
        ref_opt.step()
    weights = zip(model.parameters(), reference.parameters())
    weight_diff = max((p - q).abs().max().item() for p, q in weights)
    return {
        "losses": losses,
        "eager_losses": ref_losses,
        "grad_diffs": grad_diffs,
        "weight_diff": weight_diff,
    }


def models(make):
    """The model and its eager reference, with the same initial weights on every rank."""
    torch.manual_seed(0)
    model = make()
    reference = make()
    reference.load_state_dict(model.state_dict())
    return model, reference


def compiled_graphs(records):
    return [
        {"kind": r.kind, "kernels": len(r.kernels), "error": r.error, "cache": r.cache}
        for r in records
    ]


def main(rank, world, store, target, out):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    warnings.simplefilter("error", backend.FallbackWarning)
    warnings.simplefilter("error", backend.KernelFallbackWarning)
    options = {"target": target}
    results = {}

    # A model whose forward is PyTorch's own: Dynamo compiles nothing, minicomp says so.
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
    records = []
    with backend.recording(records), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", minicomp.DistributedWarning)
        sequential = torch.compile(DDP(model), backend="minicomp", options=options)
        for _ in range(2):
            sequential(torch.randn(BATCH, WIDTH)).sum().backward()
    results["sequential"] = {
        "graphs": compiled_graphs(records),
        "warnings": [
            {"message": str(w.message), "filename": w.filename}
            for w in caught
            if issubclass(w.category, minicomp.DistributedWarning)
        ],
    }
    torch._dynamo.reset()
    model, reference = models(Net)
    records = []
    with backend.recording(records):
        inner = DDP(
            torch.compile(model, backend="minicomp", options=options), bucket_cap_mb=BUCKET_MB
        )
        results["inner"] = train(inner, DDP(reference, bucket_cap_mb=BUCKET_MB), rank)
    results["inner"]["graphs"] = compiled_graphs(records)

    torch._dynamo.reset()
    model, reference = models(Net)
    records = []
    with backend.recording(records):
        outer = torch.compile(
            DDP(model, bucket_cap_mb=BUCKET_MB), backend="minicomp", options=options
        )
        results["outer"] = train(outer, DDP(reference, bucket_cap_mb=BUCKET_MB), rank)
    results["outer"]["graphs"] = compiled_graphs(records)

    # Around DDP in the python_reducer mode: one graph with DDP's forward inlined, each
    # gradient all-reduced by a hook. Last: the mode changes Dynamo's rules for the process.
    torch._dynamo.reset()
    model, reference = models(Net)
    eager = DDP(reference, bucket_cap_mb=BUCKET_MB)  # the usual reducer
    torch._dynamo.config.optimize_ddp = "python_reducer"
    records = []
    with backend.recording(records):
        whole = torch.compile(
            DDP(model, bucket_cap_mb=BUCKET_MB), backend="minicomp", options=options
        )
        results["python_reducer"] = train(whole, eager, rank)
    results["python_reducer"]["graphs"] = compiled_graphs(records)

    dist.destroy_process_group()
    with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
