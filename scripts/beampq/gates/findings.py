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

from beampq import Error


@dataclasses.dataclass(frozen=True)
class Finding:
  """One problem a tool reports: where, its code, and its message."""
  path: str
  line: int
  code: str
  message: str

  def key(self):
    """What identifies the finding across the base and the patched tree:
    line numbers move when a patch adds lines above, so they are left out."""
    return (self.path, self.code, re.sub(r'\(line \d+\)', '', self.message))

  def __str__(self):
    return f'{self.path}:{self.line}: {self.code} {self.message}'


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


def parse_ruff(output: str, sdk: Path) -> list[Finding]:
  """`ruff check --output-format=json`, run in sdk."""
  return [
      Finding(
          _in_sdk(item['filename'], sdk),
          item['location']['row'],
          item['code'] or 'syntax',
          item['message']) for item in _json('ruff', output)
  ]


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


def parse_mypy(output: str, files: list[str]) -> list[Finding]:
  """mypy's text output (`--show-error-codes --no-error-summary`), keeping
  the errors in files (mypy also reports the modules they import)."""
  findings = []
  for line in output.splitlines():
    match = MYPY_ERROR.match(line)
    if match and match.group(1) in files:
      findings.append(
          Finding(
              match.group(1),
              int(match.group(2)),
              match.group(4) or 'error',
              match.group(3)))
  return findings
