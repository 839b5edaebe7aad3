"""What the Kubernetes controller's 1 s pod scrape costs as the fleet grows.

``migscale controller`` scrapes every Ready Triton pod at its IP each second for
the burst layer (``observe/fast.py``): 16 fetches side by side over keep-alive
connections (``HttpFetch``, urllib3), and rounds that take at most a quarter of
the time (``max_duty`` 0.25), so a large fleet's rounds come further apart
instead of taking the CPU its ticks need. This measures, per fleet size, side by
side in one run:

- ``serial``: one fetch after another;
- ``pooled``: the controller's form (16 workers, ``max_duty`` 0.25);
- ``pooled_httpx``: the same with an httpx keep-alive client, the scrape's client before;

all with every pod answering, and at ``--silent-at`` pods also with 5% of
them silent (a pod that accepts the connection and never answers, as a hung
Triton does: each costs the 0.5 s timeout). For each: a round's wall time and
this process's CPU seconds per round (median of ``--rounds``), the gap to the
next round that ``max_duty`` sets, and so the share of one core the scrape takes
at that pace. Ratios: serial / pooled wall time, httpx / ``HttpFetch`` CPU.

The pods are emulated: a child process serves, for every pod IP, a one-model
Triton exposition of 69 lines (the request counters, the latency summary, the
GPU, CPU and pinned-memory gauges a real Triton exports), as an HTTP proxy
(``FastScrape(proxy=...)``, the controller's ``--fast-scrape-proxy``), so every
request stays on loopback; its counters move on between rounds. One server
process answering for thousands of pods is slower than thousands of Tritons would
be, so the wall times are upper bounds; the controller's CPU per round is the
figure that carries over. ``direct`` (``--direct``): pods that are each their own
listener, as each pod IP is its own host, so a connection serves one pod only: one
kept per pod against reconnecting at each fetch (``measure_direct``). ``triton``
(unless ``--no-triton``): the per-fetch cost against one real ``tritonserver``
(``against_triton``).

Run: ``flock /tmp/migscale-heavy.lock nice -n 10 .venv/bin/python benchmarks/fast_scrape.py``
Prints one JSON object and writes ``benchmarks/results/fast_scrape.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
RESULTS = ROOT / "benchmarks" / "results"

COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
            "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us")
GAUGES = ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage",
          "nv_gpu_power_limit", "nv_energy_consumption", "nv_cpu_utilization", "nv_cpu_memory_total_bytes",
          "nv_cpu_memory_used_bytes", "nv_pinned_memory_pool_total_bytes", "nv_pinned_memory_pool_used_bytes")


def exposition(model: str, served: float) -> str:
    lbl = f'model="{model}",version="1"'
    lines: list[str] = []
    for c in COUNTERS:
        lines += [f"# HELP {c} Triton's {c}", f"# TYPE {c} counter", f"{c}{{{lbl}}} {served * 1000.0:.1f}"]
    lines += ["# TYPE nv_inference_pending_request_count gauge", f"nv_inference_pending_request_count{{{lbl}}} 2"]
    lines += ["# TYPE nv_inference_request_summary_us summary"]
    lines += [f'nv_inference_request_summary_us{{{lbl},quantile="{q}"}} 4000' for q in (0.5, 0.9, 0.95, 0.99)]
    lines += [f"nv_inference_request_summary_us_count{{{lbl}}} {served:.0f}",
              f"nv_inference_request_summary_us_sum{{{lbl}}} {served * 4000:.0f}"]
    for g in GAUGES:
        lines += [f"# HELP {g} Triton's {g}", f"# TYPE {g} gauge", f'{g}{{gpu_uuid="GPU-0"}} 1.0']
    return "\n".join(lines) + "\n"


def pod_ip(i: int) -> str:
    return f"10.244.{i // 250}.{i % 250 + 2}"


def network(conn, pods: int, silent: int = 0) -> None:
    """The child process: every pod's Triton, behind one HTTP proxy on loopback; the first
    ``silent`` pods never answer (the scraper's timeout ends each fetch)."""
    start = time.monotonic()
    model_of = {pod_ip(i): f"m{i % 200}" for i in range(pods)}
    hung = {pod_ip(i) for i in range(silent)}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as Triton's server keeps it
        # the headers and the body go out as two writes; with Nagle's algorithm the body waits
        # for the client's delayed ACK (40 ms) where the client does not happen to answer
        # first. A real Triton answers a keep-alive fetch of its page in ~0.4 ms (``triton``)
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            host = self.path.split("//", 1)[-1].split(":", 1)[0]
            model = model_of.get(host)
            if host in hung:
                time.sleep(5.0)  # far past any scraper's timeout
                return
            if model is None:
                self.send_error(502)
                return
            body = exposition(model, 50.0 * (time.monotonic() - start)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 128  # a listen backlog for 16 connections opened at once (the default is 5)

    srv = Server(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    conn.send(srv.server_address[1])
    srv.serve_forever(poll_interval=0.1)


def _httpx_fetch(client):
    """The client the scrape used before ``HttpFetch``: httpx, one keep-alive client."""
    def fetch(url: str, timeout_s: float) -> str:
        r = client.get(url, timeout=timeout_s)
        r.raise_for_status()
        return r.text
    return fetch


def _timed_rounds(fs, rounds: int, pods: int) -> dict:
    """``rounds`` rounds of ``fs`` after one that opens the connections: medians of a round's
    wall time and this process's CPU, the gap to the next round ``max_duty`` sets, failures."""
    walls, cpus, gaps, fails = [], [], [], 0
    for k in range(rounds + 1):
        c0, w0 = time.process_time(), time.perf_counter()
        fs.sample(float(k))
        w, c = time.perf_counter() - w0, time.process_time() - c0
        fails += int(fs.last["failures"])
        if k:
            walls.append(w)
            cpus.append(c)
            gaps.append(fs.gap_s)  # when the scraper itself would run the next round
    wall, cpu, gap = statistics.median(walls), statistics.median(cpus), statistics.median(gaps)
    return {"round_wall_s": round(wall, 4), "round_cpu_s": round(cpu, 4), "cpu_ms_per_pod": round(cpu / pods * 1e3, 3),
            "every_s": round(gap, 2), "core_share": round(cpu / gap, 3), "failures": fails}


def direct_network(conn, pods: int) -> None:
    """The child process: every pod its own listener on loopback (its own host:port, as each pod
    IP is its own host), each serving its one-model exposition with keep-alive. Sends the ports."""
    import asyncio
    import socket

    from aiohttp import web

    start = time.monotonic()

    async def serve() -> None:
        model_of: dict[int, str] = {}

        async def metrics(request: web.Request) -> web.Response:
            port = request.transport.get_extra_info("sockname")[1]
            return web.Response(text=exposition(model_of[port], 50.0 * (time.monotonic() - start)),
                                content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        ports = []
        for i in range(pods):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            model_of[port] = f"m{i % 200}"
            await web.SockSite(runner, sock, backlog=128).start()
            ports.append(port)
        conn.send(ports)
        await asyncio.Event().wait()

    asyncio.run(serve())


def measure_direct(pods: int, ports: list[int], rounds: int, timeout_s: float = 0.5) -> dict:
    """The controller's pool (16 workers) against pods that are each their own host: one kept
    connection per pod (``HttpFetch``'s default), connections kept for only 16 hosts (so each
    fetch reconnects, as a pool sized to its workers does on a pod network), and httpx's pool of
    16 (the scrape's client before ``HttpFetch``)."""
    import httpx

    from autoscaler.observe.fast import FastScrape
    from autoscaler.observe.scrape import HttpFetch

    targets = {f"pod-{i}": (f"m{i % 200}", f"http://127.0.0.1:{p}/metrics") for i, p in enumerate(ports)}
    client = httpx.Client(timeout=timeout_s, trust_env=False,
                          limits=httpx.Limits(max_connections=16, max_keepalive_connections=16))
    few = HttpFetch(connections=16, hosts=16)
    forms = {"kept": FastScrape(lambda: targets, workers=16, max_duty=0.25, timeout_s=timeout_s),
             "reconnect": FastScrape(lambda: targets, workers=16, max_duty=0.25, timeout_s=timeout_s, fetch=few),
             "httpx_pool16": FastScrape(lambda: targets, workers=16, max_duty=0.25, timeout_s=timeout_s,
                                        fetch=_httpx_fetch(client))}
    out: dict[str, dict] = {}
    try:
        for name, fs in forms.items():
            out[name] = _timed_rounds(fs, rounds, pods)
    finally:
        for fs in forms.values():
            fs.close()
        few.close()
        client.close()
    out["ratio_reconnect_over_kept_cpu"] = round(out["reconnect"]["round_cpu_s"] / out["kept"]["round_cpu_s"], 2)
    out["ratio_httpx_over_kept_cpu"] = round(out["httpx_pool16"]["round_cpu_s"] / out["kept"]["round_cpu_s"], 2)
    return out


def measure(pods: int, port: int, rounds: int, timeout_s: float = 0.5) -> dict:
    import httpx

    from autoscaler.observe.fast import FastScrape

    targets = {f"pod-{i}": (f"m{i % 200}", f"http://{pod_ip(i)}:8002/metrics") for i in range(pods)}
    out: dict[str, dict] = {}
    proxy = f"http://127.0.0.1:{port}"
    client = httpx.Client(timeout=timeout_s, trust_env=False, proxy=proxy,
                          limits=httpx.Limits(max_connections=16, max_keepalive_connections=16))
    forms = {"serial": FastScrape(lambda: targets, timeout_s=timeout_s, proxy=proxy),
             "pooled": FastScrape(lambda: targets, workers=16, max_duty=0.25, timeout_s=timeout_s, proxy=proxy),
             "pooled_httpx": FastScrape(lambda: targets, workers=16, max_duty=0.25, timeout_s=timeout_s,
                                        fetch=_httpx_fetch(client))}
    try:
        for name, fs in forms.items():
            out[name] = {**_timed_rounds(fs, rounds, pods), "models_with_signals": len(fs.signals(float(rounds)))}
    finally:
        for fs in forms.values():
            fs.close()
        client.close()
    out["ratio_serial_over_pooled_wall"] = round(out["serial"]["round_wall_s"] / out["pooled"]["round_wall_s"], 2)
    out["ratio_httpx_over_pooled_cpu"] = round(out["pooled_httpx"]["round_cpu_s"] / out["pooled"]["round_cpu_s"], 2)
    return out


def against_triton(fetches: int = 400, repeats: int = 2) -> dict:
    """One real ``tritonserver`` (resnet and bert, this machine's CPU build) on loopback: the
    controller's CPU and wall time per ``/metrics`` fetch with ``HttpFetch``, with an httpx
    keep-alive client, and with a new httpx request each time (the local scrape's client
    before ``HttpFetch``); and the parse of its page. Alternated ``repeats`` times."""
    import tempfile

    import httpx

    from autoscaler.act.local.triton import TritonProcess
    from autoscaler.observe.scrape import HttpFetch, parse_exposition

    with tempfile.TemporaryDirectory() as work, \
            TritonProcess(ROOT / "triton_models", ["resnet", "bert"], Path(work) / "replica") as proc:
        proc.wait_ready(120)
        url = proc.url_metrics
        keep = httpx.Client(timeout=2.0, trust_env=False)

        def httpx_new(u: str, t: float) -> str:
            r = httpx.get(u, timeout=t)
            r.raise_for_status()
            return r.text

        ours = HttpFetch()
        clients = {"http_fetch": ours, "httpx_keepalive": _httpx_fetch(keep), "httpx_new_each": httpx_new}
        per: dict[str, dict[str, list[float]]] = {k: {"cpu_ms": [], "wall_ms": []} for k in clients}
        try:
            for _ in range(repeats):
                for name, f in clients.items():
                    n = fetches if name != "httpx_new_each" else max(20, fetches // 10)
                    for _ in range(10):
                        f(url, 2.0)  # the connection open, the first fetch's imports done
                    c0, w0 = time.process_time(), time.perf_counter()
                    for _ in range(n):
                        f(url, 2.0)
                    per[name]["cpu_ms"].append(round((time.process_time() - c0) / n * 1e3, 3))
                    per[name]["wall_ms"].append(round((time.perf_counter() - w0) / n * 1e3, 3))
            text = ours(url, 2.0)
            c0 = time.process_time()
            for _ in range(fetches):
                parse_exposition(text, "resnet", 0.0)
            parse_ms = round((time.process_time() - c0) / fetches * 1e3, 3)
        finally:
            ours.close()
            keep.close()
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in per.items()}
    return {"per_fetch": per, "parse_ms": parse_ms, "page_lines": len(text.splitlines()),
            "ratio_httpx_keepalive_over_ours_cpu": round(med["httpx_keepalive"]["cpu_ms"] / med["http_fetch"]["cpu_ms"], 2),
            "ratio_httpx_new_over_ours_cpu": round(med["httpx_new_each"]["cpu_ms"] / med["http_fetch"]["cpu_ms"], 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", default="50,200,500,1000,2000", help="fleet sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--silent-at", type=int, default=200,
                    help="the fleet size also run with 5%% of pods silent (0: none)")
    ap.add_argument("--out", default=str(RESULTS / "fast_scrape.json"))
    ap.add_argument("--direct", default="200,1000",
                    help="fleet sizes whose pods are each their own listener (no proxy), comma-separated; '' for none")
    ap.add_argument("--no-triton", action="store_true", help="skip the per-fetch figures against a real tritonserver")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.pods.split(",") if x]
    if any(n <= 0 for n in sizes) or args.silent_at < 0 or args.rounds <= 0:
        ap.error(f"--pods: fleet sizes > 0, --silent-at >= 0, --rounds > 0; got {args.pods!r}, "
                 f"{args.silent_at}, {args.rounds}")
    result: dict = {"pods": {}, "silent_5pct": {}}
    runs = [(n, 0, result["pods"]) for n in sizes]
    if args.silent_at:
        runs.append((args.silent_at, max(1, args.silent_at // 20), result["silent_5pct"]))
    for n, silent, into in runs:
        parent, child = mp.Pipe()
        proc = mp.get_context("fork").Process(target=network, args=(child, n, silent), daemon=True)
        proc.start()
        try:
            port = parent.recv()
            into[str(n)] = measure(n, port, args.rounds)
        finally:
            proc.terminate()
            proc.join(10)
    result["direct"] = {}
    for n in [int(x) for x in args.direct.split(",") if x]:
        parent, child = mp.Pipe()
        proc = mp.get_context("fork").Process(target=direct_network, args=(child, n), daemon=True)
        proc.start()
        try:
            result["direct"][str(n)] = measure_direct(n, parent.recv(), args.rounds)
        finally:
            proc.terminate()
            proc.join(10)
    if not args.no_triton:
        result["triton"] = against_triton()
    from generalization import code_fingerprint

    result["code"] = code_fingerprint()  # the source hash the figures belong to
    result["note"] = ("wall times are upper bounds (one emulated server answers for every pod); the "
                      "controller's CPU per round carries over")
    text = json.dumps(result, indent=2)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
