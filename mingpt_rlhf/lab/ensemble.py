"""Reward-model ensembles: several reward models scored together, or their weights averaged.

A single learned reward has errors a policy can find and exploit (docs/overoptimization.md).
K reward models trained on the same pairs with different seeds err in partly different
places, and a conservative combination of their scores gives the policy less to exploit
(Coste et al., "Reward Model Ensembles Help Mitigate Overoptimization", ICLR 2024). Members
started from one pretrained trunk share much of their errors, so they mitigate rather than
cure (Eisenstein et al. 2023, "Helping or Herding?").

The combinations of the members' normalised scores r_1 .. r_K of one response (`COMBINE`):

    mean   (1/K) sum_k r_k
    wco    min_k r_k                                   worst-case optimisation
    uwo    mean - lambda * (1/K) sum_k (r_k - mean)^2   uncertainty-weighted optimisation

(the variance is the members' own, divided by K, not K - 1: our reading of Coste et al.'s
definition; lambda is `--uwo_lambda`). WARM (Ramé et al. 2024, "WARM: On the Benefits of Weight
Averaged Reward Models") averages the members' *weights* into one model instead (`warm_average`):
one model's cost at scoring time, possible because every member was fine-tuned from the same
SFT trunk, so their weights stay close enough for the average to be a good model itself.

An ensemble is a folder, written by `train_rm.py --ensemble K`:

    DIR/member0/ckpt.pt .. DIR/member{K-1}/ckpt.pt   each a reward model of its own
    DIR/warm/ckpt.pt                                   WARM: the average, normalised again
    DIR/ensemble.json                                  {"members": [...], "warm": "warm"}, last

Every member is a whole reward model (trunk and head trained, from the SFT trunk, its own seed
and order of the same pairs), normalised on the policy's samples, so their scores are on one
scale and each folder also works alone as --rm_dir. `--rm_dir DIR` in train_ppo.py loads the
ensemble (`load_reward`), `--ensemble_combine` picks the rule (or warm).

    from mingpt_rlhf.lab.ensemble import load_reward
    rm, _, _ = load_reward("out/rm_ensemble", combine="wco")
    rm(sequences, attention_mask)   # (B,) the members' minimum
"""
from __future__ import annotations

import contextlib
import json
import os

import torch
import torch.nn as nn

from ..machinery.checkpoint import load_checkpoint
from ..stages import reward_model_from
from ..machinery.errors import UserError
from ..rewards import ModelReward
from ..tokenizer import same_tokenizer, tokenizer_from_state

MANIFEST = "ensemble.json"
UWO_LAMBDA = 0.5  # train_ppo.py's default --uwo_lambda


# ----------------------------------------------------------------------------- the rules
def combine_mean(scores: torch.Tensor, uwo_lambda: float) -> torch.Tensor:
    """(K, B) members' scores -> (B,) their mean."""
    return scores.mean(0)


def combine_wco(scores: torch.Tensor, uwo_lambda: float) -> torch.Tensor:
    """(K, B) -> (B,) the lowest member's score: the response is as good as its harshest judge."""
    return scores.min(0).values


def combine_uwo(scores: torch.Tensor, uwo_lambda: float) -> torch.Tensor:
    """(K, B) -> (B,) the mean less lambda times the members' variance (over K): a response
    the members disagree on is worth less."""
    return scores.mean(0) - uwo_lambda * scores.var(0, unbiased=False)


COMBINE = {"mean": combine_mean, "wco": combine_wco, "uwo": combine_uwo}
COMBINE_CHOICES = (*COMBINE, "warm")  # warm: a model of its own, not a rule over scores


class RewardEnsemble(nn.Module):
    """K frozen reward models scored as one: `forward` gives the combined score (B,), like a
    RewardModel's, so best-of-n and PPO take it as they take one model."""

    def __init__(self, members: list, combine: str = "mean", uwo_lambda: float = UWO_LAMBDA):
        super().__init__()
        assert combine in COMBINE, f"combine must be one of {list(COMBINE)}, got {combine!r}"
        self.members = nn.ModuleList(members)
        self.combine, self.uwo_lambda = combine, uwo_lambda

    @property
    def config(self):
        return self.members[0].config

    def member_scores(self, idx, attention_mask=None, normalise: bool = True) -> torch.Tensor:
        """(K, B) each member's score of each sequence."""
        return torch.stack([m(idx, attention_mask, normalise).float() for m in self.members])

    def forward(self, idx, attention_mask=None, normalise: bool = True) -> torch.Tensor:
        return COMBINE[self.combine](self.member_scores(idx, attention_mask, normalise),
                                     self.uwo_lambda)


class EnsembleReward(ModelReward):
    """PPO's reward from an ensemble (rewards.ModelReward's slices and autocast), which also
    keeps the members' disagreement on the rollouts it scored: `figures()` gives ens_std, the
    mean over responses of the members' standard deviation (over K), since `begin`."""

    def __init__(self, rm: RewardEnsemble, rows: int, amp=contextlib.nullcontext):
        super().__init__(rm, rows, amp)
        self.spread = []  # (B,) per scored batch

    def begin(self, at: str = "") -> None:
        self.spread = []

    def __call__(self, sequences, attention_mask, action_mask, **fields) -> torch.Tensor:
        with self.amp():
            scores = torch.cat([self.rm.member_scores(sequences[i:i + self.rows],
                                                      attention_mask[i:i + self.rows])
                                for i in range(0, len(sequences), self.rows)], dim=1)  # (K, B)
        self.spread.append(scores.std(0, unbiased=False))
        return COMBINE[self.rm.combine](scores, self.rm.uwo_lambda)

    def figures(self) -> dict:
        if not self.spread:
            return {}
        return {"ens_std": torch.cat(self.spread).mean().item()}


