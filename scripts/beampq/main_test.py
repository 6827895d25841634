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

"""Tests of the command line (python -m beampq)."""

import os
import subprocess
import sys

import pytest

from beampq import testing
from beampq.__main__ import main
from beampq.__main__ import parser
from beampq.gates.suite import PACKAGE_PARENT


def test_main_reports_errors_in_one_line(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv('PIP_INDEX_URL', 'http://127.0.0.1:9/simple/')
  project = testing.make_project(tmp_path)
  assert main(['--project', str(project.root), 'tree']) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith('beampq: error: cannot read the package index')
  assert len(err.splitlines()) == 1


def test_every_action_has_a_function():
  actions = parser()._subparsers._group_actions[0].choices  # pylint: disable=protected-access
  assert sorted(actions) == [
      'apply',
      'check',
      'differential',
      'export',
      'fetch',
      'format',
      'lint',
      'mypy',
      'pylint',
      'refresh',
      'regression',
      'test',
      'tree',
  ]
  for name, sub in actions.items():
    assert callable(sub.get_default('function')), name


def test_test_takes_series_and_pytest_arguments():
  args = parser().parse_args(['test', '--series', '--', '-k', 'Keyed'])
  assert args.series
  assert args.pytest_args == ['--', '-k', 'Keyed']
  assert not parser().parse_args(['test']).series
  assert parser().parse_args(['test', '--heads']).heads
  assert not parser().parse_args(['test']).heads


def test_actions_run_on_the_project(project, tmp_path, capsys):
  root = str(project.root)
  checkout = testing.make_checkout(project, tmp_path / 'beam')
  assert main(['--project', root, 'apply', str(checkout)]) == 0
  assert testing.tree_id(checkout) == testing.tree_id(project.tree)
  assert 'no CHANGES.md there' in capsys.readouterr().out
  assert main([
      '--project',
      root,
      'export',
      str(tmp_path / 'out'),
      '--pull-request',
      'fix',
      '--pull-request',
      'feature'
  ]) == 0
  assert sorted(os.listdir(tmp_path / 'out')) == ['feature', 'fix']
  assert main(['--project', root, 'check']) == 0
  assert main(['--project', root, 'refresh']) == 0
  assert main(['--project', root, 'tree']) == 0
  assert 'is up to date' in capsys.readouterr().out


def test_python_m_beampq_help_lists_the_actions():
  result = subprocess.run([sys.executable, '-m', 'beampq', '--help'],
                          env=dict(os.environ, PYTHONPATH=str(PACKAGE_PARENT)),
                          capture_output=True,
                          text=True,
                          check=True)
  assert 'refresh' in result.stdout and 'write one folder per upstream' in (
      result.stdout)


@pytest.mark.parametrize('argv', [[], ['nope'], ['export']])
def test_bad_command_lines_exit_with_usage(argv, capsys):
  with pytest.raises(SystemExit) as raised:
    main(argv)
  assert raised.value.code == 2
  assert 'usage: beampq' in capsys.readouterr().err
