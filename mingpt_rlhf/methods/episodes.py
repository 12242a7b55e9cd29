"""Episodes with an environment: multi-turn rollouts, kept as one token sequence each.

A single-turn rollout is a prompt and one response. An episode is a conversation: the
environment opens, the policy answers, the environment replies (a game's verdict, a tool's
output, a checker's message), the policy answers again, until the environment says the
episode is done. The policy learns from the whole episode at once.

The environment is any class with two methods, constructed with no arguments, one instance
per episode:

    class MyEnv:
        def reset(self, seed: int) -> str: ...                        # the opening text
        def step(self, action: str) -> tuple[str, float, bool]: ...   # (reply, reward, done)

`step` is called after each policy turn with that turn's text: its tokens up to the
end-of-turn token (EOS), decoded, EOS left out. Its reward is the reward of that turn; the
reply is what the policy reads next. An episode ends when `step` says done (its last reply is
kept in the transcript but never tokenized: nothing reads it), after `max_turns` policy turns,
or when the next turn would not fit in the model's context (its reply and `max_new_tokens`
more tokens, counted after the batch's longest opening: the rows are compacted to one width). Seeds below `HELD_OUT_SEEDS` are held out: the evaluation plays seeds 0, 1, 2,
...; training draws its seeds from a million upwards.

How an episode becomes what PPO, GRPO and RLOO already learn from:

1. **One sequence, token in, token out.** The opening and each reply are tokenized once, when
   they arrive, and appended; the policy's tokens are the ids it sampled. The history is never
   decoded and encoded again (with BPE that round trip can give other ids than were sampled,
   and the log-probs the learner computes would then be of tokens the policy never wrote).
2. **A mask with holes.** In the response columns of the sequence, `action_mask` is 1 on the
   policy's tokens and 0 on the environment's: the replies are attended to (context) but are
   not actions. The trainer masks every per-token quantity with it, so the environment's
   tokens get no policy loss, no KL, no entropy, no value loss, and count in no token mean.
   GAE steps over the holes (ppo.gae): the value after a turn's last action is the value at
   the next turn's first action.
3. **Rewards on the turn's last action.** Each `step` reward lands on the last token of the
   turn it judged (`Episodes.rewards`); an episode's return is their sum (GRPO and RLOO use
   it as the sequence's reward). With one reward at the end, it sits on the last action.
4. **All live episodes take their turn together**, continuing from the KV cache: the policy
   writes the turn token by token until each row has written EOS (or `max_new_tokens`), then
   each row's last token and its reply are fed in one pass, left-padded so that every row's
   last column is a real token (the logits there choose the next turn's first token).
   Positions count each row's real tokens, so the padding between turns shifts nothing.
   An episode that ends leaves the batch: its rows of the KV cache are dropped and it costs
   nothing more.
5. **Compact rows at the end.** The batched layout has padding between turns; the episodes
   are returned with it removed: each row is [left padding][opening][turn, reply, turn, ...]
   [right padding], the layout of a single-turn rollout (sampling.GenerationOutput), so the
   trainer needs nothing else. A single-turn rollout is the episode of one turn.

With `score=True` the log-prob, entropy and hidden state of every action token are kept from
sampling (as sampling.generate does): in float32 they equal a fresh forward pass over the
whole episode to rounding (tests/test_episodes.py checks it). SFT on transcripts encodes them the same way
(data.encode_transcript).

Try it:  python sample.py --ckpt_dir out/guess/sft --env guess   (after docs/multiturn.md's
         first commands; --play_env lets you play the environment's part)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from ..data import left_pad, sequence_start
from ..machinery.distributed import mean_over_ranks, shard
from ..machinery.errors import UserError
from ..logprobs import tempered_logprobs
from ..losses import GROUP_ALGOS
from ..model import position_ids_from_mask
from ..rewards import load_function, real_number
from ..machinery.runtime import require_room_for_prompt
from ..sampling import GenerationOutput, next_token_logits, sample_next

HELD_OUT_SEEDS = 1_000_000  # eval episodes use seeds below this, training episodes at or above


# ----------------------------------------------------------------------------- environments
def builtin_environments() -> dict:
    from .env_guess import GuessNumber
    return {"guess": GuessNumber}


def load_env(spec: str):
    """(environment class, name) from a built-in name, FILE.py:CLASS or MODULE:CLASS; one
    instance is built to check that it takes no arguments and has reset and step."""
    builtin = builtin_environments()
    if spec in builtin:
        env_class, name = builtin[spec], spec
    elif ":" not in spec:
        raise UserError(f"--env {spec!r} is not a built-in environment ({', '.join(builtin)}), "
                        f"FILE.py:CLASS or MODULE:CLASS")
    else:
        env_class, name = load_function(spec, flag="--env", kind="CLASS")
    try:
        env = env_class()
    except Exception as e:
        raise UserError(f"--env {name}: building it with no arguments raised "
                        f"{type(e).__name__}: {_first_line(e)}; its __init__ must take none "
                        f"(reset(seed) starts an episode)") from None
    for method in ("reset", "step"):
        if not callable(getattr(env, method, None)):
            raise UserError(f"--env {name} has no method {method}(); an environment needs "
                            f"reset(seed) -> str and step(action) -> (str, float, bool)")
    return env_class, name


def environment_figures(env_class, transcripts, returns: list[float]) -> dict:
    """The environment's own figures of a batch of episodes, when it defines a classmethod
    `figures(transcripts, returns) -> dict` (the built-in game: success, and where the
    guesses fall); `transcripts` is None when only the returns are at hand."""
    figures = getattr(env_class, "figures", None)
    if not callable(figures):
        return {}
    try:
        return dict(figures(transcripts, returns))
    except Exception as e:
        name = getattr(env_class, "__name__", "env")
        raise UserError(f"environment {name}: figures raised {type(e).__name__}: "
                        f"{_first_line(e)}; fix the environment") from None


def truth_value(value, what: str) -> bool:
    """`value` as Python's bool, or a UserError naming `what` and the value's type. Taken:
    Python's bool, numpy's (numpy.bool_, what comparing numpy numbers gives) and a 0-d bool
    tensor, as a reward may be numpy's or torch's number. Refused: anything else, numbers
    included (is 2 done?). The type is named with its module: numpy 2 calls its bool `bool`,
    and "done is a bool, not a bool" would say nothing."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype == torch.bool:
        return bool(value.item())
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(value, torch.Tensor):
        name += f" of {str(value.dtype).replace('torch.', '')} and shape {tuple(value.shape)}"
    raise UserError(f"{what} is a {name} ({str(value)[:40]}), not a bool; return True or False "
                    f"(a 0-d bool tensor or numpy's bool are taken too)")


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


