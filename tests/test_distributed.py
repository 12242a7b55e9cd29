"""Several processes under torchrun (gloo on the CPU, 2 processes, one thread each): the same
numbers as one process with the whole batch, statistics over the whole batch, ranks in step,
exact resume after a kill.

`torchrun` starts the processes (tests/ddp_worker.py calls the script's main, with probes).
Starting Python and torch in three processes costs more than these tiny runs, so one launch
(the `launched` fixture) runs every job of this module in turn, and the tests read what each
left; only the resume after a kill starts processes of its own. The one-process runs they
are compared with are the shared runs of tests/conftest.py.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import as_options
from mingpt_rlhf.ppo import masked_whiten
from test_scripts import ROOT, sft_cfg

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")


def torchrun(mode, out, script, *args, nproc=2, expect=0):
    """Run tests/ddp_worker.py MODE OUT SCRIPT args under torchrun; returns the result.
    (mode "jobs": OUT is a JSON file of jobs, SCRIPT and args are not given.)"""
    os.makedirs(out if mode != "jobs" else os.path.dirname(out), exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MINGPT_RLHF_PLOT": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
         os.path.join(ROOT, "tests", "ddp_worker.py"), mode, str(out),
         *([script] if script else []), *map(str, args)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == expect, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def options(**kw):
    return [x for k, v in kw.items() for x in (f"--{k}", v)]


PPO = dict(max_iters=2, rollout_batch_size=16, minibatch_size=8, ppo_epochs=2, eval_interval=2,
           eval_prompts=16, max_new_tokens=24)


def resume_run(root):
    """The PPO run that test_a_killed_ppo_run_under_torchrun_resumes_exactly kills and resumes."""
    return dict(sft_dir=root / "sft", rm_dir=root / "rm", **{**PPO, "max_iters": 4})


@pytest.fixture(scope="module")
def launched(stages, rm_unnormalised, dpo_run, guess_sft, tmp_path_factory):
    """One torchrun launch of 2 processes that runs each test's job in turn (ddp_worker.py
    jobs): the folder that holds every job's OUT, named after the job."""
    root, out = stages[0], tmp_path_factory.mktemp("torchrun")
    (_, rm_config), (_, dpo_config, _) = rm_unnormalised, dpo_run
    sft = sft_cfg(root / "sft")  # the shared one-process runs: batch 16; here 8 per process
    # GRPO on a prompts file whose every line carries its prompt again as a field: the
    # function raises (and the launch fails) if a rank's share pairs a response with another
    # prompt's field
    from mingpt_rlhf.tasks import get_task
    with open(out / "prompts.jsonl", "w") as f:
        f.writelines(json.dumps({"prompt": p, "same": p}) + "\n"
                     for p in get_task("reviews").prompts("train")[:24])
    (out / "same_field.py").write_text(
        "def score(prompts, responses, same):\n"
        "    if list(prompts) != list(same):\n"
        "        raise ValueError('a response met the field of another prompt')\n"
        "    return [float(len(r.split())) for r in responses]\n")
    jobs = [
        ["run", out, "train_sft", *as_options(sft, out_dir=out / "sft", batch_size=8)],
        ["run", out, "train_rm", *as_options(rm_config, out_dir=out / "rm", batch_size=8)],
        ["run", out, "train_dpo", *as_options(dpo_config, out_dir=out / "dpo", batch_size=8)],
        ["run", out, "train_ppo", *options(out_dir=out / "grpo", sft_dir=root / "sft",
                                           rm_dir=root / "rm", algo="grpo", group_size=4,
                                           prompts=out / "prompts.jsonl",
                                           reward=f"{out / 'same_field.py'}:score", **PPO)],
        ["run", out, "train_ppo", *options(out_dir=out / "straight", **resume_run(root))],
        ["kill", out, "train_ppo", *options(out_dir=out / "killed", **resume_run(root))],
        ["grad", out / "grad", "-"],
        # episodes with the guessing game: every rank plays whole groups (one seed each)
        ["run", out, "train_ppo", *options(out_dir=out / "episodes", sft_dir=guess_sft,
                                           env="guess", algo="grpo", group_size=4,
                                           max_turns=6, **{**PPO, "max_new_tokens": 3})],
        # online DPO with a lagging sampler: one pair per group on each rank, ties included
        ["run", out, "train_ppo", *options(out_dir=out / "online_dpo", sft_dir=root / "sft",
                                           rm_dir=root / "rm", algo="online_dpo", group_size=4,
                                           sampler_lag=1, **PPO)],
        ["ppo_probe", out / "probe", "train_ppo", *options(
            out_dir=out / "probe" / "ppo", sft_dir=root / "sft", rm_dir=root / "rm",
            target_kl=1e-3, **PPO)],
    ]
    with open(out / "jobs.json", "w") as f:
        json.dump([[str(x) for x in job] for job in jobs], f)
    torchrun("jobs", out / "jobs.json", None)
    return out


