"""`export`: committed samples → the files a trainer loads."""

from gen_pipeline.export.core import export_names, run_export
from gen_pipeline.export.options import ExportOptions, ExportSummary
from gen_pipeline.export.select import Filters, parse_mix, parse_val

__all__ = ["ExportOptions", "ExportSummary", "Filters", "export_names", "parse_mix", "parse_val", "run_export"]
