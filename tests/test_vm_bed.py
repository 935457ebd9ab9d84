"""The pure parts of the cgroup v2 VM bed (``vm/``), on the host, without booting anything: the image's cache key
changes when an input of the image changes and not otherwise; ``run.sh`` exits with the payload's status (a stand-in
qemu runs the payload from the disk it is given); the bed skips, saying why, where it cannot run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux" or shutil.which("bash") is None,
                                reason="the VM bed's scripts are bash on Linux")

VM = Path(__file__).resolve().parents[1] / "vm"
KERNEL = "linux-image-6.1.0-99-cloud-amd64 6.1.999-1"
IMAGE_INPUTS = ["make-image.sh", "guest/init", "packages.txt", "wheels.txt"]
NOT_INPUTS = ["run.sh", "ci.sh", "payload.sh", "README.md", "guest/init2.sh", "guest/run-tests.sh"]


def _bed(tmp_path: Path) -> Path:
    bed = tmp_path / "vm"
    shutil.copytree(VM, bed)
    return bed


def _script(bed: Path, name: str, *args: str, env: dict[str, str] | None = None,
            prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("APSI_VM_")}
    return subprocess.run([*prefix, "bash", str(bed / name), *args], capture_output=True, text=True, timeout=60,
                          env={**base, **(env or {})}, check=False)


def _key(bed: Path, kernel: str = KERNEL) -> str:
    done = _script(bed, "make-image.sh", "--key", env={"APSI_VM_KERNEL": kernel})
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert len(key) == 64 and set(key) <= set("0123456789abcdef"), key
    return key


def test_the_cache_key_is_the_same_for_the_same_inputs(tmp_path: Path) -> None:
    bed = _bed(tmp_path)
    assert _key(bed) == _key(bed) == _key(_bed(tmp_path / "again"))


@pytest.mark.parametrize(("name", "is_input"), [*((name, True) for name in IMAGE_INPUTS),
                                               *((name, False) for name in NOT_INPUTS)])
def test_the_cache_key_changes_exactly_when_an_input_of_the_image_changes(tmp_path: Path, name: str,
                                                                          is_input: bool) -> None:
    bed = _bed(tmp_path)
    before = _key(bed)
    with open(bed / name, "a") as f:
        f.write("\n# changed\n")
    assert (_key(bed) != before) == is_input


def test_the_cache_key_changes_with_the_kernel(tmp_path: Path) -> None:
    bed = _bed(tmp_path)
    assert _key(bed, KERNEL) != _key(bed, KERNEL.replace("6.1.999-1", "6.1.999-2"))



# -- run.sh, with a stand-in for qemu -------------------------------------------------------------------------------

# Finds the payload disk (a tar archive of payload/) among qemu's -drive options, runs its run.sh with /results
# moved to a folder of its own, and writes that folder as a tar archive onto the results disk, as the guest does.
# FAKE_QEMU_SAYS: a line it prints first (the console a payload could print); FAKE_QEMU_SLEEP: seconds to hang.
FAKE_QEMU = r"""#!/bin/bash
set -u
echo "fake qemu: $*"
[ -n "${FAKE_QEMU_SAYS:-}" ] && echo "$FAKE_QEMU_SAYS"
[ -n "${FAKE_QEMU_SLEEP:-}" ] && exec sleep "$FAKE_QEMU_SLEEP"
[ -n "${FAKE_QEMU_CRASH:-}" ] && exit 1
drives=()
while [ $# -gt 0 ]; do
    if [ "$1" = -drive ]; then f=${2#file=}; drives+=("${f%%,*}"); shift; fi
    shift
done
W=$(mktemp -d)
mkdir -p "$W/results" && tar -xf "${drives[2]}" -C "$W"
(cd "$W/payload" && RESULTS="$W/results" sh ./run.sh); rc=$?
echo "$rc" > "$W/results/rc"
echo "=== VM-EXIT rc=$rc"
tar -cf "${drives[1]}" -C "$W/results" .
rm -rf "$W"
"""


@pytest.fixture
def fake_vm(tmp_path: Path) -> dict[str, str]:
    """The environment that makes run.sh boot the stand-in: a fake image folder, the fake qemu, TCG."""
    image = tmp_path / "image"
    image.mkdir()
    for name in ("vmlinux", "initrd-base.cpio.gz", "root.ext4"):
        (image / name).write_bytes(b"")
    qemu = tmp_path / "fake-qemu"
    qemu.write_text(FAKE_QEMU)
    qemu.chmod(0o755)
    return {"APSI_VM_IMAGE": str(image), "APSI_VM_QEMU": str(qemu), "APSI_VM_ACCEL": "tcg", "TMPDIR": str(tmp_path)}


def _payload(tmp_path: Path, body: str) -> Path:
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "run.sh").write_text(body)
    return payload


@pytest.mark.parametrize("status", [0, 1, 7, 99])
def test_run_sh_exits_with_the_payloads_status_and_brings_its_results_back(tmp_path: Path, fake_vm: dict[str, str],
                                                                           status: int) -> None:
    payload = _payload(tmp_path, f'echo "figure: 42" > "$RESULTS/figure.txt"\necho payload ran\nexit {status}\n')
    results = tmp_path / "results"
    done = _script(VM, "run.sh", str(payload), str(results), env=fake_vm)
    assert done.returncode == status, done.stdout + done.stderr
    assert "payload ran" in done.stdout and f"payload rc {status}" in done.stdout
    assert (results / "figure.txt").read_text() == "figure: 42\n"
    assert (results / "rc").read_text() == f"{status}\n"
    assert "payload ran" in (results / "console.log").read_text()


def test_run_sh_believes_the_results_disk_over_what_the_console_says(tmp_path: Path, fake_vm: dict[str, str]) -> None:
    """A payload (or a test it runs) printing the VM's own last line does not change the exit status."""
    payload = _payload(tmp_path, "echo '=== VM-EXIT rc=0'\nexit 5\n")
    done = _script(VM, "run.sh", str(payload), env=fake_vm)
    assert done.returncode == 5, done.stdout + done.stderr


def test_run_sh_says_3_when_the_vm_ends_without_a_status(tmp_path: Path, fake_vm: dict[str, str]) -> None:
    """Also where the results folder holds the rc of an earlier run."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "rc").write_text("0\n")
    done = _script(VM, "run.sh", str(_payload(tmp_path, "exit 0\n")), str(results),
                   env={**fake_vm, "FAKE_QEMU_CRASH": "1"})
    assert done.returncode == 3, done.stdout + done.stderr


def test_run_sh_gives_124_when_the_vm_runs_past_its_time(tmp_path: Path, fake_vm: dict[str, str]) -> None:
    done = _script(VM, "run.sh", str(_payload(tmp_path, "exit 0\n")),
                   env={**fake_vm, "FAKE_QEMU_SLEEP": "30", "APSI_VM_TIMEOUT": "1"})
    assert done.returncode == 124, done.stdout + done.stderr
    assert "ran past 1 s" in done.stdout


def test_run_sh_refuses_a_payload_without_run_sh(tmp_path: Path, fake_vm: dict[str, str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _script(VM, "run.sh", str(empty), env=fake_vm)
    assert done.returncode == 2 and "no run.sh" in done.stderr


# -- where the bed cannot run: skipped, saying why ------------------------------------------------------------------

def _path_with(tmp_path: Path, stubs: dict[str, str], tools: tuple[str, ...]) -> str:
    """A PATH of only ``tools`` (links to the real ones) and ``stubs`` (name: script), in a folder of the test's.
    A stub replaces the tool of its name: it is never written through a link (that would overwrite the real one)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, body in stubs.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    for tool in tools:
        real = shutil.which(tool)
        if real is not None and tool not in stubs:
            (folder / tool).symlink_to(real)
    return str(folder)


TOOLS = ("bash", "uname", "id", "sha256sum", "cut", "awk", "dirname", "cat", "tail", "mktemp", "rm", "date")


def test_the_bed_skips_off_x86_64_and_ci_sh_exits_0(tmp_path: Path) -> None:
    path = _path_with(tmp_path, {"uname": 'case "$1" in -m) echo aarch64 ;; *) echo Linux ;; esac'},
                      tuple(t for t in TOOLS if t != "uname"))
    env = {"PATH": path, "APSI_VM_CACHE": str(tmp_path / "cache"), "APSI_VM_KERNEL": KERNEL}
    check = _script(VM, "make-image.sh", "--check", env=env)
    assert check.returncode == 1 and "x86_64 Linux host" in check.stdout and "aarch64" in check.stdout
    ci = _script(VM, "ci.sh", env=env)
    assert ci.returncode == 0 and ci.stdout.startswith("vm: SKIPPED: the VM bed needs an x86_64"), ci.stdout


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the other skip reasons come after the architecture's")
def test_the_bed_skips_without_apt_where_no_image_is_cached(tmp_path: Path) -> None:
    env = {"PATH": _path_with(tmp_path, {"id": "echo 0"}, TOOLS), "APSI_VM_CACHE": str(tmp_path / "cache"),
           "APSI_VM_KERNEL": KERNEL}
    check = _script(VM, "make-image.sh", "--check", env=env)
    assert check.returncode == 1 and "needs Debian's apt" in check.stdout, check.stdout + check.stderr


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the other skip reasons come after the architecture's")
def test_the_bed_skips_without_root_where_no_image_is_cached(tmp_path: Path) -> None:
    env = {"PATH": _path_with(tmp_path, {"id": "echo 1000", "apt-get": "exit 0", "apt-cache": "exit 0"}, TOOLS),
           "APSI_VM_CACHE": str(tmp_path / "cache"), "APSI_VM_KERNEL": KERNEL}
    check = _script(VM, "make-image.sh", "--check", env=env)
    assert check.returncode == 1 and "needs root" in check.stdout, check.stdout + check.stderr


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the other skip reasons come after the architecture's")
def test_a_cached_image_runs_without_root_or_apt(tmp_path: Path) -> None:
    env = {"PATH": _path_with(tmp_path, {"id": "echo 1000", "qemu-system-x86_64": "exit 0"}, TOOLS),
           "APSI_VM_CACHE": str(tmp_path / "cache"), "APSI_VM_KERNEL": KERNEL}
    image = tmp_path / "cache" / _key(VM)
    image.mkdir(parents=True)
    for name in ("vmlinux", "initrd-base.cpio.gz", "root.ext4"):
        (image / name).write_bytes(b"")
    check = _script(VM, "make-image.sh", "--check", env=env)
    assert (check.returncode, check.stdout) == (0, ""), check.stderr
    (image / "root.ext4").unlink()  # incomplete: not an image
    assert _script(VM, "make-image.sh", "--check", env=env).returncode == 1



@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the other skip reasons come after the architecture's")
def test_apt_waits_for_a_lock_another_apt_holds_instead_of_failing(tmp_path: Path) -> None:
    """Two CI runs at once (or unattended-upgrades) hold dpkg's lock for a while: apt-get without a lock timeout
    failed at once ('Could not get lock /var/lib/dpkg/lock-frontend'), and the VM step with it. The stub apt-get
    fails so unless told to wait for the lock; the cached image's missing qemu is then installed."""
    stub = ('case "$*" in *DPkg::Lock::Timeout=*) echo "$*" >> "$APT_CALLS" ;; '
            '*) echo "E: Could not get lock /var/lib/dpkg/lock-frontend" >&2; exit 100 ;; esac')
    calls = tmp_path / "apt-calls"
    env = {"PATH": _path_with(tmp_path, {"id": "echo 0", "apt-get": stub, "apt-cache": "exit 0"}, TOOLS),
           "APSI_VM_CACHE": str(tmp_path / "cache"), "APSI_VM_KERNEL": KERNEL, "APT_CALLS": str(calls)}
    image = tmp_path / "cache" / _key(VM)
    image.mkdir(parents=True)
    for name in ("vmlinux", "initrd-base.cpio.gz", "root.ext4"):
        (image / name).write_bytes(b"")
    made = _script(VM, "make-image.sh", env=env)
    assert made.returncode == 0 and made.stdout.strip() == str(image), made.stdout + made.stderr
    assert "install" in calls.read_text()  # qemu was asked for, waiting for the lock
    (tmp_path / "bin" / "apt-get").write_text("#!/bin/sh\nexit 100\n")  # an apt that cannot install, for good
    failed = _script(VM, "make-image.sh", env=env)
    assert failed.returncode != 0 and "could not install qemu-system-x86" in failed.stderr, failed.stderr
    assert failed.stdout == ""  # no image path printed: ci.sh does not boot without qemu

# -- a busy host: the tests' timeouts (the guest's too) stretch with the host's load ------------------------------------

@pytest.mark.parametrize(("given", "factor"), [("3.5", 3.5), ("0.2", 1.0), ("", 1.0), ("fast", 1.0), ("nan", 1.0),
                                               ("40", 10.0)])
def test_the_slowdown_is_the_given_factor_from_1_to_10(monkeypatch: pytest.MonkeyPatch, given: str,
                                                       factor: float) -> None:
    from tests.load import slowdown

    monkeypatch.setenv("APSI_TEST_SLOWDOWN", given)
    assert slowdown() == factor


def test_each_tests_timeout_is_stretched_by_the_slowdown() -> None:
    """At load 15 on 2 cores a 55-s VM test ran past its 420-s timeout and dask workers took over 30 s to start
    (nothing was wrong): every test's timeout grows, the ini's default (300 s) too."""
    show = ("import json, pytest\n"
            "class Show:\n"
            "    def pytest_collection_finish(self, session):\n"
            "        marks = [i.get_closest_marker('timeout') for i in session.items]\n"
            "        print('TIMEOUTS', json.dumps(sorted({m.args[0] if m else 0 for m in marks})))\n"
            "pytest.main(['-q', '--co', '-p', 'no:cacheprovider', 'tests/vm/test_v2_headline.py', "
            "'tests/test_units.py'], plugins=[Show()])\n")
    found = {}
    for factor in ("1", "3"):
        done = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, timeout=120, check=True,
                              cwd=VM.parent, env={**os.environ, "APSI_TEST_SLOWDOWN": factor})
        line = next(line for line in done.stdout.splitlines() if line.startswith("TIMEOUTS"))
        found[factor] = json.loads(line.split(" ", 1)[1])
    # 0: no marker (the ini's 300 s), stretched as 300 s to 900 s
    assert found["3"] == [180 * 3, 300 * 3, 420 * 3] and found["1"] == [0, 180, 300, 420]
