"""Configuration: TOML files to frozen, validated dataclasses (``sections``), the file list (``source``), value checks (``checks``)."""

from loader.config.sections import (
    DEFAULT_BIND,
    DEFAULT_DATASET,
    ClientConfig,
    DatasetConfig,
    LoaderConfig,
    PipelineConfig,
    ServiceConfig,
    WorkersConfig,
    load_config,
    resolve,
)
from loader.config.source import SourceConfig

__all__ = [
    "LoaderConfig",
    "SourceConfig",
    "PipelineConfig",
    "WorkersConfig",
    "ServiceConfig",
    "ClientConfig",
    "load_config",
    "resolve",
    "DEFAULT_BIND",
    "DEFAULT_DATASET",
    "DatasetConfig",
]
