#
# Licensed to the Apache Software Foundation (ASF) under one or more
# contributor license agreements.  See the NOTICE file distributed with
# this work for additional information regarding copyright ownership.
# The ASF licenses this file to You under the Apache License, Version 2.0
# (the "License"); you may not use this file except in compliance with
# the License.  You may obtain a copy of the License at
#
#    http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#

"""Tests of beampq.gates.suite: what the test gates run and how the
regression gate judges failures."""

import os
import subprocess
import sys
import types

import pytest

from beampq import Error
from beampq import refresh
from beampq import testing
from beampq import tree
from beampq.gates import suite
from beampq.gates.workspace import Workspace


def test_regression_failures_are_classified():
  verdicts = suite.classify_failures(
      failed=['a.py::old', 'a.py::flaky', 'b.py::new'],
      failed_again=['a.py::old', 'b.py::new'],
      failed_before=['a.py::old', 'c.py::other'])
  assert verdicts == {
      'also fails on the base': ['a.py::old'],
      'flaky: passed when rerun': ['a.py::flaky'],
      'NEW': ['b.py::new'],
  }


def test_a_test_that_fails_otherwise_on_the_base_is_new():
  # Failing on both trees excuses a test only where it fails alike.
  verdicts = suite.classify_failures(
      failed=['a.py::same', 'a.py::other', 'a.py::plain'],
      failed_again=['a.py::same', 'a.py::other', 'a.py::plain'],
      failed_before=['a.py::same', 'a.py::other', 'a.py::plain'],
      reasons={
          'a.py::same': 'ImportError: no module named torch',
          'a.py::other': 'TypeError: f() got an unexpected keyword',
          'a.py::plain': 'assert 1 == 2',
      },
      reasons_before={
          'a.py::same': 'ImportError: no module named torch (again)',
          'a.py::other': 'ImportError: no module named torch',
          'a.py::plain': 'assert 3 == 4',
      })
  assert verdicts == {
      'also fails on the base': ['a.py::same', 'a.py::plain'],
      'flaky: passed when rerun': [],
      'NEW': ['a.py::other'],
  }


def test_the_summary_gives_each_failures_reason():
  assert suite.summary_failure(
      'FAILED apache_beam/x_test.py::T::test_bad - TypeError: boom\n') == (
          'apache_beam/x_test.py::T::test_bad', 'TypeError: boom')
  assert suite.summary_failure('ERROR apache_beam/y_test.py\n') == (
      'apache_beam/y_test.py', '')
  assert suite.summary_failure('PASSED apache_beam/x_test.py::t\n') is None
  assert suite.summary_failure('x_test.py FAILED\n') is None


def test_regression_modules_cover_batch_elements_users(tmp_path):
  sdk = tmp_path
  files = {
      'apache_beam/transforms/util_test.py': '',
      'apache_beam/ml/inference/base_test.py': '',
      'apache_beam/runners/direct/direct_runner_test.py': '',
      'apache_beam/metrics/metric_test.py': '',
      'apache_beam/runners/other_test.py': '',
      'apache_beam/io/uses.py': 'beam.BatchElements()',
      'apache_beam/io/uses_test.py': '',
      'apache_beam/io/other.py': '',
      'apache_beam/io/other_test.py': '',
      'apache_beam/examples/ex.py': 'BatchElements',
      'apache_beam/examples/ex_test.py': '',
  }
  for path, text in files.items():
    (sdk / path).parent.mkdir(parents=True, exist_ok=True)
    (sdk / path).write_text(text)
  assert suite.regression_modules(sdk) == [
      'apache_beam/io/uses_test.py',
      'apache_beam/metrics/metric_test.py',
      'apache_beam/ml/inference/base_test.py',
      'apache_beam/runners/direct/direct_runner_test.py',
      'apache_beam/transforms/util_test.py',
  ]


def test_the_pytest_plugin_is_importable_from_the_package_parent():
  assert (suite.PACKAGE_PARENT / 'beampq' / 'gates' /
          'pytest_plugin.py').is_file()