class Env:
    """One episode's environment, with every call checked: an exception or a wrong type stops
    the run with one line naming the environment, the episode's seed and the turn."""

    def __init__(self, env_class, name: str, seed: int):
        self.name, self.seed, self.turn = name, seed, 0
        self.env = self._call(env_class, "__init__")

    def _call(self, method, what: str, *args):
        try:
            return method(*args)
        except UserError:
            raise
        except Exception as e:
            raise UserError(f"environment {self.name}: {what} raised {type(e).__name__}: "
                            f"{_first_line(e)} (episode seed {self.seed}, turn {self.turn}); "
                            f"fix the environment") from None

    def reset(self) -> str:
        text = self._call(self.env.reset, "reset", self.seed)
        if not isinstance(text, str):
            raise UserError(f"environment {self.name}: reset returned {str(text)[:40]} "
                            f"({type(text).__name__}), not the opening text (str) (episode seed "
                            f"{self.seed})")
        return text

    def step(self, action: str) -> tuple[str, float, bool]:
        self.turn += 1
        out = self._call(self.env.step, "step", action)
        where = f"(episode seed {self.seed}, turn {self.turn})"
        if not (isinstance(out, tuple) and len(out) == 3):
            raise UserError(f"environment {self.name}: step returned {type(out).__name__} "
                            f"{str(out)[:40]!r}, not (reply: str, reward: float, done: bool) "
                            f"{where}")
        reply, reward, done = out
        if not isinstance(reply, str):
            raise UserError(f"environment {self.name}: step's reply is a "
                            f"{type(reply).__name__}, not a str {where}")
        reward = real_number(reward, f"environment {self.name}: step's reward {where}")
        done = truth_value(done, f"environment {self.name}: step's done {where}")
        return reply, reward, done

    def encode(self, tokenizer, text: str, what: str) -> list[int]:
        """The ids of an opening or a reply, refused when empty or when the tokenizer cannot
        write it (a word it does not know would be <unk>: the policy could not read it)."""
        ids = tokenizer.encode(text)
        where = f"(episode seed {self.seed}, turn {self.turn})"
        if not ids:
            raise UserError(f"environment {self.name}: the {what} {text!r} encodes to no tokens "
                            f"{where}; give it at least one word")
        unk = getattr(tokenizer, "unk_id", None)
        bad = [w for w, i in zip(text.split(), ids) if i in (unk, tokenizer.pad_id)] \
            if unk is not None else [i for i in ids if i == tokenizer.pad_id]
        if bad:
            raise UserError(f"environment {self.name}: the {what} {text!r} has words the "
                            f"policy's tokenizer cannot encode ({', '.join(map(str, bad[:3]))}) "
                            f"{where}; use the words of its vocabulary, or train the SFT policy "
                            f"on transcripts that contain them")
        return ids


