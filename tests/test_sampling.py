"""Properties of generate(): filters, determinism, EOS handling, left-padding invariance."""
import pytest
import torch

from conftest import left_pad
from mingpt_rlhf.model import GPT, GPTConfig
from mingpt_rlhf.sampling import filter_logits, generate


def test_top_k_never_samples_outside_the_k_best():
    torch.manual_seed(0)
    logits = torch.randn(64, 30)
    kept = filter_logits(logits, top_k=5)
    best5 = logits.topk(5, dim=-1).indices
    allowed = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, best5, True)
    assert torch.equal(torch.isfinite(kept), allowed)
    draws = torch.multinomial(torch.softmax(kept, -1), 200, replacement=True)
    assert allowed.gather(-1, draws).all()


@pytest.mark.parametrize("temperature,top_k", [(2.0, 3), (0.5, 3), (2.0, None), (2.0, 6)])
def test_sampled_distribution_is_the_tempered_softmax_of_the_k_best(monkeypatch, temperature, top_k):
    """sample_next draws from softmax(logits / T) restricted to the k best ids (renormalised),
    temperature applied once, on the top-k shortcut and the general path (k = V, no top-k)
    alike: the probabilities it hands to `draw` are those, and 50,000 draws land on each id at
    that rate (within 0.01: 4.5 standard errors). Tempering twice (T^2) moves the best id's
    probability from 0.48 to 0.41 at T = 2, and from 0.84 to 0.98 at T = 0.5."""
    from mingpt_rlhf import sampling
    logits = torch.tensor([0.5, 2.0, -1.0, 1.0, -3.0, 0.0])
    k = top_k or len(logits)
    best = logits.topk(k).indices
    want = torch.zeros(len(logits)).index_put((best,), torch.softmax(logits[best] / temperature, -1))
    handed = []
    real_draw = sampling.draw
    monkeypatch.setattr(sampling, "draw", lambda probs, generator=None: (
        handed.append(probs[0]), real_draw(probs, generator))[1])
    n = 50_000
    ids = sampling.sample_next(logits.expand(n, -1), temperature, top_k,
                               generator=torch.Generator().manual_seed(0))
    # the values handed over, whichever layout the path uses (the k best, or the vocabulary)
    got = handed[0][handed[0] > 0].sort(descending=True).values
    torch.testing.assert_close(got, want[want > 0].sort(descending=True).values)
    rates = torch.bincount(ids, minlength=len(logits)).float() / n
    assert (rates - want).abs().max() < 0.01, (rates, want)
    assert rates[want == 0].sum() == 0


def test_top_p_keeps_exactly_the_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = torch.isfinite(filter_logits(probs.log(), top_p=0.7))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.7, 0.5+0.3 >= 0.7
    kept = torch.isfinite(filter_logits(probs.log(), top_p=0.1))
    assert kept.tolist() == [[True, False, False, False]]  # the best token always stays
    # random case: the kept set is the smallest prefix of sorted tokens reaching top_p
    torch.manual_seed(1)
    logits = torch.randn(32, 50)
    kept = torch.isfinite(filter_logits(logits, top_p=0.9))
    p = torch.softmax(logits, -1)
    assert ((p * kept).sum(-1) >= 0.9 - 1e-6).all()
    smallest_kept = torch.where(kept, p, torch.inf).min(-1).values
    assert ((p * kept).sum(-1) - smallest_kept < 0.9).all()  # dropping any kept token falls short


def test_temperature_zero_is_deterministic_greedy(tiny_gpt):
    ids = torch.randint(3, 17, (4, 6))
    a = generate(tiny_gpt, ids, max_new_tokens=10, temperature=0)
    b = generate(tiny_gpt, ids, max_new_tokens=10, temperature=0)
    assert torch.equal(a.sequences, b.sequences)
    # greedy means each new token is the argmax of a full forward over what came before
    logits = tiny_gpt(a.sequences[:, :-1])
    assert torch.equal(logits[:, 5:].argmax(-1), a.sequences[:, 6:])


