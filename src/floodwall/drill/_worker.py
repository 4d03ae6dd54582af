"""``python -m floodwall.drill._worker JOB RESULT``: run one pickled drill job in this process.

Started by :func:`floodwall.drill.runner.run_jobs` for runs side by side. Progress goes to
stdout as ``progress ELAPSED TOTAL`` lines; the :class:`~floodwall.drill.runner.RunResult` is
pickled to ``RESULT``; a failure leaves its traceback on stderr and exits with status 1.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
from pathlib import Path

from floodwall.drill.runner import Job, run_mode


def main(argv: list[str]) -> int:
    job_file, result_file = Path(argv[0]), Path(argv[1])
    job = pickle.loads(job_file.read_bytes())  # noqa: S301 - written by our parent process
    if not isinstance(job, Job):
        raise TypeError(f"{job_file} does not hold a drill Job")

    def report(elapsed: float, total: float) -> None:
        sys.stdout.write(f"progress {elapsed:.3f} {total:.3f}\n")
        sys.stdout.flush()

    result = asyncio.run(run_mode(job, report))
    partial = result_file.with_suffix(".partial")
    partial.write_bytes(pickle.dumps(result))
    partial.replace(result_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
