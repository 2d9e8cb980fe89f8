"""The order the suite's modules go out to xdist's workers (tests/scheduling.py)."""
from __future__ import annotations

from tests.scheduling import longest_first, scope_of, table_from_junit

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.e2e.test_build_job" name="test_builds" time="80.5"/>
<testcase classname="tests.client.test_keys" name="test_a" time="0.25"/>
<testcase classname="tests.client.test_keys" name="test_b" time="0.5"/>
<testcase classname="tests.service.test_api.TestAuth" name="test_c" time="2.0"/>
</testsuite></testsuites>"""


def test_known_scopes_go_out_costliest_first():
    costs = {"a.py": 5.0, "b.py": 80.0, "c.py": 20.0}
    assert longest_first({"a.py": 40, "b.py": 1, "c.py": 3}, costs) == ["b.py", "c.py", "a.py"]


def test_a_scope_the_table_does_not_name_goes_out_before_every_known_one():
    """A new one-test module may be an 80 s build: handed out last, it ran alone after the others had finished."""
    costs = {"old_e2e.py": 250.0, "old_unit.py": 3.0}
    order = longest_first({"old_unit.py": 50, "new_build.py": 1, "new_unit.py": 30, "old_e2e.py": 4}, costs)
    assert order == ["new_unit.py", "new_build.py", "old_e2e.py", "old_unit.py"]


def test_the_table_sums_each_scope_from_a_junit_report(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(JUNIT)
    assert table_from_junit(report) == {"modules": {
        "tests/e2e/test_build_job.py": 80.5, "tests/service/test_api.py::TestAuth": 2.0,
        "tests/client/test_keys.py": 0.8}}


def test_the_checked_in_table_names_scopes_as_xdist_does():
    from tests.scheduling import load_costs

    costs = load_costs()
    assert costs and all(scope.startswith("tests/") and ".py" in scope for scope in costs)


def test_a_test_is_in_its_modules_or_classes_scope_whatever_its_parameters_hold():
    """xdist's own split (the last ``::``) made ``test_x[http://[::1]`` a scope of its own (2026-12-07)."""
    assert scope_of("tests/client/test_cli.py::test_bad[args7-'--url': 'http://[::1' is not a URL]") == \
        "tests/client/test_cli.py"
    assert scope_of("tests/service/test_api.py::TestAuth::test_c[a::b]") == "tests/service/test_api.py::TestAuth"
    assert scope_of("tests/e2e/test_build_job.py::test_builds") == "tests/e2e/test_build_job.py"
