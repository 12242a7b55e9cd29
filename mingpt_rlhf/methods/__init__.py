"""The methods beside PPO, one file each: GRPO and RLOO's advantages (critic_free.py), DPO and
IPO (dpo.py), online DPO (online_dpo.py), best-of-n (bestofn.py), and episodes with an
environment (episodes.py, its built-in guessing game env_guess.py)."""
