"""The zd_* calls from Python: clients, models, views, errors, library lookup."""
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import numpy as np
import pytest
import torch

import zerod
from zerod import Dtype, MemKind, Tier

from conftest import BINDINGS, rank_env

SGD = 'return { optimizer = { type = "sgd", lr = 0.5 } }'


@pytest.fixture
def client():
    with zerod.connect("embedded:") as c:
        yield c


def one_layer(client, dtype=Dtype.F32, script=SGD):
    m = client.create_model(script_text=script)
    w = m.register_param("fc.weight", "fc", (2, 3), dtype, init=np.arange(6, dtype=np.float32).reshape(2, 3))
    b = m.register_param("fc.bias", "fc", (2,), dtype)
    m.finalize()
    return m, m.find_module("fc"), w, b


def test_embedded_client_info(client):
    assert client.info == zerod.ClientInfo(rank=0, world_size=1, local_rank=0, embedded=True)
    assert zerod.rank() == 0 and zerod.world_size() == 1
    assert zerod.abi_version()[0] == 1 and zerod.__version__


def test_registry_lookups(client):
    m, fc, w, b = one_layer(client)
    assert (m.param_count, m.module_count) == (2, 1)
    assert m.find_param("fc.bias") == b
    assert m.module_info(fc) == ("fc", [w, b])
    assert m.param_info(w) == zerod.ParamInfo("fc.weight", Dtype.F32, fc, (2, 3), 6)
    with pytest.raises(zerod.NotFoundError, match="no module named 'nope'"):
        m.find_module("nope")


def test_one_step_through_views(client):
    m, fc, w, b = one_layer(client)
    m.forward_begin(fc)
    view = m.param_view(w)
    arr = view.numpy()
    assert view.read_only and not arr.flags.writeable
    np.testing.assert_array_equal(arr, np.arange(6).reshape(2, 3))
    t = view.torch()
    assert t.data_ptr() == view.data_ptr == arr.ctypes.data  # no copies
    m.forward_end(fc)
    assert not view.valid
    with pytest.raises(zerod.InvalidStateError, match="ended with its module's _end"):
        view.numpy()

    m.backward_begin(fc)
    gw, gb = m.grad_view(w), m.grad_view(b)
    assert not gw.read_only
    np.testing.assert_array_equal(gw.numpy(), 0)  # zero at backward_begin
    gw.torch().fill_(1.0)                      # written through torch ...
    gb.numpy()[:] = 2.0                        # ... and through numpy
    m.backward_end(fc)
    r = m.step()
    assert r.boundary and r.applied and not r.skipped and r.step == 1
    assert r.grad_norm == pytest.approx(np.sqrt(6 + 2 * 4))
    np.testing.assert_allclose(m.param_read(w), np.arange(6).reshape(2, 3) - 0.5)
    np.testing.assert_allclose(m.param_read(b), [-1.0, -1.0])


def test_set_lr_replaces_the_schedule_from_the_next_boundary(client):
    m, fc, w, b = one_layer(client)

    def step(grad):
        m.forward_begin(fc)
        m.forward_end(fc)
        m.backward_begin(fc)
        m.grad_view(w).numpy()[:] = grad
        m.backward_end(fc)
        return m.step()
    assert step(1.0).lr == 0.5  # the job's
    m.set_lr(0.25)
    assert step(1.0).lr == 0.25
    np.testing.assert_allclose(m.param_read(w), np.arange(6).reshape(2, 3) - 0.75)
    with pytest.raises(zerod.InvalidArgumentError, match="the learning rate is nan; it must be finite and >= 0"):
        m.set_lr(float("nan"))
    m.forward_begin(fc)
    with pytest.raises(zerod.InvalidStateError, match="zd_model_set_lr while modules are begun"):
        m.set_lr(0.1)
    m.forward_end(fc)
    assert step(0.0).lr == 0.25  # refused values changed nothing


