"""What tests/test_distributed.py starts under torchrun: a training script's `main`, with probes.

    torchrun --nproc_per_node 2 tests/ddp_worker.py MODE OUT SCRIPT --opt value ...

    torchrun --nproc_per_node 2 tests/ddp_worker.py grad OUT -

    torchrun --nproc_per_node 2 tests/ddp_worker.py jobs JOBS.json

The last form runs a list of jobs, each [MODE, OUT, SCRIPT, options...], one after the other
in the same two processes: starting Python and torch in three processes costs more than a
tiny run, so the tests launch once for many runs.

MODE
  run        call SCRIPT's main with the options (what `python SCRIPT.py` does)
  grad       no script: the gradients of one PPO minibatch step (`minibatch_gradients`) in
             each of SETTINGS, after averaging over the ranks, and the tokens that
             --learn_tokens top_entropy keeps of the rank's rows (`top_entropy_share`), into
             OUT/rank{r}.pt
  kill       the same, but every rank dies right after its first checkpoint (a killed run)
  ppo_probe  train_ppo's main, recording per rank into OUT/rank{r}.json: the ratio and approx-KL
             of the first minibatch, whitening's input and output, each update's minibatch count,
             and (OUT/rank{r}.pt) the actor's weights after the last update. On rank 1 the
             approx-KL that the early stop reads is multiplied by 1e6, so the ranks' own
             decisions would differ and only a collective one keeps them in step. Also the
             most rows one `generate` call sampled (rank 0 evaluates alone: in batches of
             its own share, not the whole rollout batch's).

In every mode but kill, the worker then exits with status 4 if gloo's threads are still
running: the script's end must release the process group (see distributed.setup). In a list
of jobs a killed run ends in this process (its exception is caught) and the next job goes
on; the process group is joined by the first job and kept for the next ones (gloo cannot
join again in the same process). So that each script is still seen to join and leave it
itself, a job's calls to its `setup` and to destroy_process_group are recorded (the latter
instead of done), and the worker exits with status 4 where a script made no `setup` call,
or, unless it was killed, no destroy call. After the last job the group is left for real and
gloo's threads must end.
"""
import importlib
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from mingpt_rlhf import losses, ppo_trainer  # noqa: E402
from mingpt_rlhf.machinery import cli, distributed  # noqa: E402


class Killed(Exception):
    pass


# PPO's losses that reduce over tokens, each in one setting (token means: the case where a
# rank's own mean would be wrong); ppo_epochs 1, one minibatch holding every row
SETTINGS = {
    "ppo_shared": dict(algo="ppo", critic="shared", entropy_coef=0.01),      # policy + value + entropy
    "ppo_separate": dict(algo="ppo", critic="separate"),                     # the critic's own step
    "grpo_k3": dict(algo="grpo", group_size=2, kl_in="loss", reduction="token", entropy_coef=0.01),
}


