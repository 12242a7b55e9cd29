"""A reward written as code, for `train_ppo.py --reward examples/reward_positive.py:score`.

The function gets the decoded prompts and responses of a rollout batch (responses end with
the tokenizer's EOS, "<eos>" on the built-in "reviews" task) and returns one float each:
here the share of positive words among the response's opinion words, -1 for a response that
did not end or holds no opinion. A hand-written rule, not the task's gold reward: it knows
nothing of intensifiers or grammar (the KL penalty keeps the grammar).
"""
POSITIVE = {"wonderful", "superb", "brilliant", "moving", "delightful", "gripping", "charming",
            "excellent"}
NEGATIVE = {"dull", "awful", "boring", "clumsy", "tedious", "bland", "weak", "dreadful"}


def score(prompts: list[str], responses: list[str]) -> list[float]:
    scores = []
    for response in responses:
        words = response.split()
        positive = sum(w in POSITIVE for w in words)
        negative = sum(w in NEGATIVE for w in words)
        if words[-1:] != ["<eos>"] or positive + negative == 0:
            scores.append(-1.0)
        else:
            scores.append((positive - negative) / (positive + negative))
    return scores
