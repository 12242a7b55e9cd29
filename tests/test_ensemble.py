"""Reward-model ensembles: each combination rule and WARM against a hand computation, the
ensemble as best-of-n's and PPO's reward, train_rm.py --ensemble (members, WARM, resume), and
the members that cannot be scored together (exit 2)."""
import json
import os
import shutil

import pytest
import torch

from conftest import exits_2
from mingpt_rlhf.methods.bestofn import best_of_n
from mingpt_rlhf.lab.ensemble import (COMBINE, EnsembleReward, RewardEnsemble, load_reward,
                                      warm_average)
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.heads import RewardModel
from mingpt_rlhf.model import GPT, GPTConfig
from mingpt_rlhf.tokenizer import WordTokenizer

TINY_RM = GPTConfig(vocab_size=17, block_size=16, n_layer=1, n_head=2, n_embd=8)


def tiny_rm(seed: int, gain: float = 1.0, bias: float = 0.0) -> RewardModel:
    torch.manual_seed(seed)
    rm = RewardModel(TINY_RM).eval()
    rm.gain.fill_(gain)
    rm.bias.fill_(bias)
    return rm


# ----------------------------------------------------------------------------- the rules
# three members' scores of two responses; by hand: mean (1 + 2 + 4) / 3 = 7/3 and
# (-1 + 0 + 2) / 3 = 1/3; both columns deviate from their mean by -4/3, -1/3, 5/3, so the
# variance over K is (16 + 1 + 25) / 9 / 3 = 14/9, and UWO at lambda 0.5 is mean - 7/9
SCORES = torch.tensor([[1.0, -1.0], [2.0, 0.0], [4.0, 2.0]])
BY_HAND = {"mean": [7 / 3, 1 / 3], "wco": [1.0, -1.0], "uwo": [7 / 3 - 7 / 9, 1 / 3 - 7 / 9]}


@pytest.mark.parametrize("rule", list(COMBINE))
def test_every_combination_rule_matches_a_hand_computation(rule):
    assert set(COMBINE) == set(BY_HAND), "a new rule needs its hand computation here"
    torch.testing.assert_close(COMBINE[rule](SCORES, 0.5), torch.tensor(BY_HAND[rule]))


def test_uwo_at_lambda_zero_is_the_mean_and_agreeing_members_pay_nothing():
    torch.testing.assert_close(COMBINE["uwo"](SCORES, 0.0), COMBINE["mean"](SCORES, 0.0))
    agree = torch.tensor([[0.3, -2.0]] * 4)
    for rule in COMBINE:
        torch.testing.assert_close(COMBINE[rule](agree, 0.5), agree[0])


# ----------------------------------------------------------------------------- WARM
def test_warm_average_is_the_mean_of_the_normalised_weights():
    """Every trunk tensor is the members' mean; the head is the mean of the heads with each
    member's normalisation folded in (weight x gain, bias x gain + bias); gain 1, bias 0."""
    a, b = tiny_rm(0, gain=2.0, bias=0.5), tiny_rm(1, gain=0.5, bias=-1.0)
    warm = warm_average([a, b]).state_dict()
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        if k.startswith("gpt."):
            torch.testing.assert_close(warm[k], (sa[k] + sb[k]) / 2, msg=k)
    torch.testing.assert_close(warm["head.weight"], (2.0 * sa["head.weight"] + 0.5 * sb["head.weight"]) / 2)
    torch.testing.assert_close(warm["head.bias"], (2.0 * sa["head.bias"] + 0.5
                                                   + 0.5 * sb["head.bias"] - 1.0) / 2)
    assert warm["gain"].item() == 1.0 and warm["bias"].item() == 0.0


def test_warm_of_members_that_share_a_trunk_scores_as_their_mean():
    """With one trunk the score is linear in the head, so the averaged model is the mean rule."""
    a, b = tiny_rm(0, gain=2.0, bias=0.5), tiny_rm(0, gain=0.5, bias=-1.0)
    with torch.no_grad():
        b.head.weight.normal_(generator=torch.Generator().manual_seed(5))
    idx = torch.randint(3, 17, (4, 10))
    mask = torch.ones_like(idx)
    mean = RewardEnsemble([a, b], "mean")(idx, mask)
    torch.testing.assert_close(warm_average([a, b]).eval()(idx, mask), mean)


