"""xsim calibrate: bisection of a device constant against measured iteration times."""

from __future__ import annotations

import pytest
from helpers.gen import make_plan

from xsim_adapters.calibrate import fit, with_constant
from xsim_adapters.errors import PlanError


def _predict(plan):
    # a stand-in simulator with a closed form: compute-bound time = 2 s x 0.5 / efficiency
    return 2.0 * 0.5 / plan.device_types["H100"].efficiency


def test_fit_recovers_the_closed_form() -> None:
    plan = make_plan([[("h100", 0, 2, 0, 4)]])
    c = fit([(plan, 2.5)], "H100", predict=_predict)  # 1 / e = 2.5 -> e = 0.4
    assert c.value == pytest.approx(0.4, abs=0.002)
    assert c.before == 0.5 and c.errors_before[0] == pytest.approx(2.0 / 2.5 - 1)
    assert abs(c.errors_after[0]) < 0.01 and not c.at_bound
    # the median of several plans: measured 2.0, 2.5, 5.0 -> the middle one decides
    c = fit([(plan, 2.0), (plan, 2.5), (plan, 5.0)], "H100", predict=_predict)
    assert c.value == pytest.approx(0.4, abs=0.002)


def test_fit_stops_at_the_bound_when_the_model_cannot_match() -> None:
    plan = make_plan([[("h100", 0, 2, 0, 4)]])
    c = fit([(plan, 0.5)], "H100", predict=_predict)  # would need efficiency 2
    assert c.at_bound and c.value == 1.0


def test_fit_errors_name_what_is_wrong() -> None:
    plan = make_plan([[("h100", 0, 2, 0, 4)]])
    with pytest.raises(PlanError, match=r"^calibrate.plans\[0\]: plan 'test' does not use"):
        fit([(plan, 1.0)], "B200", predict=_predict)
    with pytest.raises(PlanError, match="calibrate.field: expected one of"):
        fit([(plan, 1.0)], "H100", field="peak_tflops", predict=_predict)
    changed = with_constant(plan, "H100", "hbm_efficiency", 0.5)
    assert changed.device_types["H100"].hbm_efficiency == 0.5


def test_cli_rejects_a_malformed_measurement(capsys) -> None:
    from xsim_adapters import cli

    assert cli.main(["calibrate", "--measured", "plan.yaml", "--device-type", "H100"]) == 2
    assert "expected PLAN=SECONDS with SECONDS a finite number > 0 (got 'plan.yaml')" in \
        capsys.readouterr().err