def minibatch_gradients(setting: str) -> dict:
    """The gradients of one minibatch step of PPOTrainer.learn, averaged over the ranks as
    Optimizer.step averages them, for SETTINGS[setting]. The minibatch: 4 responses of 1, 2, 6
    and 6 tokens; under torchrun with 2 processes rank 0 holds the two short ones and rank 1
    the two long ones, the case where a rank's own token mean weighs tokens unevenly."""
    import copy

    import train_ppo
    from mingpt_rlhf.heads import Critic, ScalarHead
    from mingpt_rlhf.model import GPT, GPTConfig
    from mingpt_rlhf.ppo import Experience, FixedKLController
    torch.manual_seed(0)  # the same models and data on every rank
    cfg = train_ppo.Config(**SETTINGS[setting], rollout_batch_size=4, minibatch_size=4,
                           ppo_epochs=1, target_kl=0, ptx_coef=0, max_new_tokens=6)
    local = train_ppo.share_of_process(cfg, distributed.world_size())
    config = GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=16)
    actor = GPT(config)
    ref = copy.deepcopy(actor).requires_grad_(False)
    critic = Critic(config) if cfg.critic == "separate" and cfg.algo == "ppo" else None
    head = ScalarHead(config.n_embd) if cfg.critic == "shared" and cfg.algo == "ppo" else None
    for h in (critic.head if critic is not None else None, head):  # values that are not 0
        if h is not None:
            torch.nn.init.normal_(h.weight, std=0.1)
    trainer = ppo_trainer.PPOTrainer(local, actor, ref, None, critic=critic, value_head=head,
                                     eos_id=1, pad_id=0, kl_ctl=FixedKLController(0.1))
    B, T, N = 4, 3, 6
    lengths = torch.tensor([1, 2, 6, 6])
    action_mask = (torch.arange(N) < lengths[:, None]).float()                  # (B, N)
    sequences = torch.randint(2, 11, (B, T + N)).masked_fill(
        torch.cat([torch.zeros(B, T), action_mask], 1) == 0, 0)
    sequences[:, :T] = torch.randint(2, 11, (B, T))
    attention_mask = torch.cat([torch.ones(B, T), action_mask], 1).long()
    with torch.no_grad():
        logprobs, _, _ = trainer.policy_and_values(sequences, attention_mask, T, with_values=False)
    noise = lambda: torch.randn(B, N) * 0.3 * action_mask
    exp = Experience(sequences, attention_mask, action_mask, (logprobs + noise()) * action_mask,
                     (logprobs + noise()) * action_mask, noise(), noise(), noise() * 3,
                     noise() * 3, torch.zeros(B))
    rows = torch.arange(B).view(distributed.world_size(), -1)[distributed.rank()]
    trainer.buffer.add(exp.select(rows))

    grads = {}
    for name, opt in (("actor", trainer.actor_opt), ("critic", trainer.critic_opt)):
        if opt is None:
            continue

        def capture(opt=opt, name=name):
            distributed.average_gradients(opt.params)
            for i, p in enumerate(opt.params):
                grads[f"{name}.{i}"] = p.grad.clone()
            opt.adamw.zero_grad(set_to_none=True)
            return True  # (a step "taken", as Optimizer.step says)
        opt.step = capture
    trainer.learn(torch.Generator().manual_seed(0))
    return grads


def top_entropy_batch():
    """An update's entropies (4, 6) and action mask for --learn_tokens top_entropy: rows 0-1
    (rank 0's under torchrun) lower than rows 2-3 (rank 1's), so that each rank's own top 20 %
    differs from the whole batch's."""
    gen = torch.Generator().manual_seed(1)
    mask = (torch.arange(6) < torch.tensor([2, 3, 6, 5])[:, None]).float()
    entropy = torch.rand(4, 6, generator=gen) + torch.tensor([0.0, 0.0, 1.0, 1.0])[:, None]
    return entropy, mask


def top_entropy_share() -> torch.Tensor:
    """The tokens top_entropy keeps of this rank's rows of `top_entropy_batch` (an update's:
    the threshold is the whole batch's, over every rank)."""
    entropy, mask = top_entropy_batch()
    rows = torch.arange(len(entropy)).view(distributed.world_size(), -1)[distributed.rank()]
    spec = losses.LossSpec(learn_tokens="top_entropy", top_entropy_quantile=0.2)
    return losses.top_entropy_tokens(entropy[rows], mask[rows], spec, for_update=True)


def covariance_batch():
    """An update's log-probs, advantages (4, 6) and action mask for --cov_loss: rank 1's rows
    (2-3) hold the confident tokens with positive advantages, so the covariance's means and the
    tokens chosen differ between each rank's own rows and the whole minibatch."""
    gen = torch.Generator().manual_seed(2)
    mask = (torch.arange(6) < torch.tensor([3, 4, 6, 5])[:, None]).float()
    logprobs = -torch.rand(4, 6, generator=gen) * 3 + torch.tensor([-2.0, -2.0, 1.5, 1.5])[:, None]
    advantages = torch.randn(4, 6, generator=gen) + torch.tensor([-0.5, -0.5, 1.0, 1.0])[:, None]
    return logprobs, advantages, mask


def covariance_share() -> dict:
    """The tokens Clip-Cov and KL-Cov choose of this rank's rows of `covariance_batch` (the
    covariance and the choice are the whole minibatch's, over every rank)."""
    from mingpt_rlhf.lab.entropy import clip_cov_tokens, kl_cov_tokens
    logprobs, advantages, mask = covariance_batch()
    rows = torch.arange(len(mask)).view(distributed.world_size(), -1)[distributed.rank()]
    tied = torch.full_like(logprobs, -1.0)  # every covariance 0: the choice is the tie-break's
    return {"kl_cov": kl_cov_tokens(logprobs[rows], advantages[rows], mask[rows], 0.2),
            "clip_cov": clip_cov_tokens(logprobs[rows], advantages[rows], mask[rows], 0.2,
                                        0.0, 5.0),
            "kl_cov_tied": kl_cov_tokens(tied[rows], advantages[rows], mask[rows], 0.3)}


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


