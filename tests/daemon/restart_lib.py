"""What the restart tests (daemon_restart.py, restart_resume_false.py) share:
reading each rank's steps from the C trainer's output, and failing with the
outputs that show why."""
import re
import sys


def steps_of(output, rank):
    """{step: loss text} of `rank`'s "[rank R] step N LOSS" lines."""
    out = {}
    for line in output.splitlines():
        m = re.match(rf"\[rank {rank}\] step (\d+) (\S+)$", line)
        if m:
            out[int(m.group(1))] = m.group(2)
    return out


def failer(name):
    """fail(why, *outputs): prints "<name>: FAILED: why" and the outputs, exits 1."""
    def fail(why, *outputs):
        print(f"{name}: FAILED:", why)
        for o in outputs:
            print(o)
        sys.exit(1)
    return fail