# ----------------------------------------------------------------------------- episodes
@dataclass
class Episodes(GenerationOutput):
    """Played episodes in the layout of a single-turn rollout (sequences and masks (B, T + N),
    the opening in the prompt's place), plus what the environment said. `action_mask` is 1 on
    the policy's tokens only; `attention_mask` on every real token (the replies too)."""
    rewards: torch.Tensor | None = None   # (B, N) each step's reward on its turn's last action
    done: torch.Tensor | None = None      # (B,) bool: the environment ended the episode
    turns: torch.Tensor | None = None     # (B,) policy turns played
    seeds: list = field(default_factory=list)
    transcripts: list = field(default_factory=list)  # per episode [(role, text), ...]
    ended_by: list = field(default_factory=list)      # per episode: env | turns | context

    @property
    def returns(self) -> torch.Tensor:
        """(B,) each episode's return: its rewards summed (no discount)."""
        return self.rewards.sum(-1)


class _Record:
    """What one episode has produced so far: its ids, who wrote each, and per action token
    the sampler's log-prob, entropy and hidden state (with `score`), and per token a reward."""

    def __init__(self, env: Env, opening: list[int]):
        self.env, self.opening = env, opening
        self.ids, self.acted, self.rewards = [], [], []
        self.scores = []  # (logprobs (n,), entropy (n,), hidden (n, C)) per turn
        self.transcript, self.ended_by, self.done = [], "", False


def _grow(cache, columns: int) -> None:
    """Make room in a KVCache for `columns` positions (doubling, keeping what is filled)."""
    have = cache.kv.size(4)
    if columns <= have:
        return
    kv = cache.kv.new_empty(*cache.kv.shape[:4], max(columns, 2 * have), cache.kv.size(5))
    kv[:, :, :, :, :cache.length] = cache.kv[:, :, :, :, :cache.length]
    cache.kv = kv


@torch.no_grad()
def play_episodes(model, tokenizer, env_class, seeds: list[int], max_turns: int,
                  max_new_tokens: int, temperature: float = 1.0, top_k=None, top_p=None,
                  generator=None, score: bool = False, env_name: str = "") -> Episodes:
    """Play one episode per seed with `model` as the policy (module docstring). Returns the
    episodes compacted into one left-padded opening and right-padded turns per row."""
    if score and temperature == 0:
        raise ValueError("score=True needs temperature > 0: greedy decoding has no log-probs")
    name = env_name or getattr(env_class, "__name__", "env")
    eos, pad = tokenizer.eos_id, tokenizer.pad_id
    suppress = pad if pad != eos else None
    block = model.config.block_size
    device = next(model.parameters()).device
    records = []
    for seed in seeds:
        env = Env(env_class, name, seed)
        text = env.reset()
        opening = sequence_start(tokenizer, env.encode(tokenizer, text, "opening"))
        if len(opening) + max_new_tokens > block:
            raise UserError(f"environment {name}: the opening of episode seed {seed} is "
                            f"{len(opening)} tokens, and a turn of --max_new_tokens "
                            f"{max_new_tokens} more does not fit the context of {block}; "
                            f"shorten the opening or lower --max_new_tokens")
        record = _Record(env, opening)
        record.transcript.append(("env", text))
        records.append(record)

    was_training = model.training
    model.eval()
    with torch.inference_mode():
        _play(model, tokenizer, records, max_turns, max_new_tokens, temperature, top_k, top_p,
              generator, score, eos, pad, suppress, block, device)
    model.train(was_training)
    return _compact(records, seeds, pad, device, score)


