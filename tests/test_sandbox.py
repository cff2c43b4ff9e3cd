"""The code sandbox against hostile programs: each attack scores 0 and leaves the host intact.

Every test here runs real programs under strict isolation (namespaces, new root, dropped uid)
and afterwards checks that no process of a sandbox uid, and no launcher, is left on the host.
The module is skipped, with the reason, where strict isolation cannot be set up.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlvr_jax.rewards.code import (
    SandboxLimits,
    SandboxUnavailableError,
    check_program,
    run_tests,
)
from rlvr_jax.rewards.code.sandbox import LAUNCHER, SANDBOX_UID_BASE, run_sandboxed

REPO = Path(__file__).resolve().parents[1]


def _strict_unavailable_reason() -> str | None:
    try:
        run_sandboxed("pass", [{"kind": "exec", "source": "pass"}])
    except SandboxUnavailableError as err:
        return str(err)
    return None


_REASON = _strict_unavailable_reason() if sys.platform.startswith("linux") else "not Linux"
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"strict sandbox: {_REASON}")

SHORT = SandboxLimits(timeout_s=1.0, memory_mb=256, max_processes=16)
"""For programs that must hit the deadline."""
LIMITS = SandboxLimits(timeout_s=5.0, memory_mb=256, max_processes=16)
"""For everything else: a deadline a loaded machine cannot reach by accident."""


def _parent(pid: int) -> int:
    """The parent pid of `pid` (0 once the process is gone)."""
    try:
        stat_text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return int(stat_text.rsplit(")", 1)[1].split()[1])


def _lineage(pid: int) -> list[int]:
    """`pid` and its ancestors, up to the host's init."""
    chain = [pid]
    while chain[-1] > 1:
        chain.append(_parent(chain[-1]))
    return chain


def _sandbox_processes() -> list[str]:
    """Live sandbox processes (a sandbox uid, or a launcher command line) that this test run
    started or that were orphaned; sandboxes of other processes on a shared machine are not
    counted. Zombies, already dead and waiting to be reaped, are not counted either."""
    candidates: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        real_uid = int(fields["Uid"].split()[0])
        if fields["State"].split()[0] in ("Z", "X"):
            continue
        if real_uid >= SANDBOX_UID_BASE or str(LAUNCHER) in cmdline:
            candidates[int(entry)] = f"pid {entry} uid {real_uid}: {cmdline.strip()}"
    ours = os.getpid()
    our_ancestors = set(_lineage(ours))
    found = []
    for pid, description in candidates.items():
        outside = next((p for p in _lineage(pid) if p not in candidates), 0)
        if outside in our_ancestors or ours in _lineage(outside):  # orphaned, or started by us
            found.append(description)
    return found


