"""Ctrl-C during a run of the command line: remembered, so that it is reported once as exit status
130 wherever Python happened to raise it."""

from __future__ import annotations

import sys


class Interrupt:
    """Ctrl-C, remembered: Python raises KeyboardInterrupt wherever the interpreter is, and one
    raised inside a garbage-collection callback (JAX registers one) is printed and dropped. The
    flag keeps it: the streaming loop re-raises at its next step, and `main` reports it even if
    the run finished."""
    seen = False

    @classmethod
    def handler(cls, signum, frame):
        cls.seen = True
        raise KeyboardInterrupt

    @classmethod
    def check(cls) -> None:
        if cls.seen:
            raise KeyboardInterrupt

    @staticmethod
    def unraisable(info) -> None:
        """sys.unraisablehook: the dropped KeyboardInterrupt is kept by the flag, so its
        "Exception ignored" traceback is not printed; anything else is, as usual."""
        if not issubclass(info.exc_type, KeyboardInterrupt):
            sys.__unraisablehook__(info)
