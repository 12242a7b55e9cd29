"""bench/distill.py and its FLOP counter (bench/model_flops.py): the counter against a hand
count of a tiny model's passes, a killed run's counts resumed to the uninterrupted run's, the
study's code path at tiny size (resumable, every model's FLOPs named, the off-policy row at
the distill row's teacher tokens), and the summary from a small JSON."""
import json

import pytest
import torch

from conftest import bench_module, copy_run


def flops():
    return bench_module("model_flops")


def distill_bench():
    return bench_module("distill")


C, L, V = 16, 2, 10


def tiny():
    from mingpt_rlhf.model import GPT, GPTConfig
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=V, block_size=16, n_layer=L, n_head=2, n_embd=C)).eval()


# by hand: a block holds ln_1 (2C), c_attn (C x 3C + 3C), c_proj (C x C + C), ln_2 (2C), c_fc
# (C x 4C + 4C), mlp c_proj (4C x C + C): 12 C^2 + 13 C; then ln_f (2C). The output layer is
# the 64-row padded embedding (64 x C), applied only to the rows asked for.
BLOCKS = L * (12 * C * C + 13 * C) + 2 * C
HEAD = 64 * C


def test_the_flop_counter_counts_each_pass_as_a_hand_count_does():
    from mingpt_rlhf.heads import RewardModel
    from mingpt_rlhf.sampling import generate
    mf = flops()
    model, frozen = tiny(), tiny().requires_grad_(False)
    assert mf.block_parameters(model) == BLOCKS
    idx = torch.randint(V, (3, 5))
    with mf.FlopCounter() as counter:
        counter.name(model, "policy")
        counter.name(frozen, "reference")
        with torch.no_grad():                      # a scoring pass: 15 positions, forward only
            model(idx)
        assert counter.flops["train"]["policy"] == 2 * (BLOCKS + HEAD) * 15
        model(idx).sum().backward()                # a learning pass: forward and backward
        assert counter.flops["train"]["policy"] == (2 + 6) * (BLOCKS + HEAD) * 15
        frozen(idx).sum()                          # under autograd, but nothing of it trains
        assert counter.flops["train"]["reference"] == 2 * (BLOCKS + HEAD) * 15
        with counter.in_phase("eval"):             # sampling with the KV cache, no EOS: the
            generate(model, idx[:2, :4], max_new_tokens=3)   # prompt (2 x 4), then 2 x 1 per
        # step for 2 steps (the last token needs no pass); the output layer: 2 rows per token
        assert counter.flops["eval"]["policy"] == 2 * (BLOCKS * (8 + 2 + 2) + HEAD * 6)
        torch.manual_seed(0)
        rm = RewardModel(tiny().config).requires_grad_(False)
        counter.name(rm, "reward model")
        with torch.no_grad():                      # the trunk and the scalar head (C + 1) on
            rm(idx)                                # every position
        assert counter.flops["train"]["reward model"] == 2 * (BLOCKS + C + 1) * 15
        with torch.no_grad():
            tiny()(idx[:1])                        # a model never named: the default's
        assert counter.flops["train"]["unnamed"] == 2 * (BLOCKS + HEAD) * 5
    from mingpt_rlhf.model import GPT
    assert counter.originals is None and GPT.blocks.__name__ == "blocks"  # put back on exit
    with torch.no_grad():  # nothing counted any more
        model(idx)
    assert counter.flops["train"]["policy"] == 8 * (BLOCKS + HEAD) * 15


