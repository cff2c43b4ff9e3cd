"""Sandbox entry point: `python -S -s -P launcher.py` isolates itself, then runs the harness.

The parent (`sandbox.py`) writes a JSON spec to stdin and reads `<token> <json>` frames from
stdout. Strict isolation (the default):

1. unshare new mount, PID, network, IPC and UTS namespaces (plus a user namespace when not
   root, mapping the caller to uid 0 inside it);
2. fork: the child is PID 1 of the new PID namespace, so when it exits the kernel kills every
   process left in the namespace, `setsid` daemons included; it dies with the launcher
   (PR_SET_PDEATHSIG) and the launcher dies with its parent;
3. PID 1 builds a minimal root on a tmpfs: read-only binds of /usr, /etc, the lib dirs and the
   Python standard library, a few /dev nodes, a fresh /proc (this namespace's processes only),
   and a size-capped writable tmpfs at /tmp (work dir /tmp/work) shared with /dev/shm; then
   chroots into it. The network namespace has no interface but a downed loopback;
4. resource limits (address space, processes, open files, no core files), then privileges go:
   as root, to a uid/gid of its own (spec["uid_base"] + launcher pid: no other process on the
   host has it, so RLIMIT_NPROC counts this sandbox only); in a user namespace, all
   capabilities are dropped. Then no_new_privs and non-dumpable;
5. the harness (`harness.py`) runs the tests as PID 1.

Weak isolation (explicit opt-in) skips the namespaces and the new root: the harness runs in a
temporary work dir made by the parent, with the same limits, the same uid drop when root, and
as subreaper of its descendants. It refuses to run as root when the dropped uid could not read
the Python standard library.

Standard library only; imports its sibling modules by path.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_PYTHON_PATHS = [path for path in sys.path if os.path.isdir(path)]
sys.path.insert(0, _HERE)
import harness  # noqa: E402
import linux  # noqa: E402

del sys.path[0]

_MAX_SPEC_BYTES = 1 << 30
_ROOT_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
_DEV_NODES = ("null", "zero", "full", "random", "urandom")
_DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}
_STAGE = "/tmp"  # the new root is mounted over this path, in the private mount namespace
_WORKDIR = "/tmp/work"


class SetupError(Exception):
    """Isolation could not be set up; the message goes to the parent as a setup_error frame."""


def main() -> int:
    """Reads the spec, isolates, runs the harness; returns the process exit status."""
    os.umask(0o022)
    spec = json.loads(_read_all(0, _MAX_SPEC_BYTES))
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != spec["parent_pid"]:
        return 1  # the parent died before PR_SET_PDEATHSIG took effect
    channel = os.dup(1)
    null_fd = os.open(os.devnull, os.O_RDWR)
    os.dup2(null_fd, 0)
    os.dup2(null_fd, 1)
    os.close(null_fd)
    try:
        _check_kernel_features()
        if spec["isolation"] == "strict":
            return _run_strict(spec, channel)
        return _run_weak(spec, channel)
    except SetupError as err:
        harness.send(channel, spec["token"], {"setup_error": str(err)})
        return 3


def _check_kernel_features() -> None:
    """The harness waits on pidfds and feeds stdin from memfds (Linux 5.3 and later)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
        os.close(os.memfd_create("probe"))
    except (AttributeError, OSError) as err:
        raise SetupError(
            f"the sandbox needs Linux >= 5.3 (pidfd_open, memfd_create): {err}"
        ) from None


