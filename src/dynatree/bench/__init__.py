"""Benchmark harness: run every strategy on the same prompts, store JSONL rows, sweep, report.

Modules: ``specs`` (strategy spec syntax), ``runner`` (timed runs + greedy check), ``store``
(resumable JSONL), ``metrics`` (pure aggregation), ``sweep`` (parameter grids), ``report`` and
``plots`` (markdown + PNG), ``sysinfo`` (machine and library versions), ``commands`` (CLI).
"""
