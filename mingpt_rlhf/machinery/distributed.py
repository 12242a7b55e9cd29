"""Data parallelism across processes: what changes when a script runs under torchrun.

    torchrun --standalone --nproc_per_node 2 train_sft.py ...     # 2 GPUs (nccl) or 2 CPU processes (gloo)

torchrun starts one process per GPU (or CPU slot) and tells each its RANK and WORLD_SIZE. Every
process holds a full copy of every model, reads its own shard of each batch, and after
backward the gradients are averaged over all processes, so every copy takes the same optimizer
step and stays identical. Without torchrun (WORLD_SIZE unset) every function here is the
identity and the scripts run exactly as a single process always did.

What must be computed over all ranks, not per rank (a per-rank figure would be a different
number, and the ranks would disagree):
- gradients: averaged in `Optimizer.step` (`average_gradients`);
- statistics of the whole batch: PPO's advantage whitening (sums and sums of squares,
  `all_sum`), token means (SFT's loss, PPO's per-token losses: `tokens_per_rank`), the KL
  fed to the KL controller and every logged mean (`mean_over_ranks`);
- decisions: the early stop on approx-KL and skipping a non-finite step (`all_agree`): if one
  rank stopped while another stepped, the next all-reduce would wait forever.
Why not DistributedDataParallel, and what is measured: docs/distributed.md.
"""
from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """Rank 0 evaluates, logs, prints and writes checkpoints."""
    return rank() == 0


def setup(device: torch.device) -> torch.device:
    """Join the process group when started by torchrun (WORLD_SIZE > 1); returns the device
    this rank uses (cuda:LOCAL_RANK on GPUs). nccl on CUDA, gloo on CPU."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or is_distributed():
        if is_distributed() and device.type == "cuda":
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return device
    # torch.distributed.nn binds the world group in its functions' default arguments when it
    # is imported, and torch imports it lazily (the first optimizer imports torch._dynamo,
    # which imports it). Imported after joining, it would keep the group alive past
    # destroy_process_group, and its gloo threads would be torn down at interpreter exit,
    # racing the other rank (a rare SIGABRT at the end of a finished run). Imported now,
    # before there is a group, the defaults are None.
    import torch.distributed.nn  # noqa: F401
    if device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            # rank 0 evaluates alone while the others wait in a collective
                            timeout=datetime.timedelta(hours=3))
    if not is_main():  # one copy of every message: rank 0 prints (errors still reach stderr)
        sys.stdout = open(os.devnull, "w")
    return device


def shutdown() -> None:
    """Leave the process group; its connections and threads end here (see `setup`)."""
    if is_distributed():
        dist.destroy_process_group()


def shard(items: list, per_rank: int) -> list:
    """This rank's `per_rank` items of `items` (world_size x per_rank of them, the same list
    on every rank): contiguous slices, so rank r gets items r*per_rank .. (r+1)*per_rank - 1."""
    r = rank()
    return items[r * per_rank:(r + 1) * per_rank]


# Each function below is one line in one process (the data are the whole batch's already);
# what several processes do is the private function it calls under torchrun.

def all_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of `x` over all ranks (a new tensor on x's device; `x` itself in one process)."""
    return _reduce(x, dist.ReduceOp.SUM) if is_distributed() else x


def _reduce(x: torch.Tensor, op) -> torch.Tensor:
    """`x` reduced over the ranks by `op`. nccl reduces GPU tensors only, so a CPU tensor
    makes the trip through the GPU."""
    on = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else x.device
    y = x.to(on, copy=True)
    dist.all_reduce(y, op=op)
    return y.to(x.device)


def mean_over_ranks(stats: dict) -> dict:
    """Each float of `stats` averaged over the ranks (their batches are the same size)."""
    return _mean_over_ranks(stats) if is_distributed() else stats


def _mean_over_ranks(stats: dict) -> dict:
    keys = sorted(k for k, v in stats.items() if isinstance(v, (int, float)))
    values = all_sum(torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64))
    return {**stats, **{k: (v / world_size()).item() for k, v in zip(keys, values)}}


def max_over_ranks(x: float) -> float:
    """The largest of every rank's `x` (`x` itself in one process)."""
    return _reduce(torch.tensor([x], dtype=torch.float64), dist.ReduceOp.MAX).item() \
        if is_distributed() else x


def tokens_per_rank(mask: torch.Tensor) -> torch.Tensor:
    """What a token mean divides by so that N processes compute one process's mean.

    One process: the number of real tokens in `mask` (the usual mean). Under torchrun each
    process holds part of the batch and the gradients are then averaged over the processes,
    so a process dividing by its own count would weigh a process of short responses as much
    as one of long responses. Dividing every process's sum by the processes' mean count
    instead makes the average of their results sum(all) / count(all): the token mean of the
    whole batch (SFT's loss, PPO's token means, ptx)."""
    count = mask.sum()
    return (all_sum(count) / world_size() if is_distributed() else count).clamp(min=1)


def token_share(mask: torch.Tensor) -> float:
    """The factor that turns this process's token mean into its part of the whole batch's
    token mean: its token count / `tokens_per_rank` (1 in one process: no count to take, and
    no host sync in the minibatch loop)."""
    return (mask.sum().clamp(min=1) / tokens_per_rank(mask)).item() if is_distributed() else 1.0


def all_agree(flag: bool) -> bool:
    """True on every rank if `flag` is true on any rank: one decision for all of them."""
    return bool(all_sum(torch.tensor([float(flag)])).item() > 0) if is_distributed() else flag


def average_gradients(params: list[torch.Tensor], bucket: int = 2 ** 24) -> None:
    """Replace each gradient by its mean over the ranks (nothing to do in one process)."""
    if is_distributed():
        _average_in_buckets(params, bucket)


def _average_in_buckets(params: list[torch.Tensor], bucket: int) -> None:
    """`average_gradients` in flat buckets of up to `bucket` elements (one all-reduce per
    bucket instead of one per tensor)."""
    for p in params:
        if p.grad is None:  # every rank must send the same tensors
            p.grad = torch.zeros_like(p)
    grads, start, size = [p.grad for p in params], 0, 0
    for i, g in enumerate(grads + [None]):
        if g is not None and (size == 0 or size + g.numel() <= bucket):
            size += g.numel()
            continue
        if i == start:  # no gradients at all
            break
        flat = torch.cat([x.reshape(-1) for x in grads[start:i]])
        dist.all_reduce(flat)
        flat /= world_size()
        offset = 0
        for x in grads[start:i]:
            x.copy_(flat[offset:offset + x.numel()].view_as(x))
            offset += x.numel()
        start, size = i, (g.numel() if g is not None else 0)


def gather(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank (e.g. random generator states)."""
    if not is_distributed():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out

