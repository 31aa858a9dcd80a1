"""Workspace planning (runtime.memory)."""

import random

from minicomp.runtime.memory import ALIGN, Interval, plan_offsets


def _padded(n: int) -> int:
    return -(-max(n, 1) // ALIGN) * ALIGN


def assert_valid_plan(buffers: list[Interval], offsets: list[int], total: int) -> None:
    """No two buffers live at the same step share a byte; every buffer is aligned and fits."""
    assert len(offsets) == len(buffers)
    for k, (b, off) in enumerate(zip(buffers, offsets)):
        assert off % ALIGN == 0, f"buffer {k} at {off}"
        assert 0 <= off and off + b.nbytes <= total
    for k in range(len(buffers)):
        for m in range(k + 1, len(buffers)):
            p, q = buffers[k], buffers[m]
            live_together = not (p.last < q.first or q.last < p.first)
            if not live_together:
                continue
            lo_p, hi_p = offsets[k], offsets[k] + max(p.nbytes, 1)
            lo_q, hi_q = offsets[m], offsets[m] + max(q.nbytes, 1)
            assert hi_p <= lo_q or hi_q <= lo_p, (
                f"buffers {k} {p} at {lo_p} and {m} {q} at {lo_q} overlap"
            )


def _random_buffers(rng: random.Random) -> list[Interval]:
    steps = rng.randint(1, 12)
    out = []
    for _ in range(rng.randint(1, 25)):
        first = rng.randrange(steps)
        last = rng.randint(first, min(steps - 1, first + rng.randint(0, 4)))
        nbytes = rng.choice([0, 1, 4, 63, 64, 65, 100, 256, 1000, rng.randint(1, 5000)])
        out.append(Interval(nbytes, first, last))
    return out


def test_random_plans_never_overlap_live_buffers():
    rng = random.Random(1234)
    for _ in range(400):
        buffers = _random_buffers(rng)
        offsets, total = plan_offsets(buffers)
        assert_valid_plan(buffers, offsets, total)
        assert total <= sum(_padded(b.nbytes) for b in buffers)


def test_buffers_with_disjoint_lifetimes_share_memory():
    buffers = [Interval(1000, s, s) for s in range(5)]
    offsets, total = plan_offsets(buffers)
    assert_valid_plan(buffers, offsets, total)
    assert total == _padded(1000)
    assert total < sum(b.nbytes for b in buffers)


def test_a_chain_needs_two_buffers():
    # Step s reads buffer s-1 and writes buffer s: neighbours overlap, every other one not.
    buffers = [Interval(512, s, s + 1) for s in range(6)]
    offsets, total = plan_offsets(buffers)
    assert_valid_plan(buffers, offsets, total)
    assert total == 2 * 512


def test_buffers_live_together_are_all_kept():
    buffers = [Interval(100, 0, 3), Interval(200, 1, 2), Interval(50, 2, 5)]
    offsets, total = plan_offsets(buffers)
    assert_valid_plan(buffers, offsets, total)
    assert total == sum(_padded(b.nbytes) for b in buffers)


def test_sizes_are_padded_to_the_alignment():
    offsets, total = plan_offsets([Interval(1, 0, 0), Interval(1, 0, 0), Interval(0, 0, 0)])
    assert sorted(offsets) == [0, ALIGN, 2 * ALIGN]
    assert total == 3 * ALIGN


def test_no_buffers():
    assert plan_offsets([]) == ([], 0)
