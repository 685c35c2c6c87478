"""The screenshots in docs/: what a person sees in MLflow's compare view of two rounds and of two
recipes (docs/mlflow.md) and on Prefect's deployment page (docs/prefect.md), taken with a headless
browser.

    # once: a browser and its driver (neither is needed to run or test the project)
    apt-get install chromium-headless-shell && pip install playwright
    # in a project folder where `make demo` and a second recipe have run (its mlflow.db):
    grpo-pipeline run configs/demo.yaml --set run_name=demo-lr --set grpo.lr=3e-6 --set rounds.count=1
    python docs/screenshots/take.py --store mlflow.db --rounds demo --recipes demo demo-lr
    # a project moved elsewhere, its original deleted: an old run's figure, read beside the moved database
    python docs/screenshots/take.py --store mlflow.db --artifact minute figures/test_accuracy.png
    # with docs/prefect.md's server, deployments and worker up, after its first run (the minute recipe):
    python docs/screenshots/take.py --prefect http://127.0.0.1:4300/deployments/deployment/<id>

It starts an MLflow server on 127.0.0.1 for the store, opens each comparison by its address, turns
on the parameters' "Show diff only", and saves the page; then stops the server.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _serve(store: Path, port: int) -> subprocess.Popen:
    mlflow = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen(
        [
            str(mlflow),
            "server",
            "--backend-store-uri",
            f"sqlite:///{store.resolve()}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(120):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError(f"MLflow did not start on port {port}")


def _comparisons(store: Path, rounds_of: str, recipes: list[str]) -> tuple[str, dict[str, list[str]]]:
    """The experiment and the runs of each comparison: ``rounds_of``'s rounds 1 and 2 (the parent
    run's ``round_run`` tags: a continuation's name the rounds before it too), and two recipes' runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store.resolve()}")
    exp = client.get_experiment_by_name("grpo-pipeline").experiment_id
    parents = {r.info.run_name: r.info.run_id for r in client.search_runs([exp], "tags.pipeline = 'deepseekmath-grpo'")}
    tags = client.get_run(parents[rounds_of]).data.tags
    return exp, {
        "compare-rounds": [tags["round_run.1"], tags["round_run.2"]],
        "compare-recipes": [parents[name] for name in recipes],
    }


def _mlflow(a, browser) -> None:
    exp, comparisons = _comparisons(a.store, a.rounds, a.recipes)
    server = _serve(a.store, a.port)
    try:
        for name, runs in comparisons.items():
            page = browser.new_page(viewport={"width": 1400, "height": 2600})  # (the view reads its runs once)
            page.goto(
                f"http://127.0.0.1:{a.port}/#/compare-runs?runs={json.dumps(runs)}"
                f"&experiments={json.dumps([exp])}&workflowType=machine_learning"
            )
            page.get_by_text("Show diff only").first.wait_for(timeout=30_000)
            for close in page.get_by_role("button", name="Close").all():  # the assistant's side panel
                close.click()
            page.get_by_role("switch").first.click()  # the parameters' "Show diff only"
            page.wait_for_timeout(1500)
            page.screenshot(path=str(a.out / f"{name}.png"))
            print(a.out / f"{name}.png")
    finally:
        server.terminate()
        server.wait(timeout=30)


def _artifact(a, browser) -> None:
    """The first run named ``a.artifact[0]`` with its artifact ``a.artifact[1]`` open (a moved
    project: the figure is read from beside the moved database)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{a.store.resolve()}")
    exp = client.get_experiment_by_name("grpo-pipeline").experiment_id
    run = client.search_runs([exp], f"attributes.run_name = '{a.artifact[0]}'", order_by=["start_time ASC"])[0]
    server = _serve(a.store, a.port)
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(
            f"http://127.0.0.1:{a.port}/#/experiments/{exp}/runs/{run.info.run_id}/artifacts"
            "?workflowType=machine_learning"
        )
        for part in a.artifact[1].split("/"):  # the artifact tree, as a person clicks it
            page.get_by_text(part, exact=True).first.click()
        page.locator("img:not([src^='data:'])").first.wait_for(timeout=60_000)  # the figure, read from the server
        page.wait_for_timeout(1000)
        for close in page.get_by_role("button", name="Close").all():  # the assistant's side panel
            close.click()
        page.wait_for_timeout(2000)
        out = a.out / f"moved-project-{Path(a.artifact[1]).stem}.png"
        page.screenshot(path=str(out))
        print(out)
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, help="an mlflow.db: the MLflow comparisons")
    ap.add_argument("--prefect", help="a Prefect UI page (docs/prefect.md's deployment, its server running)")
    ap.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    ap.add_argument("--browser", default="/usr/bin/chromium-headless-shell")
    ap.add_argument("--port", type=int, default=5077)
    ap.add_argument("--rounds", default="demo", help="the parent run whose rounds 1 and 2 are compared")
    ap.add_argument("--recipes", nargs=2, default=["demo", "demo-lr"], help="two parent runs to compare")
    ap.add_argument(
        "--artifact",
        nargs=2,
        metavar=("RUN", "PATH"),
        help="instead of the comparisons: the first run "
        "named RUN with its artifact PATH open (figures/test_accuracy.png)",
    )
    a = ap.parse_args()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=a.browser, args=["--no-sandbox"])
        if a.store and a.artifact:
            _artifact(a, browser)
        elif a.store:
            _mlflow(a, browser)
        if a.prefect:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(a.prefect)
            page.get_by_text("Deployment ID").wait_for(timeout=30_000)
            page.get_by_text("Completed").first.wait_for(timeout=60_000)  # its run listed, as the page says
            page.wait_for_timeout(1500)
            page.screenshot(path=str(a.out / "prefect-deployment.png"))
            print(a.out / "prefect-deployment.png")
        browser.close()


if __name__ == "__main__":
    main()
