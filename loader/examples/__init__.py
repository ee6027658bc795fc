"""Example mappers and providers (named in configs as ``loader.examples:NAME``), and the synthetic dataset generator (``datagen``)."""

from loader.examples.mappers import cpu_heavy, cpu_heavy_batch, labeled_text_provider, parse_labeled_line

__all__ = ["parse_labeled_line", "labeled_text_provider", "cpu_heavy", "cpu_heavy_batch"]