def metrics(run_dir, key):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [(r["step"], r[key]) for r in map(json.loads, f) if key in r and not r.get("final")]


def weights(run_dir):
    return torch.load(os.path.join(run_dir, "ckpt.pt"), weights_only=False)["model"]


def assert_same_weights(a, b, atol, skip=()):
    for k in a:
        if k not in skip:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol, msg=k)


def test_sft_on_two_processes_equals_one_process_with_twice_the_batch(stages, launched):
    single = stages[0] / "sft"  # the shared run of sft_cfg: batch 16 on one process
    assert sft_cfg(single).batch_size == 16
    for key in ("loss", "eval_loss"):
        one, two = metrics(single, key), metrics(launched / "sft", key)
        assert [s for s, _ in one] == [s for s, _ in two] and len(one) >= 2
        for (_, a), (_, b) in zip(one, two):
            assert a == pytest.approx(b, abs=2e-5), key
    assert_same_weights(weights(single), weights(launched / "sft"), atol=2e-5)


def test_rm_and_dpo_on_two_processes_equal_one_process(rm_unnormalised, dpo_run, launched):
    # the one-process runs are shared (tests/conftest.py): batch 16; two processes take 8 each
    rm1, rm_config = rm_unnormalised
    dpo1, dpo_config, _ = dpo_run  # its eval samples are scored by the RM on rank 0 alone
    assert rm_config.batch_size == dpo_config.batch_size == 16 and rm_config.norm_samples == 0
    rm2, dpo2 = launched / "rm", launched / "dpo"
    for one, two, key in ((rm1, rm2, "loss"), (rm1, rm2, "acc"), (dpo1, dpo2, "loss"),
                          (dpo1, dpo2, "reward_acc")):
        a, b = metrics(one, key), metrics(two, key)
        assert len(a) == len(b) >= 1
        for (sa, va), (sb, vb) in zip(a, b):
            assert sa == sb and va == pytest.approx(vb, abs=2e-5), (one, key)
    # the pairwise loss does not change when every score shifts by one constant, which is what
    # these two tensors do: their gradient is rounding noise, and Adam turns noise into steps of
    # about lr, of either sign. Every other tensor must agree.
    assert_same_weights(weights(rm1), weights(rm2), atol=2e-5,
                        skip=("head.bias", "gpt.transformer.ln_f.bias"))
    assert_same_weights(weights(dpo1), weights(dpo2), atol=2e-5)


def test_ppo_on_two_processes_whitens_over_both_and_stays_in_step(launched):
    probe = launched / "probe"  # the ppo_probe job: target_kl 1e-3, PPO's options
    ranks = [json.load(open(probe / f"rank{r}.json")) for r in range(2)]
    # dropout off, same weights: the first minibatch's policy is the sampler. Equal up to
    # float32 rounding, not bit for bit: scoring ran on another number of rows than the
    # minibatch, and on some CPUs (AVX-512 here) the matmul then blocks its sums differently
    for r in ranks:
        assert r["first_minibatch"]["max_ratio_error"] < 1e-5
        assert r["first_minibatch"]["approx_kl"] < 1e-9
    # whitening over both ranks' rollouts equals whitening their concatenation in one process
    for a, b in zip(ranks[0]["whiten"], ranks[1]["whiten"]):
        x = torch.tensor(a["x"] + b["x"])
        mask = torch.tensor(a["mask"] + b["mask"])
        y = torch.tensor(a["y"] + b["y"])
        torch.testing.assert_close(y, masked_whiten(x, mask), rtol=0, atol=1e-5)
        real = y[mask.bool()]
        assert real.mean().item() == pytest.approx(0, abs=1e-5)
        assert real.var(unbiased=False).item() == pytest.approx(1, abs=1e-4)
        # while each rank's own share is not whitened on its own
        assert any(abs(torch.tensor(r["y"])[torch.tensor(r["mask"]).bool()].mean().item()) > 1e-3
                   for r in (a, b))
    # the early stop: rank 1 sees a 1e6 times larger approx-KL, yet both stop together
    steps = [r["minibatch_steps"] for r in ranks]
    assert steps[0] == steps[1] and len(steps[0]) == PPO["max_iters"]
    full = PPO["ppo_epochs"] * PPO["rollout_batch_size"] // PPO["minibatch_size"]
    assert all(n < full for n in steps[0])  # it did stop
    # logged means are over both ranks; the generated tokens (a cost) are their sum
    for (_, tokens), (_, length) in zip(metrics(probe / "ppo", "gen_tokens"),
                                        metrics(probe / "ppo", "resp_len")):
        assert tokens == pytest.approx(length * PPO["rollout_batch_size"], rel=1e-4)
    a, b = (torch.load(probe / f"rank{r}.pt") for r in range(2))
    for k in a:  # gradients averaged: both copies took the same steps
        assert torch.equal(a[k], b[k]), k
    # rank 0 evaluates alone: in batches of its share, the memory a training rollout takes
    assert ranks[0]["generate_rows"] == PPO["rollout_batch_size"] // 2


