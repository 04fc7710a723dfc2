"""See the ROSE dashboard page at work: a local cluster with the Dask dashboard on, one dedicated and one
serving worker, light serving traffic, and the default pipeline running; halfway through, the
dedicated worker's slots are cut to 8 for a few steps, mid-rollout (its running rollouts beyond that
are shed and finish on the serving worker).

    python scripts/dashboard_demo.py [--steps 20] [--screenshot docs/dashboard.png]

Open http://127.0.0.1:8787/rose while it runs. With --screenshot, the page is captured near the end
of the run (needs selenium, chromium and chromedriver: `pip install selenium`,
`apt-get install chromium chromium-driver`).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import threading
import time
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--screenshot", default=None, help="write a PNG of the page here (needs chromium)")
    ap.add_argument("--rate", type=float, default=15.0, help="serving requests per second")
    args = ap.parse_args()

    from distributed import Client

    import rose
    from rose.envs import env_class
    from rose.models import prepare_model
    from rose.pipeline import load_pipeline
    from rose.runtime.cluster import LocalRoseCluster
    from rose.runtime.coserve import traffic

    pipeline = load_pipeline(os.path.join(ROOT, "pipelines", "guess.py"))
    model_dir = prepare_model(pipeline.model, env_class(pipeline.env))
    cfg = rose.ClusterConfig(num_dedicated=1, num_serving=1, serving_model=model_dir, dedicated_slots=64,
                             cores=(0, 1), trainer_cores=(0,), dashboard=True,
                             shed_after_s=0.0)
    with LocalRoseCluster(cfg, pipeline.engine) as cluster, Client(cluster) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        serving = next(w for w in workers.values() if w["metrics"]["rose"]["role"] == "serving")
        dedicated = next(a for a, w in workers.items() if w["metrics"]["rose"]["role"] == "dedicated")
        url = f"http://127.0.0.1:{serving['metrics']['rose']['http_port']}"
        arrivals, _ = traffic.azure_trace_at_rate(
            os.path.join(ROOT, "benchmarks", "data", "azure_llm_inference_2023_conv.csv"), args.rate, 3600.0)
        stop = threading.Event()
        load = threading.Thread(target=lambda: asyncio.run(traffic.play(url, arrivals, 1000.0, 100.0, stop=stop)),
                                daemon=True)
        load.start()
        print(f"dashboard: {cluster.dashboard_link.replace('/status', '/rose')}", flush=True)

        def on_step(row):
            print(f"step {row['step']}: reward {row['reward_mean']:.3f}, rollout {row['rollout_s']:.2f} s", flush=True)
            if row["step"] == args.steps // 2:  # mid-rollout of the next step, cut the dedicated worker's slots
                def cut():
                    client.run(lambda dask_worker: dask_worker.plugins["rose"].set_slot_cap(8), workers=[dedicated])

                threading.Timer(0.15, cut).start()
            if row["step"] == args.steps // 2 + 3:
                client.run(lambda dask_worker: dask_worker.plugins["rose"].set_slot_cap(None), workers=[dedicated])
            if args.screenshot and row["step"] == args.steps - 2:
                shoot(cluster.dashboard_link.replace("/status", "/rose"), args.screenshot)

        rose.run(replace(pipeline, cluster=cfg), cluster=client, steps=args.steps, progress=False, on_step=on_step)
        stop.set()
        load.join(60)


def shoot(url: str, path: str) -> None:
    """PNG of the page after its first updates (bokeh draws over a websocket, so a plain `chromium
    --screenshot` catches an empty page): selenium driving headless chromium."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        print("no screenshot: pip install selenium, and install chromium and chromedriver", file=sys.stderr)
        return
    driver_path = shutil.which("chromedriver")
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if driver_path is None or browser is None:
        print("no screenshot: chromium and chromedriver are needed", file=sys.stderr)
        return
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1150", "--hide-scrollbars"):
        opts.add_argument(a)
    opts.binary_location = browser
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        driver.get(url)
        time.sleep(4.0)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        driver.save_screenshot(path)
    finally:
        driver.quit()
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
