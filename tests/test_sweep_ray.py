"""Sweeps on a real local Ray instance (2 CPUs, started once for this module): the same frame
as the local process pool, through the API and `xsim sweep --executor ray`, rows saved as they
finish, and a dead Ray worker recorded as a crashed variant while the others go on."""

from __future__ import annotations

import os
import time

import pandas as pd
import pytest
from helpers.sweep import write_tiny_plan
from test_sweep_run import AXES, MB3_ERROR, TIMING

from xsim_adapters.cli import main
from xsim_adapters.sweep import RayExecutor, sweep

ray = pytest.importorskip("ray", reason="needs ray (extra [ray])")


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A local Ray with 2 CPUs and no dashboard; its start-up is paid once per module.

    Ray's dashboard agent imports jsonschema, which imports rfc3987-syntax when installed (it
    comes with mlc-chakra's jupyter dependencies) and builds a grammar: seconds of CPU, and on
    a loaded machine longer than the raylet waits for the agent (15 s). So Ray's processes get
    a PYTHONPATH where that optional import fails, and a failed start is retried once
    (docs/sweep.md#ray).
    """
    if ray.is_initialized():
        ray.shutdown()
    # Ray's own processes (started from this environment) skip the optional rfc3987-syntax:
    # jsonschema then only omits its IRI format checks, which Ray does not use.
    stub = tmp_path_factory.mktemp("ray-pythonpath")
    (stub / "rfc3987_syntax.py").write_text("raise ImportError('not needed by Ray')\n")
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(stub), old_path]))
    t0 = time.perf_counter()
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception:  # "The current node timed out during startup" on a loaded machine
        ray.shutdown()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    startup_s = time.perf_counter() - t0
    assert ray.cluster_resources().get("CPU") == 2
    yield startup_s
    ray.shutdown()
    if old_path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old_path


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    return write_tiny_plan(tmp_path_factory.mktemp("ray"))


@pytest.fixture(scope="module")
def pool_frame(plan_path):
    return sweep(plan_path, AXES, jobs=2)  # the local process pool


def test_a_ray_sweep_gives_the_local_pool_frame(local_ray, plan_path, pool_frame):
    got = sweep(plan_path, AXES, executor="ray")
    pd.testing.assert_frame_equal(pool_frame.drop(columns=TIMING), got.drop(columns=TIMING))
    assert list(got.loc[got["training.micro_batch"] == 3, "error"]) == [MB3_ERROR] * 2
    assert (got.loc[got["error"] == "", "wall_s"] > 0).all()


def test_xsim_sweep_executor_ray_writes_the_same_rows(local_ray, plan_path, pool_frame,
                                                      tmp_path, capsys):
    out = tmp_path / "sw"
    argv = ["sweep", str(plan_path), "--set", "training.micro_batch=1,2,3",
            "--set", "collectives.resharding=lcm,direct", "--executor", "ray", "-o", str(out)]
    assert main(argv) == 1  # micro_batch 3 fails the plan check, inside its Ray task
    assert capsys.readouterr().out.startswith(
        f"6 variants of {plan_path} on flow: 4 ran, 2 failed\n")
    csv = pd.read_csv(out / "sweep.csv", keep_default_na=False, na_values=[""])
    csv["error"] = csv["error"].fillna("")
    pd.testing.assert_frame_equal(pool_frame.drop(columns=TIMING), csv.drop(columns=TIMING),
                                  check_dtype=False)


def test_rows_are_reported_as_they_finish_and_a_dead_worker_is_a_crash_row(local_ray):
    def variant(task):  # defined here so Ray ships it by value to its workers
        if task == "die":
            os._exit(3)  # the worker process dies, as with an out-of-memory kill
        return {"task": task, "pid": os.getpid()}

    seen: dict[int, dict] = {}
    rows = RayExecutor(max_retries=0).map(variant, ["a", "die", "b"],
                                          on_result=lambda i, r: seen.setdefault(i, r))
    assert [r.get("task") for r in rows] == ["a", None, "b"]
    assert rows[1]["error"].startswith("crash: Ray could not run this variant: ")
    assert "xsim run" in rows[1]["error"]
    assert seen == dict(enumerate(rows))  # each row was handed over once, as it finished
    assert rows[0]["pid"] != os.getpid()  # the variants ran in Ray workers, not here
