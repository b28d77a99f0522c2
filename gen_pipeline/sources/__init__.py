"""Prompt sources: Hugging Face hub or local files → validated Prompts."""
