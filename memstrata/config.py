"""Configuration, for users: defined in :mod:`memstrata.core.config`."""

from memstrata.core.config import *  # noqa: F403 - the public path re-exports the whole configuration
from memstrata.core.config import __all__ as __all__