def test_bf16_views_and_whole_parameter_access(client):
    m, fc, w, _ = one_layer(client, Dtype.BF16, 'return { precision = "bf16" }')
    m.forward_begin(fc)
    view = m.param_view(w)
    assert view.numpy().dtype == np.uint16  # numpy has no bfloat16: the bits
    t = view.torch()
    assert t.dtype == torch.bfloat16 and t.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert torch.from_dlpack(view).data_ptr() == view.data_ptr  # DLPack, no copy
    m.forward_end(fc)
    m.param_write(w, torch.full((2, 3), 1.5, dtype=torch.bfloat16))
    assert m.param_read(w).tolist() == [[1.5] * 3] * 2
    bits = m.param_read(w, Dtype.BF16)
    assert bits.dtype == np.uint16 and torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).tolist()[0][0] == 1.5
    with pytest.raises(zerod.InvalidArgumentError, match="dtype=Dtype.BF16"):
        m.param_write(w, bits)
    m.param_write(w, bits, Dtype.BF16)


def test_memory_figures(client):
    m, _, _, _ = one_layer(client)
    device = m.memory(Tier.DEVICE)
    assert device.current > 0 and device.peak >= device.current
    assert m.memory(Tier.DEVICE, MemKind.MASTER).current >= 6 * 4
    with pytest.raises(zerod.InvalidArgumentError, match="rank 3 is outside"):
        m.memory(rank=3)


def test_comm_figures_or_a_clear_refusal(client):
    m, _, _, _ = one_layer(client)
    try:
        figures = m.comm_figures()
    except zerod.ZerodNotImplementedError as e:  # a libzerod from before the call existed
        assert "zd_model_comm_figures: the loaded libzerod (ABI 1." in str(e)
        return
    assert figures.network_bytes_sent == 0  # one rank, no collectives with anyone


def test_optimizer_state_for_checkpoints_or_a_clear_refusal(client):
    m, fc, w, b = one_layer(client, script='return { optimizer = { type = "adamw", lr = 0.1 } }')
    try:
        info = m.optimizer_info()
    except zerod.ZerodNotImplementedError as e:  # a libzerod from before these calls
        assert "zd_model_optimizer_info: the loaded libzerod (ABI 1." in str(e)
        return
    assert info.name == "adamw" and info.step == 0 and len(info.slot_names) == 2
    state = np.full((2, 3), 0.25, dtype=np.float32)
    m.optimizer_state_write(w, 0, state)
    np.testing.assert_array_equal(m.optimizer_state_read(w, 0), state)
    m.set_step(7)
    assert m.optimizer_info().step == 7


def test_errors_carry_zerod_messages(client):
    m, fc, w, _ = one_layer(client)
    with pytest.raises(zerod.InvalidStateError) as e:
        m.forward_end(fc)
    assert e.value.status == zerod.errors.ERR_INVALID_STATE
    assert e.value.status_name == "ZD_ERR_INVALID_STATE"
    assert "zd_forward_end: module 'fc' is not in forward" in str(e.value)
    assert m.last_error == e.value.message
    with pytest.raises(zerod.InvalidStateError, match="is not resident"):
        m.param_view(w)
    with pytest.raises(zerod.InvalidStateError, match="registered after zd_model_finalize"):
        m.register_param("late", "fc", (1,))
    with pytest.raises(ValueError, match="ndim is 0"):  # InvalidArgumentError is a ValueError too
        client.create_model(script_text=SGD).register_param("scalar", "m", ())
    bad = "return {\n  optimizer = { type = 'adamw' },\n  gradient_clipp1ng = 1.0,\n}\n"
    with pytest.raises(zerod.ConfigError, match=r"job.lua:3: unknown key 'gradient_clipp1ng' "
                                                r"\(did you mean 'gradient_clipping'\?\)"):
        client.create_model(script_text=bad)
    with pytest.raises(zerod.ZerodIOError, match="/no/such/job.lua"):
        client.create_model(script_path="/no/such/job.lua")


