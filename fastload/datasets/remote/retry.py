"""Which store errors are worth another try, and the bounded backoff.

Connection errors (refused, reset, cut mid-body), timeouts, 5xx answers and
throttling (429, 503 SlowDown) are retried with exponential backoff and
jitter, ``attempts`` tries in all; an object that is not there, a denied
request or a malformed URL fails at once.  The last error is raised as an
``OSError`` naming the URL and what failed (never the credentials: obstore's
messages hold the request, not its signature).
"""

import random
import re
import time

_STATUS = re.compile(r"status(?: code)?:?\s*(\d{3})")


class RemoteError(OSError):
    """A remote read failed: ``url`` and what failed are in the message."""


class RemoteNotFound(RemoteError, FileNotFoundError):
    """The object is not in the store."""


class ShardChanged(RemoteError):
    """An object's size or ETag is not what it was when the dataset was made."""


class FetchTimeout(RemoteError, TimeoutError):
    """A shard was not in the node cache within the time the caller gave
    (the loader's ``timeout``): the message names the URL."""


class Abandoned(Exception):
    """The caller stopped waiting: no more tries."""


def _final(error):
    """True when another try cannot help."""
    name = type(error).__name__
    if isinstance(error, (FileNotFoundError, PermissionError, ShardChanged)):
        return True
    if name in ("NotFoundError", "PermissionDeniedError", "UnauthenticatedError",
                "InvalidPathError", "NotSupportedError", "UnknownConfigurationKeyError",
                "PreconditionError", "NotModifiedError"):
        return True
    match = _STATUS.search(str(error))
    if match:
        status = int(match.group(1))
        return 400 <= status < 500 and status not in (408, 429)
    return False


def first_line(error):
    """What failed, in one line (obstore appends a debug dump)."""
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


class Backoff:
    """``attempts`` tries in all, waiting ``base_s * 2**k`` (at most
    ``max_s``, times a jitter in [0.5, 1]) before try ``k + 1``."""

    def __init__(self, attempts=6, base_s=0.2, max_s=10.0, sleep=time.sleep):
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.attempts, self.base_s, self.max_s, self.sleep = attempts, base_s, max_s, sleep

    def call(self, what, url, fn, *args, stop=None):
        """``fn(*args)``, retried; a ``RemoteError`` naming ``url`` and
        ``what`` when every try failed or the error is final.  ``stop``: an
        ``Event`` that, once set, ends the waits and makes no more tries
        (``Abandoned``)."""
        for attempt in range(self.attempts):
            if stop is not None and stop.is_set():
                raise Abandoned(url)
            try:
                return fn(*args)
            except Exception as error:  # obstore's errors have no common OSError base
                if isinstance(error, RemoteError):
                    raise
                final = _final(error)
                if final or attempt + 1 == self.attempts:
                    tries = "" if final else f" after {self.attempts} tries"
                    kind = RemoteNotFound if isinstance(error, FileNotFoundError) else RemoteError
                    raise kind(f"{url}: {what} failed{tries}: {first_line(error)}") \
                        from error
            delay = min(self.max_s, self.base_s * 2 ** attempt) * (0.5 + random.random() / 2)
            if stop is None:
                self.sleep(delay)
            elif stop.wait(delay):
                raise Abandoned(url)
        raise AssertionError("unreachable")