def test_a_killed_run_resumes_its_flop_counts(stages, tmp_path):
    """A PPO run (policy, reference, critic, reward model) killed at its first checkpoint and
    resumed ends with the FLOPs, per phase and model, and the eval points of the run made
    straight through."""
    import train_ppo
    from test_scripts import Killed, kill_after_first_save, ppo_cfg
    bench = distill_bench()
    root = stages[0]
    options = {k: v for k, v in vars(ppo_cfg(tmp_path / "x", root / "sft", root / "rm")).items()
               if k not in ("out_dir", "resume")}
    straight = bench.counted_train_ppo(str(tmp_path / "straight"), **options)
    assert set(straight["flops"]["train"]) == {"policy", "reference", "critic", "reward model"}
    assert [e["step"] for e in straight["evals"]] == [0, 2, 4] and not straight["partial"]
    with pytest.MonkeyPatch.context() as m:
        kill_after_first_save(m, train_ppo)
        with pytest.raises(Killed):
            bench.counted_train_ppo(str(tmp_path / "killed"), **options)
    resumed = bench.counted_train_ppo(str(tmp_path / "killed"), **options)
    assert not resumed["partial"]
    assert resumed["flops"] == straight["flops"]
    assert [(e["step"], e["flops"]) for e in resumed["evals"]] == \
        [(e["step"], e["flops"]) for e in straight["evals"]]
    assert bench.counted_train_ppo(str(tmp_path / "killed"), **options) == resumed  # finished


def test_the_study_at_tiny_size_runs_every_row_resumes_and_summarises(stages, tmp_path, capsys):
    """--smoke on reviews, the small student, one seed: each method's run is in the JSON with
    its curve and its FLOPs under the models it runs; sft_teacher learns from as many teacher
    tokens as distill consumed (at most one response more), and its eval at step 0 is
    train_ppo.py's of the same student; run again, nothing is trained."""
    bench = distill_bench()
    work = tmp_path / "work"
    for name in ("sft", "rm"):  # the shared tiny SFT policy and reward model: reused, not retrained
        copy_run(stages[0] / name, work / "reviews" / name)
    results = tmp_path / "d.json"
    argv = ["--smoke", "--tasks", "reviews", "--students", "small", "--seeds", "0", "--methods",
            "distill", "sft_teacher", "rl", "distill_then_rl", "--iters", "2", "--eval_interval", "1",
            "--eval_prompts", "8", "--final_samples", "2", "--work", str(work), "--results", str(results)]
    bench.main(argv)
    saved = json.loads(results.read_text())
    runs = saved["runs"]
    assert set(runs) == {f"reviews/small/{m}/0" for m in ("distill", "sft_teacher", "rl", "distill_then_rl")}
    models = {m: set(runs[f"reviews/small/{m}/0"]["flops"]["train"]) for m in
              ("distill", "sft_teacher", "rl", "distill_then_rl")}
    assert models == {"distill": {"policy", "teacher"}, "sft_teacher": {"policy", "teacher"},
                      "rl": {"policy", "reference", "critic", "reward model"},
                      "distill_then_rl": {"policy", "teacher", "reference", "critic", "reward model"}}
    distill, sft = runs["reviews/small/distill/0"], runs["reviews/small/sft_teacher/0"]
    assert [p["step"] for p in distill["curve"]] == [0, 1, 2]
    assert all(p["flops"] < q["flops"] for p, q in zip(distill["curve"], distill["curve"][1:]))
    assert distill["curve"][-1]["tokens"] == distill["tokens"] == distill["teacher_tokens"] > 0
    budget = distill["teacher_tokens"]  # sft_teacher's: at most one response (16 tokens) more
    assert sft["budget"] == budget <= sft["teacher_tokens"] <= budget + 16
    for k in ("gold", "kl", "well_formed"):  # the bench's eval is train_ppo.py's
        assert sft["curve"][0][k] == pytest.approx(distill["curve"][0][k], abs=1e-5)
    both = runs["reviews/small/distill_then_rl/0"]
    assert [p["part"] for p in both["curve"]] == ["distill", "distill", "rl"] and both["split"] == [1, 1]
    assert both["train_flops"] == pytest.approx(both["curve"][-1]["flops"])
    assert both["teacher_tokens"] == both["curve"][1]["tokens"] < both["tokens"] == both["curve"][2]["tokens"]
    for run in runs.values():
        assert {"gold", "kl_teacher", "gold_teacher_wrong"} <= set(run["measured_final"])
        assert run["measured"] and run["command"].startswith("python bench/distill.py")
    assert "reviews/sft" not in saved["stages"] and "reviews/sft_small" in saved["stages"]
    assert saved["stages"]["reviews/teacher"]["train_flops"] > 0
    assert set(saved["summary"]) == {f"reviews/small/{m}" for m in
                                     ("distill", "sft_teacher", "rl", "distill_then_rl")}

    # the teacher's errors over the first 40 training prompts: each SFT student and each run's
    # final policy measured on the prompts the teacher is wrong on
    capsys.readouterr()
    bench.main(argv + ["--errors", "--errors_prompts", "40"])
    errors = json.loads(results.read_text())["errors"]["reviews"]
    assert errors["prompts"] == 40 and errors["wrong_held_out"] == 0
    assert set(errors["policies"]) == {"reviews/same/sft", "reviews/small/sft", *runs}
    if errors["wrong"]:  # a tiny teacher is wrong somewhere; where it is not, nothing to measure
        assert all(-1 <= p["gold"] <= 1 for p in errors["policies"].values())
    assert "the teacher is wrong on" in capsys.readouterr().out

    def trained(*args, **kwargs):
        raise AssertionError("a finished run was trained again")
    with pytest.MonkeyPatch.context() as m:
        for name in ("train_ppo", "train_sft", "train_rm"):
            m.setattr(getattr(bench, name), "main", trained)
        m.setattr(bench, "sft_on_teacher", trained)
        m.setattr(bench, "errors_of", trained)
        capsys.readouterr()
        bench.main(argv)
        bench.main(argv + ["--errors", "--errors_prompts", "40"])  # measured once only
    assert "reviews/small/distill " in capsys.readouterr().out


