"""Read-only reports over outputs/: check, status, validate, diagnose, the HTML page."""

from typing import Any

from gen_pipeline.reports.check import CheckReport, format_report, run_check
from gen_pipeline.reports.status import StatusReport, config_targets, format_status, read_status, status_all
from gen_pipeline.reports.validate import ValidationReport, validate_dataset, validate_named

__all__ = ["CheckReport", "StatusReport", "ValidationReport", "config_targets", "diagnose_dataset", "format_report",
           "format_status", "read_status", "run_check", "status_all", "validate_dataset", "validate_named"]


def __getattr__(name: str) -> Any:
    if name == "diagnose_dataset":  # on first use: diagnose prices levers with server/plan (the server package)
        from gen_pipeline.reports.diagnose import diagnose_dataset
        return diagnose_dataset
    raise AttributeError(f"module 'gen_pipeline.reports' has no attribute {name!r}")