def test_warm_refuses_members_of_another_shape():
    other = RewardModel(GPTConfig(vocab_size=17, block_size=16, n_layer=1, n_head=2, n_embd=16))
    with pytest.raises(UserError, match="shape"):
        warm_average([tiny_rm(0), other])


# ----------------------------------------------------------------------------- scoring
def test_an_ensemble_scores_by_its_rule_and_ppos_reward_keeps_the_disagreement():
    members = [tiny_rm(s, gain=1.0 + s, bias=0.1 * s) for s in range(3)]
    idx = torch.randint(3, 17, (5, 12))
    mask = torch.ones_like(idx)
    mask[0, :4] = 0  # a left-padded row
    each = torch.stack([m(idx, mask) for m in members])                       # (K, B)
    for rule in COMBINE:
        torch.testing.assert_close(RewardEnsemble(members, rule, 0.3)(idx, mask),
                                   COMBINE[rule](each, 0.3))
    reward = EnsembleReward(RewardEnsemble(members, "wco"), rows=2)  # slices of 2 rows
    reward.begin("iteration 1")
    scored = reward(idx, mask, None)
    torch.testing.assert_close(scored, each.min(0).values)
    assert reward.figures()["ens_std"] == pytest.approx(each.std(0, unbiased=False).mean().item(),
                                                        abs=1e-6)
    reward.begin("iteration 2")
    assert reward.figures() == {}


class CountWord(torch.nn.Module):
    """A 'reward model' scoring a sequence by how often token `tid` occurs, times `scale`."""

    def __init__(self, tid, scale=1.0):
        super().__init__()
        self.tid, self.scale = tid, scale

    def forward(self, seqs, mask, normalise=True):
        return self.scale * ((seqs == self.tid) & mask.bool()).sum(-1).float()


def test_best_of_n_with_an_ensemble_keeps_the_best_by_the_rule():
    """WCO of two members that count different words: the kept response maximises the smaller
    count, not either count alone."""
    tok = WordTokenizer(list("abcdef"))
    torch.manual_seed(0)
    policy = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=24, n_layer=1, n_head=2, n_embd=16))
    c, d = tok.encode("c")[0], tok.encode("d")[0]
    ensemble = RewardEnsemble([CountWord(c), CountWord(d)], "wco")
    prompts = ["a b", "e f"] * 3
    texts, scores, _ = best_of_n(policy, ensemble, tok, prompts, 16, max_new_tokens=10,
                                 generator=torch.Generator().manual_seed(0))
    for text, score in zip(texts, scores.tolist()):
        if text.endswith("<eos>"):
            assert min(text.split().count("c"), text.split().count("d")) == score
    assert scores.max() > 0  # some sample has both words


# ----------------------------------------------------------------------------- train_rm.py --ensemble
def ensemble_cfg(out_dir, sft_dir, **kw):
    from test_scripts import rm_cfg
    return rm_cfg(out_dir, sft_dir, **{"ensemble": 2, **kw})


@pytest.fixture(scope="module")
def ensemble_run(stages, tmp_path_factory):
    """train_rm.py --ensemble 2 from the shared SFT, straight through: (folder, summary)."""
    import train_rm
    out = tmp_path_factory.mktemp("ensemble") / "rm"
    return out, train_rm.main(ensemble_cfg(out, stages[0] / "sft"))


def weights(folder):
    return torch.load(os.path.join(folder, "ckpt.pt"), map_location="cpu", weights_only=False)["model"]


