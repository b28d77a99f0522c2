"""`probe-kv`: what a KV-cache dtype does to the target model's outputs.

    core.py     run_probe: two servers, the same prompts, the report
    sglang.py   SGLang's request shapes (tokenize, free run, teacher-forced scoring)
    metrics.py  agreement, logprob deltas, KL bound (pure)
"""

from gen_pipeline.probe.core import ProbeOptions, format_report, probe_servers, run_probe

__all__ = ["ProbeOptions", "format_report", "probe_servers", "run_probe"]