def test_closed_objects_refuse_calls():
    c = zerod.connect("embedded:")
    m, fc, _, _ = one_layer(c)
    c.close()
    with pytest.raises(zerod.InvalidArgumentError, match="closed"):
        m.forward_begin(fc)
    c.close()  # twice is fine


@pytest.mark.parametrize("closing", ["model", "client"])
def test_views_end_with_their_model_or_client(closing):
    """Views point into the model's memory, which zd_model_destroy and
    zd_disconnect free: closing either ends every open view, as an _end
    call does, instead of leaving it to read freed memory."""
    c = zerod.connect("embedded:")
    m, fc, w, _ = one_layer(c)
    m.forward_begin(fc)
    v = m.param_view(w)
    assert v.valid and v.numpy().shape == (2, 3)
    (m if closing == "model" else c).close()
    assert not v.valid
    with pytest.raises(zerod.InvalidStateError, match="model or client was closed"):
        v.numpy()
    c.close()


def python(code, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=rank_env(**env))


def test_dlpack_tensors_freed_at_the_interpreters_last_collection_are_fine(tmp_path):
    """A view tensor that a reference cycle (a DeepSpeedEngine's) keeps until
    the interpreter's last garbage collection is freed after the bindings'
    module globals are gone: its DLPack deleter must not be Python (it was:
    SIGSEGV at exit on a GPU, where views are DLPack tensors). The engine's
    class lives in a module imported after zerod's, as DeepSpeed's does."""
    (tmp_path / "engine_like.py").write_text(textwrap.dedent("""
        import ctypes
        import numpy as np
        from zerod.views import dlpack_capsule

        MEMORY = (ctypes.c_float * 4096)(*range(4096))

        class View:
            def __init__(self, at):
                self.at = at

            def __dlpack__(self, stream=None):
                return dlpack_capsule(ctypes.addressof(MEMORY) + 4 * self.at, 1, (4, 16), 1, 0)

            def __dlpack_device__(self):
                return (1, 0)

        class Optimizer:
            def __init__(self, engine):
                self._engine = engine

        class Engine:  # a cycle, as DeepSpeedEngine and its optimizer are
            def __init__(self):
                self.tensors = {i: np.from_dlpack(View(64 * i)) for i in range(32)}
                self.optimizer = Optimizer(self)
        """))
    code = """
        import sys
        sys.path.insert(0, %r)
        import engine_like
        engine = engine_like.Engine()
        assert engine.tensors[3].shape == (4, 16) and engine.tensors[3][1, 0] == 208.0
        print("done", flush=True)
        """ % str(tmp_path)
    for _ in range(3):  # the crash depended on where the freed memory went
        p = python(code)
        assert p.returncode == 0 and p.stdout.strip() == "done", (p.returncode, p.stdout, p.stderr)


def test_library_not_found_says_how_to_fix():
    p = python("import zerod", ZEROD_LIB="/nonexistent/libzerod.so")
    assert p.returncode != 0
    assert "cannot load libzerod" in p.stderr and "ZEROD_LIB" in p.stderr and "/nonexistent" in p.stderr


def installed_elsewhere(tmp_path):
    """A copy of the package outside the checkout, as pip installs it, and a
    runner of `import zerod` there from / with only the given PATH: no
    ZEROD_LIB, no LD_LIBRARY_PATH, nothing of this build."""
    site = tmp_path / "site"
    shutil.copytree(os.path.join(BINDINGS, "zerod"), site / "zerod", ignore=shutil.ignore_patterns("__pycache__"))

    def run(code, path):
        env = {"PATH": path, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(tmp_path)}
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              env=env, cwd="/")
    return run


def fake_install(prefix, libdir, library):
    """<prefix>/bin/zerod (a stand-in: only its place matters) and
    <prefix>/<libdir>/libzerod.so.1 -> library."""
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "zerod").write_text("#!/bin/sh\nexit 1\n")
    (prefix / "bin" / "zerod").chmod(0o755)
    (prefix / libdir).mkdir(parents=True)
    (prefix / libdir / "libzerod.so.1").symlink_to(library)


