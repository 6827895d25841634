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

"""Tests of beampq.gates.findings: the ratchet, and the parsers on real
output of the pinned tools.

testdata/ holds what ruff 0.15.22, pyrefly 1.1.1, pylint 2.17.5 and mypy
2.4.1 printed for sample_base.py.txt and sample_patched.py.txt (the same
file with two lines added above and one function below), saved as
apache_beam/bad.py in /tmp/samples/sdk and checked there as the gates
check (beampq.gates.lint); the "_base" and "_patched" outputs stand for a
file of the base and the patched tree.
"""

from pathlib import Path

import pytest

from beampq import Error
from beampq.gates import findings
from beampq.gates.findings import Finding

DATA = Path(__file__).parent / 'testdata'
SDK = Path('/tmp/samples/sdk')
FILE = 'apache_beam/bad.py'


def read(name: str) -> str:
  return (DATA / name).read_text()


def test_parse_ruff():
  parsed = findings.parse_ruff(read('ruff_base.json'), SDK)
  assert [(f.path, f.line, f.code) for f in parsed] == [
      (FILE, 1, 'I001'),
      (FILE, 1, 'F401'),
      (FILE, 2, 'F401'),
      (FILE, 11, 'F841'),
  ]
  assert parsed[1].message == '`sys` imported but unused'
  syntax = findings.parse_ruff(read('ruff_syntax.json'), SDK)
  assert [(f.path, f.line, f.code)
          for f in syntax] == [('apache_beam/syntax.py', 2, 'invalid-syntax')]


def test_parse_pyrefly():
  parsed = findings.parse_pyrefly(read('pyrefly_base.json'), SDK)
  assert [(f.path, f.line, f.code) for f in parsed] == [
      (FILE, 12, 'bad-return'),
      (FILE, 12, 'bad-argument-type'),
      (FILE, 12, 'bad-argument-type'),
      (FILE, 17, 'missing-attribute'),
      (FILE, 21, 'missing-argument'),
  ]
  assert parsed[4].message == 'Missing argument `b` in function `add`'
  assert findings.parse_pyrefly('{"errors": []}', SDK) == []


def test_parse_pylint():
  parsed = findings.parse_pylint(read('pylint_base.json'))
  assert [(f.path, f.line, f.code, f.message) for f in parsed] == [
      (FILE, 11, 'unused-variable', "Unused variable 'unused'"),
      (FILE, 1, 'unused-import', 'Unused import sys'),
      (FILE, 2, 'unused-import', 'Unused import os'),
  ]


def test_parse_mypy_keeps_the_errors_of_the_files_asked_for():
  parsed = findings.parse_mypy(read('mypy_base.txt'), [FILE])
  assert [(f.path, f.line, f.code) for f in parsed] == [
      (FILE, 12, 'return-value'),
      (FILE, 12, 'arg-type'),
      (FILE, 12, 'arg-type'),
  ]
  assert parsed[0].message == (
      'Incompatible return value type (got "int", expected "str")')
  assert findings.parse_mypy(read('mypy_base.txt'), ['apache_beam/x.py']) == []
  assert findings.parse_mypy(read('mypy_base.txt')) == parsed
  assert [
      f.path for f in findings.parse_mypy(
          'a.py:3: error: Bad  [misc]\nb.py:4: error: Bad  [misc]\n')
  ] == ['a.py', 'b.py']
  assert findings.parse_mypy(
      'a.py:3:7: error: Name "x" is not defined  [name-defined]\n'
      'a.py:4: note: See the docs\n'
      'a.py:5: error: Something without a code\n', ['a.py']) == [
          Finding('a.py', 3, 'name-defined', 'Name "x" is not defined'),
          Finding('a.py', 5, 'error', 'Something without a code'),
      ]


@pytest.mark.parametrize(
    'parse',
    [
        lambda text: findings.parse_ruff(text, SDK),
        lambda text: findings.parse_pyrefly(text, SDK),
        findings.parse_pylint,
    ])
def test_parsers_refuse_output_that_is_not_json(parse):
  with pytest.raises(Error, match='printed no JSON: Traceback'):
    parse('Traceback (most recent call last):\n  boom\n')


def test_parse_pyrefly_refuses_json_without_errors():
  with pytest.raises(Error, match='pyrefly printed no list of errors'):
    findings.parse_pyrefly('[]', SDK)


@pytest.mark.parametrize(
    'tool, parse',
    [
        ('ruff', lambda name: findings.parse_ruff(read(name), SDK)),
        ('pyrefly', lambda name: findings.parse_pyrefly(read(name), SDK)),
        ('pylint', lambda name: findings.parse_pylint(read(name))),
        ('mypy', lambda name: findings.parse_mypy(read(name), [FILE])),
    ])
def test_the_ratchet_ignores_moved_lines_and_reports_added_findings(
    tool, parse, capsys):
  suffix = 'txt' if tool == 'mypy' else 'json'
  before = parse(f'{tool}_base.{suffix}')
  after = parse(f'{tool}_patched.{suffix}')
  added = findings.added_findings(before, after)
  # The patched file has every finding of the base two lines lower, and
  # the type checkers find the bad return the patch adds at line 27.
  if tool in ('mypy', 'pyrefly'):
    assert [(f.line, f.code) for f in added
            ] == [(27, 'return-value' if tool == 'mypy' else 'bad-return')]
  else:
    assert added == []
  assert findings.ratchet(tool, before, after) == (not added)
  out = capsys.readouterr().out
  assert (
      f'beampq: {tool}: {len(before)} findings on the base, {len(after)} on '
      f'the patched tree, {len(added)} added') in out
  for finding in added:
    assert f'  {finding}\n' in out


def test_the_ratchet_counts_repeats_and_ignores_line_numbers_in_messages():
  def finding(line, message='Redefining name x from outer scope (line 3)'):
    return Finding('a.py', line, 'redefined-outer-name', message)

  before = [finding(10)]
  assert findings.added_findings(
      before,
      [finding(12, message=finding(0).message.replace('3', '5'))]) == []
  twice = [finding(12), finding(40)]
  assert findings.added_findings(before, twice) == [finding(40)]
  other_file = Finding('b.py', 10, 'redefined-outer-name', finding(0).message)
  assert findings.added_findings(before, [other_file]) == [other_file]
  assert findings.added_findings(before + twice, []) == []
  assert str(finding(7)) == (
      'a.py:7: redefined-outer-name Redefining name x from outer scope '
      '(line 3)')


def test_with_source_tells_apart_one_message_on_other_lines(tmp_path):
  # The base has the finding on one line; the patch fixes it and makes the
  # same mistake on another: counted by message alone, nothing was added.
  for tree, text in (('base', 'x = 1\ny = f()\n'), ('patched', 'x = g()\n'),
                     ('moved', '\n\nx = g()\n')):
    (tmp_path / tree).mkdir()
    (tmp_path / tree / 'a.py').write_text(text)

  def found(tree, line):
    return findings.with_source([Finding('a.py', line, 'E', 'bad call')],
                                tmp_path / tree)

  before, after = found('base', 2), found('patched', 1)
  assert [f.source for f in before + after] == ['y = f()', 'x = g()']
  assert findings.added_findings(before, after) == after
  # The same line, moved down by lines added above it, is not added.
  assert findings.added_findings(after, found('moved', 3)) == []
  assert findings.with_source([Finding('gone.py', 3, 'E', 'm')],
                              tmp_path)[0].source == ''
