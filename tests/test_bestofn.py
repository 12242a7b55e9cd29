import torch

from mingpt_rlhf.methods.bestofn import best_of_n
from mingpt_rlhf.model import GPT, GPTConfig
from mingpt_rlhf.tokenizer import WordTokenizer


class CountWordReward(torch.nn.Module):
    """Scores a sequence by how often token `tid` occurs in it."""

    def __init__(self, tid):
        super().__init__()
        self.tid = tid

    def forward(self, seqs, mask):
        return ((seqs == self.tid) & mask.bool()).sum(-1).float()


def test_best_of_n_keeps_the_highest_scoring_sample_and_more_n_is_no_worse():
    tok = WordTokenizer(list("abcdef"))
    torch.manual_seed(0)
    policy = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=24, n_layer=1, n_head=2, n_embd=16))
    rm = CountWordReward(tok.encode("c")[0])
    prompts = ["a b", "d e f", "b"] * 4
    means = []
    for n in [1, 4, 16]:
        texts, scores, tokens = best_of_n(policy, rm, tok, prompts, n, max_new_tokens=10,
                                          generator=torch.Generator().manual_seed(0))
        assert len(texts) == len(prompts) and scores.shape == (len(prompts),)
        for text, score in zip(texts, scores.tolist()):
            if text.endswith("<eos>"):
                assert text.split().count("c") == score  # the kept text has the kept score
        assert 0 < tokens <= n * 10
        means.append(scores.mean().item())
    assert means[0] <= means[1] <= means[2] and means[2] > means[0]


def test_best_of_n_keeps_a_cut_off_responses_own_score_without_the_penalty():
    # 2 new tokens and a policy that rarely says EOS: most responses are cut off
    tok = WordTokenizer(list("abcdef"))
    torch.manual_seed(0)
    policy = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=24, n_layer=1, n_head=2, n_embd=16))
    rm = CountWordReward(tok.encode("c")[0])
    prompts = ["a b", "d e f"] * 4

    def run(penalty):
        return best_of_n(policy, rm, tok, prompts, 1, max_new_tokens=2, missing_eos_penalty=penalty,
                         generator=torch.Generator().manual_seed(0))

    (texts, penalised, _), (same_texts, kept, _) = run(-5.0), run(None)
    assert texts == same_texts  # n = 1: the same samples either way
    cut = [not t.endswith("<eos>") for t in texts]
    assert any(cut)
    for text, p, k, c in zip(texts, penalised.tolist(), kept.tolist(), cut):
        assert k == text.split().count("c")  # the reward model's own score, cut off or not
        assert p == (-5.0 if c else k)
