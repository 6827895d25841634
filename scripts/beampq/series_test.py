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

"""Tests of beampq.series: the series file and pull request descriptions."""

import pytest

from beampq import Error
from beampq import series
from beampq.series import Patch
from beampq.series import PullRequest
from beampq.series import Series

TEXT = """\
# comment
[fix]
0001-a.patch
[feature]
0002-b.patch
  + sdks/x.py
  + sdks/y.py  # a comment
0003-c.patch
"""


def test_parse_groups_patches_by_pull_request():
  parsed = series.parse(TEXT)
  assert parsed == Series([
      PullRequest('fix', [Patch('0001-a.patch')]),
      PullRequest(
          'feature',
          [
              Patch('0002-b.patch', ['sdks/x.py', 'sdks/y.py']),
              Patch('0003-c.patch')
          ]),
  ])
  assert [p.name for p in parsed.patches
          ] == ['0001-a.patch', '0002-b.patch', '0003-c.patch']
  assert parsed.new_files == ['sdks/x.py', 'sdks/y.py']
  assert parsed.pull_request_of('0003-c.patch') == 'feature'
  assert parsed.pull_request_of('0009-z.patch') is None


def test_to_text_round_trips():
  parsed = series.parse(TEXT)
  text = series.to_text(parsed)
  assert text.startswith(series.HEADER)
  assert series.parse(text) == parsed
  assert '[feature]\n0002-b.patch\n  + sdks/x.py\n' in text


@pytest.mark.parametrize(
    'text, message',
    [
        ('[a]\na.patch\n  sdks/x.py\n', 'series:3: expected "\\+ <new file>"'),
        ('[a]\n  + sdks/x.py\n', 'series:2: expected'),
        ('[a]\na.patch\n  + ../x.py\n', 'is not under sdks/'),
        ('[a]\na.patch\n  + sdks/../x.py\n', 'is not under sdks/'),
        ('[a]\na.patch\na.patch\n', 'a.patch is listed more than once'),
        ('[a]\na.patch\n[a]\nb.patch\n', 'a is listed more than once'),
        ('a.patch\n', 'series:1: a.patch comes before any "\\[name\\]"'),
        ('[A b]\n', 'is not a pull request line'),
        ('[a\n', 'is not a pull request line'),
        ('[a]\ndir/a.patch\n', 'is not a patch file name'),
        ('[a]\na.diff\n', 'is not a patch file name'),
    ])
def test_parse_errors_name_the_line(text, message):
  with pytest.raises(Error, match=message):
    series.parse(text)


def test_group_starts_a_pull_request_where_the_name_changes():
  patches = [Patch('1.patch'), Patch('2.patch'), Patch('3.patch')]
  grouped = series.group(patches, ['a', 'b', 'b'])
  assert [(pr.name, [p.name for p in pr.patches])
          for pr in grouped.pull_requests] == [('a', ['1.patch']),
                                               ('b', ['2.patch', '3.patch'])]


def test_group_refuses_a_pull_request_split_in_two():
  patches = [Patch('1.patch'), Patch('2.patch'), Patch('3.patch')]
  with pytest.raises(Error,
                     match='3.patch belongs to pull request \\[a\\], '
                     'whose patches come before those of \\[b\\]'):
    series.group(patches, ['a', 'b', 'a'])


def test_get_names_the_pull_requests_there_are():
  parsed = series.parse(TEXT)
  assert parsed.get('fix').patches == [Patch('0001-a.patch')]
  with pytest.raises(Error, match="no pull request 'nope'.*fix, feature"):
    parsed.get('nope')


def test_description_has_a_title_and_a_body():
  description = series.Description.parse(
      '# [Python] Do a thing\n\nBecause.\n\nMore.\n', 'x.md')
  assert description.title == '[Python] Do a thing'
  assert description.body == 'Because.\n\nMore.'
  assert description.commit_message() == (
      '[Python] Do a thing\n\nBecause.\n\nMore.\n')
  assert series.Description.parse(description.markdown(), 'x.md') == (
      description)
  with pytest.raises(Error, match='x.md: the first line is not'):
    series.Description.parse('Do a thing\n\nBecause.\n', 'x.md')
  with pytest.raises(Error, match='x.md: there is no description'):
    series.Description.parse('# Do a thing\n\n', 'x.md')


def test_a_description_for_reviewers_has_no_figure_markers():
  description = series.Description.parse(
      '# Title\n\nWhy.\n\n<!-- bench:pr-x -->\nFigures 1.5x.\n'
      '<!-- /bench:pr-x -->\n',
      'x.md')
  assert description.markdown() == '# Title\n\nWhy.\n\nFigures 1.5x.\n'
  assert description.commit_message() == 'Title\n\nWhy.\n\nFigures 1.5x.\n'
  assert '<!-- bench:pr-x -->' in description.body


def test_a_description_for_reviewers_has_no_notes_to_maintainers():
  description = series.Description.parse(
      '# Title\n\nWhy.\n<!-- Regenerate with tox -e x. -->\n| a |\n', 'x.md')
  assert description.commit_message() == 'Title\n\nWhy.\n| a |\n'
