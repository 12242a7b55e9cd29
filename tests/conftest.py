import dataclasses
import importlib
import os
import shutil

import pytest
import torch

from mingpt_rlhf.machinery import cli
from mingpt_rlhf.model import GPT, GPTConfig

# the training scripts draw their curves at the end when matplotlib is installed; the tests run
# them dozens of times, so only tests/test_plot.py draws (it turns this back on)
os.environ["MINGPT_RLHF_PLOT"] = "0"


@pytest.fixture(autouse=True)
def torch_threads_restored():
    """A test that calls a bench's main with --threads (torch.set_num_threads) would leave the
    rest of the session on another thread count; sums then add in another order, and a run
    resumed later no longer matches, to 1e-6, the uninterrupted run a fixture made earlier."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_gpt():
    """A random 2-layer GPT in eval mode (dropout off), fp32, seeded."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=17, block_size=64, n_layer=2, n_head=2, n_embd=32))
    return model.eval()


def bench_module(name: str):
    """A module of bench/ by name (the benchmarks import each other that way, so bench/ joins
    sys.path)."""
    import sys
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    return importlib.import_module(name)


def example_game(filename: str, class_name: str):
    """(module, --env spec) of a game in examples/, loaded from its file as a user's would be."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                        filename)
    spec = importlib.util.spec_from_file_location(filename[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, f"{path}:{class_name}"


def sft_then_rl_on_a_game(tmp_path, module, env: str, algo: str) -> list[dict]:
    """A tiny SFT on 400 of the teacher's episodes, then two RL iterations, through the
    scripts' mains as a user runs them; the RL run's metrics lines."""
    import train_ppo
    import train_sft
    from mingpt_rlhf.run.metrics import read_metrics
    path = tmp_path / "demos.jsonl"
    module.write_demonstrations(str(path), episodes=400)
    train_sft.main(train_sft.Config(out_dir=str(tmp_path / "sft"), data=str(path), env=env,
                                    max_iters=20, eval_interval=20, eval_prompts=8,
                                    batch_size=16, warmup_iters=2, max_new_tokens=3,
                                    n_layer=1, n_head=2, n_embd=32))
    assert {"win", "illegal", "empty"} <= set(read_metrics(str(tmp_path / "sft" / "metrics.jsonl"))[-1])
    groups = {"group_size": 4} if algo != "ppo" else {}
    train_ppo.main(train_ppo.Config(out_dir=str(tmp_path / algo), sft_dir=str(tmp_path / "sft"),
                                    env=env, algo=algo, max_new_tokens=3, max_iters=2,
                                    rollout_batch_size=16, minibatch_size=8, eval_interval=2,
                                    eval_prompts=8, **groups))
    rows = read_metrics(str(tmp_path / algo / "metrics.jsonl"))
    assert [r["step"] for r in rows if "pg_loss" in r][-1] == 2
    assert 0.0 <= rows[-1]["win"] <= 1.0
    return rows


def left_pad(rows, pad_id=0):
    """List of token lists -> (ids, mask), left-padded to the longest row."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, T - len(r):] = torch.tensor(r)
            mask[i, T - len(r):] = 1
    return ids, mask


def exits_2(capsys, script, argv) -> str:
    """Run `script` (a module name: train_sft, sample, ...) with `argv` in this process, through
    `cli.run` as `python script.py argv` does; assert exit status 2 with one `error:` line;
    return that line."""
    module = importlib.import_module(script)
    with pytest.raises(SystemExit) as exit_info:
        cli.run(module.main, module.Config, argv)
    err = capsys.readouterr().err.strip()
    # progress bars (tqdm's "%|") may stand before the error, as they do in a terminal
    lines = [line for line in err.splitlines() if line.strip() and "%|" not in line]
    assert exit_info.value.code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err
    return lines[0]


def as_options(cfg, **override) -> list[str]:
    """A script's Config as the command line that builds it: `--name value` for each field
    that differs from the default (then `override`), for runs that torchrun starts."""
    default = type(cfg)()
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
              if getattr(cfg, f.name) != getattr(default, f.name)}
    return [x for k, v in {**fields, **override}.items() for x in (f"--{k}", str(v))]


# ---- runs that several tests read (never write): each is trained once per session ----------
# A test that changes a run's folder (resumes it, edits its checkpoint) copies it first.