def test_train_rm_ensemble_writes_members_warm_and_a_manifest(stages, ensemble_run):
    """Member 0 is the single reward model of the same options (seed --seed, the same pairs);
    member 1 differs from it in its trunk and its head (it trains both, from its own seed and
    order); WARM is their normalised average, normalised again on the policy's samples."""
    import train_rm
    from mingpt_rlhf.stages import load_policy, load_reward_model
    from mingpt_rlhf.machinery.runtime import autocast
    from mingpt_rlhf.tasks import get_task
    out, summary = ensemble_run
    root = stages[0]
    manifest = json.load(open(out / "ensemble.json"))
    assert manifest == {"members": ["member0", "member1"], "warm": "warm"}
    single, m0, m1 = weights(root / "rm"), weights(out / "member0"), weights(out / "member1")
    for k in single:
        torch.testing.assert_close(m0[k], single[k], rtol=0, atol=1e-6, msg=k)
    assert not torch.equal(m0["head.weight"], m1["head.weight"])
    assert not torch.equal(m0["gpt.transformer.h.0.attn.c_attn.weight"],
                           m1["gpt.transformer.h.0.attn.c_attn.weight"])
    assert {"member0_eval_acc", "member1_eval_acc", "warm_eval_acc"} <= set(summary)
    # WARM: normalised on the same samples as the members (the data seed's)
    warm = load_reward_model(str(out / "warm"))
    policy, tokenizer, _ = load_policy(str(root / "sft"))
    cfg = ensemble_cfg(out, root / "sft")
    prompts = get_task("reviews", seed=cfg.seed).prompts("train")[:cfg.norm_samples]
    raw = train_rm.sft_sample_scores(policy, warm, tokenizer, prompts, cfg, autocast(torch.device("cpu"), torch.float32))
    scores = warm.gain * raw + warm.bias
    assert abs(scores.mean().item()) < 1e-4 and abs(scores.std().item() - 1) < 1e-4
    averaged = warm_average([load_reward_model(str(out / m)) for m in manifest["members"]]).state_dict()
    for k in averaged:
        if k not in ("gain", "bias"):
            torch.testing.assert_close(warm.state_dict()[k], averaged[k], msg=k)


def test_train_rm_ensemble_resumes_a_killed_member_exactly(stages, ensemble_run, tmp_path):
    """Killed right after member 1's first checkpoint, --resume keeps member 0, resumes member
    1 from its checkpoint and ends where the uninterrupted ensemble did."""
    import train_rm
    from test_scripts import Killed
    out = tmp_path / "rm"
    cfg = ensemble_cfg(out, stages[0] / "sft")
    real, saves = train_rm.save_checkpoint, []

    def save_then_maybe_die(path, state):
        real(path, state)
        saves.append(path)
        if "member1" in path:
            raise Killed()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(train_rm, "save_checkpoint", save_then_maybe_die)
        with pytest.raises(Killed):
            train_rm.main(cfg)
    assert not (out / "ensemble.json").exists()  # no manifest: the ensemble is not there yet
    kept = os.path.getmtime(out / "member0" / "ckpt.pt")
    cfg.resume = True
    train_rm.main(cfg)
    assert os.path.getmtime(out / "member0" / "ckpt.pt") == kept  # finished: not retrained
    for name in ("member0", "member1", "warm"):
        straight, resumed = weights(ensemble_run[0] / name), weights(out / name)
        for k in straight:
            torch.testing.assert_close(resumed[k], straight[k], rtol=0, atol=1e-6, msg=f"{name} {k}")


def test_an_ensemble_resumed_with_other_options_exits_2(stages, ensemble_run, tmp_path, capsys):
    shutil.copytree(ensemble_run[0], tmp_path / "rm")
    line = exits_2(capsys, "train_rm", ["--ensemble", "2", "--resume", "--out_dir", str(tmp_path / "rm"),
                                        "--sft_dir", str(stages[0] / "sft"), "--n_pairs", "320",
                                        "--batch_size", "16", "--norm_samples", "32"])
    assert "--n_pairs" in line and "member 0" in line


@pytest.mark.parametrize("combine", ["mean", "wco", "uwo", "warm"])
def test_load_reward_gives_the_ensemble_by_its_rule(ensemble_run, combine):
    rm, ckpt, path = load_reward(str(ensemble_run[0]), combine=combine, uwo_lambda=0.3)
    if combine == "warm":
        assert isinstance(rm, RewardModel) and path.endswith(os.path.join("warm", "ckpt.pt"))
    else:
        assert isinstance(rm, RewardEnsemble) and rm.combine == combine and len(rm.members) == 2
        assert path.endswith(os.path.join("member0", "ckpt.pt"))  # a separate critic starts here
    assert ckpt["stage"] == "rm"


def broken_copy(ensemble_run, tmp_path, edit):
    out = tmp_path / "rm"
    shutil.copytree(ensemble_run[0], out)
    path = out / "member1" / "ckpt.pt"
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    edit(ckpt)
    torch.save(ckpt, path)
    return out