def test_the_summary_says_which_runs_reached_the_teacher_and_at_what_share_of_rl(tmp_path, capsys):
    """A teacher at gold 0.5 and a tolerance of 0.02: a run reaches it at its first eval at
    0.48 or above (its FLOPs then), one that never does has None; the table gives the rows'
    FLOPs to reach against rl's (1e9 / 4e9 = 0.25)."""
    bench = distill_bench()

    def run(golds, flops_per_step):
        return {"curve": [{"step": 5 * i, "gold": g, "kl": 0.0, "flops": flops_per_step * i,
                           "seconds": i, "tokens": 100 * i} for i, g in enumerate(golds)],
                "final": {"gold": golds[-1]}, "tokens": 100 * (len(golds) - 1),
                "train_flops": flops_per_step * (len(golds) - 1), "seconds": len(golds)}
    result = {"tolerance": 0.02, "teachers": {"sort": {"gold": 0.5, "wrong": [True, False],
                                                     "prompts_wrong": 1, "gold_teacher_wrong": 0.0}},
              "runs": {"sort/small/distill/0": run([0.1, 0.3, 0.485, 0.45], 0.5e9),
                       "sort/small/rl/0": run([0.1, 0.2, 0.3, 0.4, 0.49], 1e9),
                       "sort/small/sft_teacher/0": run([0.1, 0.2, 0.3], 1e9)}}
    summary = bench.summarise(result)
    runs = result["runs"]
    assert runs["sort/small/distill/0"]["reached"] == {"step": 10, "flops": 1e9, "seconds": 2, "tokens": 200}
    assert runs["sort/small/rl/0"]["reached"]["flops"] == 4e9
    assert runs["sort/small/sft_teacher/0"]["reached"] is None
    assert summary["sort/small/sft_teacher"]["reached"]["mean"] == 0.0
    assert summary["sort/small/distill"]["reach_flops_vs_rl"] == 0.25
    # against GRPO on the reward model too where the task has that row (reviews)
    result["runs"]["sort/small/rl_grpo/0"] = run([0.1, 0.49], 2e9)
    assert bench.summarise(result)["sort/small/distill"]["reach_flops_vs_rl_grpo"] == 0.5
    del result["runs"]["sort/small/rl_grpo/0"]
    # held: three evals in a row at 0.48 or above on average, at the third; distill's 0.485
    # was not kept (0.3, 0.485, 0.45: 0.41), rl never held (0.3, 0.4, 0.49: 0.397)
    assert runs["sort/small/distill/0"]["held"] is None and runs["sort/small/rl/0"]["held"] is None
    assert bench.held([{"gold": g, "step": i} for i, g in enumerate([0.4, 0.5, 0.47, 0.49, 0.2])],
                      0.48)["step"] == 3  # (0.5 + 0.47 + 0.49) / 3 = 0.4867, not 0.4567 before
    path = tmp_path / "d.json"
    path.write_text(json.dumps(result))
    bench.main(["--summary_only", "--results", str(path)])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("sort/small/distill "))
    assert " 0.25 " in line and " 1/1 " in line and line.split()[-3:] == ["0/1", "-", "-"]
    assert " 0/1 " in next(x for x in out.splitlines() if x.startswith("sort/small/sft_teacher "))


