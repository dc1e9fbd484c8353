"""The fp32 masters of a zerod checkpoint, read from its files without a
model: what zerod.deepspeed's load_checkpoint(load_module_only=True) and
(load_optimizer_states=False) load, where zd_model_load would bring the
optimizer state too (and refuses another optimizer's).

The format is docs/checkpoints.md's ("On disk"), written and read by
engine/checkpoint/ (manifest.cpp, shard_file.cpp, source.cpp): a manifest
naming each parameter, then one shard per rank of records, each a run of a
parameter's elements of one buffer (0: the master), with a CRC-32C. Every
record read is checked against its checksum, and every parameter's master
must be whole, as zd_model_load checks them: a damaged or cut-off file is
refused naming it, before the caller changes anything.
"""
import os
import struct

import numpy as np

from .errors import InvalidArgumentError, ZerodIOError

MANIFEST = "zerod-checkpoint.txt"
_FORMAT = 6                     # the newest manifest format this reads (engine/checkpoint/manifest.h)
_SHARD_VERSION = 1
_HEADER, _ENTRY, _FOOTER = 32, 40, 32


class Manifest:
    """What a checkpoint's manifest says: step, world_size, zero_stage,
    precision, optimizer, slots, loss_scale, lr (the lr zd_model_set_lr had
    set, None where none was), params [(name, shape)], shard_set, shared
    (False for a snapshot across nodes on node-local disks), parts [(node,
    host, first rank, ranks)]."""

    def __init__(self):
        self.step = 0
        self.world_size = 1
        self.zero_stage = 0
        self.precision = "fp32"
        self.optimizer = ""
        self.slots = ()
        self.loss_scale = None
        self.lr = None
        self.params = []
        self.shard_set = 0
        self.shared = True
        self.parts = []


def _unescape(s):
    if s == "%00":
        return ""
    out, i = bytearray(), 0
    while i < len(s):
        if s[i] == "%":
            out.append(int(s[i + 1:i + 3], 16))
            i += 3
        else:
            out += s[i].encode()
            i += 1
    return out.decode()