def test_a_minibatch_split_over_two_processes_has_one_processs_gradient(launched):
    """Token means under torchrun: rank 0 holds responses of 1 and 2 tokens, rank 1 two of 6.
    Each rank dividing by its own count would weigh rank 0's 3 tokens as much as rank 1's 12;
    the gradient must be that of one process with the whole minibatch: policy, value,
    entropy and the k3 KL term alike."""
    from ddp_worker import SETTINGS, minibatch_gradients
    ranks = [torch.load(launched / "grad" / f"rank{r}.pt") for r in range(2)]  # the grad job
    for setting in SETTINGS:
        one = minibatch_gradients(setting)
        assert set(one) == set(ranks[0][setting]) and len(one) > 4
        for k in one:
            torch.testing.assert_close(ranks[0][setting][k], one[k], rtol=1e-5, atol=1e-5,
                                       msg=f"{setting} {k}")
            assert torch.equal(ranks[0][setting][k], ranks[1][setting][k])


def test_top_entropy_takes_one_threshold_over_both_processes(launched):
    """--learn_tokens top_entropy under torchrun: each rank keeps the tokens above the whole
    update batch's threshold, not its own share's (rank 0 holds the low-entropy rows, so its
    own top 20 % would keep tokens that the batch's does not)."""
    from ddp_worker import top_entropy_batch
    from mingpt_rlhf.losses import LossSpec, top_entropy_tokens
    entropy, mask = top_entropy_batch()
    spec = LossSpec(learn_tokens="top_entropy", top_entropy_quantile=0.2)
    whole = top_entropy_tokens(entropy, mask, spec, for_update=True)  # one process, every row
    ranks = [torch.load(launched / "grad" / f"rank{r}.pt")["top_entropy"] for r in range(2)]
    assert torch.equal(torch.cat(ranks), whole)
    own = torch.cat([top_entropy_tokens(entropy[rows], mask[rows], spec, for_update=True)
                     for rows in (slice(0, 2), slice(2, 4))])
    assert not torch.equal(own, whole) and whole[:2].sum() == 0 < own[:2].sum()


def test_the_largest_figure_over_processes_is_every_ranks_maximum(launched):
    """max_logratio under torchrun: each rank's largest, then the maximum over the ranks, the
    same on both (rank 0 gave 3.5, rank 1 -1.0)."""
    ranks = [torch.load(launched / "grad" / f"rank{r}.pt") for r in range(2)]
    assert [r["max_over_ranks"] for r in ranks] == [3.5, 3.5]


def test_clip_cov_and_kl_cov_choose_over_both_processes(launched):
    """--cov_loss under torchrun: each rank chooses its tokens by the whole minibatch's
    covariance (means over both ranks' tokens) and count, as one process does on every row;
    each rank's own rows alone would choose others. Ties are broken alike too."""
    from ddp_worker import covariance_batch
    from mingpt_rlhf.lab.entropy import clip_cov_tokens, kl_cov_tokens
    lp, adv, mask = covariance_batch()
    whole = {"kl_cov": kl_cov_tokens(lp, adv, mask, 0.2),
             "clip_cov": clip_cov_tokens(lp, adv, mask, 0.2, 0.0, 5.0),
             "kl_cov_tied": kl_cov_tokens(torch.full_like(lp, -1.0), adv, mask, 0.3)}
    # every covariance tied: exactly floor(0.3 x 18) = 5 tokens, the first 5 in row order (rank
    # 0's 3 + 4 real tokens hold them), on whichever process they sit
    assert torch.equal(whole["kl_cov_tied"], torch.tensor([[1.0, 1, 1, 0, 0, 0],
                                                           [1, 1, 0, 0, 0, 0], [0] * 6, [0] * 6]))
    ranks = [torch.load(launched / "grad" / f"rank{r}.pt") for r in range(2)]
    for name, chosen in whole.items():
        assert chosen.sum() >= 1
        assert torch.equal(torch.cat([r[name] for r in ranks]), chosen), name
    own = torch.cat([kl_cov_tokens(lp[rows], adv[rows], mask[rows], 0.2)
                     for rows in (slice(0, 2), slice(2, 4))])
    assert not torch.equal(own, whole["kl_cov"])


