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

"""Our CHANGES.md entries, in the format of Beam's CHANGES.md, and putting
them into a Beam checkout's.

Our CHANGES.md has one "Unreleased" section. Each entry belongs to one pull
request of the series, named by a comment line above it::

  ## Bugfixes

  <!-- pull request: max-batch-weight -->
  * (Python) Fixed ... ([#N](https://github.com/apache/beam/issues/N)).

A comment names the pull request of the entries after it, up to the next
comment or heading. The comments stay in this file: Beam's gets the entries
alone.
"""

import dataclasses
import re
from pathlib import Path
from typing import Iterable

from beampq import Error

UNRELEASED = re.compile(r'^# \[[^\]]+\] - Unreleased\s*$')
ATTRIBUTION = re.compile(r'^<!-- pull request: ([a-z0-9][a-z0-9.-]*) -->$')
LINK = re.compile(
    r'\(\[#\d+\]\(https://github\.com/apache/beam/(issues|pull)/\d+\)\)\.$')
# Any link to an issue or pull request: an entry has at most one, at its end.
ANY_LINK = re.compile(r'\[#[^\]]*\]\(https://github\.com/apache/beam/')
# Beam's template entries, which stand for "nothing yet".
PLACEHOLDER = '[#X]'
# Beam's entries are one sentence of about 40 words at most.
MAX_ENTRY_WORDS = 45


@dataclasses.dataclass(frozen=True)
class Entry:
  """One bullet of CHANGES.md: its heading, its text (continuation lines
  included) and the pull request it belongs to."""
  heading: str
  text: str
  pull_request: str


def _unreleased(lines: list[str]) -> int | None:
  """The index of the first "# [x.y.z] - Unreleased" heading outside HTML
  comments: Beam's CHANGES.md opens with a commented-out template section
  whose heading has that form too."""
  commented = False
  for i, line in enumerate(lines):
    if commented:
      commented = '-->' not in line
    elif line.lstrip().startswith('<!--'):
      commented = '-->' not in line
    elif UNRELEASED.match(line):
      return i
  return None


def read(path: Path) -> list[Entry]:
  """The entries of the top Unreleased section of our CHANGES.md."""
  if not path.is_file():
    raise Error(f'{path.name} is missing')
  return parse(path.read_text(), path.name)


def parse(text: str, name: str = 'CHANGES.md') -> list[Entry]:
  lines = text.splitlines()
  start = _unreleased(lines)
  if start is None:
    raise Error(f'{name} has no "# [x.y.z] - Unreleased" section')
  entries: list[Entry] = []
  heading = None
  pull_request = None
  # Whether continuation lines extend entries[-1] (not a skipped template).
  extending = False
  for lineno, line in enumerate(lines[start + 1:], start + 2):
    if line.startswith('# '):
      break
    attribution = ATTRIBUTION.match(line.strip())
    if line.startswith('## '):
      heading = line[3:].strip()
      pull_request = None
      extending = False
    elif attribution:
      pull_request = attribution.group(1)
      extending = False
    elif line.startswith('* '):
      if heading is None:
        raise Error(f'{name}:{lineno}: entry before any "## " heading')
      extending = PLACEHOLDER not in line
      if not extending:
        if pull_request is not None:
          raise Error(
              f'{name}:{lineno}: an entry of pull request {pull_request} '
              f'links the placeholder {PLACEHOLDER}: link an existing issue '
              'or pull request, or none')
        continue
      if pull_request is None:
        raise Error(
            f'{name}:{lineno}: entry under "{heading}" has no '
            '"<!-- pull request: NAME -->" line above it')
      entries.append(Entry(heading, line, pull_request))
    elif line.startswith('  ') and extending:
      last = entries.pop()
      entries.append(dataclasses.replace(last, text=last.text + '\n' + line))
    elif line.strip():
      extending = False
  for entry in entries:
    _check_entry(name, entry)
  return entries


def _check_entry(name: str, entry: Entry):
  """Beam's form: a sentence of at most MAX_ENTRY_WORDS words, ending in
  its one link if it has one."""
  links = len(ANY_LINK.findall(entry.text))
  if links > 1 or (links and not LINK.search(entry.text)):
    raise Error(
        f'{name}: entry under "{entry.heading}" must end with its one '
        '([#N](https://github.com/apache/beam/issues/N)). link: '
        f'{entry.text[:60]}...')
  if not entry.text.endswith('.'):
    raise Error(
        f'{name}: entry under "{entry.heading}" does not end with a full '
        f'stop: {entry.text[:60]}...')
  words = len(LINK.sub('', entry.text).split()) - 1
  if words > MAX_ENTRY_WORDS:
    raise Error(
        f'{name}: entry under "{entry.heading}" has {words} words, more '
        f'than {MAX_ENTRY_WORDS}: split it. {entry.text[:60]}...')


def by_heading(entries: Iterable[Entry]) -> dict[str, list[str]]:
  """The entries' texts under their headings, in order."""
  grouped: dict[str, list[str]] = {}
  for entry in entries:
    grouped.setdefault(entry.heading, []).append(entry.text)
  return grouped


def to_text(entries: Iterable[Entry]) -> str:
  """The entries as CHANGES.md sections (for CHANGES-entries.md)."""
  return '\n'.join(
      f'## {heading}\n\n' + '\n'.join(items) + '\n'
      for heading, items in by_heading(entries).items())


def insert(text: str, entries: Iterable[Entry]) -> tuple[str, int]:
  """Adds entries to a Beam CHANGES.md (text) under their headings in its
  top Unreleased section, after its real entries and in place of Beam's
  template ones (Bugfixes keeps its template entry last). Entries already
  there are not added again. Returns the new text and how many were added.
  """
  lines = text.splitlines()
  start = _unreleased(lines)
  if start is None:
    raise Error('CHANGES.md has no "# [x.y.z] - Unreleased" section')
  end = next(
      (i for i in range(start + 1, len(lines)) if lines[i].startswith('# ')),
      len(lines))
  added = 0
  for heading, items in by_heading(entries).items():
    at = next((
        i
        for i in range(start + 1, end) if lines[i].strip() == f'## {heading}'),
              None)
    if at is None:
      lines[end:end] = [f'## {heading}', '']
      at, end = end, end + 2
    stop = next((i for i in range(at + 1, end) if lines[i].startswith('#')),
                end)
    block = '\n'.join(lines[at + 1:stop])
    bullets = [i for i in range(at + 1, stop) if lines[i].startswith('* ')]
    new = [item for item in items if item not in block]
    if not new:
      continue
    real, placeholders = [], []
    i = bullets[0] if bullets else None
    last = at
    while i is not None and i < stop:
      if lines[i].startswith('* '):
        j = i + 1
        while j < stop and lines[j].startswith('  '):
          j += 1
        entry = '\n'.join(lines[i:j])
        (placeholders if PLACEHOLDER in entry else real).append(entry)
        last = j - 1
        i = j
      elif lines[i].strip() == '':
        i += 1
      else:
        break
    keep = placeholders if heading == 'Bugfixes' else []
    replacement = '\n'.join(real + new + keep).split('\n')
    if bullets:
      lines[bullets[0]:last + 1] = replacement
      delta = len(replacement) - (last + 1 - bullets[0])
    else:
      lines[at + 1:at + 1] = [''] + replacement + ([''] if (
          at + 1 < len(lines) and lines[at + 1].strip()) else [])
      delta = len(replacement) + 1
    end += delta
    added += len(new)
  return '\n'.join(lines) + '\n', added