def run_job(mode, out, script, argv) -> bool:
    """One job: False when it was a killed run (it ended at its first checkpoint)."""
    os.makedirs(out, exist_ok=True)
    if mode == "grad":
        distributed.setup(torch.device("cpu"))
        grads = {setting: minibatch_gradients(setting) for setting in SETTINGS}
        grads["top_entropy"] = top_entropy_share()
        grads.update(covariance_share())
        grads["max_over_ranks"] = distributed.max_over_ranks([3.5, -1.0][distributed.rank()])
        torch.save(grads, os.path.join(out, f"rank{distributed.rank()}.pt"))
        distributed.shutdown()
        return True
    module = importlib.import_module(script)
    record = {"first_minibatch": None, "whiten": [], "minibatch_steps": [], "generate_rows": 0}
    patched = []  # (owner, name, original): put back after the job

    def patch(owner, name, value):
        patched.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    if mode == "kill":
        real = module.save_checkpoint

        def save_then_die(path, state):
            real(path, state)
            raise Killed()
        patch(module, "save_checkpoint", save_then_die)

    if mode == "ppo_probe":
        real_kl, real_whiten, real_learn = (losses.approx_kl, losses.masked_whiten,
                                            ppo_trainer.PPOTrainer.learn)

        def approx_kl(logprobs, start_logprobs, mask, *args, **kwargs):
            kl = real_kl(logprobs, start_logprobs, mask, *args, **kwargs)
            if record["first_minibatch"] is None:
                ratio = torch.exp(logprobs - start_logprobs)[mask.bool()]
                record["first_minibatch"] = {"max_ratio_error": (ratio - 1).abs().max().item(),
                                             "approx_kl": kl.item()}
            return kl * 1e6 if distributed.rank() == 1 else kl

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
        real_generate = ppo_trainer.generate

        def generate(model, prompt_ids, *args, **kwargs):
            record["generate_rows"] = max(record["generate_rows"], len(prompt_ids))
            return real_generate(model, prompt_ids, *args, **kwargs)
        for name, value in (("approx_kl", approx_kl), ("masked_whiten", masked_whiten)):
            patch(losses, name, value)  # the trainer's loss and advantages come from losses.py
        patch(ppo_trainer, "generate", generate)
        patch(ppo_trainer.PPOTrainer, "learn", learn)

    try:
        cli.run(module.main, module.Config, argv)
    except Killed:
        return False
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)
    if mode == "ppo_probe":
        with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
            json.dump(record, f)
    return True


def require_released(what: str) -> None:
    """Exit with status 4 if gloo's threads outlive the process group."""
    for _ in range(20):  # a joined thread may linger in /proc for a moment
        left = gloo_threads()
        if not left:
            break
        time.sleep(0.05)
    if left:  # the process group outlived the run: torn down at exit, racing the other rank
        print(f"process group still alive after {what} returned: threads {left}", file=sys.stderr)
        sys.exit(4)


def run_jobs(jobs: list) -> None:
    """Each job in turn over one process group (see the module docstring)."""
    import torch.distributed as dist
    real_destroy, released = dist.destroy_process_group, []
    dist.destroy_process_group = lambda *args, **kwargs: released.append(True)
    try:
        for i, (mode, out, script, *argv) in enumerate(jobs):
            released.clear()
            print(f"job {i}: {mode} {script} -> {out}", file=sys.stderr, flush=True)
            joined = []
            if mode != "grad":  # a script: its own call to distributed.setup, recorded
                module = importlib.import_module(script)
                real_setup = module.setup
                module.setup = lambda *a, **k: joined.append(True) or real_setup(*a, **k)
            try:
                finished = run_job(mode, out, script, argv)
            finally:
                if mode != "grad":
                    module.setup = real_setup
            if mode != "grad" and not joined:
                print(f"job {i} ({script}) never called distributed.setup", file=sys.stderr)
                sys.exit(4)
            if finished and not released:
                print(f"job {i} ({script}) returned without leaving the process group",
                      file=sys.stderr)
                sys.exit(4)
    finally:
        dist.destroy_process_group = real_destroy
    distributed.shutdown()
    require_released(f"the last of {len(jobs)} jobs")


def main():
    if sys.argv[1] == "jobs":
        with open(sys.argv[2]) as f:
            return run_jobs(json.load(f))
    mode, out, script, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    if not run_job(mode, out, script, argv):
        sys.exit(3)  # killed
    require_released(script)


if __name__ == "__main__":
    main()
