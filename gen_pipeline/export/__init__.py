"""`export`: committed samples → the files a trainer loads.

    core.py     run_export: read, select, split, write (atomic)
    formats.py  specforge / speculators JSONL, hf datasets
    select.py   filters, --mix, the validation split (pure)
"""

from gen_pipeline.export.core import export_names, run_export
from gen_pipeline.export.options import ExportOptions, ExportSummary
from gen_pipeline.export.select import Filters, parse_mix, parse_val

__all__ = ["ExportOptions", "ExportSummary", "Filters", "export_names", "parse_mix", "parse_val", "run_export"]