def _run_strict(spec: dict, channel: int) -> int:
    is_root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    flags = (
        linux.CLONE_NEWNS
        | linux.CLONE_NEWPID
        | linux.CLONE_NEWNET
        | linux.CLONE_NEWIPC
        | linux.CLONE_NEWUTS
    )
    try:
        linux.unshare(flags if is_root else flags | linux.CLONE_NEWUSER)
        if not is_root:
            _write_file("/proc/self/setgroups", "deny")
            _write_file("/proc/self/uid_map", f"0 {uid} 1")
            _write_file("/proc/self/gid_map", f"0 {gid} 1")
    except OSError as err:
        how = "as root" if is_root else f"as uid {uid} with a user namespace"
        raise SetupError(f"cannot create namespaces {how}: {err}") from None
    sandbox_id = spec["uid_base"] + os.getpid() if is_root else None
    pid = os.fork()
    if pid == 0:  # PID 1 of the new PID namespace
        status = 4
        try:
            _init(spec, channel, sandbox_id)
            status = 0
        except SetupError as err:
            harness.send(channel, spec["token"], {"setup_error": str(err)})
            status = 3
        except BaseException:
            import traceback

            traceback.print_exc()  # to the parent's capped stderr pipe
        finally:
            os._exit(status)
    os.close(channel)
    _, wait_status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wait_status)


def _init(spec: dict, channel: int, sandbox_id: int | None) -> None:
    """PID 1: builds the root, chroots, limits and drops privileges, then serves the tests."""
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        root = _build_root(spec["limits"]["tmpfs_mb"], sandbox_id)
        os.chroot(root)
        os.chdir(_WORKDIR)
    except OSError as err:
        raise SetupError(f"cannot build the sandbox filesystem: {err}") from None
    _set_limits(spec["limits"])
    _drop_privileges(sandbox_id)
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)  # changing credentials cleared it
    _set_environment(_WORKDIR)
    harness.serve(spec, channel, kill_all=True)


def _build_root(tmpfs_mb: int, sandbox_id: int | None) -> str:
    """Mounts the minimal root filesystem at _STAGE and returns its path."""
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    binds = [f"/{name}" for name in _ROOT_DIRS if _is_real_dir(f"/{name}")]
    binds += [path for path in _PYTHON_PATHS if path.split("/")[1] not in _ROOT_DIRS]
    binds += [f"/dev/{name}" for name in _DEV_NODES if os.path.exists(f"/dev/{name}")]
    links = {
        f"/{name}": os.readlink(f"/{name}") for name in _ROOT_DIRS if os.path.islink(f"/{name}")
    }
    links.update({f"/dev/{name}": target for name, target in _DEV_LINKS.items()})
    sources = {path: os.open(path, os.O_PATH) for path in binds}  # opened before _STAGE is covered
    linux.mount("tmpfs", _STAGE, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "size=1m,mode=0755")
    writable = _mount_writable(tmpfs_mb, sandbox_id)
    for path, fd in sources.items():
        target = _STAGE + path
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        linux.mount(f"/proc/self/fd/{fd}", target, None, linux.MS_BIND | linux.MS_REC)
        os.close(fd)
    for path, target in links.items():
        os.makedirs(os.path.dirname(_STAGE + path), exist_ok=True)
        os.symlink(target, _STAGE + path)
    os.mkdir(_STAGE + "/proc")
    flags = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    linux.mount("proc", _STAGE + "/proc", "proc", flags)
    _make_read_only(keep_writable={*writable, _STAGE + "/proc"})
    return _STAGE


def _mount_writable(tmpfs_mb: int, sandbox_id: int | None) -> tuple[str, str]:
    """The size-capped tmpfs at /tmp (work dir /tmp/work), also bound at /dev/shm."""
    tmp, shm = _STAGE + "/tmp", _STAGE + "/dev/shm"
    os.makedirs(tmp)
    options = f"size={tmpfs_mb}m,nr_inodes=16384,mode=1777"
    linux.mount("tmpfs", tmp, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, options)
    for name, mode in (("work", 0o700), (".shm", 0o1777)):
        os.mkdir(f"{tmp}/{name}")
        os.chmod(f"{tmp}/{name}", mode)
    if sandbox_id is not None:
        os.chown(f"{tmp}/work", sandbox_id, sandbox_id)
    os.makedirs(shm)
    linux.mount(f"{tmp}/.shm", shm, None, linux.MS_BIND)
    return tmp, shm


