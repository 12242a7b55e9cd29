"""The reward model (one score per sequence), the critic (one value per token), the pairwise loss.

Both are the GPT trunk with a `Linear(n_embd, 1)` head, one layout of parameters (`gpt.*`,
`head.*`): a reward-model checkpoint loads straight into a critic, as InstructGPT initialises
its value function. `RewardModel` reads the head at the **last real token** of each sequence,
however it is padded (read at a pad, a row's score would depend on its padding), and a gain and
a bias normalise its scores to mean 0, std 1 on the SFT policy's samples. `Critic` reads the
head at every position. `pairwise_loss`: InstructGPT's `-log sigmoid(r_chosen - r_rejected)`.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .machinery.errors import UserError
from .model import GPT, GPTConfig, load_state_dict_checked


def last_real_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) column of the last 1 in each row of a (B, T) mask; works for left or right padding."""
    T = attention_mask.size(1)
    positions = torch.arange(T, device=attention_mask.device)
    return (attention_mask.long() * positions).argmax(-1)


class ScalarHead(nn.Linear):
    """Linear(n_embd, 1), computed in float32 even under autocast, like the output layer.

    A reward or a value is one number, and bfloat16 keeps 8 bits of it: a score near 2 could
    only be 2 +- 0.008, so rewards would move in steps and the RM's accuracy would count
    rounding ties as mistakes. The head costs n_embd multiply-adds per position, so float32
    is free. Its weights stay float32 too (`keep_float32` tells runtime.hold_frozen_in)."""
    keep_float32 = True

    def __init__(self, n_embd: int):
        super().__init__(n_embd, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., 1) float32."""
        with torch.autocast(hidden.device.type, enabled=False):
            return F.linear(hidden.float(), self.weight.float(), self.bias.float())


class ScalarHeadModel(nn.Module):
    """GPT trunk + a linear head giving one number per position."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.gpt = GPT(config)
        self.head = ScalarHead(config.n_embd)

    @property
    def config(self) -> GPTConfig:
        return self.gpt.config

    def token_scores(self, idx, attention_mask=None) -> torch.Tensor:
        """(B, T) head outputs at every position, float32."""
        hidden = self.gpt.trunk(idx, attention_mask)  # (B, T, C)
        return self.head(hidden).squeeze(-1)          # (B, T)

    def load_trunk_and_head(self, state_dict: dict, where: str = "reward model checkpoint"):
        """Take `gpt.*` and `head.*` from a RewardModel or Critic state dict; keep our buffers.

        A normalised reward model scores `gain * head(h) + bias`; that normalisation is folded
        into the head (weight x gain, bias x gain + bias), so the loaded head speaks in the
        normalised units PPO's rewards are in (a critic on another scale than the rewards would start with large, wrong values)."""
        if "head.weight" not in state_dict:
            raise UserError(f"{where} holds no scalar head: is it a reward model checkpoint?")
        gain = state_dict.get("gain", torch.tensor(1.0)).float()
        shift = state_dict.get("bias", torch.tensor(0.0)).float()
        picked = dict(state_dict, **{"head.weight": gain * state_dict["head.weight"].float(),
                                     "head.bias": gain * state_dict["head.bias"].float() + shift})
        own = self.state_dict()
        picked = {k: picked.get(k, v) if k.startswith(("gpt.", "head.")) else v
                  for k, v in own.items()}
        load_state_dict_checked(self, picked, where)


class RewardModel(ScalarHeadModel):
    def __init__(self, config: GPTConfig):
        super().__init__(config)
        # InstructGPT-style head init: N(0, 1/sqrt(n_embd + 1)) keeps initial scores O(1)
        nn.init.normal_(self.head.weight, std=1 / math.sqrt(config.n_embd + 1))
        nn.init.zeros_(self.head.bias)
        # score normalisation, set after training by `set_normalisation`; saved with the model
        self.register_buffer("gain", torch.tensor(1.0))
        self.register_buffer("bias", torch.tensor(0.0))

    def forward(self, idx, attention_mask=None, normalise: bool = True) -> torch.Tensor:
        """(B,) score of each sequence, read at its last real token."""
        if attention_mask is None:
            attention_mask = torch.ones_like(idx)
        scores = self.token_scores(idx, attention_mask)                     # (B, T)
        last = last_real_index(attention_mask)                               # (B,)
        raw = scores.gather(1, last[:, None]).squeeze(1)                     # (B,)
        return self.gain * raw + self.bias if normalise else raw

    def set_normalisation(self, raw_scores: torch.Tensor) -> None:
        """Choose gain and bias so that these raw scores get mean 0 and std 1."""
        mean, std = raw_scores.float().mean(), raw_scores.float().std()
        self.gain.fill_(1.0 / max(std.item(), 1e-6))
        self.bias.fill_(-mean.item() * self.gain.item())


class Critic(ScalarHeadModel):
    """Value of every prefix: values[:, t] estimates the return from position t on.

    Initialised from the reward model when one is given (InstructGPT): the trunk already knows
    what makes a response good, and the RM head (with the RM's normalisation folded in) gives
    values on the reward's scale from the first step. A critic built without an RM starts with a zero head, so its first values
    are 0 and carry no false signal into the advantages.
    """

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, idx, attention_mask=None) -> torch.Tensor:
        return self.token_scores(idx, attention_mask)  # (B, T)


def pairwise_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: float = 0.0):
    """Mean of -log sigmoid(r_chosen - r_rejected - margin) over (B,) scores (`logsigmoid`
    stays finite where log(sigmoid(x)) underflows to log(0))."""
    return -F.logsigmoid(chosen - rejected - margin).mean()
