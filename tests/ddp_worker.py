"""What tests/test_distributed.py starts under torchrun: a training script's `main`, with probes.

    torchrun --nproc_per_node 2 tests/ddp_worker.py MODE OUT SCRIPT --opt value ...

MODE
  run        call SCRIPT's main with the options (what `python SCRIPT.py` does)
  kill       the same, but every rank dies right after its first checkpoint (a killed run)
  ppo_probe  train_ppo's main, recording per rank into OUT/rank{r}.json: the ratio and approx-KL
             of the first minibatch, whitening's input and output, each update's minibatch count,
             and (OUT/rank{r}.pt) the actor's weights after the last update. On rank 1 the
             approx-KL that the early stop reads is multiplied by 1e6, so the ranks' own
             decisions would differ and only a collective one keeps them in step.

In every mode but kill, the worker then exits with status 4 if gloo's threads are still
running: the script's end must release the process group (see distributed.setup).
"""
import importlib
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from mingpt_rlhf import cli, distributed, ppo_trainer  # noqa: E402


class Killed(Exception):
    pass


def gloo_threads() -> list[str]:
    """Names of this process's threads that belong to gloo (Linux; [] where /proc is absent)."""
    task = f"/proc/{os.getpid()}/task"
    if not os.path.isdir(task):
        return []
    names = []
    for t in os.listdir(task):
        try:
            with open(os.path.join(task, t, "comm")) as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return [n for n in names if "gloo" in n]


def main():
    mode, out, script, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    module = importlib.import_module(script)
    record = {"first_minibatch": None, "whiten": [], "minibatch_steps": []}

    if mode == "kill":
        real = module.save_checkpoint

        def save_then_die(path, state):
            real(path, state)
            raise Killed()
        module.save_checkpoint = save_then_die

    if mode == "ppo_probe":
        real_loss, real_whiten, real_learn = (ppo_trainer.policy_loss, ppo_trainer.masked_whiten,
                                              ppo_trainer.PPOTrainer.learn)

        def policy_loss(logprobs, old_logprobs, advantages, mask, *args):
            pg, clipfrac, approx_kl = real_loss(logprobs, old_logprobs, advantages, mask, *args)
            if record["first_minibatch"] is None:
                ratio = torch.exp(logprobs - old_logprobs)[mask.bool()]
                record["first_minibatch"] = {"max_ratio_error": (ratio - 1).abs().max().item(),
                                             "approx_kl": approx_kl.item()}
            if distributed.rank() == 1:
                approx_kl = approx_kl * 1e6
            return pg, clipfrac, approx_kl

        def masked_whiten(x, mask, *args, **kwargs):
            y = real_whiten(x, mask, *args, **kwargs)
            if kwargs.get("all_ranks"):
                record["whiten"].append({"x": x.tolist(), "mask": mask.tolist(), "y": y.tolist()})
            return y

        def learn(self, generator=None):
            stats = real_learn(self, generator)
            record["minibatch_steps"].append(stats["minibatch_steps"])
            torch.save(self.actor.state_dict(), os.path.join(out, f"rank{os.environ['RANK']}.pt"))
            return stats
        ppo_trainer.policy_loss, ppo_trainer.masked_whiten = policy_loss, masked_whiten
        ppo_trainer.PPOTrainer.learn = learn

    try:
        cli.run(module.main, module.Config, argv)
    except Killed:
        sys.exit(3)
    for _ in range(20):  # a joined thread may linger in /proc for a moment
        left = gloo_threads()
        if not left:
            break
        time.sleep(0.05)
    if left:  # the process group outlived the run: torn down at exit, racing the other rank
        print(f"process group still alive after {script} returned: threads {left}", file=sys.stderr)
        sys.exit(4)
    if mode == "ppo_probe":
        with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    main()