def test_beam_tests_get_a_temporary_folder_of_their_own(tmp_path):
  env = suite.beam_test_env(tmp_path / 'sdk', str(tmp_path / 'tmp'))
  (tmp_path / 'tmp').mkdir()
  seen = subprocess.run([
      sys.executable,
      '-c',
      'import tempfile, beampq; print(tempfile.gettempdir()); '
      'print(beampq.__file__)'
  ],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=True).stdout.split()
  assert seen[0] == str(tmp_path / 'tmp')
  assert seen[1] == str(suite.PACKAGE_PARENT / 'beampq' / '__init__.py')
  assert env['BEAMPQ_TREE'] == str(tmp_path / 'sdk')
  assert env['PYTHONPATH'].split(os.pathsep)[0] == str(tmp_path / 'sdk')


AREA_TEST = """\
import unittest

from apache_beam import area


class AreaTest(unittest.TestCase):
  def test_area(self):
    self.assertEqual(area.area(2), 12)
"""

# What the gates' pytest plugin imports from Beam.
TEST_SETUP = {
    'apache_beam/__init__.py': '',
    'apache_beam/options/__init__.py': '',
    'apache_beam/options/pipeline_options.py': (
        'def enable_all_additional_type_checks():\n  pass\n'),
    'apache_beam/testing/__init__.py': '',
    'apache_beam/testing/test_pipeline.py': 'class TestPipeline:\n  pass\n',
}
# A base with it.
SDIST_WITH_TEST_SETUP = testing.make_sdist({
    **TEST_SETUP,
    'apache_beam/util.py': testing.UTIL,
    'setup.cfg': '[yapf]\n',
})

SERIAL_TEST = """\
import unittest

import pytest


class ParallelTest(unittest.TestCase):
  def test_parallel(self):
    pass


@pytest.mark.no_xdist
class SerialTest(unittest.TestCase):
  def test_serial(self):
    pass
"""


def _stub_sdk(root):
  stubs = {**TEST_SETUP, 'apache_beam/serial_test.py': SERIAL_TEST}
  for path, text in stubs.items():
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)
  return root


def test_the_serial_run_runs_only_when_a_test_to_run_needs_it(tmp_path, capsys):
  sdk = _stub_sdk(tmp_path / 'sdk')
  targets = ['apache_beam/serial_test.py']
  assert suite.pytest_on(sdk, targets, tmp_path / 'cache') == 0
  out = capsys.readouterr().out
  assert 'pytest -m "no_xdist"' in out
  assert '1 passed, 1 deselected' in out
  only_parallel = {'apache_beam/serial_test.py': {'ParallelTest': '*'}}
  assert suite.pytest_on(
      sdk, targets, tmp_path / 'cache', chosen=only_parallel) == 0
  out = capsys.readouterr().out
  assert 'pytest -m "no_xdist"' not in out
  assert 'no test to run is marked no_xdist: no serial run' in out
  failed = []
  (sdk / targets[0]).write_text(
      SERIAL_TEST.replace(
          '  def test_serial(self):\n    pass',
          '  def test_serial(self):\n    assert False'))
  assert suite.pytest_on(sdk, targets, tmp_path / 'cache', failed) == 1
  assert failed == ['apache_beam/serial_test.py::SerialTest::test_serial']


def test_options_narrow_the_modules_and_paths_replace_them():
  modules = ['apache_beam/a_test.py', 'apache_beam/b_test.py']
  assert suite.module_targets(modules, []) == modules
  assert suite.module_targets(modules,
                              ['-k', 'Keyed']) == modules + ['-k', 'Keyed']
  for named in (['apache_beam/c_test.py', '-k', 'Batch'], ['c_test.py'],
                ['apache_beam/c_test.py::CTest::test_c']):
    assert suite.module_targets(modules, named) == named
  # Options' values name no test to run.
  for options in (['--deselect',
                   'apache_beam/a_test.py::ATest::test_a'], ['-k',
                                                             'Keyed',
                                                             '--basetemp',
                                                             '/tmp/x']):
    assert suite.module_targets(modules, options) == modules + options