def test_a_copied_error_is_the_teachers_most_common_wrong_answer_word_for_word():
    """On sort: the teacher's most common wrong answer to a prompt (right answers left out,
    the first on a tie), and the share of a policy's answers that are it (responses as the
    sampler decodes them, EOS written)."""
    bench = distill_bench()
    from mingpt_rlhf.tasks import get_task
    task = get_task("sort")
    prompt = "sort 4 7 9 :"
    assert task.gold_reward(prompt, " 4 7 9 <eos>") == 1.0
    teacher = [" 4 7 9 <eos>", " 4 9 7 <eos>", " 7 4 9 <eos>", " 4 9 7 <eos> ", " 7 4 9 <eos>"]
    assert bench.most_common_wrong(task, prompt, teacher) == "4 9 7 <eos>"
    assert bench.most_common_wrong(task, prompt, [" 4 7 9 <eos>"] * 3) is None
    answers = [[" 4 9 7 <eos>", "4 7 9 <eos>", " 9 7 4 <eos>", "4 9 7 <eos>"], [" 1 2", " 2 1"]]
    # the second prompt has no wrong answer of the teacher's: left out; 2 of the first 4 copy
    assert bench.copied_share(answers, ["4 9 7 <eos>", None]) == 0.5
    assert bench.copied_share(answers, [None, None]) is None


def test_merge_joins_two_processes_results_and_refuses_another_design(tmp_path):
    """Two files of one design (a process per task) merge into one: every run, teacher,
    reference and stage of both; a file made with other --iters is refused."""
    bench = distill_bench()

    def part(task, iters):
        return {"iters": iters, "eval_interval": 5, "tolerance": 0.02,
                "runs": {f"{task}/small/rl/0": {"curve": [{"step": 0, "gold": 0.1}], "final": {"gold": 0.1}}},
                "teachers": {task: {"gold": 0.5, "wrong": [True], "prompts_wrong": 1,
                                    "gold_teacher_wrong": 0.0}},
                "references": {f"{task}/small/sft": {"gold": 0.1, "gold_teacher_wrong": 0.0,
                                                     "kl_teacher": 1.0}},
                "stages": {f"{task}/teacher": {"train_flops": 1.0}}}
    paths = {}
    for name, task, iters in (("a", "reviews", 200), ("b", "sort", 200), ("c", "sort", 100)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(part(task, iters)))
    out = tmp_path / "all.json"
    merged = bench.merged({"runs": {}}, [str(paths["a"]), str(paths["b"])])
    assert set(merged["runs"]) == {"reviews/small/rl/0", "sort/small/rl/0"}
    assert set(merged["teachers"]) == {"reviews", "sort"} and merged["iters"] == 200
    assert set(merged["stages"]) == {"reviews/teacher", "sort/teacher"}
    with pytest.raises(SystemExit, match="other options"):
        bench.merged(merged, [str(paths["c"])])
    bench.main(["--results", str(out), "--merge", str(paths["a"]), str(paths["b"])])
    assert set(json.loads(out.read_text())["runs"]) == set(merged["runs"])
