"""Prompt sources: Hugging Face hub or local files → validated Prompts.

    loading.py  load a source, parse and validate its rows, stable ids (iter_prompts)
    files.py    local .jsonl files: lines that are not JSON become rejects
    hub.py      the hub: offline detection
"""

from gen_pipeline.sources.loading import LoadedSource, SourceStats, iter_prompts, load_source

__all__ = ["LoadedSource", "SourceStats", "iter_prompts", "load_source"]
