"""What the recipe runs on and a first reading can skip: processes (distributed.py), padding-free
passes, LoRA, devices and seeds, checkpoints, logs, curves and the run report, the command line
and its errors, GPT-2's weights and BPE, the recorded rollouts, the run's warnings."""
