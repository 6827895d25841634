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

"""What lint tools report: one Finding per problem, parsed from each tool's
machine-readable output, and the ratchet that compares the base's findings
with the patched tree's."""

import collections
import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Optional

from beampq import Error


@dataclasses.dataclass(frozen=True)
class Finding:
  """One problem a tool reports: where, its code, and its message; source is
  the text of its line (with_source)."""
  path: str
  line: int
  code: str
  message: str
  source: str = ''

  def key(self):
    """What identifies the finding across the base and the patched tree:
    line numbers move when a patch adds lines above, so they are left out,
    but the text of the line is in, so that one message repeated on other
    lines (a tool's fixed wording) counts as another finding."""
    return (
        self.path,
        self.code,
        re.sub(r'\(line \d+\)', '', self.message),
        self.source)

  def __str__(self):
    return f'{self.path}:{self.line}: {self.code} {self.message}'


class _Lines:
  """The lines of the files under sdk, read once each."""
  def __init__(self, sdk: Path):
    self._sdk = sdk
    self._files: dict[str, list[str]] = {}

  def __call__(self, path: str) -> list[str]:
    if path not in self._files:
      try:
        self._files[path] = (self._sdk / path).read_text().splitlines()
      except (OSError, UnicodeDecodeError):
        self._files[path] = []
    return self._files[path]


def with_source(found: list[Finding], sdk: Path) -> list[Finding]:
  """found, each with the stripped text of its line in the file under sdk
  ('' where there is none)."""
  lines = _Lines(sdk)
  out = []
  for finding in found:
    text = lines(finding.path)
    source = text[finding.line -
                  1].strip() if 0 < finding.line <= len(text) else ''
    out.append(dataclasses.replace(finding, source=source))
  return out


def added_findings(before: list[Finding],
                   after: list[Finding]) -> list[Finding]:
  """The findings of after that before does not have, counting repeats: a
  second copy of a finding the base has once is added."""
  remaining = collections.Counter(f.key() for f in before)
  added = []
  for finding in sorted(after, key=lambda f: (f.path, f.line)):
    if remaining[finding.key()] > 0:
      remaining[finding.key()] -= 1
    else:
      added.append(finding)
  return added


def ratchet(tool: str, before: list[Finding], after: list[Finding]) -> bool:
  """Reports the findings the queue adds; True when there are none."""
  added = added_findings(before, after)
  print(
      f'beampq: {tool}: {len(before)} findings on the base, '
      f'{len(after)} on the patched tree, {len(added)} added')
  for finding in added:
    print(f'  {finding}')
  return not added


def _json(tool: str, output: str):
  try:
    return json.loads(output)
  except ValueError:
    raise Error(f'{tool} printed no JSON: {output.strip()[-300:]}') from None


def _in_sdk(path: str, sdk: Path) -> str:
  """A path a tool run in sdk printed, relative to sdk."""
  return os.path.relpath(path, sdk) if os.path.isabs(path) else path


def _import_block(item, lines: list[str]):
  """The lines (number, text) of the import block an unsorted-imports item
  (I001) names, and those of ruff's sorted block; None without a fix."""
  edits = (item.get('fix') or {}).get('edits') or []
  if item['code'] != 'I001' or len(edits) != 1 or not lines:
    return None
  start = edits[0]['location']['row']
  end = edits[0]['end_location']
  stop = end['row'] - 1 if end['column'] == 1 else end['row']
  block = [(row, lines[row - 1].strip())
           for row in range(start, min(stop, len(lines)) + 1)
           if lines[row - 1].strip()]
  fixed = [line.strip() for line in edits[0]['content'].splitlines()]
  return block, [line for line in fixed if line]


