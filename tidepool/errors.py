"""The root of every error Tidepool raises on purpose; the `tidepool` command turns any of them
into one line on stderr, without a traceback."""

from __future__ import annotations


class TidepoolError(Exception):
    """Something Tidepool cannot do, with a message that says what and, where it can, how to fix it."""
