"""A rank of the daemon receives its own device pool and no other: the
daemon sends a rank's connection the fds of that rank's pool only (its
memfd arenas here; on a GPU its CUDA allocations, the same way), so no
trainer can map another rank's memory (issue 32). Two ranks at stage 3
train a few steps under `zerod run`; each lists the pool regions mapped in
its process."""
from conftest import HERE, zerod_run
from models import job


def test_each_rank_maps_its_own_pool_only(tmp_job):
    rc, ranks, out = zerod_run(2, tmp_job(job("fp32", 3)), f"{HERE}/pools_rank.py", 3)
    assert rc == 0, out
    for r in (0, 1):
        line = next(line for line in ranks[r] if line.startswith("rank "))
        pools = line.split("pools", 1)[1].split()
        assert pools, f"rank {r} mapped no pool region at all: the test proves nothing ({line})"
        assert all(p.startswith(f"zerod-rank{r}-") for p in pools), f"rank {r} mapped {pools}"
