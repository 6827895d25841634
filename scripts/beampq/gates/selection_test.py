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

"""Tests of beampq.gates.selection, and of the pytest plugin's use of it."""

import json
import subprocess
import sys
import textwrap

from beampq.gates import selection
from beampq.gates import suite
from beampq.gates.suite_test import TEST_SETUP

ALL = selection.ALL

BASE = textwrap.dedent(
    """
    import unittest
    from os import path

    LIMIT = 3


    class FakeModel:
      def predict(self, x):
        return x


    def helper():
      return 1


    def test_function():
      assert helper() == 1


    class ATest(unittest.TestCase):
      def setUp(self):
        self.x = 1

      def test_kept(self):
        pass

      def test_changed(self):
        pass


    class BTest(unittest.TestCase):
      def test_b(self):
        pass


    class CTest(ATest):
      def test_c(self):
        pass


    if __name__ == '__main__':
      unittest.main()
    """)


def test_a_new_module_runs_whole():
  assert selection.module_selection(None, BASE) == ALL


def test_comments_and_formatting_change_nothing():
  tree = BASE.replace('def test_b(self):', 'def test_b(self):  # note')
  tree = tree.replace(
      "if __name__ == '__main__':", 'if __name__ == "__main__":')
  assert selection.module_selection(BASE, tree) == {}


def test_a_changed_test_runs_and_its_subclasses_run_it():
  tree = BASE.replace(
      """  def test_changed(self):
    pass""",
      """  def test_changed(self):
    self.assertEqual(self.x, 1)""")
  assert selection.module_selection(BASE, tree) == {
      'ATest': ['test_changed'], 'CTest': ['test_changed']
  }


def test_a_new_class_and_a_new_test_run():
  tree = BASE.replace(
      """class BTest(unittest.TestCase):
  def test_b(self):
    pass""",
      """class BTest(unittest.TestCase):
  def test_b(self):
    pass

  def test_b2(self):
    pass


class NewTest(unittest.TestCase):
  def test_new(self):
    pass""")
  assert selection.module_selection(BASE, tree) == {
      'BTest': ['test_b2'], 'NewTest': ALL
  }


def test_a_changed_set_up_runs_the_class_and_its_subclasses():
  tree = BASE.replace('self.x = 1', 'self.x = 2')
  assert selection.module_selection(BASE, tree) == {'ATest': ALL, 'CTest': ALL}


def test_a_new_set_up_runs_the_class():
  tree = BASE.replace(
      """class BTest(unittest.TestCase):
""",
      """class BTest(unittest.TestCase):
  def setUp(self):
    pass

""")
  assert selection.module_selection(BASE, tree) == {'BTest': ALL}


def test_a_changed_helper_constant_or_import_runs_the_module():
  changes = (
      ('return 1', 'return 2'),
      ('LIMIT = 3', 'LIMIT = 4'),
      ('LIMIT = 3', ''),
      ('return x', 'return -x'),
      ('from os import path', 'import os.path as path'),
      ('from os import path', ''),
      ('assert helper() == 1', 'assert helper() == 2'),
  )
  for old, new in changes:
    assert selection.module_selection(BASE, BASE.replace(old, new)) == ALL, new


def test_new_module_code_runs_the_module_when_it_may_reach_old_tests():
  fresh = BASE.replace(
      'LIMIT = 3',
      'LIMIT = 3\nOTHER = 4\n\n\ndef other_helper():\n  pass\n\n\n'
      'class OtherFake:\n  pass\n')
  fresh = fresh.replace('import unittest', 'import json\nimport unittest')
  assert selection.module_selection(BASE, fresh) == {}
  reaching = (
      BASE.replace('LIMIT = 3', 'LIMIT = 3\nLIMIT = 5'),
      BASE + '\n\ndef helper():\n  return 2\n',
      BASE + '\n\nclass FakeModel:\n  pass\n',
      BASE.replace(
          'from os import path', 'from os import path\nfrom sys import path'),
      BASE + '\nunittest.TestCase.maxDiff = None\n',
      BASE + '\nprint(LIMIT)\n',
      # A try block that does more than guard an import, or that binds a
      # name the base has.
      BASE + '\ntry:\n  import numpy\nexcept Exception:\n  numpy = None\n',
      BASE + '\ntry:\n  import numpy\nexcept ImportError:\n  print(1)\n',
      BASE + '\ntry:\n  import numpy\n  print(1)\nexcept ImportError:\n'
      '  pass\n',
      BASE + '\ntry:\n  import numpy\nexcept ImportError:\n  pass\n'
      'finally:\n  NEW = 4\n',
      BASE + '\ntry:\n  import numpy\nexcept ImportError as e:\n  pass\n',
      BASE + '\ntry:\n  import numpy\nexcept:\n  numpy = None\n',
      BASE + '\ntry:\n  import numpy\nexcept ImportError:\n'
      '  def helper():\n    return 2\n',
      BASE + '\ntry:\n  from numpy import *\nexcept ImportError:\n  pass\n',
      BASE.replace('import unittest', 'from numpy import *\nimport unittest'),
      BASE + '\ntry:\n  from os import sep as path\nexcept ImportError:\n'
      '  pass\n',
      BASE + '\ntry:\n  import numpy\nexcept ImportError:\n  LIMIT = 4\n',
      # Hooks and fixtures that run around every test of the module.
      BASE + '\n\ndef setUpModule():\n  raise RuntimeError()\n',
      BASE + '\n\n@pytest.fixture(autouse=True)\ndef slow():\n  pass\n',
  )
  for tree in reaching:
    assert selection.module_selection(BASE, tree) == ALL, tree


