"""The typed messages agents and orchestrators exchange with memory actors (the public place).

Every message is a frozen, slotted dataclass that validates its fields when it is built (a bad
field raises :class:`~memstrata.errors.InvalidInputError` naming the message and the field).
``encode``/``decode`` and ``to_dict``/``from_dict`` give the orjson wire form. They are defined
in :mod:`memstrata.actors.messages`, whose protocol they are; this module keeps the public path.
"""

from memstrata.actors.messages import *  # noqa: F403 - the public path re-exports the whole protocol
from memstrata.actors.messages import __all__ as __all__
