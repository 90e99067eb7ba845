"""The one exception hierarchy of memstrata, for users: defined in :mod:`memstrata.core.errors`."""

from memstrata.core.errors import *  # noqa: F403 - the public path re-exports the whole hierarchy
from memstrata.core.errors import __all__ as __all__