def test_run_once_tests_are_deselected_by_prefix_and_must_exist(tmp_path):
  module = tmp_path / 'apache_beam' / 'a_test.py'
  module.parent.mkdir()
  module.write_text(
      'import unittest\n\n\nclass ATest(unittest.TestCase):\n'
      '  def test_many_elements(self):\n    pass\n')
  prefix = 'apache_beam/a_test.py::ATest::test_many'
  assert suite.run_once_args(tmp_path, (prefix, )) == ['--deselect', prefix]
  # A renamed test, class or module is an error, not a test left out.
  for gone in ('apache_beam/a_test.py::ATest::test_few',
               'apache_beam/a_test.py::BTest::test_many',
               'apache_beam/b_test.py::ATest::test_many'):
    with pytest.raises(Error, match='RUN_ONCE names no test'):
      suite.run_once_args(tmp_path, (prefix, gone))


def test_only_series_runs_leave_run_once_tests_out(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(
      suite,
      '_series_on', lambda ws, sdk, modules, args, where: calls.append(
          ('series', args)) or 0)
  monkeypatch.setattr(
      suite,
      'pytest_on', lambda sdk, targets, cache: calls.append(
          ('whole', targets)) or 0)
  monkeypatch.setattr(suite, 'RUN_ONCE', ('m_test.py::ATest::test_a', ))
  (tmp_path /
   'm_test.py').write_text('class ATest:\n  def test_a_0(self):\n    pass\n')
  ws = types.SimpleNamespace(
      sdk=tmp_path,
      test_modules=['m_test.py'],
      project=types.SimpleNamespace(build=tmp_path))
  assert suite.run(ws, ['-k', 'A'], series=True) == 0
  assert suite.run(ws, ['-k', 'A']) == 0
  assert calls == [
      ('series', ['-k', 'A', '--deselect', 'm_test.py::ATest::test_a']),
      ('whole', ['m_test.py', '-k', 'A']),
  ]


def test_heads_test_each_pull_request_alone(tmp_path, index, capsys):
  # The first pull request's code uses a name that only the second defines:
  # the tree passes its tests, but the first is submitted broken.
  index.publish('apache_beam-9.9.0.tar.gz', SDIST_WITH_TEST_SETUP)
  project = testing.make_project(tmp_path / 'repo', SDIST_WITH_TEST_SETUP)
  tree.update(project)
  area = 'def area(r):\n  return SCALE * r * r\n'
  testing.commit_in_tree(
      project,
      '[Python] Add area',
      {
          'sdks/python/apache_beam/area.py': area,
          'sdks/python/apache_beam/area_test.py': AREA_TEST,
      })
  testing.commit_in_tree(
      project,
      '[Python] Define SCALE',
      {'sdks/python/apache_beam/area.py': 'SCALE = 3\n\n\n' + area})
  refresh.refresh(project)
  testing.start_pull_request(project, 'scale', '0002-Python-Define-SCALE.patch')
  ws = Workspace.open(project)
  assert suite.run(ws, ['apache_beam/area_test.py']) == 0
  capsys.readouterr()
  assert suite.heads(ws, []) == 1
  out = capsys.readouterr().out
  assert 'at the head of fix' in out
  assert "NameError: name 'SCALE' is not defined" in out
  assert 'failing at the head of: fix' in out


def test_heads_pass_when_each_pull_request_passes_alone(project, capsys):
  # make_queue: the first pull request changes util.py and adds no test.
  assert suite.heads(Workspace.open(project), []) == 0
  out = capsys.readouterr().out
  assert 'at the head of fix' in out
  assert 'all pass' in out


def test_heads_fail_when_the_heads_cannot_be_told(project, capsys):
  testing.commit_in_tree(
      project, 'Local', {'sdks/python/apache_beam/new_mod.py': 'NEW = 2\n'})
  assert suite.heads(Workspace.open(project), []) == 1
  assert '3 commits for 2 patches' in capsys.readouterr().out
