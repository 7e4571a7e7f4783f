"""The search: a space of configurations, a platform probe, Optuna proposing, Ray running."""