# CMAKE_INSTALL_LIBDIR's usual values: the default, Fedora's, Debian's for /usr.
MULTIARCH = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"


@pytest.mark.parametrize("libdir", ["lib", "lib64", f"lib/{MULTIARCH}"])
def test_an_installed_package_finds_the_libzerod_beside_zerod_on_path(tmp_path, libdir):
    # `cmake --install` without ldconfig: the dynamic linker does not look in
    # <prefix>/lib, but the install's bin is on PATH. It failed, naming a
    # build tree that an installed package does not have.
    run = installed_elsewhere(tmp_path)
    prefix = tmp_path / "prefix"
    fake_install(prefix, libdir, os.path.realpath(zerod._lib.lib._name))
    p = run("import zerod; print(zerod._lib.lib._name)", f"{prefix}/bin:/usr/bin:/bin")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"{prefix}/{libdir}/libzerod.so.1"


def test_library_not_found_lists_what_was_tried_with_the_loaders_reasons(tmp_path):
    run = installed_elsewhere(tmp_path)
    prefix = tmp_path / "prefix"
    not_a_library = tmp_path / "not_a_library"
    not_a_library.write_text("not an ELF file\n" * 16)  # longer than an ELF header, or "file too short"
    fake_install(prefix, "lib", not_a_library)
    p = run("import zerod; print(zerod._lib.lib._name)", f"{prefix}/bin:/usr/bin:/bin")
    if p.returncode == 0:
        pytest.skip(f"this machine has a libzerod of its own the package finds: {p.stdout.strip()}")
    err = p.stderr
    assert "cannot load libzerod. Tried, in order:" in err and "ZEROD_LIB: not set" in err, err
    assert "build tree" not in err, err  # an installed package has none
    assert f"beside the zerod on PATH ({prefix}/bin/zerod): {prefix}/lib/libzerod.so.1: " in err, err
    assert "invalid ELF header" in err, err  # the loader's own reason
    assert "the dynamic linker's search path" in err and "cannot open shared object file" in err, err
    assert "run `sudo ldconfig`" in err and "set ZEROD_LIB=<prefix>/lib/libzerod.so" in err, err
    p = run("import zerod", "/nonexistent")
    assert "beside the zerod on PATH: no zerod on PATH" in p.stderr, p.stderr


def test_torchrun_ranks_without_a_daemon_are_refused_by_name():
    # torchrun --nproc_per_node 2 train.py: each process has RANK and
    # WORLD_SIZE. Without a daemon each would silently train alone as rank 0
    # of 1 (issue 36); zerod refuses naming the launcher and `zerod run`.
    code = '''
        import torch, zerod.torch
        zerod.torch.initialize(torch.nn.Linear(2, 2), job_text="return {}")
    '''
    p = python(code, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", ZEROD_ENDPOINT="")
    assert p.returncode != 0
    assert "torchrun" in p.stderr and "rank 1 of 2" in p.stderr and "zerod run --nproc N" in p.stderr, p.stderr
    assert python(code, RANK="0", WORLD_SIZE="1", ZEROD_ENDPOINT="").returncode == 0


def test_another_abi_major_is_refused(tmp_path):
    src = tmp_path / "fake.c"
    src.write_text("unsigned zd_abi_version(void) { return 2u << 16; }\n")
    lib = tmp_path / "libzerod.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    p = python("import zerod", ZEROD_LIB=str(lib))
    assert p.returncode != 0
    assert "provides ABI 2.0, but this Python package speaks ABI 1.x" in p.stderr


def test_pip_installable_offline(tmp_path):
    # The package installs with Debian's pip and setuptools and no network.
    # From a copy: setuptools writes build/ and *.egg-info beside the sources.
    if python("import setuptools, wheel, pip").returncode != 0:
        pytest.skip("pip, setuptools or wheel is not installed")
    source = tmp_path / "src"
    shutil.copytree(BINDINGS, source, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                        "--no-deps", "--target", str(target), str(source)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (target / "zerod" / "torch.py").exists()