@pytest.fixture(scope="session")
def stages(tmp_path_factory):
    """A tiny SFT run and the RM trained from it, shared read-only by the script tests:
    (root folder holding sft/ and rm/, SFT summary, RM summary). They are also the
    uninterrupted runs that the resume tests of tests/test_scripts.py compare against, and the
    one-process runs of tests/test_distributed.py's SFT check."""
    import train_rm
    import train_sft
    from test_scripts import rm_cfg, sft_cfg
    root = tmp_path_factory.mktemp("pipeline")
    sft = train_sft.main(sft_cfg(root / "sft"))
    rm = train_rm.main(rm_cfg(root / "rm", root / "sft"))
    return root, sft, rm


@pytest.fixture(scope="session")
def ppo_run(stages, tmp_path_factory):
    """test_scripts.ppo_cfg's run (PPO, separate critic, 4 iterations) from `stages`, straight
    through: (folder, summary). The PPO smoke test, the resume tests' uninterrupted run and
    sample.py's tests read it."""
    import train_ppo
    from test_scripts import ppo_cfg
    root = stages[0]
    out = tmp_path_factory.mktemp("ppo") / "straight"
    return out, train_ppo.main(ppo_cfg(out, root / "sft", root / "rm"))


@pytest.fixture(scope="session")
def rm_unnormalised(stages, tmp_path_factory):
    """test_scripts.rm_cfg's run without the score normalisation (--norm_samples 0), whose
    training every process count and accumulation must reproduce: (folder, its Config)."""
    import train_rm
    from test_scripts import rm_cfg
    out = tmp_path_factory.mktemp("rm_unnormalised") / "rm"
    cfg = rm_cfg(out, stages[0] / "sft", norm_samples=0)
    train_rm.main(cfg)
    return out, cfg


@pytest.fixture(scope="session")
def dpo_run(stages, tmp_path_factory):
    """test_scripts.dpo_cfg's run (eval samples scored by the shared RM), straight through:
    (folder, its Config, summary). The DPO resume test and the two-process DPO check read it."""
    import train_dpo
    from test_scripts import dpo_cfg
    root = stages[0]
    out = tmp_path_factory.mktemp("dpo") / "straight"
    cfg = dpo_cfg(out, root / "sft", rm_dir=str(root / "rm"))
    return out, cfg, train_dpo.main(cfg)


def copy_run(folder, to):
    """A private copy of a shared run's folder, for a test that resumes or edits it."""
    shutil.copytree(folder, to)
    return to


@pytest.fixture
def first_minibatch_kl(monkeypatch):
    """The approx-KL of the first minibatch of every PPO update (ratio 1 there: the policy
    that learns is the one that sampled), recorded while the fixture is in use.

    It is 0 to float32 rounding, in float32 and under bf16 autocast alike, and measured exactly
    0.0 in every run here. The ratio itself is 1 to rounding: in float32 the stored log-probs
    are the sampler's (decoding with the KV cache, |log-ratio| <= 5e-7 measured); under bf16
    they come from a scoring pass over slices of the rollout, while the learner's pass runs on
    the shuffled, trimmed minibatch, other shapes that round apart (|log-ratio| <= 4.5e-5).
    approx-KL is computed in float32, and per token (r - 1) - log r is then 0 or off by a
    rounding step of 1 (1.2e-7), of either sign: hence FIRST_MINIBATCH_KL."""
    from mingpt_rlhf import ppo_trainer
    seen, state = [], {"first": False}
    real_loss, real_learn = ppo_trainer.actor_loss, ppo_trainer.PPOTrainer.learn

    def learn(self, *args, **kwargs):
        state["first"] = True
        return real_learn(self, *args, **kwargs)

    def actor_loss(*args, **kwargs):  # whatever the run's entry of losses.POLICY_LOSSES
        out = real_loss(*args, **kwargs)
        if state["first"]:
            seen.append(out[1]["approx_kl"].item())
            state["first"] = False
        return out
    monkeypatch.setattr(ppo_trainer, "actor_loss", actor_loss)
    monkeypatch.setattr(ppo_trainer.PPOTrainer, "learn", learn)
    return seen


@pytest.fixture(scope="session")
def guess_sft(tmp_path_factory):
    """A tiny SFT policy of the built-in guessing game (its teacher's episodes), shared
    read-only by the episode tests: its folder."""
    import train_sft
    from test_scripts import sft_cfg
    out = tmp_path_factory.mktemp("guess") / "sft"
    train_sft.main(sft_cfg(out, env="guess", max_new_tokens=3, eval_prompts=8, max_turns=6))
    return out
