"""The argument parser of every gdn-deploy command line (gdn-export, gdn-check, gdn-build, samples, benchmarks).

A usage error (unknown option, bad choice, missing value) is one line on stderr,
``<prog>: error: <message> (see <prog> --help)``, and exit code 2 (``ExitCode.USAGE``),
instead of argparse's usage block followed by the message.
"""
from __future__ import annotations

import argparse

from .errors import ExitCode

__all__ = ["OneLineParser"]


class OneLineParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose usage errors are one line and exit 2; ``--help`` is unchanged."""

    def error(self, message: str):
        self.exit(int(ExitCode.USAGE), f"{self.prog}: error: {message} (see {self.prog} --help)\n")