def _deepspeed_file_in(path):
    """The first of DeepSpeed's own checkpoint files in directory `path`
    (what `zerod ckpt import` converts; engine/checkpoint/tools.cpp knows
    them by the same names), or None."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return None
    return next((n for n in names if n.endswith(("_model_states.pt", "_optim_states.pt"))), None)


def read_manifest(path):
    """The manifest of the checkpoint in directory `path`."""
    name = os.path.join(path, MANIFEST)
    try:
        with open(name) as f:
            lines = f.read().splitlines()
    except OSError as e:
        theirs = _deepspeed_file_in(path)
        if theirs:
            raise ZerodIOError(f"no zerod checkpoint at {path}: it holds DeepSpeed's own checkpoint files ({theirs}), "
                               f"not zerod's: convert them with `zerod ckpt import {path} --to OUT` and load OUT") \
                from None
        raise ZerodIOError(f"no checkpoint at {path}: {name} cannot be read ({e.strerror}); a directory without "
                           "it holds no whole checkpoint") from None
    m, ended = Manifest(), False
    for n, line in enumerate(lines, 1):
        f = line.split()
        try:
            if n == 1:
                if f[:1] != ["zerod-checkpoint"]:
                    raise ValueError("not a zerod checkpoint manifest")
                if int(f[1]) > _FORMAT:
                    raise ValueError(f"format version {f[1]} is newer than this zerod reads ({_FORMAT})")
            elif not f:
                continue
            elif f[0] == "step":
                m.step = int(f[1])
            elif f[0] == "world_size":
                m.world_size = int(f[1])
            elif f[0] == "zero_stage":
                m.zero_stage = int(f[1])
            elif f[0] == "precision":
                m.precision = f[1]
            elif f[0] == "optimizer":
                m.optimizer = _unescape(f[1])
                m.slots = tuple(_unescape(s) for s in f[3:3 + int(f[2])])
            elif f[0] == "loss_scale":
                m.loss_scale = float.fromhex(f[1])
            elif f[0] == "lr":
                m.lr = float.fromhex(f[1])
            elif f[0] == "param":
                numel, ndim = int(f[1]), int(f[3])
                shape = tuple(int(d) for d in f[4:4 + ndim])
                if int(np.prod(shape)) != numel:
                    raise ValueError("its extents do not multiply to its element count")
                m.params.append((_unescape(f[5 + ndim]), shape))
            elif f[0] == "nodes":
                m.shared = f[2] == "shared"
            elif f[0] == "part":
                m.parts.append((int(f[1]), _unescape(f[2]), int(f[3]), int(f[4])))
            elif f[0] == "shard_set":
                m.shard_set = int(f[1])
            elif f[0] == "end":
                ended = True
                break
            elif f[0] not in ("params", "tensor_scalars", "scalars", "error_feedback", "rank_copies"):
                raise ValueError(f"unknown key '{f[0]}'")
        except (ValueError, IndexError) as e:
            raise InvalidArgumentError(f"{name}:{n}: {e if isinstance(e, ValueError) and str(e) else 'a bad line'}"
                                       ) from None
    if not ended:
        raise InvalidArgumentError(f"{name}: cut off (no 'end' line)")
    return m


def shard_name(rank, world_size, shard_set):
    return f"rank-{rank:05d}-of-{world_size:05d}{'-b' if shard_set == 1 else ''}.zdshard"


def read_masters(path, manifest=None, names=None):
    """{parameter name: float32 numpy array of its shape}: the fp32 masters
    the checkpoint in `path` holds (of `names` only, where given), each
    record checked against its checksum and each master checked whole."""
    m = manifest or read_manifest(path)
    want = {i for i, (name, _) in enumerate(m.params) if names is None or name in names}
    flat = {i: np.empty(int(np.prod(m.params[i][1])), np.float32) for i in want}
    covered = {i: [] for i in want}
    for rank in range(m.world_size):
        shard = os.path.join(path, shard_name(rank, m.world_size, m.shard_set))
        if not m.shared and not os.path.exists(shard):
            for node, host, first, ranks in m.parts:
                if first <= rank < first + ranks:
                    raise ZerodIOError(f"{shard} is not here: this snapshot was taken across nodes on node-local "
                                       f"disks, and rank {rank}'s shard is on node {node} (host {host}); copy every "
                                       f"node's files of {path} into one directory to read it whole")
        with open(shard, "rb") as f:
            for param, first, count, offset, crc in _master_records(f, shard, m):
                if param not in want:
                    continue
                f.seek(offset)
                data = np.fromfile(f, np.uint8, count * 4)
                if data.size != count * 4:
                    raise ZerodIOError(f"{shard} is cut off")
                if crc32c(data) != crc:
                    raise ZerodIOError(f"{shard}: the record of parameter #{param}, buffer 0, elements "
                                       f"{first}..{first + count} fails its checksum: the file is damaged")
                flat[param][first:first + count] = data.view("<f4")
                covered[param].append((first, count))
    out = {}
    for i in sorted(want):
        name, shape = m.params[i]
        at = 0
        for first, count in sorted(covered[i]):
            if first > at:
                break
            at = max(at, first + count)
        if at < flat[i].size:
            raise ZerodIOError(f"{path}: the master of '{name}' is not whole in its shards (elements from {at} "
                               "are in none): the checkpoint is damaged")
        out[name] = flat[i].reshape(shape)
    return out


def _master_records(f, path, m):
    """(param, first, count, offset, crc) of each master record of the
    shard open in `f`, its header, footer and index checked as
    ShardReader checks them."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    if size < _HEADER + _FOOTER:
        raise ZerodIOError(f"{path} is not a whole checkpoint shard ({size} bytes)")
    f.seek(0)
    h = f.read(_HEADER)
    if h[:8] != b"ZDSHARD\0":
        raise ZerodIOError(f"{path} is not a zerod checkpoint shard")
    if struct.unpack_from("<I", h, 8)[0] > _SHARD_VERSION:
        raise ZerodIOError(f"{path} is of shard format {struct.unpack_from('<I', h, 8)[0]}, newer than this "
                           "zerod reads")
    f.seek(size - _FOOTER)
    foot = f.read(_FOOTER)
    if foot[:8] != b"ZDSHIDX\0":
        raise ZerodIOError(f"{path} has no index at its end: it was not written to the end")
    index_at, records, index_crc = struct.unpack_from("<QQI", foot, 8)
    if records > (size - _HEADER - _FOOTER) // _ENTRY or index_at + records * _ENTRY != size - _FOOTER:
        raise ZerodIOError(f"{path}: its index does not fit the file")
    f.seek(index_at)
    index = f.read(records * _ENTRY)
    if crc32c(index) != index_crc:
        raise ZerodIOError(f"{path}: its index fails its checksum")
    for i in range(records):
        param, buffer, first, count, offset, crc = struct.unpack_from("<IIQQQI", index, i * _ENTRY)
        if offset < _HEADER or offset + count * 4 > index_at:
            raise ZerodIOError(f"{path}: record {i} lies outside the file's data")
        if buffer != 0:
            continue
        if param >= len(m.params) or first + count > int(np.prod(m.params[param][1])):
            raise InvalidArgumentError(f"{path}: a record outside the parameters the manifest lists")
        yield param, first, count, offset, crc


