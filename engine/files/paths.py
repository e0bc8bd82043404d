"""Where Arbor keeps its files. One override, ARBOR_HOME, moves all of them (tests use it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "Arbor"
HOME_ENV = "ARBOR_HOME"


@dataclass(frozen=True)
class DataDirs:
    data: Path  # conversations database, models/
    cache: Path  # checkpoint disk tier, file-hash cache
    config: Path  # settings
    logs: Path  # the app's log, the engine's, native crash stacks

    @property
    def models(self) -> Path:
        return self.data / "models"


def data_dirs(base: Path | str | None = None) -> DataDirs:
    """The directories to use: under `base` or $ARBOR_HOME if given, else the platform's."""
    if base is None and os.environ.get(HOME_ENV):
        base = os.environ[HOME_ENV]
    if base is not None:
        root = Path(base)
        return DataDirs(data=root / "data", cache=root / "cache", config=root / "config",
                        logs=root / "logs")
    return DataDirs(
        data=Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)),
        cache=Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)),
        config=Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
        logs=Path(platformdirs.user_log_dir(APP_NAME, appauthor=False)),
    )
