"""The file_sd targets file is rewritten by the tick and by every drain worker at once."""

from __future__ import annotations

import json
import threading

from autoscaler.act.local.prometheus import PrometheusServer, ScrapeTarget


def test_concurrent_target_writes_do_not_collide(tmp_path):
    prom = PrometheusServer(tmp_path, setting="off")
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def writer(k: int) -> None:
        start.wait()
        try:
            for i in range(200):
                prom.write_targets([ScrapeTarget(f"127.0.0.1:{9000 + k}", f"r{k}-{i}", "m", "1g.10gb", "g/0", 0)])
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    doc = json.loads(prom.targets_file.read_text())  # whole JSON, one writer's last document
    assert len(doc) == 1 and doc[0]["targets"][0].startswith("127.0.0.1:90")
