"""The one options module: declarations, validation, --option parsing, per-backend split."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import WORKLOADS

from xsim_adapters.errors import BackendError, OptionError, XsimError
from xsim_adapters.options import (
    COMMON_OPTIONS,
    Option,
    check_options,
    parse_option_items,
    split_backend_options,
)

DECL = (
    Option("protocol", "str", "roce", "transport", choices=("roce", "ndp", "eqds")),
    Option("mtu", "int", None, "bytes", low=256, high=65535),
    Option("limit_s", "float", 10.0, "seconds", low=0, low_open=True),
    Option("trace", "bool", False, "keep a trace"),
    Option("work_dir", "path", None, "a directory"),
    *COMMON_OPTIONS,
)


def test_defaults_fill_every_declared_option() -> None:
    assert check_options("b", DECL, {}) == {
        "protocol": "roce", "mtu": None, "limit_s": 10.0, "trace": False, "work_dir": None,
        "seed": 1, "progress": None}


def test_unknown_key_names_backend_suggests_and_lists_allowed() -> None:
    with pytest.raises(OptionError) as e:
        check_options("htsim", DECL, {"protcol": "ndp"})
    assert str(e.value) == (
        "unknown option 'protcol' for backend htsim; did you mean 'protocol'? allowed: limit_s,"
        " mtu, progress, protocol, seed, trace, work_dir")
    with pytest.raises(OptionError) as e:
        check_options("b", DECL, {"zzz": 1})
    assert "did you mean" not in str(e.value) and "allowed: limit_s" in str(e.value)


def test_option_error_is_a_backend_error_and_a_value_error() -> None:
    assert issubclass(OptionError, BackendError) and issubclass(OptionError, ValueError)
    assert issubclass(OptionError, XsimError)


@pytest.mark.parametrize(("opts", "msg"), [
    ({"protocol": "ndpp"}, "b: option protocol: must be one of roce, ndp, eqds (got 'ndpp');"
                           " did you mean 'ndp'?"),
    ({"mtu": 255}, "b: option mtu: expected an integer >= 256 and <= 65535 (got 255)"),
    ({"mtu": 65536}, "b: option mtu: expected an integer >= 256 and <= 65535 (got 65536)"),
    ({"mtu": 9000.0}, "b: option mtu: expected an integer >= 256 and <= 65535 (got 9000.0)"),
    ({"mtu": True}, "b: option mtu: expected an integer >= 256 and <= 65535 (got True)"),
    ({"limit_s": 0}, "b: option limit_s: expected a number > 0 (got 0)"),
    ({"limit_s": float("nan")}, "b: option limit_s: expected a number > 0 (got nan)"),
    ({"limit_s": "soon"}, "b: option limit_s: expected a number > 0 (got 'soon')"),
    ({"limit_s": None}, "b: option limit_s: expected a number > 0 (got None)"),
    ({"trace": "yes"}, "b: option trace: expected true or false (got 'yes')"),
    ({"work_dir": ""}, "b: option work_dir: expected a file or directory path (got '')"),
    ({"progress": 3}, "b: option progress: expected a callable (got 3)"),
    ({"seed": -1}, "b: option seed: expected an integer >= 0 and <= 2147483647 (got -1)"),
])
def test_bad_values_are_named(opts: dict, msg: str) -> None:
    with pytest.raises(OptionError) as e:
        check_options("b", DECL, opts)
    assert str(e.value) == msg


def test_good_values_pass_and_numbers_given_as_text_are_read() -> None:
    got = check_options("b", DECL, {"mtu": 256, "limit_s": "1e3", "work_dir": Path("/tmp"),
                                    "seed": "7", "progress": print, "trace": True})
    assert got["mtu"] == 256 and got["limit_s"] == 1000.0 and isinstance(got["limit_s"], float)
    assert got["seed"] == 7 and got["progress"] is print and got["trace"] is True
    assert check_options("b", DECL, {"mtu": None})["mtu"] is None  # None is "backend decides"


def test_a_long_value_is_truncated_in_the_message() -> None:
    with pytest.raises(OptionError) as e:
        check_options("b", DECL, {"protocol": "x" * 10_000})
    assert len(str(e.value)) < 200


def test_declaring_an_unknown_type_fails() -> None:
    with pytest.raises(ValueError, match="type must be one of"):
        Option("x", "list", None, "doc")


def test_describe_is_one_line_with_type_range_and_default() -> None:
    assert DECL[1].describe() == "mtu (int >= 256 and <= 65535, default None): bytes"
    assert DECL[0].describe() == "protocol (roce|ndp|eqds, default 'roce'): transport"
    assert DECL[2].describe() == "limit_s (float > 0, default 10.0): seconds"


def test_parse_option_items_reads_yaml_scalars() -> None:
    assert parse_option_items(["seed=3", "rate=0.5", "ecn=true", "transport=dctcp", "x="]) == {
        "seed": 3, "rate": 0.5, "ecn": True, "transport": "dctcp", "x": ""}
    with pytest.raises(XsimError, match=r"--option 'seed': expected KEY=VALUE"):
        parse_option_items(["seed"])


def test_split_prefix_goes_to_one_backend_unprefixed_to_those_declaring_it() -> None:
    per = split_backend_options({"seed": 1, "ns3.transport": "dctcp"}, ["flow", "ns3"])
    assert per == {"flow": {"seed": 1}, "ns3": {"seed": 1, "transport": "dctcp"}}
    decl = {"flow": COMMON_OPTIONS, "htsim": DECL}
    per = split_backend_options({"seed": 2, "protocol": "ndp"}, ["flow", "htsim"], decl)
    assert per == {"flow": {"seed": 2}, "htsim": {"seed": 2, "protocol": "ndp"}}
    with pytest.raises(OptionError, match=r"unknown option 'protcol' for backend flow, htsim;"
                                          r" did you mean 'protocol'\?"):
        split_backend_options({"protcol": "ndp"}, ["flow", "htsim"], decl)


def test_every_installed_backend_declares_valid_options() -> None:
    from xsim_adapters.backends.registry import backend_names, backend_options

    for name in backend_names():
        try:
            opts = backend_options(name)
        except XsimError:  # a plugin that does not import here
            continue
        names = [o.name for o in opts]
        assert len(names) == len(set(names)), name
        assert {"seed", "progress"} <= set(names), name  # every backend accepts the common ones
        defaults = check_options(name, opts, {})
        assert set(defaults) == set(names)


def test_flow_backend_rejects_a_misspelled_option() -> None:
    from xsim_adapters.backends.flow import FlowBackend
    from xsim_adapters.testing.handmade import TraceBuilder

    tb = TraceBuilder(2)
    tb.flow(0, 1, 1000)
    # options are checked first, before the topology is looked at
    with pytest.raises(OptionError, match="unknown option 'trasnport' for backend flow; allowed:"
                                          " engine, progress, seed"):
        FlowBackend().run(tb.build(), None, {"trasnport": "udp"})  # type: ignore[arg-type]


def test_sweep_refuses_a_bad_option_before_running(tmp_path: Path) -> None:
    from xsim_adapters.sweep import sweep

    plan = WORKLOADS / "homogeneous-h100.yaml"
    with pytest.raises(OptionError, match="unknown option 'sed' for backend flow; did you mean"
                                          " 'seed'"):
        sweep(plan, {"training.micro_batch": [1, 2]}, options={"sed": 1})