def test_same_generator_seed_same_samples(tiny_gpt):
    ids = torch.randint(3, 17, (4, 6))
    runs = [generate(tiny_gpt, ids, max_new_tokens=12, generator=torch.Generator().manual_seed(s))
            for s in (7, 7, 8)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert not torch.equal(runs[0].sequences, runs[2].sequences)


def test_eos_stops_a_row_and_the_rest_is_padding(tiny_gpt):
    eos, pad = 1, 0
    with torch.no_grad():  # make EOS likely so some rows stop early and others do not
        tiny_gpt.lm_head.weight[eos] *= 0
        tiny_gpt.lm_head.weight[eos] += tiny_gpt.transformer.ln_f.weight.new_full((32,), 0.0)
    ids = torch.randint(3, 17, (32, 4))
    out = generate(tiny_gpt, ids, max_new_tokens=20, temperature=3.0, eos_token_id=eos,
                   pad_token_id=pad, generator=torch.Generator().manual_seed(0))
    resp, act = out.responses, out.action_mask[:, out.prompt_len:]
    stopped = 0
    for row, mask in zip(resp.tolist(), act.tolist()):
        if eos in row:
            stopped += 1
            k = row.index(eos)
            assert mask[:k + 1] == [1] * (k + 1)          # EOS itself is an action
            assert all(t == pad for t in row[k + 1:]) and not any(mask[k + 1:])
        else:
            assert all(mask)
    assert 0 < stopped < 32
    assert torch.equal(out.attention_mask[:, out.prompt_len:], act)


class AlwaysEOS(GPT):
    def logits(self, hidden):
        logits = super().logits(hidden)
        logits[..., 1] += 100.0  # token 1 (EOS) always wins
        return logits


def test_loop_ends_when_every_row_has_stopped():
    model = AlwaysEOS(GPTConfig(vocab_size=17, block_size=64, n_layer=1, n_head=2, n_embd=16))
    out = generate(model, torch.randint(3, 17, (3, 4)), max_new_tokens=20, eos_token_id=1)
    assert out.sequences.shape == (3, 5) and (out.responses == 1).all()


def test_left_padding_invariance_of_greedy_generation(tiny_gpt):
    rows = [[3, 4, 5, 6, 7, 8], [9, 10], [11, 12, 13]]
    ids, mask = left_pad(rows)
    batched = generate(tiny_gpt, ids, mask, max_new_tokens=8, temperature=0)
    for i, r in enumerate(rows):
        alone = generate(tiny_gpt, torch.tensor([r]), max_new_tokens=8, temperature=0)
        assert torch.equal(batched.responses[i], alone.responses[0])


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_k=-3), dict(top_p=0),
                                    dict(top_p=1.5), dict(max_new_tokens=100),
                                    dict(prompt_ids=torch.zeros(1, 0, dtype=torch.long))])
def test_impossible_options_are_refused(tiny_gpt, kwargs):
    with pytest.raises(ValueError):
        generate(tiny_gpt, **{"prompt_ids": torch.zeros(1, 4, dtype=torch.long), "max_new_tokens": 4,
                              **kwargs})


class LovesPad(GPT):
    def logits(self, hidden):
        logits = super().logits(hidden)
        logits[..., 0] += 100.0  # PAD (id 0) would win every draw
        return logits


def test_pad_is_never_sampled():
    """A response with a PAD in it would be scored by the RM but lose that token in decode."""
    torch.manual_seed(0)
    model = LovesPad(GPTConfig(vocab_size=17, block_size=64, n_layer=1, n_head=2, n_embd=16))
    prompts = torch.randint(3, 17, (8, 4))
    for temperature in [1.0, 0.0]:
        out = generate(model, prompts, max_new_tokens=10, temperature=temperature,
                       eos_token_id=1, pad_token_id=0, generator=torch.Generator().manual_seed(0))
        assert not (out.responses[out.action_mask[:, 4:].bool()] == 0).any()
    # PAD left at its default (= EOS) is a real token and stays allowed
    out = generate(model, prompts, max_new_tokens=3, eos_token_id=0)
    assert (out.responses[:, 0] == 0).all()


def test_non_finite_probabilities_stop_sampling_with_a_clear_error():
    """A diverged model must stop the run (torch.multinomial refused NaN; the inverse-CDF draw
    that replaced it would otherwise return the last id forever)."""
    from mingpt_rlhf.sampling import sample_next
    for bad in (float("nan"), float("inf")):
        with pytest.raises(RuntimeError, match="not finite"):
            sample_next(torch.full((2, 4), bad))
    assert sample_next(torch.zeros(2, 4)).shape == (2,)  # finite logits still draw


def test_zero_new_tokens_with_scores_gives_empty_scores():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=16, block_size=16, n_layer=1, n_head=2, n_embd=16))
    prompts = torch.tensor([[3, 4, 5], [6, 7, 8]])
    out = generate(m, prompts, max_new_tokens=0, score=True)
    assert torch.equal(out.sequences, prompts)
    assert out.logprobs.shape == out.entropy.shape == (2, 0) and out.hidden.shape == (2, 0, 16)
