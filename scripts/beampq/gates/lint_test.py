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

"""Tests of beampq.gates.lint on a small project's tree, with the real ruff
and yapf the harness env installs."""

import re
from pathlib import Path

import pytest

from beampq import Error
from beampq import refresh
from beampq import testing
from beampq import tree
from beampq.gates import findings
from beampq.gates import lint
from beampq.gates.findings import Finding
from beampq.gates.workspace import Workspace


def test_unittest_main_check(tmp_path):
  files = {
      'a_test.py': 'import unittest\n',
      'b_test.py': 'import unittest\n\nif __name__ == "__main__":\n'
      '  unittest.main()\n',
      'c_test.py': 'from unittest import mock\n',
  }
  for name, text in files.items():
    (tmp_path / name).write_text(text)
  assert lint.unittest_main_problems(tmp_path, list(files) + ['gone.py']) == [
      'a_test.py imports unittest but never calls unittest.main'
  ]


def test_a_gate_whose_tool_is_missing_fails(tmp_path):
  # `python -m mypy` without mypy exits 1, which mypy uses for findings:
  # the gate must not read that as a clean run.
  with pytest.raises(Error, match='no_such_linter is not installed'):
    lint._tool('no_such_linter', '--version', cwd=tmp_path)


def test_ruff_ratchet_fails_only_on_what_the_queue_adds(project, capsys):
  testing.commit_in_tree(
      project,
      'Lint',
      {
          # The base file gets an unused import at the top, which also moves
          # its lines; the new module gets one too.
          'sdks/python/apache_beam/__init__.py': 'import os\n',
          'sdks/python/apache_beam/new_mod.py': 'import sys\nNEW = 1\n',
      })
  ws = Workspace.open(project)
  (ws.base_sdk / 'apache_beam/__init__.py').write_text('import os\n')
  # util.py of the small project is not Python: leave it out.
  before = lint.ruff_findings(ws.base_sdk, ['apache_beam/__init__.py'])
  after = lint.ruff_findings(
      ws.sdk, ['apache_beam/__init__.py', 'apache_beam/new_mod.py'])
  assert [(f.path, f.code)
          for f in before] == [('apache_beam/__init__.py', 'F401')]
  assert lint.findings.ratchet('ruff', before, after) is False
  assert 'apache_beam/new_mod.py:1: F401' in capsys.readouterr().out


def _sdk_with(root: Path, text: str) -> Path:
  """An sdk folder whose ruff sorts imports, with text as apache_beam/m.py."""
  (root / 'apache_beam').mkdir(parents=True)
  (root / 'pyproject.toml').write_text(
      '[tool.ruff.lint]\nselect = ["I"]\n'
      '[tool.ruff.lint.isort]\nforce-single-line = true\n')
  (root / 'apache_beam' / 'm.py').write_text(text)
  return root


# A block the base has unsorted, as Beam 2.77's util.py has one.
UNSORTED = 'import time\nimport bisect\nimport re\n\nX = 1\n'


@pytest.mark.parametrize(
    'patched, added',
    [
        # Imports added in order, and lines added above.
        ('import time\nimport bisect\nimport os\nimport re\n\nX = 1\n', []),
        ('import time\nimport bisect\nimport re\nimport uuid\n\nX = 1\n', []),
        ('"""Doc."""\nimport time\nimport bisect\nimport re\n\nX = 1\n', []),
        # One added out of order in the unsorted block: last, first, among
        # the lines in order, or next to the one out of order.
        (
            'import time\nimport bisect\nimport re\nimport abc\n\nX = 1\n',
            ['import abc']),
        (
            'import zlib\nimport time\nimport bisect\nimport re\n\nX = 1\n',
            ['import zlib']),
        (
            'import time\nimport bisect\nimport zlib\nimport re\n\nX = 1\n',
            ['import zlib']),
        (
            'import time\nimport uuid\nimport bisect\nimport re\n\nX = 1\n',
            ['import uuid']),
        # The base's block sorted, and an unsorted one added elsewhere.
        (
            'import bisect\nimport re\nimport time\n\n\ndef f():\n'
            '  import sys\n  import os\n  import re\n  return os, re, sys\n',
            ['import sys']),
    ])
def test_ruff_ratchet_sees_each_misplaced_import(tmp_path, patched, added):
  # ruff reports an unsorted block once, with one message: the ratchet
  # compares the imports its fix moves, as the base's block has them.
  files = ['apache_beam/m.py']
  before, after = lint.ruff_compared(
      _sdk_with(tmp_path / 'base', UNSORTED), files,
      _sdk_with(tmp_path / 'patched', patched), files)
  assert [f.source for f in before] == ['import time']
  assert [f.source for f in findings.added_findings(before, after)] == added


