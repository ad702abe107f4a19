"""Verdict on a racecheck analysis report of the wgmma prefill scan (gdnPrefillScanWgKernel).

racecheck does not model mbarrier synchronisation: it reports a correctly synchronised producer/consumer
hand-off through an mbarrier even with plain shared stores (sync_patterns.cu, mode mbar_st). In the wgmma scan
every shared-memory write that racecheck tracks against another warp's read is the producer warp's cp.async
stage load (the partial last chunk of a sequence, and launches without tensor maps), handed to the math warps
by the stage's `full` mbarrier and taken back by its `empty` mbarrier. So a race report whose write side is that
cp.async (cpAsync16) is this known false positive; any other report is not, and fails the verdict.

  python3 tests/kernels/sanitizer/racecheck_verdict.py LOG    (exit 1 on an unexpected report)
"""
from __future__ import annotations

import re
import sys

ACCESS = re.compile(r"(Read|Write) access at (.*?) in (\S+):(\d+)")


def reports(text: str) -> list[list[tuple[str, str, str]]]:
    """Race reports, each the list of its (kind, function, file:line) accesses."""
    out: list[list[tuple[str, str, str]]] = []
    for line in text.splitlines():
        if "Race reported between" in line:
            out.append([])
        if out and (m := ACCESS.search(line)):
            out[-1].append((m.group(1), m.group(2), f"{m.group(3)}:{m.group(4)}"))
    return out


def known(report: list[tuple[str, str, str]]) -> bool:
    writes = [a for a in report if a[0] == "Write"]
    return bool(writes) and all("cpAsync16" in fn for _, fn, _ in writes)


def main(argv: list[str]) -> int:
    text = open(argv[1], errors="replace").read()
    rs = reports(text)
    bad = [r for r in rs if not known(r)]
    if not bad:
        print(f"{len(rs)} race reports, all between the producer warp's cp.async stage loads and other warps' reads "
              "(the mbarrier hand-off racecheck does not model: sync_patterns.cu mbar_st): known false positive")
        return 0
    print(f"{len(bad)} of {len(rs)} race reports are not the known mbarrier false positive:")
    for r in bad:
        print("  " + "; ".join(f"{k} {fn.split('(')[0]} {loc}" for k, fn, loc in r))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
