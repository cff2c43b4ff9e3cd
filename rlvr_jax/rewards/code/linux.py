"""Thin ctypes wrappers over the Linux system calls the sandbox launcher needs.

Python 3.11 has no `os.unshare`, `mount` or `capset`, so they are called through libc. Every
wrapper raises `OSError` naming the call and its arguments when the kernel refuses. Standard
library only: this module is imported by `launcher.py`, which runs as a bare script
(`python -S -s -P launcher.py`), never through the `rlvr_jax` package.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
_libc.unshare.argtypes = [ctypes.c_int]
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _check(ret: int, call: str) -> None:
    """Raises OSError(errno) describing `call` when a libc call returned -1."""
    if ret == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{call} failed: {os.strerror(err)}")


def _encode(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def unshare(flags: int) -> None:
    """Moves the calling process into new namespaces (CLONE_NEW* flags)."""
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    """mount(2). Never call with MS_REMOUNT but without MS_BIND on a mount shared with the host:
    that would change the host's superblock; per-mount flags need MS_REMOUNT | MS_BIND."""
    ret = _libc.mount(_encode(source), _encode(target), _encode(fstype), flags, _encode(data))
    _check(ret, f"mount({source!r}, {target!r}, {fstype!r}, {flags:#x}, {data!r})")


def prctl(option: int, arg: int) -> None:
    """prctl(2) with one argument."""
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option}, {arg})")


def drop_capabilities() -> None:
    """Clears the effective, permitted and inheritable capability sets of the calling thread.

    The launcher is single-threaded when it calls this, so the whole process loses them. Ambient
    capabilities vanish with the permitted set.
    """
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset(0)")


def preserved_mount_flags(path: str) -> int:
    """The per-mount flags of the mount at `path` that a bind remount must keep.

    Inside a user namespace the kernel locks nosuid/nodev/noexec and the atime flags of mounts
    inherited from the parent namespace; a remount that drops one of them fails with EPERM.
    """
    st_flags = os.statvfs(path).f_flag
    pairs = (
        (os.ST_NOSUID, MS_NOSUID),
        (os.ST_NODEV, MS_NODEV),
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
    )
    return sum(ms for st, ms in pairs if st_flags & st)
