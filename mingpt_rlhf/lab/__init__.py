"""The lab: the modules of the studies, each plugged into the recipe from outside (a table entry,
an option): the gradient oracle (gradients.py on tabular.py), reward-model ensembles, the
reward-hacking warning, overoptimization's fits, off-policy corrections, later refinements, pass@k (passk.py)."""