# -- CRC-32C (Castagnoli), as engine/checkpoint/crc32c.cpp -------------------
#
# The register update r -> T[(r ^ b) & 0xff] ^ (r >> 8) is linear over GF(2)
# in (r, b), so a run's sum from r is (r shifted through as many zero bytes)
# ^ (the run's sum from 0). numpy sums many equal runs at once, one byte of
# each per step, and joins them pairwise with the shift, a linear map kept
# as four byte tables.

def _table():
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(0x82F63B78), t >> 1).astype(np.uint32)
    return t


_T = _table()
_T16 = _T[np.arange(65536, dtype=np.uint32) & 0xFF] ^ (np.arange(65536, dtype=np.uint32) >> 8)
_T16 = _T[_T16 & 0xFF] ^ (_T16 >> 8)   # a register's low 16 bits through two bytes
_T_LIST = [int(v) for v in _T]
_BASIS = np.uint32(1) << np.arange(32, dtype=np.uint32)
_BYTES = np.arange(256)


class _Shift:
    """x -> the register after x meets n zero bytes."""

    def __init__(self, images):  # images[k]: the map of 1 << k
        self.tabs = np.zeros((4, 256), np.uint32)
        for p in range(4):
            for j in range(8):
                self.tabs[p][(_BYTES >> j) & 1 == 1] ^= images[8 * p + j]

    def __call__(self, x):
        t = self.tabs
        return t[0][x & 0xFF] ^ t[1][(x >> 8) & 0xFF] ^ t[2][(x >> 16) & 0xFF] ^ t[3][x >> 24]

    def then(self, other):
        """This map, then `other`."""
        return _Shift(other(self(_BASIS)))


_IDENTITY = _Shift(_BASIS)
_ONE_ZERO = _Shift(_T[_BASIS & 0xFF] ^ (_BASIS >> 8))


def _shift(n):
    out, base = _IDENTITY, _ONE_ZERO
    while n:
        if n & 1:
            out = out.then(base)
        base = base.then(base)
        n >>= 1
    return out


def _raw(data):
    """The register after `data` (uint8 array) from 0."""
    n = data.size
    if n < 1024:
        r = 0
        for b in data.tolist():
            r = _T_LIST[(r ^ b) & 0xFF] ^ (r >> 8)
        return np.uint32(r)
    lanes = 1 << min(14, (n // 64).bit_length() - 1)
    run = (n // lanes) & ~1
    words = data[:lanes * run].view("<u2").reshape(lanes, run // 2)  # two bytes of each run per step
    r = np.zeros(lanes, np.uint32)
    for k in range(run // 2):
        r = _T16[(r ^ words[:, k]) & 0xFFFF] ^ (r >> 16)
    z = _shift(run)
    while r.size > 1:
        r = z(r[0::2]) ^ r[1::2]
        z = z.then(z)
    rest = data[lanes * run:]
    return _shift(rest.size)(r[0]) ^ _raw(rest)


def crc32c(data):
    """CRC-32C of a bytes-like object, as zerod's checkpoints sum records."""
    a = np.frombuffer(data, np.uint8)
    r = _shift(a.size)(np.uint32(0xFFFFFFFF)) ^ _raw(a)
    return int(~np.uint32(r)) & 0xFFFFFFFF
