"""The driver manager double's view of who holds the driver: what the
upgrade test's "the driver is in use" rests on."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from testkit.driver_manager import holders


def test_a_holder_that_opens_and_closes_sockets_all_along_is_still_found(tmp_path: Path) -> None:
    # The agent answers scrapes while the test asks who holds the driver: its
    # sockets come and go between /proc's listing of descriptors and their
    # readlink, and that must not hide the one that stays open.
    driver = tmp_path / "nvidiactl"
    driver.touch()
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for _ in range(64):
                socket.socket().close()

    with driver.open("rb"):
        churner = threading.Thread(target=churn)
        churner.start()
        try:
            seen = [os.getpid() in holders(driver) for _ in range(300)]
        finally:
            stop.set()
            churner.join()
    assert all(seen), f"missed the holder in {seen.count(False)} of {len(seen)} looks"
    assert os.getpid() not in holders(driver), "closed: no longer a holder"