@pytest.fixture(autouse=True)
def _nothing_survives():
    assert _sandbox_processes() == [], "sandbox processes were running before the test"
    yield
    deadline = time.monotonic() + 3.0  # SIGKILLed processes may take a moment to exit
    while (leftovers := _sandbox_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers == [], f"sandbox processes survived the test: {leftovers}"


def _program(source: str) -> str:
    return textwrap.dedent(source).strip() + "\n"


def test_infinite_loop_is_stopped_at_the_deadline():
    program = _program(
        """
        def f():
            while True:
                pass
        """
    )
    start = time.monotonic()
    results = check_program(program, [{"call": "f", "expected": 1}], limits=SHORT)
    elapsed = time.monotonic() - start
    assert [r.outcome.status for r in results] == ["timeout"]
    assert not results[0].passed
    assert 1.0 <= elapsed < 5.0  # the 1 s deadline, plus start-up and cleanup


def test_fork_bomb_is_capped_by_the_process_limit_and_fully_killed():
    counting = _program(
        """
        import os, time
        def forks():
            made = 0
            try:
                while True:
                    if os.fork() == 0:
                        time.sleep(60)
                        os._exit(0)
                    made += 1
            except OSError:
                return made
        """
    )
    (counted,) = check_program(counting, [{"call": "forks", "expected": -1}], limits=LIMITS)
    made = json.loads(counted.outcome.values[0])
    # RLIMIT_NPROC = 16 for the sandbox uid: the harness and the test process hold 2 of them.
    assert counted.outcome.status == "ok" and 1 <= made <= LIMITS.max_processes - 2
    exponential = _program(
        """
        import os
        def bomb():
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        """
    )
    start = time.monotonic()
    assert run_tests(exponential, ["assert bomb() is None"], timeout_s=1.0, memory_mb=256) == 0.0
    assert time.monotonic() - start < 8.0


def test_memory_bomb_fails_fast_under_the_address_space_limit():
    program = _program(
        """
        def at_once():
            return len(bytearray(8 << 30))
        def growing():
            chunks = []
            while True:
                chunks.append(bytearray(64 << 20))
        """
    )
    tests = [{"call": "at_once", "expected": 8 << 30}, {"call": "growing", "expected": 0}]
    start = time.monotonic()
    results = check_program(program, tests, limits=LIMITS)
    assert [r.passed for r in results] == [False, False]
    assert [r.outcome.detail.split(":")[0] for r in results] == ["MemoryError", "MemoryError"]
    assert time.monotonic() - start < 5.0


def test_writes_outside_the_work_dir_fail_and_never_reach_the_host(tmp_path):
    open_dir = tmp_path / "world_writable"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    tag = secrets.token_hex(4)
    targets = [
        str(open_dir / "pwned"),
        f"/var/tmp/rlvr_pwned_{tag}",
        str(REPO / f"rlvr_pwned_{tag}"),
        f"/etc/rlvr_pwned_{tag}",
    ]
    shm = f"/dev/shm/rlvr_pwned_{tag}"  # the sandbox's own /dev/shm: writable, but private
    program = _program(
        f"""
        import os
        TARGETS = {targets!r}
        def attempt(path):
            try:
                with open(path, "w") as handle:
                    handle.write("pwned")
                return True
            except OSError:
                return False
        def outside():
            return [attempt(path) for path in TARGETS]
        def own_dir():
            return [attempt("here.txt"), attempt("/tmp/scratch.txt"), attempt({shm!r}), os.getcwd()]
        """
    )
    tests = [
        {"call": "outside", "expected": [True] * len(targets)},
        {"call": "own_dir", "expected": [True, True, True, "/tmp/work"]},
    ]
    results = check_program(program, tests, limits=LIMITS)
    assert json.loads(results[0].outcome.values[0]) == [False] * len(targets)
    assert [r.passed for r in results] == [False, True]
    assert [path for path in [*targets, shm] if os.path.exists(path)] == []


def test_parent_environment_secrets_are_unreachable(monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("RLVR_SANDBOX_TEST_SECRET", secret)
    program = _program(
        """
        import glob, os
        NAME = b"RLVR_SANDBOX_TEST_SECRET="
        def steal():
            if "RLVR_SANDBOX_TEST_SECRET" in os.environ:
                return os.environ["RLVR_SANDBOX_TEST_SECRET"]
            paths = glob.glob("/proc/*/environ") + [f"/proc/{os.getppid()}/environ"]
            for path in paths:
                try:
                    data = open(path, "rb").read()
                except OSError:
                    continue
                for item in data.split(b"\\0"):
                    if item.startswith(NAME):
                        return item[len(NAME):].decode()
            return None
        def environment():
            return sorted(os.environ)
        """
    )
    tests = [{"call": "steal", "expected": secret}, {"call": "environment", "expected": []}]
    steal, environment = check_program(program, tests, limits=LIMITS)
    assert not steal.passed and steal.outcome.values == ("null",)
    names = json.loads(environment.outcome.values[0])
    assert "RLVR_SANDBOX_TEST_SECRET" not in names
    assert set(names) <= {"PATH", "HOME", "TMPDIR", "LANG"} | {
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
    }


def test_network_connection_to_a_local_listener_is_impossible():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        program = _program(
            f"""
            import socket
            def connect():
                with socket.create_connection(("127.0.0.1", {port}), timeout=0.5) as conn:
                    conn.sendall(b"exfiltrated")
                return "connected"
            def interfaces():
                return [name for _, name in socket.if_nameindex()]
            """
        )
        tests = [
            {"call": "connect", "expected": "connected"},
            {"call": "interfaces", "expected": ["lo"]},
        ]
        connect, interfaces = check_program(program, tests, limits=LIMITS)
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()
    assert not connect.passed and connect.outcome.status == "error"
    assert "unreachable" in connect.outcome.detail.lower()
    assert interfaces.passed  # a network namespace with a (downed) loopback only


def test_objects_that_lie_about_equality_score_zero():
    program = _program(
        """
        class Liar:
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
            def __lt__(self, other):
                return True
            def __bool__(self):
                return True
            __hash__ = object.__hash__
        class LyingInt(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def f(x):
            return Liar()
        def g(x):
            return LyingInt(x + 100)
        def honest(x):
            return x + 1
        """
    )
    lying_tests = [
        {"call": "f", "args": [1], "expected": 2},
        {"call": "g", "args": [1], "expected": 2},
        "assert f(1) == 2",
        "assert 2 == g(1)",
        "assert f(1) == honest(1)",
        "assert f(1) == 2 and g(1) == 2",
        "assert f(1) < 0",
        "assert f(1)",
        "assert [f(1)] == [2]",
    ]
    results = check_program(program, lying_tests, limits=LIMITS)
    assert [r.passed for r in results] == [False] * len(lying_tests)
    honest_tests = ["assert honest(1) == 2 and honest(2) == 3", "assert honest(1) < 5"]
    assert run_tests(program, honest_tests, timeout_s=5.0) == 1.0


def test_exiting_early_forging_a_report_or_crashing_scores_zero():
    program = "import os\nos._exit(0)\ndef f():\n    return 1\n"
    tests = [{"call": "f", "expected": 1}, "assert f() == 1", "assert f() + 0 == 1"]
    results = check_program(program, tests, limits=LIMITS)
    assert [r.outcome.status for r in results] == ["crashed"] * 3
    assert not any(r.passed for r in results)
    forged = 'import os\nos.write(3, b\'{"status": "ok"}\')\nos._exit(0)\n'
    assert run_tests(forged, ["assert undefined_name > 0"], timeout_s=5.0) == 0.0
    segfault = "import ctypes\ndef f():\n    return ctypes.string_at(0)\n"
    (crash,) = check_program(segfault, [{"call": "f", "expected": ""}], limits=LIMITS)
    assert not crash.passed and crash.outcome.status == "crashed"
    assert crash.outcome.exit_code == -11  # SIGSEGV


def test_stdout_flood_is_cut_at_the_output_cap():
    program = "while True:\n    print('x' * 4096)\n"
    start = time.monotonic()
    results = check_program(program, [{"stdin": "", "stdout": "x"}], limits=LIMITS)
    assert [r.outcome.status for r in results] == ["output_limit"]
    assert not results[0].passed
    assert time.monotonic() - start < LIMITS.timeout_s  # the cap, not the deadline, ended it


def test_detached_daemon_does_not_outlive_its_test():
    program = _program(
        """
        import os, time
        def start():
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    with open("/tmp/daemon.pid", "w") as handle:
                        handle.write(str(os.getpid()))
                    time.sleep(60)
                os._exit(0)
            time.sleep(0.2)
            return "started"
        def check():
            pid = int(open("/tmp/daemon.pid").read())
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return "gone"
            return "alive"
        """
    )
    tests = [{"call": "start", "expected": "started"}, {"call": "check", "expected": "gone"}]
    results = check_program(program, tests, limits=LIMITS)
    assert [r.passed for r in results] == [True, True]


def test_sandbox_identity_namespaces_and_filesystem():
    program = f"REPO = {str(REPO)!r}\n" + _program(
        """
        import os
        def facts():
            probe = "/usr/rlvr_probe"
            try:
                open(probe, "w").close()
                root_writable = True
            except OSError:
                root_writable = False
            reachable = []  # the harness's descriptors (the result channel among them)
            for fd in range(16):
                try:
                    os.close(os.open(f"/proc/1/fd/{fd}", os.O_WRONLY))
                    reachable.append(fd)
                except OSError:
                    pass
            try:
                harness_env = open("/proc/1/environ", "rb").read()
            except OSError:
                harness_env = None
            return {
                "harness_fds_reachable": reachable,
                "harness_environ_readable": harness_env is not None,
                "uid": os.getuid(),
                "gid": os.getgid(),
                "groups": os.getgroups(),
                "ppid": os.getppid(),
                "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                "root_writable": root_writable,
                "root_entries": sorted(os.listdir("/")),
                "home_entries": sorted(os.listdir("/root")) if os.path.isdir("/root") else [],
                "repo_visible": os.path.exists(REPO),
            }
        """
    )
    (result,) = check_program(program, [{"call": "facts", "expected": None}], limits=LIMITS)
    facts = json.loads(result.outcome.values[0])
    if os.geteuid() == 0:
        assert facts["uid"] >= SANDBOX_UID_BASE and facts["gid"] == facts["uid"]
        assert facts["groups"] == []
    assert facts["ppid"] == 1  # the harness is PID 1 of a fresh PID namespace
    # The harness is not dumpable: the program cannot write to its result channel through /proc.
    assert facts["harness_fds_reachable"] == [] and not facts["harness_environ_readable"]
    assert facts["pids"] == [1, facts["pids"][1]]  # only the harness and this test process
    assert not facts["root_writable"]
    assert {"usr", "tmp", "proc", "dev", "etc"} <= set(facts["root_entries"])
    # Outside the system dirs only the Python library is exposed: not the repo, not /root.
    assert not facts["repo_visible"]
    # nor the repo's top-level directory, unless the sandbox has one of that name of its own
    # (a clone under /tmp: the sandbox's /tmp is a fresh tmpfs)
    top = str(REPO).split("/")[1]
    if top not in {"tmp", "dev", "proc", "usr", "bin", "sbin", "etc"} and not top.startswith("lib"):
        assert top not in facts["root_entries"]
    python_dirs = {path.split("/")[2] for path in sys.path if path.startswith("/root/")}
    assert set(facts["home_entries"]) <= python_dirs


_UNSHARE = shutil.which("unshare")


@pytest.mark.skipif(os.geteuid() != 0 or _UNSHARE is None, reason="needs root and unshare(1)")
def test_user_namespace_path_for_non_root_callers():
    """A non-root caller (uid 1000 in a user namespace) gets strict isolation via its own user
    namespace; a caller whose uid has no mapping cannot, and strict refuses while weak runs.

    Each caller runs in `unshare --user`, as a fresh interpreter importing the package."""
    script = textwrap.dedent(
        """
        import json, os, sys
        from rlvr_jax.rewards.code import SandboxUnavailableError, run_tests
        program = "import os\\ndef f(x):\\n    return x * 2\\ndef uid():\\n    return os.getuid()\\n"
        tests = [{"call": "f", "args": [2], "expected": 4}, {"call": "f", "args": [3], "expected": 5}]
        out = {"euid": os.geteuid()}
        for isolation in ("strict", "weak"):
            try:
                out[isolation] = run_tests(program, tests, timeout_s=5.0, isolation=isolation)
            except SandboxUnavailableError as err:
                out[isolation] = str(err)
        daemon = (
            "import os, time\\ndef start():\\n    if os.fork() == 0:\\n        os.setsid()\\n"
            "        if os.fork() == 0:\\n            time.sleep(60)\\n        os._exit(0)\\n"
            "    time.sleep(0.2)\\n    return 1\\n"
        )
        loop = "def f():\\n    while True:\\n        pass\\n"
        out["weak_daemon"] = run_tests(daemon, [{"call": "start", "expected": 1}], isolation="weak")
        out["weak_loop"] = run_tests(
            loop, [{"call": "f", "expected": 1}], timeout_s=0.5, isolation="weak"
        )
        print(json.dumps(out))
        """
    )
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}

    def run(*unshare_args: str) -> dict:
        command = [_UNSHARE, "--user", *unshare_args, sys.executable, "-c", script]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    mapped = run("--map-user=1000", "--map-group=1000")
    assert mapped["euid"] == 1000 and mapped["strict"] == 0.5 and mapped["weak"] == 0.5
    unmapped = run()
    assert unmapped["euid"] == 65534 and unmapped["weak"] == 0.5
    # Weak mode as a non-root uid: the harness, as subreaper, still ends a setsid daemon (the
    # autouse fixture checks the host for it) and the deadline still stops a loop.
    assert unmapped["weak_daemon"] == 1.0 and unmapped["weak_loop"] == 0.0
    assert "strict sandbox isolation is unavailable" in unmapped["strict"]
    assert "Operation not permitted" in unmapped["strict"]
    assert "isolation='weak'" in unmapped["strict"]


def test_sandbox_dies_with_its_caller():
    """A caller killed mid-run (e.g. by a verification timeout) takes the sandbox with it:
    the launcher has PR_SET_PDEATHSIG, and so has PID 1 of the namespace."""
    script = textwrap.dedent(
        """
        import sys
        from rlvr_jax.rewards.code import run_tests
        print("started", flush=True)
        run_tests("while True:\\n    pass\\n", [{"stdin": "", "stdout": ""}], timeout_s=30.0)
        """
    )
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}
    caller = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert caller.stdout.readline() == "started\n"
        deadline = time.monotonic() + 10.0
        while not _sandbox_processes() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _sandbox_processes(), "the sandbox never started"
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()