def test_a_new_guarded_import_changes_nothing():
  guarded = (
      '\ntry:\n  import numpy\nexcept ImportError:\n  numpy = None\n',
      '\ntry:\n  from numpy import random as nprandom\n'
      'except (ImportError, ModuleNotFoundError):\n  pass\n',
      '\ntry:\n  import numpy\nexcept ImportError:\n  try:\n'
      '    import numpy_stub as numpy\n  except ImportError:\n'
      '    numpy = None\n',
  )
  for block in guarded:
    tree = BASE.replace('LIMIT = 3', 'LIMIT = 3\n' + block)
    assert tree != BASE
    assert selection.module_selection(BASE, tree) == {}, block


def test_a_new_import_changes_nothing():
  tree = BASE.replace('import unittest', 'import os\nimport unittest')
  tree = tree.replace(
      """  def test_b(self):
    pass""",
      """  def test_b(self):
    self.assertTrue(os.sep)""")
  assert selection.module_selection(BASE, tree) == {'BTest': ['test_b']}


def test_is_selected_matches_parameterized_names():
  chosen = {
      'a_test.py': {
          'ATest': ['test_x'], 'BTest': ALL
      },
      'b_test.py': ALL,
  }
  assert selection.is_selected(chosen, 'a_test.py', 'ATest', 'test_x')
  assert selection.is_selected(chosen, 'a_test.py', 'ATest', 'test_x_0_fast')
  assert not selection.is_selected(chosen, 'a_test.py', 'ATest', 'test_xy')
  assert selection.is_selected(chosen, 'a_test.py', 'BTest', 'test_any')
  assert selection.is_selected(chosen, 'a_test.py', 'BTest_0', 'test_any')
  assert selection.is_selected(chosen, 'a_test.py', 'ATest_1_b', 'test_x')
  assert not selection.is_selected(chosen, 'a_test.py', 'ATest_1', 'test_y')
  assert not selection.is_selected(chosen, 'a_test.py', 'CTest', 'test_x')
  assert selection.is_selected(chosen, 'b_test.py', 'ZTest', 'test_z')
  assert not selection.is_selected(chosen, 'c_test.py', 'ATest', 'test_x')


def test_series_tests_reads_both_trees(tmp_path):
  base, tree = tmp_path / 'base', tmp_path / 'tree'
  for root in (base, tree):
    (root / 'pkg').mkdir(parents=True)
    (root / 'pkg' / 'a_test.py').write_text(BASE)
  (tree / 'pkg' / 'a_test.py').write_text(
      BASE.replace('self.x = 1', 'self.x = 2'))
  (tree / 'pkg' / 'new_test.py').write_text(BASE)
  chosen = selection.series_tests(
      base, tree, ['pkg/a_test.py', 'pkg/new_test.py'])
  assert chosen == {
      'pkg/a_test.py': {
          'ATest': ALL, 'CTest': ALL
      }, 'pkg/new_test.py': ALL
  }
  assert selection.count(chosen) == (
      'pkg/a_test.py: 2 classes whole; pkg/new_test.py: whole')


def test_the_plugin_runs_only_the_selected_tests(tmp_path):
  sdk = tmp_path / 'sdk'
  stubs = {
      **TEST_SETUP,
      'pkg/__init__.py': '',
      'pkg/a_test.py': BASE.replace(
          'class BTest(unittest.TestCase):',
          'class BTest(unittest.TestCase):\n'
          '  def test_b_0_fast(self):\n    pass\n'),
  }
  for path, text in stubs.items():
    (sdk / path).parent.mkdir(parents=True, exist_ok=True)
    (sdk / path).write_text(text)
  select_file = tmp_path / 'selection.json'
  select_file.write_text(
      json.dumps(
          {'pkg/a_test.py': {
              'ATest': ['test_changed'], 'BTest': ['test_b']
          }}))
  env = suite.beam_test_env(sdk, str(tmp_path))
  result = subprocess.run([
      sys.executable,
      '-m',
      'pytest',
      '-p',
      'beampq.gates.pytest_plugin',
      '-p',
      'no:cacheprovider',
      f'--beampq-select={select_file}',
      '-v',
      'pkg/a_test.py'
  ],
                          cwd=sdk,
                          env=env,
                          capture_output=True,
                          text=True,
                          check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  ran = sorted(
      line.split(' ')[0] for line in result.stdout.splitlines()
      if line.endswith('PASSED') or ' PASSED ' in line)
  assert ran == [
      'pkg/a_test.py::ATest::test_changed',
      'pkg/a_test.py::BTest::test_b',
      'pkg/a_test.py::BTest::test_b_0_fast',
  ]
  assert '5 deselected' in result.stdout


def test_a_swapped_dotted_import_runs_the_module():
  base = BASE.replace('import unittest', 'import os.path\nimport unittest')
  swapped = base.replace('import os.path', 'import os.abc')
  assert selection.module_selection(base, swapped) == ALL
  added = base.replace('import os.path', 'import os.path\nimport json.decoder')
  assert selection.module_selection(base, added) == {}
