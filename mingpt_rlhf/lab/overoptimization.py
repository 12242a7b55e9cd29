"""The functional forms of reward-model overoptimization (Gao, Schulman, Hilton 2023), fitted.

Optimise a policy against a learned proxy reward and measure the true (gold) reward as the
policy moves away from where it started. With d = sqrt(KL(pi || pi_init)) in nats, and the gold
counted from the starting policy's (so gold(0) = 0), the paper finds:

    best-of-n:  gold(d) = d (alpha - beta d)
    RL:         gold(d) = d (alpha - beta log d)

Both are linear in (alpha, beta): gold = alpha x1 - beta x2 with x1 = d and x2 = d^2 (best-of-n)
or d log d (RL). So each fit is an ordinary least-squares problem with no intercept, solved in
closed form; no optimiser and no starting guess. The gold of a fitted curve peaks where its
derivative is 0: at d = alpha / (2 beta) for best-of-n (or at d = 0, if that is negative), at
d = exp(alpha / beta - 1) for RL.

    from mingpt_rlhf.lab.overoptimization import fit
    f = fit("rl", d=[0.5, 1, 2, 3], gold=[0.2, 0.35, 0.4, 0.3])
    f["alpha"], f["beta"], f["r2"], f["peak_d"]
"""
from __future__ import annotations

import math

import torch

FORMS = ("bon", "rl")


def features(form: str, d: torch.Tensor) -> torch.Tensor:
    """(len(d), 2) columns [d, d^2] (best-of-n) or [d, d log d] (RL; 0 at d = 0)."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    d = d.double()
    second = d * d if form == "bon" else torch.where(d > 0, d * torch.log(d.clamp(min=1e-300)), 0.0)
    return torch.stack([d, second], -1)


def curve(form: str, d, alpha: float, beta: float) -> torch.Tensor:
    """gold(d) of the form with these coefficients."""
    x = features(form, torch.as_tensor(d, dtype=torch.float64))
    return alpha * x[:, 0] - beta * x[:, 1]


def fit(form: str, d, gold) -> dict:
    """Least-squares alpha and beta of `form` through the points (d, gold), no intercept.
    Returns alpha, beta, r2 (1 - residual / total sum of squares around the mean gold; 1 is a
    perfect fit, and it can be negative for a form that fits worse than a flat line), rmse,
    points, and peak_d, the d >= 0 where the fitted gold is highest (inf when beta <= 0, the
    curve never turns down, or when the peak is beyond any float; 0 when the gold only falls)."""
    d = torch.as_tensor(d, dtype=torch.float64)
    gold = torch.as_tensor(gold, dtype=torch.float64)
    if d.dim() != 1 or d.shape != gold.shape or len(d) < 2:
        raise ValueError("fit needs two 1-d sequences of the same length, at least 2 points")
    if (d < 0).any():
        raise ValueError("d = sqrt(KL) cannot be negative")
    x = features(form, d)
    coef = torch.linalg.lstsq(x, gold[:, None]).solution[:, 0]
    alpha, beta = coef[0].item(), -coef[1].item()
    residual = gold - x @ coef
    total = ((gold - gold.mean()) ** 2).sum().item()
    r2 = 1 - (residual ** 2).sum().item() / total if total > 0 else float("nan")
    if beta <= 0:
        peak = math.inf
    elif form == "bon":
        peak = max(alpha / (2 * beta), 0.0)  # alpha < 0: the gold only falls from d = 0
    else:
        try:
            peak = math.exp(alpha / beta - 1)
        except OverflowError:  # a tiny beta: the curve is still rising almost linearly
            peak = math.inf
    return {"alpha": alpha, "beta": beta, "r2": r2,
            "rmse": math.sqrt((residual ** 2).mean().item()), "points": len(d), "peak_d": peak}
