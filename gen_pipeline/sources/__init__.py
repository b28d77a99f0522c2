"""Prompt sources: Hugging Face hub or local files → validated Prompts."""

from gen_pipeline.sources.loading import LoadedSource, SourceStats, iter_prompts, load_source

__all__ = ["LoadedSource", "SourceStats", "iter_prompts", "load_source"]
