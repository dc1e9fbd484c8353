"""scripts/openblas-coretype.py, which scripts/run-main.sh runs before the
main job: where the OpenBLAS torch loaded fell back to its Prescott kernels
(a CPU its table does not know) it chooses the best kernels the CPU's flags
allow, after checking that OpenBLAS runs them and that they compute what
the fallback computes; anywhere else it chooses nothing. The fallback is
made here with OPENBLAS_CORETYPE=Prescott (the chooser's --assume-core), on
whatever CPU runs the tests."""
import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "openblas-coretype.py")
spec = importlib.util.spec_from_file_location("openblas_coretype", SCRIPT)
oc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(oc)

AVX512 = {"sse3", "avx", "avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


def test_candidate_from_flags():
    assert oc.candidate(AVX512, "Prescott") == "SkylakeX"
    assert oc.candidate(AVX512, "PRESCOTT") == "SkylakeX"  # OPENBLAS_CORETYPE is case-blind
    assert oc.candidate(AVX512 - {"avx512bw"}, "Prescott") == "Haswell"  # AVX-512 F alone (Knights Landing)
    assert oc.candidate({"sse3", "avx", "avx2", "fma"}, "Prescott") == "Haswell"
    assert oc.candidate({"sse3", "avx", "avx2"}, "Prescott") == "SandyBridge"  # AVX2 without FMA
    assert oc.candidate({"sse3", "ssse3"}, "Prescott") is None  # Prescott is right there
    # A CPU OpenBLAS recognised keeps OpenBLAS's choice, whatever the flags.
    for core in ("SkylakeX", "Cooperlake", "Haswell", "Zen", "Nehalem"):
        assert oc.candidate(AVX512, core) is None
    assert oc.candidate(AVX512, None) is None


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu sse3 avx2 fma avx\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert oc.cpu_flags(str(f)) == {"fpu", "sse3", "avx2", "fma", "avx"}
    assert oc.cpu_flags(str(tmp_path / "none")) == set()


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """This CPU's flags and the kernels OpenBLAS picks for it, or a skip
    where torch does not use OpenBLAS."""
    probe = oc.run_probe(sys.executable, None, save=str(tmp_path_factory.mktemp("probe") / "products.pt"))
    if not probe.get("openblas"):
        pytest.skip(f"{sys.executable}'s torch does not do its matrix math through OpenBLAS")
    return oc.cpu_flags(), probe["core"]


def test_chooses_better_kernels_after_the_fallback_and_checks_them(machine):
    flags, _ = machine
    want = oc.candidate(flags, "Prescott")
    if want is None:
        pytest.skip("this CPU has nothing better than Prescott's kernels (no AVX)")
    assert oc.choose(sys.executable, flags, assume_core="Prescott") == want


def test_leaves_openblas_choice_on_a_cpu_it_knows(machine):
    flags, core = machine
    # What a user's run does: only the Prescott fallback is replaced.
    assert oc.choose(sys.executable, flags) == oc.candidate(flags, core)
    if core.lower() != "prescott":
        assert oc.choose(sys.executable, flags) is None


def test_refuses_kernels_openblas_does_not_run(machine, capsys):
    flags, _ = machine
    # OpenBLAS answers an OPENBLAS_CORETYPE it has no kernels for with its
    # own pick: not the kernels asked for, so not chosen.
    assert oc.choose(sys.executable, flags, assume_core="Prescott", candidates=[("NoSuchCore", set())]) is None
    assert "OPENBLAS_CORETYPE=NoSuchCore gave" in capsys.readouterr().err


def test_refuses_kernels_whose_results_differ(machine, capsys):
    flags, _ = machine
    want = oc.candidate(flags, "Prescott")
    if want is None:
        pytest.skip("this CPU has nothing better than Prescott's kernels (no AVX)")
    # Other kernels round differently: with no rounding allowed at all the
    # check must see the difference and keep the fallback.
    assert oc.choose(sys.executable, flags, assume_core="Prescott", tolerance=0.0) is None
    assert f"{want}'s products differ from Prescott's" in capsys.readouterr().err


def test_command_line_prints_only_the_choice(machine):
    flags, _ = machine
    want = oc.candidate(flags, "Prescott")
    p = subprocess.run([sys.executable, SCRIPT, "--assume-core", "Prescott"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout == (f"{want}\n" if want else ""), p.stderr
    # A torch that cannot be run: nothing chosen, the reason said, exit 0
    # (the main job then runs with OpenBLAS's own choice).
    p = subprocess.run([sys.executable, SCRIPT, "--python", "/nonexistent/python3"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "" and "could not ask OpenBLAS" in p.stderr, p.stderr
