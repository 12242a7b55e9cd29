"""What the recipe stands on and a first reading can skip: processes (distributed.py),
padding-free passes, LoRA, devices and seeds, checkpoint files, the command line and its
errors, published weights (GPT-2's; Llama 3 / SmolLM2, Qwen2 / 2.5 and Qwen3's in families.py),
byte-level BPE tokenizers and chat formats. Nothing here imports the recipe."""
