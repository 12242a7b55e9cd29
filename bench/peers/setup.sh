#!/usr/bin/env bash
# Creates bench/peers/.venv with the peers (trl 0.11.4, transformers 4.45.2, peft) for
# bench/peers/trl_ppo.py and bench/peers/hf_generate.py. Safe to re-run.
#     bash bench/peers/setup.sh            # then: bench/peers/.venv/bin/python bench/peers/...
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
[ -x "$here/.venv/bin/python" ] || "$python" -m venv "$here/.venv"
pip=("$here/.venv/bin/python" -m pip install --disable-pip-version-check)
# torch first and pinned: the CPU wheel. Left to the resolver, torch would come with
# gigabytes of CUDA packages.
"${pip[@]}" torch==2.13.0
"${pip[@]}" -r "$here/requirements.txt"
# trl imports lazily: name the classes so that datasets / pyarrow / rich are really imported
"$here/.venv/bin/python" -c "
import torch, trl, transformers, peft, datasets
from trl import PPOTrainer, PPOConfig, AutoModelForCausalLMWithValueHead
print('torch', torch.__version__, 'trl', trl.__version__, 'transformers', transformers.__version__,
      'peft', peft.__version__, 'datasets', datasets.__version__)"
