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

from beampq.gates import suite


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


def test_regression_modules_cover_batch_elements_users(tmp_path):
  sdk = tmp_path
  files = {
      'apache_beam/transforms/util_test.py': '',
      'apache_beam/ml/inference/base_test.py': '',
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
      'apache_beam/ml/inference/base_test.py',
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
