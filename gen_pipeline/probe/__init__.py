"""`probe-kv`: what a KV-cache dtype does to the target model's outputs."""

from gen_pipeline.probe.core import ProbeOptions, format_report, probe_servers, run_probe

__all__ = ["ProbeOptions", "format_report", "probe_servers", "run_probe"]