# ----------------------------------------------------------------------------- WARM
@torch.no_grad()
def warm_average(members: list):
    """One RewardModel whose every weight is the members' mean (Ramé et al.'s WARM). Each
    member's normalisation is folded into its head first (weight x gain, bias x gain + bias),
    so the heads are averaged in the same (normalised) units; the average has gain 1 and bias
    0 until normalised again. Members of another shape, or not fine-tuned from one trunk,
    have no meaningful average: the caller checks they share their SFT start."""
    from ..heads import RewardModel
    first = members[0]
    shapes = {k: v.shape for k, v in first.state_dict().items()}
    for i, m in enumerate(members[1:], 1):
        if {k: v.shape for k, v in m.state_dict().items()} != shapes:
            raise UserError(f"WARM averages weights, and member {i} has another shape than "
                            f"member 0; train the members from one SFT model")
    warm = RewardModel(first.config)
    states = []
    for m in members:
        state = {k: v.float() for k, v in m.state_dict().items()}
        state["head.weight"] = m.gain * state["head.weight"]
        state["head.bias"] = m.gain * state["head.bias"] + m.bias
        state["gain"], state["bias"] = torch.tensor(1.0), torch.tensor(0.0)
        states.append(state)
    warm.load_state_dict({k: torch.stack([s[k] for s in states]).mean(0) for k in states[0]})
    return warm


# ----------------------------------------------------------------------------- the folder
def is_ensemble(rm_dir: str) -> bool:
    return os.path.isfile(os.path.join(rm_dir, MANIFEST))


def write_manifest(rm_dir: str, members: list[str], warm: str | None) -> None:
    """DIR/ensemble.json, atomically (the ensemble exists once its manifest does): member and
    WARM folders relative to DIR."""
    path = os.path.join(rm_dir, MANIFEST)
    with open(path + ".tmp", "w") as f:
        json.dump({"members": members, "warm": warm}, f, indent=1)
    os.replace(path + ".tmp", path)


def read_manifest(rm_dir: str) -> dict:
    path = os.path.join(rm_dir, MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
        members = manifest["members"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{path} is not an ensemble manifest ({{\"members\": [folders]}}); "
                        f"train the ensemble again with train_rm.py --ensemble K") from None
    if not isinstance(members, list) or len(members) < 2:
        raise UserError(f"{path} lists {members!r}: an ensemble needs at least 2 member "
                        f"folders")
    return manifest


def load_reward(rm_dir: str, tokenizer=None, policy_from: str = "", combine: str = "mean",
                uwo_lambda: float = UWO_LAMBDA):
    """(reward model, the checkpoint it came from, its path) from `rm_dir`: one reward model
    (train_rm.py's folder; `combine` must then be mean, which for one model is the model), an
    ensemble's WARM model (`combine` "warm"), or a RewardEnsemble of its members with the rule
    `combine`, the checkpoint then the first member's (a separate critic starts from it).
    Members that cannot be scored together are a UserError: a member that is missing or not a
    reward model, members with other tokenizers than the policy or than each other, some
    normalised and some not."""
    hint = ("run train_rm.py first, pass --rm_dir, or train on a reward computed by code "
            "(--reward task or FILE.py:FUNCTION)")
    if combine not in COMBINE_CHOICES:
        raise UserError(f"--ensemble_combine must be one of {', '.join(COMBINE_CHOICES)}, "
                        f"got {combine!r}")
    if not is_ensemble(rm_dir):
        if combine != "mean":
            raise UserError(f"--ensemble_combine {combine} needs an ensemble, and {rm_dir} holds "
                            f"no {MANIFEST}; train one with train_rm.py --ensemble K")
        return _load_one(os.path.join(rm_dir, "ckpt.pt"), tokenizer, policy_from, hint)
    manifest = read_manifest(rm_dir)
    if combine == "warm":
        if not manifest.get("warm"):
            raise UserError(f"the ensemble in {rm_dir} has no WARM model; train it with "
                            f"train_rm.py --ensemble K --resume")
        return _load_one(os.path.join(rm_dir, manifest["warm"], "ckpt.pt"), tokenizer,
                         policy_from, hint)
    loaded = [_load_one(os.path.join(rm_dir, m, "ckpt.pt"), tokenizer, policy_from, hint)
              for m in manifest["members"]]
    first_ckpt, first_path = loaded[0][1], loaded[0][2]
    for rm, ckpt, path in loaded[1:]:
        if not same_tokenizer(tokenizer_from_state(ckpt["tokenizer"]),
                              tokenizer_from_state(first_ckpt["tokenizer"])):
            raise UserError(f"ensemble members {first_path} and {path} use other tokenizers; "
                            f"train every member from the same SFT model")
        if bool(ckpt.get("normalised")) != bool(first_ckpt.get("normalised")):
            raise UserError(f"ensemble member {path} is {'' if ckpt.get('normalised') else 'not '}"
                            f"normalised and {first_path} is "
                            f"{'' if first_ckpt.get('normalised') else 'not '}so: their scores are "
                            f"on other scales; train every member with the same --norm_samples")
    ensemble = RewardEnsemble([rm for rm, _, _ in loaded], combine, uwo_lambda)
    return ensemble.eval().requires_grad_(False), first_ckpt, first_path


def _load_one(path: str, tokenizer, policy_from: str, hint: str):
    ckpt = load_checkpoint(path, "reward model checkpoint", hint, mmap=True)
    return reward_model_from(ckpt, path, tokenizer, policy_from), ckpt, path
