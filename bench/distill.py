"""On-policy distillation against RL, on the built-in tasks' exact gold: does a student reach
its teacher's quality, and at what share of RL's compute?

    python bench/distill.py                                  # the whole study (hours: below)
    python bench/distill.py --tasks sort --seeds 0 --iters 100     # a quicker look
    python bench/distill.py --summary_only                   # the table from the JSON
    python bench/distill.py --smoke --work /tmp/d --results /tmp/d.json --iters 2   # tiny sizes

The teachers (one per task, in --work/TASK/teacher, trained here at the scripts' defaults with
their SFT policy in --work/TASK/sft and reward model in --work/TASK/rm, unless a finished run is
already there: runs made earlier can be copied in, their training FLOPs then unknown):
- reviews: the built-in pipeline, `train_sft.py`, `train_rm.py`, `train_ppo.py` (PPO against
  the reward model, 200 iterations);
- sort: `train_sft.py --task sort`, then `train_ppo.py --task sort --reward task --algo grpo`
  (GRPO against the exact check, 200 iterations).
Their held-out evals run every --eval_interval iterations too (that changes no training).

The students (--students): `same`, the teacher's size, starting from the SFT policy the
teacher started from; `small`, fewer layers and narrower (--small: layers, heads, width;
2 2 64 against the teacher's 4 4 128), from an SFT run of its own size on the same
demonstrations (`train_sft.py --n_layer 2 --n_head 2 --n_embd 64`). One SFT policy per size
(seed 1337, the scripts' default); the seeds (--seeds) are those of the runs below.

The methods (--methods), each for every task, student and seed, --iters iterations:
- distill: `train_ppo.py --algo distill --teacher_dir TEACHER` (sequence form, the default);
- distill_token: the same with `--distill_form token`;
- sft_teacher: off-policy distillation, SFT on the teacher's samples, at the number of teacher
  tokens the distill run of the same task, student and seed consumed. There the teacher graded
  every token the student sampled in training (the sum of its iterations' `gen_tokens`: every
  response token, EOS included, cut-off responses too). Here, iteration by iteration, the
  teacher answers 64 training prompts drawn at random (at temperature 1, --max_new_tokens 32,
  as the student samples), its answers that ended with EOS become demonstrations (as
  `sample.py --out` writes them), each counting its response tokens and EOS (what SFT learns
  from), until the count reaches the distill run's (the last demonstration may pass it, by at
  most one response). Each iteration's demonstrations are learnt as distill learns a rollout
  batch: 4 epochs in minibatches of 16 (train_ppo.py's --ppo_epochs and --minibatch_size), by
  AdamW at --sft_lr (1e-4, distill's rate, no weight decay, gradients clipped at 1, the rate
  falling linearly to 0 as the tokens are spent), on SFT's loss (next-token cross-entropy
  on the response and EOS), from the student's SFT policy. (`train_sft.py --data` trains a
  new model, whose tokenizer it builds from the file: it cannot start from the student.)
- rl: RL from the reward the teacher had, at the defaults: PPO against the reward model on
  reviews (its separate critic from the reward model, of the teacher's size), GRPO with
  `--reward task` on sort;
- rl_grpo (reviews only): GRPO against the reward model;
- distill_then_rl: distill for round(--split x --iters) iterations, then the rl row's method
  for the rest, from the distilled student (`--sft_dir` its folder: it is RL's start and
  reference), each part with its own learning-rate decay. The curve joins the two.

Per run, in bench/results/distill.json as it ends (a run there is not run again unless
--rerun; a train_ppo.py run killed part-way resumes from its checkpoint, its FLOP counts from
the file beside it, model_flops.json; an sft_teacher run, a few minutes, starts again):
- the held-out eval every --eval_interval iterations (train_ppo.py's own: --eval_prompts
  prompts, one sample each at temperature 1; for sft_teacher the same, computed here): step,
  gold (sort: the accuracy), kl (distill and sft_teacher: to the teacher; RL: to its
  reference, the policy it started from), gold_unseen on sort; with the model FLOPs and the
  training seconds (evals left out) spent before it, and the response tokens learnt from by
  then (the student's own samples; sft_teacher's, the teacher's); teacher_tokens, those the
  teacher graded (distill) or wrote (sft_teacher);
- the final figures of the run's log, its wall seconds, its FLOPs per phase and model;
- model FLOPs (model_flops.py): 2 x parameters per position in a forward pass, 4 x in a
  backward, counted in the models' own passes (every model the method runs: policy, teacher,
  reference, critic, reward model, value head), in phases: train (the method's cost), eval,
  monitor (the watch's largest log-ratio pass). The stages (SFT, the reward model's training,
  the teacher's RL) are counted apart, in "stages";
- reached: the first eval whose gold is within --tolerance (0.02: on sort 2 points of
  accuracy) of the teacher's held-out gold, with its step, FLOPs, seconds and teacher tokens,
  or None; held: the same for the first eval from which the mean of three evals in a row is
  within it, at the last of the three (one eval's gold swings by several points: reaching it
  once can be luck);
- the final student measured by the bench: --final_samples answers to each of the
  --eval_prompts held-out prompts: its gold, its KL to the teacher, and its gold on the
  prompts where the teacher is wrong and on the others. "Wrong" is decided by one draw of the
  teacher's answers (the same number per prompt): its mean gold below 0 on reviews, right
  less than half the time on sort; the teacher's own figure on those prompts comes from a
  second, independent draw (the first is low on them by selection);
- on sort, pass@k of the final student (lab/passk.py): --passk_n answers (64) to each of the
  first --passk_problems held-out problems (200), k = 1, 2, 4, .. --passk_n.
The teachers and the SFT students are measured the same way ("references").

Afterwards, `--errors` (on the merged JSON) asks the error question on more prompts than the
held-out 200, on which a good teacher is wrong too rarely to tell: the training prompts and the
held-out ones (2,200), --final_samples answers each from the teacher, the prompts where it is
wrong as above; every SFT student and every run's final policy answers those prompts as often
(seed 5000 + the run's seed): its gold there and, on sort, the share of its answers that are
word for word the teacher's most common wrong answer to the prompt ("copied"; the teacher's own
share from a second draw is the mark of a full copy). Saved policy by policy, resumable:

    python bench/distill.py --errors --results bench/results/distill.json

Cost, from the training seconds per iteration of one seed at --iters 10 (2026-11-29, one
thread, the 2-core machine shared with other work: load about 4.5; alone it should take about
half), teacher's size / small student:
    sort     distill 0.66 / 0.50, distill_token 0.35 / 0.44, sft_teacher 0.94 / 0.42,
             rl (GRPO) 0.76 / 0.26, distill_then_rl 0.78 / 0.31
    reviews  distill 0.76 / 0.68, distill_token 0.92 / 0.56, sft_teacher 0.91 / 0.71,
             rl (PPO) 2.96 / 1.80, rl_grpo 1.46 / 0.40, distill_then_rl 2.54 / 1.16
and about 1 s (0.4-2.9) per held-out eval, 41 of them in a run of 200 iterations; the final
measures take ~8 s per policy on reviews, ~19 s on sort (pass@k). At those rates the default
grid (66 runs of 200 iterations) takes about 3.0 h on reviews and 1.2 h on sort, the stages
(4 SFT runs, the reward model, the 2 teachers) and the measures 0.6 h more: about 5 CPU hours,
give or take half (the rates move as responses lengthen or shorten in training). A process
per task brings the wall time on 2 cores down to the longer task's, about 3.5 h:

    python bench/distill.py --tasks reviews --results bench/results/distill_reviews.json &
    python bench/distill.py --tasks sort --results bench/results/distill_sort.json
    python bench/distill.py --merge bench/results/distill_reviews.json bench/results/distill_sort.json

(`--iters 100` halves the cost, with RL runs half as long as the teachers'.)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import results_file  # noqa: E402
import torch  # noqa: E402
from model_flops import FlopCounter  # noqa: E402

import train_ppo  # noqa: E402
import train_rm  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.data import SFTData  # noqa: E402
from mingpt_rlhf.evaluate import generate_batches, response_texts  # noqa: E402
from mingpt_rlhf.lab.passk import pass_at_k_curve, right_answers  # noqa: E402
from mingpt_rlhf.logprobs import lm_loss, sequence_logprobs  # noqa: E402
from mingpt_rlhf.machinery.checkpoint import save_checkpoint  # noqa: E402
from mingpt_rlhf.stages import load_policy, weights_for_later_stages  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402
from mingpt_rlhf.machinery.runtime import (autocast, hold_frozen_in, pick_device,  # noqa: E402
                                           resolve_dtype)
from mingpt_rlhf.optim import Optimizer  # noqa: E402
from mingpt_rlhf.tasks import get_task  # noqa: E402
from sample import demonstrations_of  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "distill.json")
SIDECAR = "model_flops.json"
METHODS = ("distill", "distill_token", "sft_teacher", "rl", "rl_grpo", "distill_then_rl")
# per task: the teacher's train_ppo.py options and the RL rows' (the reward the teacher had)
TASKS = {"reviews": dict(teacher={}, rl={}, rl_grpo=dict(algo="grpo"), reward_model=True),
         "sort": dict(teacher=dict(algo="grpo", reward="task"), rl=dict(algo="grpo", reward="task"),
                      reward_model=False)}
# what a sort answer can be: the longest is 7 digits and EOS (lab/passk.py's default)
PASSK_TOKENS = 16
# sizes: the scripts' defaults for the study; --smoke's tiny ones check the code path only
FULL = dict(sft={}, rm={}, ppo={}, teacher_iters=None)
SMOKE = dict(sft=dict(n_layer=2, n_head=2, n_embd=32, block_size=48, batch_size=16, max_iters=20,
                      eval_interval=10, eval_prompts=16, warmup_iters=2),
             rm=dict(n_pairs=160, batch_size=16, eval_interval=5, norm_samples=32),
             ppo=dict(rollout_batch_size=16, minibatch_size=8, ppo_epochs=1, max_new_tokens=16,
                      group_size=4),
             teacher_iters=2)


# ---------------------------------------------------------------- runs with their FLOPs counted

def ppo_config(size: dict) -> train_ppo.Config:
    """train_ppo.py's config at a size's options (group_size is GRPO's, given per run)."""
    return train_ppo.Config(**{k: v for k, v in size["ppo"].items() if k != "group_size"})


def finished(out_dir: str) -> bool:
    path = os.path.join(out_dir, "metrics.jsonl")
    return os.path.exists(path) and any(r.get("final") for r in read_metrics(path)[-1:])


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


@contextlib.contextmanager
def counted_train_ppo_internals(counter: FlopCounter, state: dict, sidecar: str):
    """train_ppo.py's models named for `counter` as it loads them; its evals counted in the
    "eval" phase, each noting the training FLOPs and seconds spent before it; the watch's
    log-ratio pass in "monitor"; at every checkpoint `state` (the counts, the eval points, the
    seconds) written to `sidecar` under the checkpoint's step, just before the checkpoint
    (a run killed between the two writes resumes from the previous checkpoint, whose state
    is kept beside it)."""
    start, seconds_before, in_eval = time.time(), state["seconds"], [0.0]

    def train_seconds() -> float:
        return seconds_before + time.time() - start - in_eval[0]

    load_models, evaluate = train_ppo.load_models, train_ppo.TrainingPrompts.evaluate
    largest, save = train_ppo.largest_logratio, train_ppo.Run.save

    def named_models(cfg, device, dtype):
        tokenizer, actor, ref, rm, critic, value_head = models = load_models(cfg, device, dtype)
        counter.name(actor, "policy")
        for model, label in ((ref, "teacher" if cfg.algo == "distill" else "reference"),
                             (rm, "reward model"), (critic, "critic"), (value_head, "value head")):
            if model is not None:
                counter.name(model, label)
        return models

    def counted_evaluate(self, step, *args, **kwargs):
        point = {"step": step, "flops": counter.total("train"), "seconds": round(train_seconds(), 2)}
        t = time.time()
        with counter.in_phase("eval"):
            figures = evaluate(self, step, *args, **kwargs)
        in_eval[0] += time.time() - t
        state["evals"].append(point)
        return figures

    def counted_largest(*args, **kwargs):
        with counter.in_phase("monitor"):
            return largest(*args, **kwargs)

    def save_with_counts(run, step):
        state.update(flops=counter.state(), seconds=round(train_seconds(), 2))
        saves = read_json(sidecar)["saves"] if os.path.exists(sidecar) else {}
        last = {k: v for k, v in saves.items() if int(k) < step}
        kept = {k: last[k] for k in sorted(last, key=int)[-1:]}
        write_json(sidecar, {"saves": {**kept, str(step): json.loads(json.dumps(state))}})
        save(run, step)

    train_ppo.load_models, train_ppo.TrainingPrompts.evaluate = named_models, counted_evaluate
    train_ppo.largest_logratio, train_ppo.Run.save = counted_largest, save_with_counts
    try:
        yield
    finally:
        train_ppo.load_models, train_ppo.TrainingPrompts.evaluate = load_models, evaluate
        train_ppo.largest_logratio, train_ppo.Run.save = largest, save


def last_counts(sidecar: str) -> dict | None:
    """The counts of a run's last checkpoint (its end, for a finished run), or None."""
    if not os.path.exists(sidecar):
        return None
    saves = read_json(sidecar)["saves"]
    return saves[max(saves, key=int)]


def counted_train_ppo(out_dir: str, **options) -> dict | None:
    """train_ppo.py into `out_dir` with `options` (resumed, or left alone when finished, as
    results_file.train_stage does), its model FLOPs counted: {"flops": {phase: {model:
    FLOPs}}, "evals": [{"step", "flops", "seconds"}], "seconds", "partial"} as kept beside its
    checkpoints (SIDECAR); None for a run that finished without them (one made elsewhere).
    "partial": a run resumed whose earlier part was not counted."""
    sidecar = os.path.join(out_dir, SIDECAR)
    if finished(out_dir):
        return last_counts(sidecar)
    counter = FlopCounter()
    state = {"flops": {}, "evals": [], "seconds": 0.0, "partial": False}
    ckpt = os.path.join(out_dir, "ckpt.pt")
    if os.path.exists(ckpt):  # resumed: from the counts saved with its checkpoint's step
        step = torch.load(ckpt, map_location="cpu", mmap=True, weights_only=False)["step"]
        saves = read_json(sidecar)["saves"] if os.path.exists(sidecar) else {}
        state = saves.get(str(step), dict(state, partial=True))
        counter.load(state["flops"])
    with counter, counted_train_ppo_internals(counter, state, sidecar):
        results_file.train_stage(train_ppo.main, train_ppo.Config, out_dir, **options)
    return last_counts(sidecar)


def counted_stage(main, config_class, out_dir: str, label: str, **options) -> dict | None:
    """An SFT or reward-model stage (resumed, or left alone when finished), every pass of its
    model counted under `label`: {"flops", "seconds", "resumed"}; None when it had finished
    before (then its cost was not seen here)."""
    if finished(out_dir):
        return None
    resumed = os.path.exists(os.path.join(out_dir, "ckpt.pt"))
    start = time.time()
    with FlopCounter(default=label) as counter:
        results_file.train_stage(main, config_class, out_dir, **options)
    return {"flops": counter.state(), "seconds": round(time.time() - start, 1), "resumed": resumed}


def curve_of(out_dir: str, counted: dict | None, offset: dict | None = None) -> list[dict]:
    """The run's held-out evals: step, gold, kl (gold_unseen, well_formed), with the training
    FLOPs and seconds spent before each and the response tokens generated in training by
    then. `offset` ({"step", "flops", "seconds", "tokens"}): a second part's start."""
    offset = offset or {"step": 0, "flops": 0.0, "seconds": 0.0, "tokens": 0}
    rows = read_metrics(os.path.join(out_dir, "metrics.jsonl"))
    at = {e["step"]: e for e in (counted or {}).get("evals", [])}
    tokens, by_step = 0, {}
    for r in rows:
        if "split" not in r and not r.get("final"):
            tokens += r["gen_tokens"]
            by_step[r["step"]] = tokens
    curve = []
    for r in rows:
        if r.get("split") != "eval":
            continue
        point = {"step": r["step"] + offset["step"],
                 **{k: r[k] for k in ("gold", "gold_unseen", "kl", "well_formed") if k in r}}
        if r["step"] in at:
            point.update(flops=at[r["step"]]["flops"] + offset["flops"],
                         seconds=round(at[r["step"]]["seconds"] + offset["seconds"], 2))
        point["tokens"] = by_step.get(r["step"], 0) + offset["tokens"]
        curve.append(point)
    return curve


def ppo_record(out_dir: str, counted: dict | None) -> dict:
    """What the JSON keeps of a train_ppo.py run."""
    rows = read_metrics(os.path.join(out_dir, "metrics.jsonl"))
    final = rows[-1]
    record = {"curve": curve_of(out_dir, counted),
              "final": {k: final[k] for k in ("gold", "gold_unseen", "kl", "well_formed",
                                              "distinct2") if k in final},
              "tokens": sum(r["gen_tokens"] for r in rows if "split" not in r and not r.get("final")),
              "ran_with": results_file.ran_with(out_dir)}
    if counted is not None:
        record.update(flops=counted["flops"], train_flops=sum(counted["flops"].get("train", {}).values()),
                      seconds=counted["seconds"], partial=counted["partial"])
    return record


# ---------------------------------------------------------------- sampling and measuring

@torch.no_grad()
def answers(policy, tokenizer, prompts: list[str], max_new_tokens: int, batch: int, seed: int,
            teacher=None):
    """One sample per prompt (repeat a prompt to get more), as train_ppo.py's eval samples
    (temperature 1, PAD never written): (texts, each response's KL to `teacher`, or None),
    the KL being the sum over the response's tokens of log pi - log pi_teacher."""
    generator = torch.Generator(next(policy.parameters()).device).manual_seed(seed)
    texts, kls = [], []
    for out in generate_batches(policy, tokenizer, prompts, max_new_tokens, batch, generator=generator):
        texts += response_texts(tokenizer, out)
        if teacher is not None:
            T, mask = out.prompt_len, out.action_mask[:, out.prompt_len:].float()
            logp = [sequence_logprobs(m, out.sequences, out.attention_mask, T,
                                      suppress=tokenizer.pad_id)[0] for m in (policy, teacher)]
            kls += ((logp[0] - logp[1]) * mask).sum(-1).tolist()
    return texts, (kls if teacher is not None else None)


def held_out_eval(policy, teacher, tokenizer, task, prompts, max_new_tokens, batch, seed) -> dict:
    """train_ppo.py's held-out eval, for a policy trained outside it: one answer per prompt
    from the generator of seed + 7, gold, well_formed, gold_unseen (sort) and the KL to the
    teacher."""
    texts, kls = answers(policy, tokenizer, prompts, max_new_tokens, batch, seed + 7, teacher)
    return {"gold": sum(task.gold_reward(p, t) for p, t in zip(prompts, texts)) / len(prompts),
            **task.extra_eval_figures(prompts, texts), "kl": sum(kls) / len(kls),
            "well_formed": sum(task.well_formed(p, t) for p, t in zip(prompts, texts)) / len(prompts)}


def per_prompt_gold(policy, tokenizer, task, prompts, n, max_new_tokens, batch, seed, teacher=None):
    """(each prompt's mean gold over n answers, the mean KL to `teacher` or None)."""
    repeated = [p for p in prompts for _ in range(n)]
    texts, kls = answers(policy, tokenizer, repeated, max_new_tokens, batch, seed, teacher)
    golds = [task.gold_reward(p, t) for p, t in zip(repeated, texts)]
    means = [sum(golds[i * n:(i + 1) * n]) / n for i in range(len(prompts))]
    return means, (sum(kls) / len(kls) if kls is not None else None)


def mean_where(values: list[float], flags: list[bool], keep: bool) -> float | None:
    """The mean of the values whose flag is `keep` (None if there are none)."""
    kept = [v for v, f in zip(values, flags) if f == keep]
    return sum(kept) / len(kept) if kept else None


def teacher_wrong(task_name: str, gold: float) -> bool:
    """Whether a prompt's mean gold says the teacher is wrong there: below 0 on reviews (the
    gold is in [-1, 1]), right less than half the time on sort."""
    return gold < 0.0 if task_name == "reviews" else gold < 0.5


def measure_final(folder: str, task_name: str, task, teacher, tokenizer, teacher_side: dict,
                  args, max_new_tokens: int, seed: int) -> dict:
    """The bench's own figures of a final policy (module docstring): gold over --final_samples
    answers per held-out prompt, KL to the teacher, gold on the teacher's wrong and right
    prompts, and on sort pass@k."""
    policy = load_policy(folder, flag="policy", frozen=True)[0].to(pick_device(args.device))
    prompts = task.prompts("eval")[:args.eval_prompts]
    means, kl = per_prompt_gold(policy, tokenizer, task, prompts, args.final_samples,
                                max_new_tokens, 64, seed, teacher)
    wrong = teacher_side["wrong"]
    figures = {"gold": sum(means) / len(means), "kl_teacher": kl,
               "gold_teacher_wrong": mean_where(means, wrong, True),
               "gold_teacher_right": mean_where(means, wrong, False)}
    if task_name == "sort":
        figures["passk"] = passk_of(policy, tokenizer, task, args, seed)
    return figures


def passk_of(policy, tokenizer, task, args, seed) -> dict:
    prompts = task.prompts("eval")[:args.passk_problems]
    generator = torch.Generator(next(policy.parameters()).device).manual_seed(seed)
    right = right_answers(policy, tokenizer, task, prompts, args.passk_n, PASSK_TOKENS,
                          generator=generator)
    ks = [2 ** i for i in range(args.passk_n.bit_length()) if 2 ** i <= args.passk_n]
    return {str(k): v for k, v in pass_at_k_curve([(args.passk_n, c) for c in right], ks).items()}


def measure_teacher(task_name: str, task, folder: str, args, max_new_tokens: int) -> dict:
    """The teacher's held-out figures: draw A (seed 1000) decides on which prompts it is wrong,
    draw B (seed 2000) gives its gold there and overall; on sort its pass@k."""
    teacher, tokenizer, _ = load_policy(folder, flag="teacher", frozen=True)
    teacher.to(pick_device(args.device))
    prompts = task.prompts("eval")[:args.eval_prompts]
    first, _ = per_prompt_gold(teacher, tokenizer, task, prompts, args.final_samples, max_new_tokens, 64, 1000)
    second, _ = per_prompt_gold(teacher, tokenizer, task, prompts, args.final_samples, max_new_tokens, 64, 2000)
    wrong = [teacher_wrong(task_name, g) for g in first]
    figures = {"gold": sum(second) / len(second), "wrong": wrong, "prompts_wrong": sum(wrong),
               "gold_teacher_wrong": mean_where(second, wrong, True),
               "gold_teacher_right": mean_where(second, wrong, False)}
    if task_name == "sort":
        figures["passk"] = passk_of(teacher, tokenizer, task, args, 0)
    return figures


# ---------------------------------------------------------------- off-policy: SFT on the teacher's samples

def sft_on_teacher(student_dir: str, teacher_dir: str, task, budget: int, seed: int,
                   ppo: train_ppo.Config, lr: float, eval_prompts: int, eval_interval: int,
                   out_dir: str, device: torch.device) -> dict:
    """The sft_teacher row (module docstring): the student's SFT policy trained on the
    teacher's samples until `budget` teacher tokens, evaluated as train_ppo.py evaluates, its
    FLOPs counted (the teacher's sampling and the student's passes, in phase train), the
    final student saved as a policy checkpoint in `out_dir` (no resuming: a killed run starts
    again). On `device`, in the dtype train_ppo.py would take there (bfloat16 autocast on a
    GPU that has it)."""
    start = time.time()
    counter, in_eval = FlopCounter(), [0.0]
    curve, used = [], 0
    with counter:
        dtype = resolve_dtype("auto", device)
        amp = lambda: autocast(device, dtype)
        teacher, tokenizer, _ = load_policy(teacher_dir, flag="--teacher_dir", frozen=True)
        student = load_policy(student_dir, flag="student")[0].to(device)
        hold_frozen_in(teacher.to(device), dtype)
        counter.name(teacher, "teacher")
        counter.name(student, "policy")
        params = [p for p in student.parameters() if p.requires_grad]
        optimizer = Optimizer([{"params": params, "lr": lr, "weight_decay": 0.0}], dtype, device,
                              ppo.grad_clip)
        train_prompts, held_out = task.prompts("train"), task.prompts("eval")[:eval_prompts]
        prompt_gen = torch.Generator().manual_seed(seed)             # which prompts (CPU)
        sample_gen = torch.Generator(device).manual_seed(seed + 1)   # the teacher's tokens
        shuffle_gen = torch.Generator().manual_seed(seed + 2)        # minibatch order (CPU)

        def evaluate(step):
            point = {"step": step, "flops": counter.total("train"),
                     "seconds": round(time.time() - start - in_eval[0], 2), "tokens": used}
            t = time.time()
            with counter.in_phase("eval"), amp():
                point.update(held_out_eval(student, teacher, tokenizer, task, held_out,
                                           ppo.max_new_tokens, ppo.rollout_batch_size, seed))
            in_eval[0] += time.time() - t
            curve.append(point)

        evaluate(0)
        step = idle = 0
        while used < budget:
            picked = torch.randint(len(train_prompts), (ppo.rollout_batch_size,), generator=prompt_gen)
            prompts = [train_prompts[i] for i in picked.tolist()]
            with torch.no_grad(), amp():
                out = next(generate_batches(teacher, tokenizer, prompts, ppo.max_new_tokens,
                                            len(prompts), generator=sample_gen))
            lengths = out.action_mask[:, out.prompt_len:].sum(-1).tolist()  # response + EOS
            demos, scale = [], 1.0 - used / budget   # the rate falls as the tokens are spent
            for p, text, n in zip(prompts, demonstrations_of(tokenizer, out), lengths):
                if text is not None and used < budget:
                    demos.append((p, text))
                    used += n
            idle = 0 if demos else idle + 1
            if idle == 10:  # else it would sample for ever
                sys.exit(f"the teacher in {teacher_dir} ended none of its answers in 10 batches "
                         f"of {len(prompts)}: it makes no demonstrations")
            if demos:
                data = SFTData(tokenizer, demos, student.config.block_size)
                optimizer.set_lr_scale(scale)
                student.train()
                for _ in range(ppo.ppo_epochs):
                    order = torch.randperm(len(data), generator=shuffle_gen)
                    for rows in order.split(ppo.minibatch_size):
                        inputs, targets = data.batch(rows.tolist())
                        with amp():
                            loss = lm_loss(student, inputs.to(device), targets.to(device))
                        optimizer.backward(loss)
                        optimizer.step()
                student.eval()
            step += 1
            if step % eval_interval == 0 or used >= budget:
                evaluate(step)
    os.makedirs(out_dir, exist_ok=True)
    save_checkpoint(os.path.join(out_dir, "ckpt.pt"), {
        "stage": "sft_teacher", "model": weights_for_later_stages(student),
        "model_config": asdict(student.config), "tokenizer": tokenizer.state_dict(), "step": step})
    return {"curve": curve, "final": {k: v for k, v in curve[-1].items()
                                      if k not in ("step", "flops", "seconds", "tokens")},
            "tokens": used, "teacher_tokens": used, "budget": budget, "iterations": step,
            "flops": counter.state(), "train_flops": counter.total("train"),
            "seconds": round(time.time() - start - in_eval[0], 2),
            "wall_seconds": round(time.time() - start, 1),
            "ran_with": {"sft_lr": lr, "prompts_per_iteration": ppo.rollout_batch_size,
                         "epochs": ppo.ppo_epochs, "minibatch_size": ppo.minibatch_size,
                         "max_new_tokens": ppo.max_new_tokens, "seed": seed}}


# ---------------------------------------------------------------- the grid

def stage_folders(work: str, task_name: str) -> dict:
    root = os.path.join(work, task_name)
    return {name: os.path.join(root, name) for name in ("sft", "rm", "teacher", "sft_small")}


def train_stages(task_name: str, args, size: dict, result: dict) -> dict:
    """The task's SFT policies, reward model (reviews) and teacher, trained unless finished."""
    folders = stage_folders(args.work, task_name)
    spec = TASKS[task_name]
    done = result.setdefault("stages", {})

    def keep(name, record):  # the first sitting that saw the stage trained records it
        if record is not None and f"{task_name}/{name}" not in done:
            done[f"{task_name}/{name}"] = {**record, "measured": results_file.measured(ROOT),
                                           "command": result["command"]}

    keep("sft", counted_stage(train_sft.main, train_sft.Config, folders["sft"], "sft",
                              task=task_name, device=args.device, **size["sft"]))
    small = dict(size["sft"], n_layer=args.small[0], n_head=args.small[1], n_embd=args.small[2])
    keep("sft_small", counted_stage(train_sft.main, train_sft.Config, folders["sft_small"], "sft",
                                    task=task_name, device=args.device, **small))
    if spec["reward_model"]:
        keep("rm", counted_stage(train_rm.main, train_rm.Config, folders["rm"], "reward model",
                                 sft_dir=folders["sft"], task=task_name, device=args.device,
                                 **size["rm"]))
    teacher_options = dict(size["ppo"], **spec["teacher"], task=task_name, sft_dir=folders["sft"],
                           rm_dir=folders["rm"], eval_interval=args.eval_interval,
                           eval_prompts=args.eval_prompts, device=args.device)
    if size["teacher_iters"]:
        teacher_options["max_iters"] = size["teacher_iters"]
    teacher_options = {k: v for k, v in teacher_options.items()
                       if k != "group_size" or teacher_options.get("algo") == "grpo"}
    counted = counted_train_ppo(folders["teacher"], **teacher_options)
    keep("teacher", ppo_record(folders["teacher"], counted))  # (made elsewhere: no FLOPs)
    return folders


def ppo_options(task_name: str, method: str, args, size: dict, folders: dict, student_sft: str,
                seed: int) -> dict:
    """train_ppo.py's options of a method's (first) run."""
    spec = TASKS[task_name]
    base = dict(size["ppo"], task=task_name, seed=seed, eval_interval=args.eval_interval,
                eval_prompts=args.eval_prompts, sft_dir=student_sft, max_iters=args.iters,
                device=args.device)
    if method.startswith("distill"):
        base.update(algo="distill", teacher_dir=folders["teacher"])
        if method == "distill_token":
            base["distill_form"] = "token"
        if method == "distill_then_rl":
            base["max_iters"] = distill_iters(args)
    else:
        base.update(spec[method], rm_dir=folders["rm"])
    if base.get("algo") not in ("grpo", "distill"):
        base.pop("group_size", None)
    return base


def distill_iters(args) -> int:
    return max(1, min(args.iters - 1, round(args.split * args.iters)))


def run_method(task_name: str, student: str, method: str, seed: int, args, size: dict,
               folders: dict, result: dict) -> dict:
    """One run of the grid (module docstring): its record for the JSON."""
    student_sft = folders["sft"] if student == "same" else folders["sft_small"]
    out = os.path.join(args.work, task_name, student, method, f"seed{seed}")
    start = time.time()
    if method == "sft_teacher":
        distilled = result["runs"].get(f"{task_name}/{student}/distill/{seed}")
        if distilled is None:
            sys.exit(f"sft_teacher matches the teacher tokens of the distill run of "
                             f"{task_name}/{student}/seed {seed}, which is not in {args.results}: "
                             f"put distill before sft_teacher in --methods")
        ppo = ppo_config(size)
        return sft_on_teacher(student_sft, folders["teacher"], get_task(task_name, seed=seed),
                              distilled["teacher_tokens"], seed, ppo, args.sft_lr, args.eval_prompts,
                              args.eval_interval, out, pick_device(args.device))
    options = ppo_options(task_name, method, args, size, folders, student_sft, seed)
    if method != "distill_then_rl":
        counted = counted_train_ppo(out, **options)
        record = ppo_record(out, counted)
        record["wall_seconds"] = round(time.time() - start, 1)
        if method.startswith("distill"):  # the teacher graded every token the student sampled
            record["teacher_tokens"] = record["tokens"]
        return record
    # distillation, then RL from the distilled student
    first, second = os.path.join(out, "distill"), os.path.join(out, "rl")
    counted = counted_train_ppo(first, **options)
    part1 = ppo_record(first, counted)
    rl_options = ppo_options(task_name, "rl", args, size, folders, first, seed)
    rl_options["max_iters"] = args.iters - options["max_iters"]
    counted2 = counted_train_ppo(second, **rl_options)
    part2 = ppo_record(second, counted2)
    end = part1["curve"][-1]
    offset = {"step": end["step"], "flops": part1.get("train_flops", 0.0),
              "seconds": part1.get("seconds", 0.0), "tokens": part1["tokens"]}
    curve2 = curve_of(second, counted2, offset)[1:]  # its step 0 is the distilled student again
    flops = {}  # the two parts' counts added, phase by phase and model by model
    for part in (part1, part2):
        for phase, models in part.get("flops", {}).items():
            for model, f in models.items():
                flops.setdefault(phase, {})[model] = flops.get(phase, {}).get(model, 0.0) + f
    return {"curve": [dict(p, part="distill") for p in part1["curve"]] + [dict(p, part="rl") for p in curve2],
            "final": part2["final"], "tokens": part1["tokens"] + part2["tokens"],
            "teacher_tokens": part1["tokens"],
            "flops": flops, "train_flops": part1.get("train_flops", 0.0) + part2.get("train_flops", 0.0),
            "seconds": part1.get("seconds", 0.0) + part2.get("seconds", 0.0),
            "partial": part1.get("partial", False) or part2.get("partial", False),
            "split": [options["max_iters"], rl_options["max_iters"]],
            "ran_with": {"distill": part1["ran_with"], "rl": part2["ran_with"]},
            "wall_seconds": round(time.time() - start, 1)}


def final_folder(args, task_name: str, student: str, method: str, seed: int) -> str:
    out = os.path.join(args.work, task_name, student, method, f"seed{seed}")
    return os.path.join(out, "rl") if method == "distill_then_rl" else out


def methods_of(task_name: str, methods: list[str]) -> list[str]:
    """The methods that apply to the task, distill first (sft_teacher needs its tokens)."""
    return [m for m in METHODS if m in methods and (m != "rl_grpo" or task_name == "reviews")]


# ---------------------------------------------------------------- the teacher's errors: copied or not

def most_common_wrong(task, prompt: str, texts: list[str]) -> str | None:
    """The wrong answer the teacher gave most often to `prompt` (the first of the most common
    on a tie), or None if every answer was right."""
    wrong = [t.strip() for t in texts if task.gold_reward(prompt, t) < 1.0]
    return max(wrong, key=wrong.count) if wrong else None


def copied_share(texts_by_prompt: list[list[str]], teacher_answers: list[str | None]) -> float | None:
    """The share of a policy's answers that are, word for word, the teacher's most common wrong
    answer to their prompt (over the prompts that have one)."""
    pairs = [(t.strip(), a) for texts, a in zip(texts_by_prompt, teacher_answers) if a is not None
             for t in texts]
    return sum(t == a for t, a in pairs) / len(pairs) if pairs else None


def error_pool(task, args) -> list[str]:
    """The prompts --errors looks over: the training prompts, then the held-out ones."""
    pool = task.prompts("train") + task.prompts("eval")[:args.eval_prompts]
    return pool[:args.errors_prompts] if args.errors_prompts else pool


def error_prompts(task_name: str, task, teacher, tokenizer, args, max_new_tokens: int) -> dict:
    """Where the teacher is wrong, over many prompts: the training prompts (every method learnt
    on them) and the held-out ones, --final_samples answers each (draw A, seed 1000; wrong as
    teacher_wrong says); on sort its most common wrong answer at each; then its own figures on
    those prompts from a second draw (seed 2000)."""
    prompts, n = error_pool(task, args), args.final_samples
    texts, _ = answers(teacher, tokenizer, [p for p in prompts for _ in range(n)], max_new_tokens,
                       64, 1000)
    by_prompt = [texts[i * n:(i + 1) * n] for i in range(len(prompts))]
    means = [sum(task.gold_reward(p, t) for t in ts) / n for p, ts in zip(prompts, by_prompt)]
    wrong = [i for i, g in enumerate(means) if teacher_wrong(task_name, g)]
    train = len(task.prompts("train"))
    found = {"prompts": len(prompts), "wrong": wrong, "wrong_held_out": sum(i >= train for i in wrong),
             "teacher_gold_draw_a": sum(means) / len(means)}
    if task_name == "sort":
        found["teacher_answers"] = [most_common_wrong(task, prompts[i], by_prompt[i]) for i in wrong]
    found["teacher"] = errors_of(task_name, task, teacher, tokenizer, [prompts[i] for i in wrong],
                                 found.get("teacher_answers"), n, max_new_tokens, 2000)
    return found


def errors_of(task_name: str, task, policy, tokenizer, prompts: list[str],
              teacher_answers: list | None, n: int, max_new_tokens: int, seed: int) -> dict:
    """A policy's mean gold on the teacher's wrong prompts and (sort) the share of its answers
    that copy the teacher's most common wrong answer."""
    if not prompts:
        return {"gold": None}
    texts, _ = answers(policy, tokenizer, [p for p in prompts for _ in range(n)], max_new_tokens,
                       64, seed)
    by_prompt = [texts[i * n:(i + 1) * n] for i in range(len(prompts))]
    figures = {"gold": sum(task.gold_reward(p, t) for p, ts in zip(prompts, by_prompt)
                           for t in ts) / len(texts)}
    if teacher_answers is not None:
        figures["copied"] = copied_share(by_prompt, teacher_answers)
    return figures


def measure_errors(args, result: dict) -> None:
    """--errors: the teacher's wrong prompts of each task found over --errors_prompts prompts,
    then every SFT student's and every finished run's final policy measured there; saved as
    each policy is done (run again, only what is missing is measured)."""
    for task_name in sorted(result.get("teachers", {})):
        task, folders = get_task(task_name), stage_folders(args.work, task_name)
        max_new_tokens = ppo_config(SMOKE if args.smoke else FULL).max_new_tokens
        teacher, tokenizer, _ = load_policy(folders["teacher"], flag="teacher", frozen=True)
        teacher.to(pick_device(args.device))
        errors = result.setdefault("errors", {})
        if task_name not in errors:
            errors[task_name] = dict(error_prompts(task_name, task, teacher, tokenizer, args, max_new_tokens),
                                     policies={}, measured=results_file.measured(ROOT))
            results_file.save(args.results, result)
        found = errors[task_name]
        prompts = error_pool(task, args)
        wrong = [prompts[i] for i in found["wrong"]]
        policies = {f"{task_name}/{s}/sft": folders["sft" if s == "same" else "sft_small"]
                    for s in ("same", "small")}
        for key in sorted(result["runs"]):
            if key.startswith(task_name + "/"):
                _, student, method, seed = key.split("/")
                policies[key] = final_folder(args, task_name, student, method, int(seed))
        for key, folder in policies.items():
            if key in found["policies"] or not os.path.exists(os.path.join(folder, "ckpt.pt")):
                continue
            policy = load_policy(folder, flag="policy", frozen=True)[0].to(pick_device(args.device))
            seed = int(key.split("/")[-1]) if key.count("/") == 3 else 0
            found["policies"][key] = errors_of(task_name, task, policy, tokenizer, wrong,
                                               found.get("teacher_answers"), args.final_samples,
                                               max_new_tokens, 5000 + seed)
            results_file.save(args.results, result)


def errors_table(result: dict) -> None:
    """Per task: how many prompts the teacher is wrong on; per row (SFT students, methods) the
    mean gold there and (sort) the share of answers copying the teacher's, over the seeds."""
    for task_name, found in sorted(result.get("errors", {}).items()):
        t = found["teacher"]
        print(f"{task_name}: the teacher is wrong on {len(found['wrong'])} of {found['prompts']} prompts "
              f"({found['wrong_held_out']} of them held-out); there its gold {fmt(t['gold'])}"
              + (f", its own answers copy its most common wrong one {fmt(t.get('copied'))}"
                 if "copied" in t else ""))
        rows = {}
        for key, figures in found["policies"].items():
            rows.setdefault(key.rsplit("/", 1)[0] if key.count("/") == 3 else key, []).append(figures)
        for row, runs in sorted(rows.items()):
            line = f"  {row:30s} {len(runs)} gold there "
            golds = [r["gold"] for r in runs if r["gold"] is not None]
            line += (f"{fmt(sum(golds) / len(golds))} ({fmt(min(golds))}..{fmt(max(golds))})"
                     if golds else "-")
            copies = [r["copied"] for r in runs if r.get("copied") is not None]
            if copies:
                line += f", copied {fmt(sum(copies) / len(copies))} ({fmt(min(copies))}..{fmt(max(copies))})"
            print(line)


# ---------------------------------------------------------------- the summary

def reached(curve: list[dict], target: float) -> dict | None:
    """The first eval whose gold is at least `target` (the teacher's less the tolerance)."""
    for point in curve:
        if point["gold"] >= target:
            return {k: point.get(k) for k in ("step", "flops", "seconds", "tokens")}
    return None


def held(curve: list[dict], target: float, window: int = 3) -> dict | None:
    """The first eval at which the mean gold of `window` evals in a row (it and those before)
    is at least `target`: reached and kept, not one eval's lucky draw (a policy's held-out gold
    swings by several points from one eval to the next in these runs). Its costs are those
    spent by that eval, when a run would know."""
    for i in range(window - 1, len(curve)):
        if sum(p["gold"] for p in curve[i - window + 1:i + 1]) / window >= target:
            return {k: curve[i].get(k) for k in ("step", "flops", "seconds", "tokens")}
    return None


def summarise(result: dict) -> dict:
    """Each run's `reached` against its teacher's held-out gold, and per row (task/student/
    method) the figures' mean, min and max over the seeds."""
    tolerance = result["tolerance"]
    flat = {}
    for key, run in result["runs"].items():
        teacher = result["teachers"].get(key.split("/")[0])
        if teacher is None:
            continue
        run["reached"] = reached(run["curve"], teacher["gold"] - tolerance)
        run["held"] = held(run["curve"], teacher["gold"] - tolerance)
        figures = {"final_gold": run["final"]["gold"], "train_flops": run.get("train_flops"),
                   "seconds": run.get("seconds"), "teacher_tokens": run.get("teacher_tokens"),
                   "reached": float(run["reached"] is not None),
                   "held": float(run["held"] is not None)}
        for name in ("reached", "held"):
            if run[name] is not None:
                prefix = "reach" if name == "reached" else "held"
                figures.update({f"{prefix}_{k}": v for k, v in run[name].items()})
        for k, v in run.get("measured_final", {}).items():
            if k == "passk":
                figures.update({f"pass@{kk}": vv for kk, vv in v.items()})
            else:
                figures[k] = v
        flat[key] = {k: v for k, v in figures.items() if v is not None}
    names = sorted({f for figures in flat.values() for f in figures})
    summary = results_file.over_seeds(flat, names)
    for row, figures in summary.items():  # the mean FLOPs to reach (hold), over rl's of the
        for baseline in ("rl", "rl_grpo"):   # same student (and rl_grpo's, on reviews)
            rl = summary.get(row.rsplit("/", 1)[0] + "/" + baseline, {})
            for prefix in ("reach", "held"):
                if f"{prefix}_flops" in figures and rl.get(f"{prefix}_flops", {}).get("mean"):
                    figures[f"{prefix}_flops_vs_{baseline}"] = (figures[f"{prefix}_flops"]["mean"]
                                                                / rl[f"{prefix}_flops"]["mean"])
    return summary


def fmt(x, digits=3) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1e6:
        return f"{x:.2e}"
    return f"{x:.{digits}f}"


def table(result: dict) -> None:
    """The teachers, the SFT students, then a line per row (task/student/method): seeds, the
    final gold (the bench's measure) with its range over the seeds, the seeds that reached the
    teacher, the mean FLOPs and training seconds to reach it (over those seeds) and the FLOPs'
    ratio to rl's, the whole run's training FLOPs, the teacher tokens, the gold on the
    teacher's wrong prompts, the KL to the teacher, pass@1 and pass@n (sort); then the seeds
    that held the teacher's level (three evals' mean), the FLOPs to hold it and their ratio to
    rl's."""
    summary, n = result.get("summary", {}), str(result.get("passk_n", ""))
    for task_name, teacher in sorted(result.get("teachers", {}).items()):
        stage = result.get("stages", {}).get(f"{task_name}/teacher", {})
        passk = teacher.get("passk", {})
        print(f"{task_name} teacher: gold {fmt(teacher['gold'])}, wrong on {teacher['prompts_wrong']} "
              f"of {len(teacher['wrong'])} prompts (gold there {fmt(teacher['gold_teacher_wrong'])}), "
              f"its RL {fmt(stage.get('train_flops'))} FLOPs"
              + (f", pass@1 {fmt(passk['1'])} pass@{n} {fmt(passk.get(n))}" if passk else ""))
    for key, ref in sorted(result.get("references", {}).items()):
        print(f"{key:30s} gold {fmt(ref['gold'])}, on the teacher's wrong prompts "
              f"{fmt(ref['gold_teacher_wrong'])}, KL to the teacher {fmt(ref['kl_teacher'])}")
    print(f"{'row':30s} {'n':>2s} {'gold':>6s} {'min..max':>13s} {'reached':>7s} "
          f"{'FLOPs to reach':>14s} {'x rl':>5s} {'s to reach':>10s} {'train FLOPs':>11s} "
          f"{'t tokens':>9s} {'t-wrong':>7s} {'KL->t':>6s} {'pass@1':>6s} {'@' + n:>6s} "
          f"{'held':>5s} {'FLOPs to hold':>13s} {'x rl':>5s}")
    for row, s in sorted(summary.items()):
        mean = lambda k: s[k]["mean"] if k in s else None
        gold = s.get("gold", s["final_gold"])
        print(f"{row:30s} {s['seeds']:2d} {fmt(gold['mean']):>6s} "
              f"{fmt(gold['min']) + '..' + fmt(gold['max']):>13s} "
              f"{fmt(s['reached']['mean'] * s['seeds'], 0) + '/' + str(s['seeds']):>7s} "
              f"{fmt(mean('reach_flops')):>14s} {fmt(s.get('reach_flops_vs_rl'), 2):>5s} "
              f"{fmt(mean('reach_seconds'), 0):>10s} {fmt(mean('train_flops')):>11s} "
              f"{fmt(mean('teacher_tokens'), 0):>9s} {fmt(mean('gold_teacher_wrong')):>7s} "
              f"{fmt(mean('kl_teacher'), 2):>6s} {fmt(mean('pass@1')):>6s} {fmt(mean('pass@' + n)):>6s} "
              f"{fmt(s['held']['mean'] * s['seeds'], 0) + '/' + str(s['seeds']):>5s} "
              f"{fmt(mean('held_flops')):>13s} {fmt(s.get('held_flops_vs_rl'), 2):>5s}")
    errors_table(result)


def merged(result: dict, paths: list[str]) -> dict:
    """`result` with the runs, teachers, references and stages of the files `paths` added:
    studies made at once by several processes, each into its own file, with one design."""
    for path in paths:
        other = results_file.load(path)
        design = {k: other[k] for k in ("iters", "split", "eval_interval", "eval_prompts", "small",
                                         "sft_lr", "final_samples", "passk_n", "passk_problems",
                                         "smoke", "tolerance") if k in other}
        clash = {k: (result[k], v) for k, v in design.items() if k in result and result[k] != v}
        if result.get("runs") and clash:
            sys.exit(f"{path} was made with other options than the runs it would join "
                     f"(theirs, its): {clash}")
        if not result.get("runs"):
            result.update(design)
        for part in ("runs", "teachers", "references", "stages"):
            result.setdefault(part, {}).update(other.get(part, {}))
    return result


# ---------------------------------------------------------------- main

def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--students", nargs="+", default=["same", "small"], choices=["same", "small"])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS),
                    help="rl_grpo runs on reviews only (sort's rl is GRPO)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--iters", type=int, default=200, help="iterations of every method's run "
                    "(train_ppo.py's default, the teachers'); distill_then_rl splits them")
    ap.add_argument("--split", type=float, default=0.5, help="distill_then_rl: the share of "
                    "--iters that distills (rounded), RL the rest")
    ap.add_argument("--eval_interval", type=int, default=5)
    ap.add_argument("--eval_prompts", type=int, default=200, help="held-out prompts of every eval "
                    "and of the final measures")
    ap.add_argument("--tolerance", type=float, default=0.02, help="reached: gold within this of "
                    "the teacher's")
    ap.add_argument("--small", type=int, nargs=3, default=[2, 2, 64], metavar=("LAYERS", "HEADS", "WIDTH"),
                    help="the small student's size")
    ap.add_argument("--sft_lr", type=float, default=1e-4, help="sft_teacher's learning rate")
    ap.add_argument("--final_samples", type=int, default=8, help="answers per held-out prompt "
                    "in the final measures (and in each of the teacher's two draws)")
    ap.add_argument("--passk_n", type=int, default=64, help="sort: answers per problem for pass@k")
    ap.add_argument("--passk_problems", type=int, default=200, help="sort: held-out problems for pass@k")
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_distill"))
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | mps, of every run and "
                    "measure (the scripts' --device; their dtype at its default)")
    ap.add_argument("--rerun", action="store_true", help="run again what the JSON already has "
                    "(its folders are emptied first; the teachers and SFT policies are kept)")
    ap.add_argument("--summary_only", action="store_true", help="only print the table of the JSON")
    ap.add_argument("--merge", nargs="+", default=[], help="add these results files' runs, "
                    "teachers, references and stages to --results (a process per task, each "
                    "with its own --results), then print the table")
    ap.add_argument("--errors", action="store_true", help="after the grid: find the prompts the "
                    "teacher is wrong on among the training and held-out prompts, and measure every "
                    "SFT student and finished run there (gold; on sort, answers that copy the "
                    "teacher's wrong one); resumable")
    ap.add_argument("--errors_prompts", type=int, default=0, help="--errors: only the first this "
                    "many of those prompts (0: all of them)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (SMOKE): checks the code "
                    "path, measures nothing")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MINGPT_RLHF_PLOT", "0")
    result = results_file.load(args.results)
    if args.merge:
        result = merged(result, args.merge)
        result["merged_from"] = sorted(set(result.get("merged_from", []) + args.merge))
        result["summary"] = summarise(result)
        results_file.save(args.results, result)
        table(result)
        return result
    if args.summary_only:  # recomputed from the runs, not written back
        result["summary"] = summarise(result)
        table(result)
        return result
    if args.errors:
        measure_errors(args, result)
        errors_table(result)
        return result
    size = SMOKE if args.smoke else FULL
    result["command"] = "python bench/distill.py " + " ".join(argv if argv is not None else sys.argv[1:])
    design = dict(iters=args.iters, split=args.split, eval_interval=args.eval_interval,
                  eval_prompts=args.eval_prompts, small=args.small, sft_lr=args.sft_lr,
                  final_samples=args.final_samples, passk_n=args.passk_n,
                  passk_problems=args.passk_problems, smoke=args.smoke)
    held = {k: result[k] for k in design if k in result}
    if result["runs"] and held != {k: design[k] for k in held}:
        sys.exit(f"{args.results} holds runs made with {held}: pass the same options, or another "
                 f"--results (and --work) for other ones")
    result.update(design, torch=torch.__version__, threads=args.threads, tolerance=args.tolerance)
    result.setdefault("teachers", {})
    result.setdefault("references", {})
    for task_name in args.tasks:
        folders = train_stages(task_name, args, size, result)
        ppo = ppo_config(size)
        teacher, tokenizer, _ = load_policy(folders["teacher"], flag="teacher", frozen=True)
        teacher.to(pick_device(args.device))
        task = get_task(task_name)
        if task_name not in result["teachers"] or args.rerun:
            result["teachers"][task_name] = dict(
                measure_teacher(task_name, task, folders["teacher"], args, ppo.max_new_tokens),
                measured=results_file.measured(ROOT))
        side = result["teachers"][task_name]
        for student in args.students:
            ref = f"{task_name}/{student}/sft"
            if ref not in result["references"] or args.rerun:
                folder = folders["sft"] if student == "same" else folders["sft_small"]
                result["references"][ref] = dict(
                    measure_final(folder, task_name, task, teacher, tokenizer, side, args,
                                  ppo.max_new_tokens, 3000), measured=results_file.measured(ROOT))
        results_file.save(args.results, result)
        for seed in args.seeds:
            for student in args.students:
                for method in methods_of(task_name, args.methods):
                    key = f"{task_name}/{student}/{method}/{seed}"
                    if key in result["runs"] and not args.rerun:
                        continue
                    out = os.path.join(args.work, task_name, student, method, f"seed{seed}")
                    if args.rerun and os.path.isdir(out):
                        shutil.rmtree(out)
                    print(f"== {key}", flush=True)
                    record = run_method(task_name, student, method, seed, args, size, folders, result)
                    record["measured_final"] = measure_final(
                        final_folder(args, task_name, student, method, seed), task_name, task,
                        teacher, tokenizer, side, args, ppo.max_new_tokens, 3000 + seed)
                    record.update(measured=results_file.measured(ROOT), command=result["command"])
                    result["runs"][key] = record
                    result["summary"] = summarise(result)
                    results_file.save(args.results, result)
    result["summary"] = summarise(result)
    results_file.save(args.results, result)
    table(result)
    return result


if __name__ == "__main__":
    main()
