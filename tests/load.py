"""How much slower than on an idle machine the tests run now. A timeout sized for an idle machine is stretched by
it, so a busy host (two CI runs and busy loops: load 15 on 2 cores) makes a run slower, not red: at that load a dask
worker took over 30 s to start and a VM test 6 minutes for 55 s of work.

``APSI_TEST_SLOWDOWN`` overrides the reading; inside the VM it is the host's load when the VM started
(``vm/ci.sh`` writes it into the payload), elsewhere this machine's 1-minute load per core. At least 1, at most
``MOST``: a real hang is still caught, later.
"""

from __future__ import annotations

import math
import os

VM_FILE = "/payload/slowdown"  # vm/ci.sh: the host's load per core when the VM started
MOST = 10.0


def slowdown() -> float:
    text = os.environ.get("APSI_TEST_SLOWDOWN")
    if text is None and os.path.exists(VM_FILE):
        with open(VM_FILE) as f:
            text = f.read()
    try:
        factor = float(text) if text is not None else os.getloadavg()[0] / (os.cpu_count() or 1)
    except ValueError:
        factor = 1.0
    return 1.0 if math.isnan(factor) else min(MOST, max(1.0, factor))


def stretched(seconds: float) -> float:
    """``seconds`` on an idle machine, as long as they take now."""
    return seconds * slowdown()
