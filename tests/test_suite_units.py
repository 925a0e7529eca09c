"""The suite's own machinery. Its scheduling (tests/conftest.py): under ``--dist loadgroup`` a test reading a
module-scoped fixture carries its module's group, so pytest-xdist runs the module's tests on one worker and the
fixture is built once. pytest 9.2 with pytest-xdist 3.8 drops the groups without a word (pytest-xdist issue #1386):
every module fixture and shared training run is then built on both workers. Its serving host
(tests/subprocess_util.py): served code that needs the project fails the test, and the next test gets a clean host."""

import pytest


@pytest.fixture(scope="module")
def built_once():
    return object()


def test_a_test_reading_a_module_fixture_runs_in_its_modules_unit(request, built_once):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@tests/test_suite_units.py"), (
        f"{request.node.nodeid}: the xdist group is lost (pytest-xdist does not group on this pytest version)")


@pytest.mark.slow
def test_the_serving_host_fails_code_that_needs_the_project_and_starts_clean_after(tmp_path):
    from tests.subprocess_util import run_like_a_server

    run_like_a_server("print('printed output goes to the log')\nopen('ok', 'w').write(str(tf.add(1, 2).numpy()))",
                      tmp_path)
    assert (tmp_path / "ok").read_text() == "3"  # in the test's directory, the replies not mixed with prints
    with pytest.raises(AssertionError, match="needed the project's modules .*'xlnet_tf'"):
        run_like_a_server("import xlnet_tf", tmp_path)
    run_like_a_server("assert 'xlnet_tf' not in sys.modules", tmp_path)  # a new host: nothing of the failed code