def _make_read_only(keep_writable: set[str]) -> None:
    """Bind-remounts every mount under _STAGE read-only and nosuid, except `keep_writable`.

    MS_BIND makes this a per-mount change in this namespace; the host's mounts are untouched.
    """
    for mount_point in _mount_points():
        inside = mount_point == _STAGE or mount_point.startswith(_STAGE + "/")
        if inside and mount_point not in keep_writable:
            flags = linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY | linux.MS_NOSUID
            linux.mount(None, mount_point, None, flags | linux.preserved_mount_flags(mount_point))


def _mount_points() -> list[str]:
    """Mount points of this mount namespace, from /proc/self/mountinfo (octal escapes decoded)."""
    with open("/proc/self/mountinfo") as handle:
        fields = [line.split()[4] for line in handle if line.strip()]
    return sorted({re.sub(r"\\([0-7]{3})", _octal_char, field) for field in fields})


def _octal_char(match: re.Match[str]) -> str:
    return chr(int(match.group(1), 8))


def _run_weak(spec: dict, channel: int) -> int:
    """Weak isolation: limits, uid drop when root, subreaper cleanup; no namespaces."""
    workdir = spec["workdir"]
    sandbox_id = spec["uid_base"] + os.getpid() if os.geteuid() == 0 else None
    if sandbox_id is not None:
        unreadable = [path for path in _PYTHON_PATHS if not _world_readable(path)]
        if unreadable:
            raise SetupError(
                f"weak isolation drops root to uid {sandbox_id}, which cannot read the Python "
                f"library at {unreadable[0]} (a parent directory is not world-searchable); "
                "make it world-readable or use isolation='strict'"
            )
        os.chown(workdir, sandbox_id, sandbox_id)
    os.chdir(workdir)
    linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)
    _set_limits(spec["limits"])
    _drop_privileges(sandbox_id)
    _set_environment(workdir)
    harness.serve(spec, channel, kill_all=sandbox_id is not None)
    return 0


def _set_limits(limits: dict) -> None:
    """Hard and soft limits of the harness, inherited by every test process."""
    import resource

    for name, which, value in (
        ("address space", resource.RLIMIT_AS, limits["memory_mb"] << 20),
        ("processes", resource.RLIMIT_NPROC, limits["max_processes"]),
        ("open files", resource.RLIMIT_NOFILE, limits["max_open_files"]),
        ("core size", resource.RLIMIT_CORE, 0),
    ):
        try:
            resource.setrlimit(which, (value, value))
        except (OSError, ValueError) as err:
            raise SetupError(f"cannot set the {name} limit to {value}: {err}") from None


def _drop_privileges(sandbox_id: int | None) -> None:
    """As root: switch to `sandbox_id` (capabilities go with uid 0). Else: drop capabilities."""
    try:
        if sandbox_id is not None:
            os.setgroups([])
            os.setresgid(sandbox_id, sandbox_id, sandbox_id)
            os.setresuid(sandbox_id, sandbox_id, sandbox_id)
        else:
            linux.drop_capabilities()
        linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
        linux.prctl(linux.PR_SET_DUMPABLE, 0)
    except OSError as err:
        raise SetupError(f"cannot drop privileges: {err}") from None


def _set_environment(workdir: str) -> None:
    """A fixed environment for the program: nothing inherited, one thread per math library."""
    os.environ.clear()
    os.environ.update(
        {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
    )


def _is_real_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


def _world_readable(path: str) -> bool:
    """True when a uid with no relation to the owners can list `path` and reach it."""
    parts = os.path.abspath(path).split("/")
    for depth in range(1, len(parts)):
        ancestor = "/".join(parts[:depth]) or "/"
        if not os.stat(ancestor).st_mode & stat.S_IXOTH:
            return False
    mode = os.stat(path).st_mode
    return bool(mode & stat.S_IROTH and mode & stat.S_IXOTH)


def _read_all(fd: int, cap: int) -> bytes:
    chunks = []
    size = 0
    while chunk := os.read(fd, 1 << 20):
        size += len(chunk)
        if size > cap:
            raise ValueError(f"sandbox spec larger than {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _write_file(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    sys.exit(main())
