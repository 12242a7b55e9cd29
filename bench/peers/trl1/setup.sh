#!/usr/bin/env bash
# Creates bench/peers/trl1/.venv with trl 1.16.0 and transformers 5.24.0 for
# bench/peers/trl_grpo.py (trl's GRPOTrainer). Apart from bench/peers/.venv (trl 0.11.4's
# classic PPOTrainer, transformers 4.45), which these versions cannot share. Safe to re-run.
#     bash bench/peers/trl1/setup.sh      # then: bench/peers/trl1/.venv/bin/python bench/peers/trl_grpo.py
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
[ -x "$here/.venv/bin/python" ] || "$python" -m venv "$here/.venv"
pip=("$here/.venv/bin/python" -m pip install --disable-pip-version-check)
# torch first and pinned: the CPU wheel. Left to the resolver, torch would come with
# gigabytes of CUDA packages.
"${pip[@]}" torch==2.13.0
"${pip[@]}" -r "$here/requirements.txt"
"$here/.venv/bin/python" -m pip check
# trl imports lazily: name the classes so that datasets / accelerate are really imported
"$here/.venv/bin/python" -c "
import torch, trl, transformers, datasets, accelerate
from trl import GRPOConfig, GRPOTrainer
print('torch', torch.__version__, 'trl', trl.__version__, 'transformers', transformers.__version__,
      'datasets', datasets.__version__, 'accelerate', accelerate.__version__)"
