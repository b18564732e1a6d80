"""``python -m fastload.tune``: how many workers and how much prefetch, on
your own data (see ``fastload.observe.tune``)."""

from .observe.tune import *  # noqa: F401,F403
from .observe.tune import __all__, main  # noqa: F401

if __name__ == "__main__":
    main()
