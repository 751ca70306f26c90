"""deploy.ray.session.stop_within: a shutdown that hangs still ends, with Ray's processes and one
line. A real process stands in for the stopped server, and a real child of it (its command
line says ray, as Ray's own processes' do) for what Ray left behind."""
import subprocess
import sys
import time

import pytest

from vit_export.deploy.ray.session import alive

HANGS = """
import subprocess, sys, time
from vit_export.deploy.ray.session import stop_within
from vit_export.errors import Signalled
left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # raylet"])
print(left.pid, flush=True)
cause = {"SIGINT": KeyboardInterrupt(), "SIGTERM": Signalled(15), "none": None}[sys.argv[1]]
timer = stop_within(0.5, "Ray Serve", cause)
if sys.argv[2] == "cancel":
    timer.cancel()
    time.sleep(1)  # past the limit: a cancelled timer does not fire
    print("shut down in time", flush=True)
    left.kill()
    sys.exit(0)
time.sleep(60)  # a shutdown that never returns
"""


@pytest.mark.parametrize("cause, code, head", [
    ("SIGINT", 130, "stopped by SIGINT; "), ("SIGTERM", 143, "stopped by SIGTERM; "),
    ("none", 1, "Error: ")])
def test_a_shutdown_that_hangs_is_ended_with_one_line(cause, code, head):
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", HANGS, cause, "hang"], check=False,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == code and time.monotonic() - start < 20
    assert done.stderr.strip().splitlines() == [
        f"{head}Ray Serve did not shut down within 0.5 s: its processes were killed"]
    left = int(done.stdout.split()[0])
    deadline = time.monotonic() + 5
    while alive(left) and time.monotonic() < deadline:  # reparented: init reaps it
        time.sleep(0.05)
    assert not alive(left)


def test_a_shutdown_in_time_is_left_alone():
    done = subprocess.run([sys.executable, "-c", HANGS, "SIGINT", "cancel"],
                          check=False, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines()[1] == "shut down in time"
