"""How long one all-reduce takes here: a scalar (the early-stop and finite-loss decisions) and
the 0.8M gradients of the built-in task's model (the gradient average of every optimizer step).

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 bench/allreduce.py

gloo on CPU (nccl when CUDA is visible). Rank 0 writes bench/results/allreduce.json.
"""
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = "cuda" if cuda else "cpu"
    results = {"backend": dist.get_backend(), "processes": dist.get_world_size()}
    for name, numel, repeats in (("scalar", 1, 2000), ("0.8M floats", 800_000, 200)):
        x = torch.zeros(numel, device=device)
        dist.barrier()
        start = time.time()
        for _ in range(repeats):
            dist.all_reduce(x)
        if cuda:
            torch.cuda.synchronize()
        results[f"ms_per_all_reduce_{name}"] = round((time.time() - start) / repeats * 1e3, 3)
    if dist.get_rank() == 0:
        print(results)
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "allreduce.json")
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