def test_grpo_groups_stay_whole_on_one_process(launched):
    """Also: each rank's share of a prompts file's fields reaches the reward function beside
    its own prompts (the function would have stopped the launch otherwise)."""
    ckpt = torch.load(launched / "grpo" / "ckpt.pt", weights_only=False)
    assert ckpt["stage"] == "grpo" and len(ckpt["rng"]) == 2  # each rank's random streams
    assert ckpt["config"]["reward"].endswith("same_field.py:score")
    assert metrics(launched / "grpo", "reward")  # scored by the function, every iteration


def test_online_dpo_trains_on_two_processes_with_a_lagging_sampler(launched):
    """Each rank keeps one pair per group of its own share (so both take the same number of
    minibatch steps, or the launch would hang), and the run ends with a checkpoint of both
    ranks' streams and the lagging sampler's weights."""
    ckpt = torch.load(launched / "online_dpo" / "ckpt.pt", weights_only=False)
    assert ckpt["stage"] == "online_dpo" and len(ckpt["rng"]) == 2
    assert len(ckpt["sampler_behind"]) == 1
    steps = metrics(launched / "online_dpo", "minibatch_steps")
    assert steps and all(n > 0 for _, n in steps)


def test_episodes_train_on_two_processes(launched):
    """GRPO on episodes runs under torchrun: two ranks, each with its own random streams, each
    group whole on one rank (group_baselined asserts that a group shares its seed, and would
    have stopped the launch), and the game's figures logged for every iteration and eval."""
    ckpt = torch.load(launched / "episodes" / "ckpt.pt", weights_only=False)
    assert ckpt["stage"] == "grpo" and len(ckpt["rng"]) == 2 and ckpt["config"]["env"] == "guess"
    assert not torch.equal(ckpt["rng"][0]["sample"], ckpt["rng"][1]["sample"])  # own streams
    assert [step for step, _ in metrics(launched / "episodes", "success")] == [0, 1, 2, 2]


def test_each_process_gets_whole_groups_or_the_run_is_refused():
    import train_ppo
    from mingpt_rlhf.machinery.errors import UserError
    cfg = train_ppo.Config(algo="grpo", group_size=4, rollout_batch_size=16, minibatch_size=8)
    local = train_ppo.share_of_process(cfg, 2)  # 4 groups of 4: 2 whole groups per process
    assert (local.rollout_batch_size, local.minibatch_size) == (8, 4)
    assert local.score_batch_size == 8  # scoring (no gradients) keeps the whole minibatch's size
    assert train_ppo.share_of_process(cfg, 1) is cfg
    with pytest.raises(UserError, match="must both divide by 2"):  # 3 groups cannot be split
        train_ppo.share_of_process(train_ppo.Config(algo="grpo", group_size=4,
                                                    rollout_batch_size=12, minibatch_size=4), 2)


def test_a_killed_ppo_run_under_torchrun_resumes_exactly(stages, launched, tmp_path):
    """The launch ran resume_run straight through and again killed right after its first
    checkpoint; two new processes resume (a copy of) the killed one."""
    root = stages[0]
    common = resume_run(root)
    shutil.copytree(launched / "killed", tmp_path / "killed")
    assert torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)["step"] == 2
    torchrun("run", tmp_path, "train_ppo", *options(out_dir=tmp_path / "killed", resume=True, **common))
    straight = launched / "straight"
    assert_same_weights(weights(straight), weights(tmp_path / "killed"), atol=1e-6)
    assert metrics(straight, "rm_score") == metrics(tmp_path / "killed", "rm_score")
    # its random streams are those of 2 processes: one process cannot continue it exactly
    import train_ppo
    from mingpt_rlhf.machinery.errors import UserError
    with pytest.raises(UserError, match="2 process"):
        train_ppo.main(train_ppo.Config(out_dir=str(tmp_path / "killed"), resume=True,
                                        **{k: str(v) if k.endswith("_dir") else v for k, v in common.items()}))
