"""Metrics, traces and logs. The modules sit at different layers (see pyproject's import-linter
contract): tracing and logging context are used by the scheduler and the data plane, while the
metrics collector reads the repository from above the data plane."""
