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

"""Tests of beampq.changes: our CHANGES.md entries and Beam's CHANGES.md."""

import pytest

from beampq import Error
from beampq import changes
from beampq import testing
from beampq.changes import Entry
from beampq.project import Project

LINK = '([#{0}](https://github.com/apache/beam/pull/{0})).'


def test_entries_carry_heading_and_pull_request():
  assert changes.parse(testing.CHANGES) == [
      Entry(
          'New Features / Improvements',
          '* (Python) Added a thing '
          '([#1](https://github.com/apache/beam/issues/1)).',
          'feature'),
      Entry(
          'Bugfixes',
          '* (Python) Fixed a bug '
          '([#2](https://github.com/apache/beam/issues/2)).',
          'fix'),
  ]


def test_an_attribution_lasts_to_the_next_one_or_heading():
  text = f"""\
# [1.0.0] - Unreleased

## Bugfixes

<!-- pull request: a -->
* (Python) One,
  continued {LINK.format(1)}
* (Python) Two {LINK.format(2)}
<!-- pull request: b -->
* (Python) Three {LINK.format(3)}

## Breaking Changes

* (Python) Four {LINK.format(4)}
"""
  with pytest.raises(Error,
                     match='CHANGES.md:14: entry under "Breaking '
                     'Changes" has no "<!-- pull request: NAME -->" line'):
    changes.parse(text)
  entries = changes.parse(
      text.replace(
          '## Breaking Changes\n\n',
          '## Breaking Changes\n\n<!-- pull request: b -->\n'))
  assert [(e.heading, e.text.split()[2], e.pull_request) for e in entries] == [
      ('Bugfixes', 'One,', 'a'),
      ('Bugfixes', 'Two', 'a'),
      ('Bugfixes', 'Three', 'b'),
      ('Breaking Changes', 'Four', 'b'),
  ]
  assert entries[0].text.endswith(f'\n  continued {LINK.format(1)}')


def test_template_entries_and_their_lines_are_skipped():
  text = f"""\
# [1.0.0] - Unreleased

## Bugfixes

* Fixed X (Java/Python) ([#X](https://github.com/apache/beam/issues/X)),
  over two lines.
<!-- pull request: a -->
* (Python) Real {LINK.format(1)}
"""
  assert [e.text for e in changes.parse(text)
          ] == [f'* (Python) Real {LINK.format(1)}']


@pytest.mark.parametrize(
    'text, message',
    [
        ('# [1.0] - 2020\n', 'has no "# \\[x.y.z\\] - Unreleased" section'),
        (
            '# [1.0] - Unreleased\n* x ([#1](https://github.com/apache/beam/'
            'pull/1)).\n',
            'CHANGES.md:2: entry before any "## " heading'),
        (
            '# [1.0] - Unreleased\n## Bugfixes\n<!-- pull request: a -->\n'
            '* (Python) Linked ([#1](https://github.com/apache/beam/issues/1))'
            ' then more.\n',
            'entry under "Bugfixes" must end with its one'),
        (
            '# [1.0] - Unreleased\n## Bugfixes\n<!-- pull request: a -->\n'
            '* (Python) Two ([#1](https://github.com/apache/beam/issues/1)) '
            '([#2](https://github.com/apache/beam/issues/2)).\n',
            'entry under "Bugfixes" must end with its one'),
        (
            '# [1.0] - Unreleased\n## Bugfixes\n<!-- pull request: a -->\n'
            '* (Python) No full stop\n',
            'does not end with a full stop'),
        (
            '# [1.0] - Unreleased\n## Bugfixes\n<!-- pull request: a -->\n'
            '* (Python) Fixed it ([#X](https://github.com/apache/beam/issues/'
            'X)).\n',
            r'CHANGES.md:4: an entry of pull request a links the placeholder'),
        (
            '# [1.0] - Unreleased\n## Bugfixes\n<!-- pull request: a -->\n'
            '* (Python) ' + 'word ' * 45 + 'end.\n',
            'has 47 words, more than 45: split it'),
    ])
def test_parse_errors(text, message):
  with pytest.raises(Error, match=message):
    changes.parse(text)


def test_an_entry_may_have_no_link():
  text = (
      '# [1.0] - Unreleased\n## Bugfixes\n<!-- pull request: a -->\n'
      '* (Python) Fixed a thing, with no issue to link.\n')
  assert [e.text for e in changes.parse(text)
          ] == ['* (Python) Fixed a thing, with no issue to link.']


def test_to_text_groups_by_heading():
  entries = changes.parse(testing.CHANGES)
  assert changes.to_text(entries) == (
      '## New Features / Improvements\n\n' + entries[0].text + '\n\n'
      '## Bugfixes\n\n' + entries[1].text + '\n')
  assert changes.to_text(entries[1:]).startswith('## Bugfixes\n\n* (Python)')


def test_insert_replaces_templates_and_keeps_bugfixes_last():
  text, added = changes.insert(
      testing.UPSTREAM_CHANGES, changes.parse(testing.CHANGES))
  assert added == 2
  template, section = text.split('# [9.9.0] - Unreleased\n')
  assert template == testing.UPSTREAM_TEMPLATE, 'the commented one stays'
  unreleased, released = section.split('# [9.8.0]')
  assert '* (Python) Added a thing' in unreleased
  assert 'X feature added' not in unreleased, 'the template entry goes'
  assert '<!--' not in unreleased
  bugfixes = unreleased.split('## Bugfixes')[1].split('##')[0].strip()
  assert bugfixes.splitlines() == [
      '* (Java) Fixed something else '
      '([#3](https://github.com/apache/beam/issues/3)).',
      '* (Python) Fixed a bug ([#2](https://github.com/apache/beam/issues/2)).',
      '* Fixed X (Java/Python) ([#X](https://github.com/apache/beam/issues/X)).',
  ]
  assert 'Fixed a bug' not in released


def test_insert_is_idempotent_and_adds_missing_headings():
  entries = changes.parse(testing.CHANGES)
  once, added = changes.insert(testing.UPSTREAM_CHANGES, entries)
  assert added == 2
  twice, added = changes.insert(once, entries)
  assert (twice, added) == (once, 0)
  bare = '# [1.0.0] - Unreleased\n\n## Highlights\n\n# [0.9.0] - 2020\n'
  text, added = changes.insert(bare, entries)
  assert added == 2
  assert text.index('## Bugfixes') < text.index('# [0.9.0]')
  assert [(e.heading, e.text) for e in entries] == [
      (heading, item) for heading, items in changes.by_heading(entries).items()
      for item in items
  ]


def test_real_changes_entries_are_in_beams_format():
  project = Project()
  entries = changes.read(project.changes)
  assert entries, 'CHANGES.md has entries'
  names = {pr.name for pr in project.read_series().pull_requests}
  for entry in entries:
    assert entry.heading in (
        'Highlights',
        'I/Os',
        'New Features / Improvements',
        'Breaking Changes',
        'Deprecations',
        'Bugfixes',
        'Security Fixes',
        'Known Issues')
    assert entry.pull_request in names