def _kept(block: list[str], fixed: list[str], anchors: set[str]) -> set[int]:
  """The indices of block's lines in a longest subsequence it shares with
  fixed (what sorting leaves in place), a line of anchors counting twice:
  of the ties, the one that keeps the base's lines in place."""
  n, m = len(block), len(fixed)
  best = [[0] * (m + 1) for _ in range(n + 1)]
  for i in range(n - 1, -1, -1):
    for j in range(m - 1, -1, -1):
      if block[i] == fixed[j]:
        best[i][j] = best[i + 1][j + 1] + (2 if block[i] in anchors else 1)
      else:
        best[i][j] = max(best[i + 1][j], best[i][j + 1])
  kept, i, j = set(), 0, 0
  while i < n and j < m:
    if block[i] == fixed[j]:
      kept.add(i)
      i, j = i + 1, j + 1
    elif best[i + 1][j] >= best[i][j + 1]:
      i += 1
    else:
      j += 1
  return kept


def kept_imports(output: str, sdk: Path) -> dict[str, set[str]]:
  """Per file, the lines of its unsorted import blocks that sorting leaves
  in place, from `ruff check --output-format=json` run in sdk: the anchors
  of parse_ruff on the patched tree."""
  lines = _Lines(sdk)
  kept: dict[str, set[str]] = {}
  for item in _json('ruff', output):
    path = _in_sdk(item['filename'], sdk)
    found = _import_block(item, lines(path))
    if found:
      texts = [text for _, text in found[0]]
      kept.setdefault(path, set()).update(
          texts[i] for i in _kept(texts, found[1], set()))
  return kept


def parse_ruff(
    output: str,
    sdk: Path,
    anchors: Optional[dict[str, set[str]]] = None) -> list[Finding]:
  """`ruff check --output-format=json`, run in sdk. An unsorted import block
  (I001, reported once per block, with one message) becomes one finding
  per line that its fix moves, of the lines a longest common order with
  the sorted block leaves out; anchors (kept_imports of the base) breaks
  its ties in favour of the lines the base has in place. So a patch that
  adds an import out of order to a block the base has unsorted adds a
  finding, and one placed in order adds none."""
  lines = _Lines(sdk)
  found = []
  for item in _json('ruff', output):
    path = _in_sdk(item['filename'], sdk)
    block = _import_block(item, lines(path))
    moved = []
    if block:
      texts = [text for _, text in block[0]]
      kept = _kept(texts, block[1], (anchors or {}).get(path, set()))
      moved = [entry for i, entry in enumerate(block[0]) if i not in kept]
    found.extend(
        Finding(path, row, 'I001', f'{item["message"]}: moves {text}')
        for row, text in moved)
    if not moved:
      found.append(
          Finding(
              path,
              item['location']['row'],
              item['code'] or 'syntax',
              item['message']))
  return found


def parse_pyrefly(output: str, sdk: Path) -> list[Finding]:
  """`pyrefly check --output-format=json`, run in sdk."""
  data = _json('pyrefly', output)
  if not isinstance(data, dict) or 'errors' not in data:
    raise Error(f'pyrefly printed no list of errors: {output.strip()[-300:]}')
  return [
      Finding(
          _in_sdk(item['path'], sdk),
          item['line'],
          item['name'],
          item['description']) for item in data['errors']
  ]


def parse_pylint(output: str) -> list[Finding]:
  """`pylint --output-format=json`."""
  return [
      Finding(item['path'], item['line'], item['symbol'], item['message'])
      for item in _json('pylint', output)
  ]


MYPY_ERROR = re.compile(
    r'^(.+?):(\d+):(?:\d+:)? error: (.*?)(?:  \[([\w-]+)\])?$')


def parse_mypy(output: str, files: Optional[list[str]] = None) -> list[Finding]:
  """mypy's text output (`--show-error-codes --no-error-summary`): the
  errors in files, or in every module it reports (with follow_imports, the
  files checked and the modules they import) if files is None."""
  findings = []
  for line in output.splitlines():
    match = MYPY_ERROR.match(line)
    if match and (files is None or match.group(1) in files):
      findings.append(
          Finding(
              match.group(1),
              int(match.group(2)),
              match.group(4) or 'error',
              match.group(3)))
  return findings
