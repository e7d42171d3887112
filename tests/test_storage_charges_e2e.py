"""Storage charges through the real daemons, on a clock the test moves forward: a Job whose outputs
exceed a small `--free-storage` accrues hourly Storage charges into status.cost (bySegment.storageUSD,
within totalUSD), as much as billedBytes × the GiB-month rate × the hours elapsed, to the cent; once
the Job and its storage are deleted nothing more is charged.

The price book's storage rate is 7200.00 USD per GiB-month (10.00 USD per GiB-hour at 720 hours a
month), so the few MiB of a test output cost cents an hour.
"""
from __future__ import annotations

import textwrap
import time
from decimal import Decimal
from typing import Any, Iterator

import pytest

from agent_double import wait_for
from conftest import Coordinator
from e2e import JOBS, create, get_job, grant
from offset_clock import Clock
from test_money_e2e import _book, money_fleet

pytestmark = pytest.mark.slow

RATE = Decimal("7200.00")
GIB = Decimal(1024**3)
WRITER = textwrap.dedent("""
    import os
    with open(os.path.join(os.environ["NODUS_OUTPUTS_DIR"], "weights.bin"), "wb") as f:
        f.write(os.urandom(6 * 1024 * 1024))
""")


@pytest.fixture(scope="module")
def clock(tmp_path_factory: pytest.TempPathFactory) -> Clock:
    return Clock(tmp_path_factory.mktemp("clock") / "offset")


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory, clock: Clock) -> Iterator[Coordinator]:
    root = tmp_path_factory.mktemp("storage")
    # The Jobs finish at once and their node's lease outlasts the hours moved: the clock need not wait
    # for its heartbeats at each step.
    with money_fleet(root, clock, "s1", "--free-storage", "1Mi", lease="48h", moved_agents=False,
                     book=_book(root / "book.yaml", "2026-12-02-storage", str(RATE))) as coordinator:
        yield coordinator


def segments(status: dict[str, Any]) -> dict[str, Decimal]:
    return {k: Decimal(v) for k, v in ((status.get("cost") or {}).get("bySegment") or {}).items() if k.endswith("USD")}


def test_outputs_above_the_free_inclusion_are_charged_by_the_gib_month(c: Coordinator, clock: Clock) -> None:
    grant(c, "20.00")
    for name in ("weights", "witness"):
        create(c, name, command=["python3", "-c", WRITER])

    def stored(name: str) -> dict[str, Any]:
        s = get_job(c, name).get("status") or {}
        # The run's own charge posted too (its Boot increment at least): only storage accrues from here.
        return s if s.get("phase") == "Succeeded" and (s.get("storage") or {}).get("billedBytes") and \
            s.get("cost", {}).get("bySegment") and Decimal(s["cost"].get("totalUSD") or 0) > 0 else {}

    done = wait_for(lambda: stored("weights"), 60, interval=0.3, what="the Job to succeed with billed storage")
    wait_for(lambda: stored("witness"), 60, interval=0.3, what="the witness Job to succeed")
    billed = int(done["storage"]["billedBytes"])
    assert billed > 4 * 1024 * 1024, done["storage"]
    compute = Decimal(done["cost"]["totalUSD"])
    per_hour = Decimal(billed) / GIB * RATE / 720
    first_seen = time.time() + clock.offset
    for _ in range(3):
        clock.advance(3600)
    last = wait_for(lambda: segments(s := get_job(c, "weights")["status"]).get("storageUSD", 0) >=
                    (per_hour * 2).quantize(Decimal("0.01")) - Decimal("0.01") and s, 60, interval=0.3,
                    what="hourly storage charges")
    storage = segments(last)["storageUSD"]
    elapsed_h = Decimal(str(time.time() + clock.offset - first_seen + 5)) / 3600  # since the controller first saw it
    assert storage <= per_hour * elapsed_h, (storage, per_hour, elapsed_h)
    assert Decimal(last["cost"]["totalUSD"]) == compute + storage, last["cost"]
    assert sum(v for k, v in segments(last).items()) == Decimal(last["cost"]["totalUSD"])
    assert last["cost"]["final"] is False, "storage still accrues: more charges will post"

    # The Job and its storage deleted: nothing more is charged to it, while the witness goes on accruing
    # (which shows the money controller has passed over the moved clock since).
    final = Decimal(get_job(c, "weights")["status"]["cost"]["totalUSD"])
    r = c.session().delete(c.url(f"{JOBS}/weights"))
    assert r.status_code in (200, 202), r.text
    wait_for(lambda: c.session().get(c.url(f"{JOBS}/weights")).status_code == 404, 60, interval=0.3,
             what="the Job deleted")
    witness = Decimal(get_job(c, "witness")["status"]["cost"]["totalUSD"])
    clock.advance(3 * 3600)
    wait_for(lambda: Decimal(get_job(c, "witness")["status"]["cost"]["totalUSD"]) > witness, 60, interval=0.3,
             what="the witness charged for the hours after the deletion")
    spent = Decimal(c.run("nodus", "credits").stdout.splitlines()[1].split()[5])  # before the witness: it only grows
    assert spent - Decimal(get_job(c, "witness")["status"]["cost"]["totalUSD"]) <= final, \
        "nothing more was charged for the deleted Job's storage"