def other_tokenizer(ckpt):
    ckpt["tokenizer"] = WordTokenizer(["x", "y"]).state_dict()


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c.update(normalised=False), "normalised"),
    (lambda c: c.update(stage="sft"), "not a reward model"),
    (other_tokenizer, "tokenizer"),
])
def test_members_that_cannot_be_scored_together_are_refused(ensemble_run, tmp_path, edit, needle):
    out = broken_copy(ensemble_run, tmp_path, edit)
    with pytest.raises(UserError, match=needle):
        load_reward(str(out))


def test_an_ensemble_without_its_members_or_warm_is_refused(ensemble_run, stages, tmp_path):
    out = tmp_path / "rm"
    shutil.copytree(ensemble_run[0], out)
    shutil.rmtree(out / "member1")
    with pytest.raises(UserError, match="member1"):
        load_reward(str(out))
    (out / "ensemble.json").write_text(json.dumps({"members": ["member0", "member1"], "warm": None}))
    with pytest.raises(UserError, match="no WARM"):
        load_reward(str(out), combine="warm")
    (out / "ensemble.json").write_text(json.dumps({"members": ["member0"]}))
    with pytest.raises(UserError, match="at least 2"):
        load_reward(str(out))
    with pytest.raises(UserError, match="needs an ensemble"):
        load_reward(str(stages[0] / "rm"), combine="wco")


def test_train_rm_gives_the_labeller_its_faults(stages, tmp_path, monkeypatch):
    """train_rm.py's pairs come from get_task with --label_noise and --length_bias."""
    import train_rm
    seen = {}

    class Stop(Exception):
        pass

    def get_task(name, **kwargs):
        seen.update(kwargs)
        raise Stop()
    monkeypatch.setattr(train_rm, "get_task", get_task)
    with pytest.raises(Stop):
        train_rm.main(train_rm.Config(out_dir=str(tmp_path), sft_dir=str(stages[0] / "sft"),
                                      label_noise=0.25, length_bias=0.3, data_seed=7))
    assert seen["label_noise"] == 0.25 and seen["length_bias"] == 0.3 and seen["seed"] == 7


# ----------------------------------------------------------------------------- train_ppo.py
def test_ppo_with_an_ensemble_logs_its_disagreement_the_held_out_gap_and_the_signals(
        stages, ensemble_run, tmp_path):
    """PPO against the ensemble's WCO, the single RM as the held-out one: every training line
    has ens_std, heldout_gap and hacking_warning; the signals from the third window on."""
    import train_ppo
    from test_scripts import ppo_cfg, read_metrics
    root = stages[0]
    cfg = ppo_cfg(tmp_path / "ppo", root / "sft", ensemble_run[0], ensemble_combine="wco",
                  heldout_rm_dir=str(root / "rm"), warning_window=1)
    train_ppo.main(cfg)
    lines = [r for r in read_metrics(tmp_path / "ppo") if "split" not in r and not r.get("final")]
    assert len(lines) == cfg.max_iters
    for r in lines:
        assert r["ens_std"] > 0 and "heldout_gap" in r and r["hacking_warning"] in (True, False)
    assert "signal_kl_accel" not in lines[1] and "signal_kl_accel" in lines[2]
    assert "signal_disagreement" in lines[2] and "signal_heldout_gap" in lines[2]


@pytest.mark.parametrize("argv, needle", [
    (["--ensemble_combine", "best"], "--ensemble_combine"),
    (["--ensemble_combine", "wco", "--reward", "task"], "--reward rm"),
    (["--heldout_rm_dir", "x", "--reward", "task"], "--reward rm"),
    (["--uwo_lambda", "-1"], "--uwo_lambda"),
])
def test_ppo_refuses_impossible_ensemble_options(argv, needle, capsys, tmp_path):
    assert needle in exits_2(capsys, "train_ppo", argv + ["--out_dir", str(tmp_path)])


def test_ppo_refuses_a_single_rm_as_an_ensemble_and_mismatched_members(stages, ensemble_run,
                                                                       tmp_path, capsys):
    root = stages[0]
    common = ["--sft_dir", str(root / "sft"), "--out_dir", str(tmp_path / "ppo")]
    line = exits_2(capsys, "train_ppo", common + ["--rm_dir", str(root / "rm"),
                                                  "--ensemble_combine", "wco"])
    assert "needs an ensemble" in line
    broken = broken_copy(ensemble_run, tmp_path, lambda c: c.update(normalised=False))
    line = exits_2(capsys, "train_ppo", common + ["--rm_dir", str(broken)])
    assert "normalised" in line and "member1" in line
