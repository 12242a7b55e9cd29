"""What runs the recipe, above it: the RL script's options checked together (rl_options.py), the
run's warnings (watch.py), the recorded rollouts and the run report (rollouts.py, report.py),
the logs and their curves (metrics.py, plot.py), and a trained policy written out as a Hugging
Face folder (export.py). These import the recipe; nothing of the recipe imports them."""
