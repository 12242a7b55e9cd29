"""What the recipe runs on and a first reading can skip: processes (distributed.py), padding-free
passes, LoRA, devices and seeds, checkpoints, logs, curves and the run report, the command line
and its errors, published weights (GPT-2's; Llama 3 / SmolLM2, Qwen2 / 2.5 and Qwen3's in
families.py) and GPT-2's BPE, the recorded rollouts, the run's warnings."""
