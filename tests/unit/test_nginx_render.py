"""Front-door config and Prometheus file_sd rendering (pure), checked by nginx -t where nginx exists."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from autoscaler.act.local.nginx import DoorConfig, Route, find_nginx, render_config
from autoscaler.act.local.prometheus import ScrapeTarget, render_file_sd
from autoscaler.act.local.prometheus import render_config as render_prom


def _cfg(tmp_path: Path, routes) -> str:
    return render_config(DoorConfig(8123, tmp_path, tuple(routes)))


def test_ready_model_gets_least_conn_upstream_and_both_locations(tmp_path):
    text = _cfg(tmp_path, [Route("resnet", ("127.0.0.1:9001", "127.0.0.1:9002"))])
    block = text[text.index("upstream m_resnet {") : text.index("}", text.index("upstream m_resnet {"))]
    assert "least_conn;" in block
    assert "server 127.0.0.1:9001" in block and "server 127.0.0.1:9002" in block
    assert "location = /v2/models/resnet { proxy_pass http://m_resnet/v2/models/resnet; }" in text
    assert "location /v2/models/resnet/ { proxy_pass http://m_resnet/v2/models/resnet/; }" in text
    assert "listen 127.0.0.1:8123;" in text
    assert "location = /v2/health/ready { return 200 ''; }" in text
    assert "daemon off;" in text


def test_model_without_ready_replica_answers_503_json_and_has_no_upstream(tmp_path):
    text = _cfg(tmp_path, [Route("resnet", ("127.0.0.1:9001",)), Route("bert-large", ())])
    assert "upstream m_bert_large" not in text
    line = next(ln for ln in text.splitlines() if "location /v2/models/bert-large/" in ln)
    assert "return 503" in line
    body = line[line.index("'") + 1 : line.rindex("'")]
    assert json.loads(body) == {"error": "model bert-large has no ready replica"}
    # the door is not ready while any model has no replica
    ready = next(ln for ln in text.splitlines() if "/v2/health/ready" in ln)
    assert "503" in ready and "bert-large" in ready


def test_triton_name_differs_from_public_name(tmp_path):
    text = _cfg(tmp_path, [Route("classifier", ("127.0.0.1:9001",), triton_name="resnet")])
    assert "location /v2/models/classifier/ { proxy_pass http://m_classifier/v2/models/resnet/; }" in text


def test_no_routes_at_all_is_still_a_valid_door(tmp_path):
    text = _cfg(tmp_path, [])
    assert "upstream m_" not in text
    assert "location = /v2 { return 503" in text


@pytest.mark.parametrize(
    "routes",
    [
        [],
        [Route("resnet", ("127.0.0.1:9001", "127.0.0.1:9002")), Route("rnn", ())],
    ],
)
def test_rendered_config_passes_nginx_t(tmp_path, routes):
    nginx = find_nginx()
    if nginx is None:
        pytest.fail("nginx is required (make setup installs nginx-light)")
    for d in ("logs", "temp"):
        (tmp_path / d).mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(_cfg(tmp_path, routes))
    r = subprocess.run(
        [nginx, "-t", "-q", "-p", str(tmp_path), "-c", str(conf), "-e", str(tmp_path / "logs/e.log")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 0, r.stderr


def test_file_sd_one_group_per_target_with_all_labels():
    doc = render_file_sd(
        [
            ScrapeTarget("127.0.0.1:9102", "rnn-a", "rnn", "1g.10gb", "node-a/0", 6),
            ScrapeTarget("127.0.0.1:9101", "bert-a", "bert", "3g.40gb", "node-a/1", 4),
        ]
    )
    assert doc == [
        {
            "targets": ["127.0.0.1:9101"],
            "labels": {
                "replica": "bert-a",
                "model": "bert",
                "profile": "3g.40gb",
                "gpu": "node-a/1",
                "start": "4",
            },
        },
        {
            "targets": ["127.0.0.1:9102"],
            "labels": {
                "replica": "rnn-a",
                "model": "rnn",
                "profile": "1g.10gb",
                "gpu": "node-a/0",
                "start": "6",
            },
        },
    ]
    assert render_file_sd([]) == []


def test_prometheus_config_scrapes_file_sd_every_2s_and_keeps_triton_model_label(tmp_path):
    cfg = json.loads(render_prom(tmp_path / "targets.json"))
    assert cfg["global"]["scrape_interval"] == "2s"
    job = cfg["scrape_configs"][0]
    assert job["honor_labels"] is True
    assert job["file_sd_configs"][0]["files"] == [str(tmp_path / "targets.json")]
