"""`arbor-engine bench` and what it stands on: the benchmark's cases (cases), the systems it
compares (systems), its models (models, random_models), its summaries (stats, report) and the
engine's limits (limits)."""