def _play(model, tokenizer, records, max_turns, max_new_tokens, temperature, top_k, top_p,
          generator, score, eos, pad, suppress, block, device):
    """The turns of `play_episodes`, filling each _Record. `live` lists the records still
    playing, in the order of the batch's rows."""
    live = list(records)
    ids, mask = (x.to(device) for x in left_pad([r.opening for r in live], pad))
    # the rows will be compacted to one width, the longest opening plus the longest run of
    # turns (_compact), and the trainer's passes need that width to fit the context: so the
    # longest opening counts for every row when deciding whether another turn fits
    opening = ids.size(1)
    # a first guess at the columns; _grow makes room as the turns come
    cache = model.new_kv_cache(len(live), min(opening + max_turns * (max_new_tokens + 4), block))
    logits, hidden = next_token_logits(model, ids, mask, position_ids_from_mask(mask), cache, suppress)
    n_real = mask.sum(-1)                                   # (b,) real tokens of each row so far
    for turn in range(1, max_turns + 1):
        # ---- the policy's turn: every live row writes until its EOS or the token budget
        _grow(cache, cache.length + max_new_tokens)
        b = len(live)
        ended = torch.zeros(b, dtype=torch.bool, device=device)
        steps = []  # per step: (token, real) and, with score, (logprob, entropy, hidden)
        for t in range(max_new_tokens):
            token = sample_next(logits, temperature, top_k, top_p, generator)   # (b,)
            real = ~ended
            token = token.masked_fill(ended, pad)
            ended = ended | (token == eos)
            scores = (*tempered_logprobs(logits, token, temperature, suppress, "value"), hidden) \
                if score else ()
            steps.append((token, real, *scores))
            if t + 1 == max_new_tokens or bool(ended.all()):
                break  # the last token is fed with the reply, below
            mask = torch.cat([mask, real.long()[:, None]], 1)
            logits, hidden = next_token_logits(model, token[:, None], mask, n_real[:, None],
                                               cache, suppress)
            n_real = n_real + real.long()
        tokens = torch.stack([s[0] for s in steps], 1)                 # (b, t)
        reals = torch.stack([s[1] for s in steps], 1)                  # (b, t)
        if score:
            lps, ents, hids = (torch.stack([s[i] for s in steps], 1) for i in (2, 3, 4))

        # ---- the environment's turn: step each episode with its turn's text
        keep, new_ids = [], []
        for row, (record, token_row, real_row) in enumerate(zip(live, tokens.tolist(), reals.tolist())):
            action = [tok for tok, r in zip(token_row, real_row) if r]
            record.ids += action
            record.acted += [1] * len(action)
            record.rewards += [0.0] * len(action)
            if score:
                n = len(action)
                record.scores.append((lps[row, :n].clone(), ents[row, :n].clone(),
                                      hids[row, :n].clone()))
            text = tokenizer.decode([tok for tok in action if tok != eos])
            record.transcript.append(("policy", text))
            reply, reward, done = record.env.step(text)
            record.rewards[-1] += reward
            record.transcript.append(("env", reply))
            if done or turn == max_turns:
                record.ended_by, record.done = ("env" if done else "turns"), done
                continue
            reply_ids = record.env.encode(tokenizer, reply, "reply")
            # the turn's last column was sampled but not fed in yet: it goes in with the reply
            pending_ids = [action[-1]] if real_row[-1] else []
            if opening + len(record.ids) + len(reply_ids) + max_new_tokens > block:
                record.ended_by = "context"  # the reply and another turn do not fit
                continue
            record.ids += reply_ids
            record.acted += [0] * len(reply_ids)
            record.rewards += [0.0] * len(reply_ids)
            keep.append(row)
            new_ids.append(pending_ids + reply_ids)
        if not keep:
            return
        # ---- finished episodes leave the batch; the others read their reply
        if len(keep) < b:
            index = torch.tensor(keep, device=device)
            cache.kv = cache.kv[:, :, index]
            mask, n_real = mask[index], n_real[index]
            live = [live[i] for i in keep]
        block_ids, block_mask = (x.to(device) for x in left_pad(new_ids, pad))
        # each row's pending token (if real) and its reply, numbered on from its real tokens
        positions = (n_real[:, None] + block_mask.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([mask, block_mask], 1)
        _grow(cache, cache.length + block_ids.size(1))
        logits, hidden = next_token_logits(model, block_ids, mask, positions, cache, suppress)
        n_real = n_real + block_mask.sum(-1)


def _compact(records, seeds, pad, device, score) -> Episodes:
    """The episodes as rows [left pad][opening][turns and replies][right pad] (module docstring)."""
    B = len(records)
    T = max(len(r.opening) for r in records)
    N = max(len(r.ids) for r in records)
    sequences = torch.full((B, T + N), pad, dtype=torch.long)
    attention = torch.zeros(B, T + N, dtype=torch.long)
    acted = torch.zeros(B, T + N, dtype=torch.long)
    rewards = torch.zeros(B, N)
    for i, r in enumerate(records):
        t, n = len(r.opening), len(r.ids)
        sequences[i, T - t:T + n] = torch.tensor(r.opening + r.ids)
        attention[i, T - t:T + n] = 1
        acted[i, T:T + n] = torch.tensor(r.acted)
        rewards[i, :n] = torch.tensor(r.rewards)
    logprobs = entropy = hidden = None
    if score:
        C = records[0].scores[0][2].size(-1)
        logprobs, entropy = torch.zeros(B, N, device=device), torch.zeros(B, N, device=device)
        hidden = torch.zeros(B, N, C, device=device, dtype=records[0].scores[0][2].dtype)
        for i, r in enumerate(records):
            where = torch.tensor(r.acted).nonzero().squeeze(-1).to(device)  # action columns
            logprobs[i, where] = torch.cat([s[0] for s in r.scores]).float()
            entropy[i, where] = torch.cat([s[1] for s in r.scores]).float()
            hidden[i, where] = torch.cat([s[2] for s in r.scores])
    return Episodes(
        sequences.to(device), attention.to(device), acted.to(device), T, logprobs, entropy,
        hidden, rewards=rewards.to(device),
        done=torch.tensor([r.done for r in records], device=device),
        turns=torch.tensor([sum(1 for role, _ in r.transcript if role == "policy") for r in records],
                           device=device),
        seeds=list(seeds), transcripts=[r.transcript for r in records],
        ended_by=[r.ended_by for r in records])


@torch.no_grad()
def play_and_measure(model, source: "EpisodeSource", seeds, cfg, batch_size: int,
                     generator=None) -> tuple[dict, list]:
    """Play the episodes of `seeds` in batches and measure them: (figures, transcripts) with
    figures reward (the mean return), turns, done_rate (the share the environment ended) and
    the environment's own (`environment_figures`). The scripts' evals of held-out episodes."""
    seeds = list(seeds)
    transcripts, returns, turns, done = [], [], [], []
    for i in range(0, len(seeds), batch_size):
        ep = source.play(model, seeds[i:i + batch_size], cfg, generator)
        transcripts += ep.transcripts
        returns += ep.returns.tolist()
        turns += ep.turns.tolist()
        done += ep.done.tolist()
    n = max(1, len(seeds))
    figures = {"reward": sum(returns) / n, "turns": sum(turns) / n, "done_rate": sum(done) / n}
    figures.update(environment_figures(source.env_class, transcripts, returns))
    return figures, transcripts


def transcript_text(transcript: list[tuple[str, str]]) -> str:
    """A transcript as lines "env: ..." / "policy: ..." for printing."""
    return "\n".join(f"{role:>6}: {text}" for role, text in transcript)


@dataclass
class EpisodeSource:
    """What a trainer needs to roll out episodes (ppo_trainer.PPOTrainer `episodes`): the
    environment, the tokenizer that writes its text, the turn budget, and whether its tokens
    are masked out of the losses (`mask_env`; False only to show what the mask is for)."""
    env_class: type
    name: str
    tokenizer: object
    max_turns: int
    mask_env: bool = True

    def play(self, model, seeds, cfg, generator=None, score: bool = False) -> Episodes:
        """Episodes of `seeds` sampled as `cfg` says (max_new_tokens per turn, temperature,
        top_k, top_p)."""
        top_k, top_p = getattr(cfg, "top_k", 0), getattr(cfg, "top_p", 1.0)
        return play_episodes(model, self.tokenizer, self.env_class, seeds, self.max_turns,
                             cfg.max_new_tokens, cfg.temperature, top_k or None,
                             top_p if top_p < 1 else None, generator, score, self.name)


class EnvironmentReward:
    """The reward source of a run with an environment: each step of the environment gives its
    reward (`play`), so the trainer never calls this; it only has what the script asks of
    every reward (rewards.ModelReward's `begin` and `figures`)."""
    clipped = False

    def __call__(self, *args, **kwargs):
        raise AssertionError("with an environment the rewards come from its steps")

    def begin(self, at: str = "") -> None:
        pass

    def figures(self) -> dict:
        return {}


class EpisodeSeeds:
    """train_ppo.py's source of rollouts with --env, in place of its TrainingPrompts: `draw()`
    gives this process's share of one rollout batch's episode seeds (at or above
    HELD_OUT_SEEDS; a group of group_size episodes shares its seed), `figures` the training
    episodes' environment figures, `evaluate` plays the held-out seeds 0, 1, ..."""

    def __init__(self, cfg, local, env_class, name: str, device, generator):
        self.cfg, self.local, self.env_class, self.name = cfg, local, env_class, name
        self.device, self.generator = device, generator
        self.group = cfg.group_size if cfg.algo in GROUP_ALGOS else 1

    def encode(self, block_size: int) -> None:
        require_room_for_prompt(self.cfg.max_new_tokens, block_size)

    def describe(self) -> str:
        return (f"episodes of {self.name} (up to {self.cfg.max_turns} turns), "
                f"{self.cfg.eval_prompts} eval episodes")

    def draw(self) -> list[int]:
        idx = torch.randint(HELD_OUT_SEEDS, 2 ** 31 - 1, (self.cfg.rollout_batch_size // self.group,),
                            generator=self.generator)
        return shard(idx.repeat_interleave(self.group).tolist(), self.local.rollout_batch_size)

    def figures(self, experiences) -> dict:
        returns = [x for e in experiences for x in e.scores.tolist()]  # each episode's
        return mean_over_ranks(environment_figures(self.env_class, None, returns))

    @torch.no_grad()
    def evaluate(self, step: int, trainer, recorder, log, reward_fn=None, score_name="") -> dict:
        """Held-out episodes (seeds 0, 1, ...), sampled as in training: the mean return, KL,
        turns and the share the environment ended, and the built-in environment's figures."""
        gen = torch.Generator(device=self.device).manual_seed(self.cfg.seed + 7)  # same each eval
        seeds = list(range(self.cfg.eval_prompts))
        batch = self.local.rollout_batch_size
        sums, transcripts, returns = {"reward": 0.0, "kl": 0.0, "turns": 0.0, "done_rate": 0.0}, [], []
        for i in range(0, len(seeds), batch):
            exp, stats, ep = trainer.play(seeds[i:i + batch], gen, for_update=False)
            recorder.record(trainer, step, exp, first=i, episodes=ep)
            n = len(ep.seeds)
            for k, source in (("reward", "rm_score"), ("kl", "kl"), ("turns", "turns"),
                              ("done_rate", "eos_rate")):
                sums[k] += stats[source] * n
            transcripts += ep.transcripts
            returns += ep.returns.tolist()
        figures = {k: v / len(seeds) for k, v in sums.items()}
        figures.update(environment_figures(self.env_class, transcripts, returns))
        log.log(step, split="eval", **figures)
        tqdm.write(f"eval {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items()))
        for transcript in transcripts[:2]:
            tqdm.write("  " + " | ".join(f"{role} {text}" for role, text in transcript))
        return figures
