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

"""The series: which upstream pull requests the queue holds, in order, and
the patches and new files of each. The data model alone, with its file
format; nothing here touches git or a tree.

The file (``patches/series``) reads::

  [max-batch-weight]
  0001-Fix-one-thing.patch
  [prefix-batching]
  0002-Add-a-module.patch
    + sdks/python/apache_beam/new_module.py

A ``[name]`` line starts the patches of one pull request, described (title,
then description) in ``patches/pull-requests/<name>.md``. Each patch line is
a file in ``patches/``; the indented ``+ path`` lines under it name the new
files its commit adds, kept at their upstream paths under ``sdks/`` as they
stand at the end of the series. A later patch may change such a file: its
patch file holds that change as a diff.
"""

import collections
import dataclasses
import re
from pathlib import Path
from typing import Iterable
from typing import Optional

from beampq import Error

HEADER = """\
# The patch queue, applied in order to the base in base.cfg.
# "[name]" starts the patches of one upstream pull request, described in
# pull-requests/<name>.md. One patch file per line; the indented "+ path"
# lines under a patch name the new files (kept under sdks/) that the
# patch's commit adds. Written by `beampq refresh`, which keeps each patch
# in its pull request (and no comment but this one); move or add "[name]"
# lines by hand.
"""
NAME = re.compile(r'[a-z0-9][a-z0-9.-]*')


@dataclasses.dataclass
class Patch:
  """One patch of the series and the new files its commit adds."""
  name: str
  new_files: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class PullRequest:
  """One upstream pull request: its name and its patches, in order."""
  name: str
  patches: list[Patch] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Series:
  """The pull requests of the queue, in the order they apply."""
  pull_requests: list[PullRequest] = dataclasses.field(default_factory=list)

  @property
  def patches(self) -> list[Patch]:
    return [patch for pr in self.pull_requests for patch in pr.patches]

  @property
  def new_files(self) -> list[str]:
    return [path for patch in self.patches for path in patch.new_files]

  def pull_request_of(self, patch_name: str) -> Optional[str]:
    for pr in self.pull_requests:
      if any(patch.name == patch_name for patch in pr.patches):
        return pr.name
    return None

  def get(self, name: str) -> PullRequest:
    for pr in self.pull_requests:
      if pr.name == name:
        return pr
    raise Error(
        f'no pull request {name!r} in the series; it has '
        f'{", ".join(pr.name for pr in self.pull_requests) or "none"}')


def parse(text: str, where: str = 'series') -> Series:
  series = Series()
  for lineno, raw in enumerate(text.splitlines(), 1):
    line = raw.split('#', 1)[0].rstrip()
    if not line.strip():
      continue
    if raw[0].isspace():
      item = line.strip()
      if not item.startswith('+ ') or not series.patches:
        raise Error(
            f'{where}:{lineno}: expected "+ <new file>" under a patch, '
            f'got {item!r}')
      path = item[2:].strip()
      if (not path.startswith('sdks/') or '..' in Path(path).parts or
          Path(path).is_absolute()):
        raise Error(f'{where}:{lineno}: new file {path!r} is not under sdks/')
      series.pull_requests[-1].patches[-1].new_files.append(path)
    elif line.startswith('['):
      name = line[1:-1] if line.endswith(']') else ''
      if not NAME.fullmatch(name):
        raise Error(
            f'{where}:{lineno}: {line!r} is not a pull request line '
            '("[name]", lower case letters, digits, "-" and ".")')
      series.pull_requests.append(PullRequest(name))
    else:
      if '/' in line or not line.endswith('.patch'):
        raise Error(f'{where}:{lineno}: {line!r} is not a patch file name')
      if not series.pull_requests:
        raise Error(
            f'{where}:{lineno}: {line} comes before any "[name]" line; '
            'every patch belongs to a pull request')
      series.pull_requests[-1].patches.append(Patch(line))
  names = ([pr.name for pr in series.pull_requests] +
           [p.name for p in series.patches] + series.new_files)
  duplicates = sorted(
      name for name, count in collections.Counter(names).items() if count > 1)
  if duplicates:
    raise Error(f'{where}: {duplicates[0]} is listed more than once')
  return series


def to_text(series: Series) -> str:
  lines = [HEADER.rstrip('\n')]
  for pr in series.pull_requests:
    lines.append(f'[{pr.name}]')
    for patch in pr.patches:
      lines.append(patch.name)
      lines.extend(f'  + {path}' for path in patch.new_files)
  return '\n'.join(lines) + '\n'


def group(
    patches: Iterable[Patch], pull_request_names: Iterable[str]) -> Series:
  """A series of patches, each in the pull request named beside it. The
  patches of a pull request must be next to each other."""
  series = Series()
  for patch, name in zip(patches, pull_request_names):
    if not series.pull_requests or series.pull_requests[-1].name != name:
      if any(pr.name == name for pr in series.pull_requests):
        raise Error(
            f'{patch.name} belongs to pull request [{name}], whose patches '
            f'come before those of [{series.pull_requests[-1].name}]: keep '
            'the commits of a pull request together (git rebase -i base), '
            'or move the "[name]" lines of patches/series')
      series.pull_requests.append(PullRequest(name))
    series.pull_requests[-1].patches.append(patch)
  return series


# Whole-line HTML comments: the markers of generated figures (see
# bench/blocks.py) and notes to this repository's maintainers.
_COMMENT_LINE = re.compile(r'^<!--.*?-->\n?', re.M)


@dataclasses.dataclass(frozen=True)
class Description:
  """A pull request's title and description, as a reviewer reads them."""
  title: str
  body: str

  @classmethod
  def parse(cls, text: str, where: str) -> 'Description':
    title, _, body = text.partition('\n')
    if not title.startswith('# ') or not title[2:].strip():
      raise Error(f'{where}: the first line is not "# <title>"')
    if not body.strip():
      raise Error(f'{where}: there is no description under the title')
    return cls(title[2:].strip(), body.strip())

  def reviewer_body(self) -> str:
    """The body without its whole-line HTML comments (the markers of
    generated figures, see bench/blocks.py), which only this repository
    needs and which a commit message would show as they are."""
    return _COMMENT_LINE.sub('', self.body).strip()

  def markdown(self) -> str:
    return f'# {self.title}\n\n{self.reviewer_body()}\n'

  def commit_message(self) -> str:
    return f'{self.title}\n\n{self.reviewer_body()}\n'