def test_format_fixes_the_touched_files_in_the_tree(project, capsys):
  testing.commit_in_tree(
      project,
      'Ugly',
      {
          # yapf stops at a file that is not Python: make util.py Python.
          'sdks/python/apache_beam/util.py': 'UTIL = 1\n',
          'sdks/python/apache_beam/new_mod.py': 'import sys,os\nNEW = ( 1 )\n',
      })
  assert lint.format_files(Workspace.open(project)) == 0
  assert (project.tree / 'sdks/python/apache_beam/new_mod.py').read_text() == (
      'import os\nimport sys\n\nNEW = (1)\n')
  out = capsys.readouterr().out
  assert '1 changed in build/beam' in out
  # It names the commit whose patch the change belongs in.
  assert 'sdks/python/apache_beam/new_mod.py: ' in out
  assert re.search(
      r'new_mod\.py: [0-9a-f]{7,} \[Python\] Add a module; '
      r'[0-9a-f]{7,} Ugly\n',
      out), out
  assert testing.tree_git(
      project, 'status',
      '--porcelain') == ('M sdks/python/apache_beam/new_mod.py')


def test_format_leaves_files_outside_the_package_alone(project):
  # Beam formats apache_beam/ with yapf, but not setup.py.
  setup = "setup(name='apache-beam',\n  packages = [ 'apache_beam' ])\n"
  testing.commit_in_tree(
      project,
      '[Python] Touch setup.py',
      {
          'sdks/python/setup.py': setup,
          'sdks/python/apache_beam/util.py': 'UTIL = 1\n',
          'sdks/python/apache_beam/new_mod.py': 'NEW = [ 1,2 ]\n',
      })
  lint.format_files(Workspace.open(project))
  sdk = project.tree / 'sdks/python'
  assert (sdk / 'setup.py').read_text() == setup
  assert (sdk / 'apache_beam/new_mod.py').read_text() == 'NEW = [1, 2]\n'


def test_ruff_runs_at_the_head_of_each_pull_request(tmp_path, index, capsys):
  # The first pull request uses math, which only the second imports: the
  # tree is clean, but the first is submitted broken.
  index.publish('apache_beam-9.9.0.tar.gz', testing.SDIST)
  project = testing.make_project(tmp_path / 'repo')
  tree.update(project)
  uses_math = 'def area(r):\n  return math.pi * r * r\n'
  testing.commit_in_tree(
      project,
      '[Python] Add area', {'sdks/python/apache_beam/area.py': uses_math})
  testing.commit_in_tree(
      project,
      '[Python] Import math',
      {'sdks/python/apache_beam/area.py': 'import math\n\n\n' + uses_math})
  refresh.refresh(project)
  testing.start_pull_request(
      project, 'imports', '0002-Python-Import-math.patch')
  ws = Workspace.open(project)
  assert lint.ruff_findings(ws.sdk, ws.files) == []
  assert lint.ruff_at_heads(ws) is False
  out = capsys.readouterr().out
  assert 'ruff at the head of fix' in out
  assert "apache_beam/area.py:2: F821 Undefined name `math`" in out


def test_ruff_at_heads_passes_a_clean_queue(project, capsys):
  # make_queue: two pull requests, whose first changes only util.py, which
  # is not Python to ruff, the same on the base.
  assert lint.ruff_at_heads(Workspace.open(project)) is True
  assert 'ruff at the head of fix' in capsys.readouterr().out


def test_ruff_at_heads_fails_when_the_heads_cannot_be_told(project, capsys):
  # A commit not refreshed yet: the tree's commits are not one per patch.
  testing.commit_in_tree(
      project, 'Local', {'sdks/python/apache_beam/new_mod.py': 'NEW = 2\n'})
  assert lint.ruff_at_heads(Workspace.open(project)) is False
  assert '3 commits for 2 patches' in capsys.readouterr().out


def test_mypy_checks_on_the_base_what_the_patched_run_reaches(
    monkeypatch, tmp_path, capsys):
  # The patched tree's new import reaches a module with errors of its own,
  # which the base run must check too; a caller it breaks counts as added.
  reached = Finding('apache_beam/other.py', 5, 'arg-type', 'old error')
  broken = Finding('apache_beam/caller.py', 9, 'call-arg', 'new error')
  caller = Finding('apache_beam/caller.py', 2, 'misc', 'old error')
  checked = {}

  def fake_mypy(sdk, files, cache):
    checked[sdk.name] = files
    if sdk.name == 'patched':
      return [reached, broken, caller]
    return [f for f in (reached, caller) if f.path in files]

  class FakeProject:
    build = tmp_path

  class FakeWorkspace:
    project = FakeProject()
    base_sdk, sdk = tmp_path / 'base', tmp_path / 'patched'
    modified = ['apache_beam/util.py']
    files = modified + ['apache_beam/new.py']

  monkeypatch.setattr(lint, 'mypy_findings', fake_mypy)
  assert lint.mypy(FakeWorkspace()) == 1
  assert checked['base'] == [
      'apache_beam/util.py', 'apache_beam/caller.py', 'apache_beam/other.py'
  ]
  out = capsys.readouterr().out
  assert '2 findings on the base, 3 on the patched tree, 1 added' in out
  assert 'caller.py:9: call-arg new error' in out
