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

"""A patch-set repository: where its files live, and the base it pins."""

import configparser
import dataclasses
import re
from pathlib import Path

from beampq import Error
from beampq import series

# The repository holding this package: <root>/scripts/beampq/project.py.
ROOT = Path(__file__).resolve().parent.parent.parent


@dataclasses.dataclass(frozen=True)
class Base:
  """The upstream release the queue applies to (``patches/base.cfg``)."""
  project: str
  version: str
  filename: str
  sha256: str
  subdir: str

  @classmethod
  def load(cls, path: Path) -> 'Base':
    parser = configparser.ConfigParser()
    if not parser.read(path):
      raise Error(f'{path} is missing')
    try:
      section = parser['base']
      base = cls(**{f.name: section[f.name] for f in dataclasses.fields(cls)})
    except KeyError as e:
      raise Error(f'{path}: missing {e.args[0]!r} in [base]') from None
    if not re.fullmatch(r'[0-9a-f]{64}', base.sha256):
      raise Error(f'{path}: sha256 {base.sha256!r} is not 64 hex digits')
    return base


class Project:
  """The paths of a patch-set repository (this one, or one made by a test).

  The words used throughout: the *base* is the pinned upstream release; the
  *tree* is build/beam, the queue imported as commits on the base; *new
  files* are the files the queue adds, kept under sdks/; an *sdk* folder is
  the Python SDK folder (base.subdir) of a tree or of the base.
  """
  def __init__(self, root: Path = ROOT):
    self.root = root.resolve()
    self.patches = self.root / 'patches'
    self.series_file = self.patches / 'series'
    self.pull_requests = self.patches / 'pull-requests'
    self.new_files = self.root / 'sdks'
    self.changes = self.root / 'CHANGES.md'
    self.build = self.root / 'build'
    self.tree = self.build / 'beam'
    self.cache = self.build / 'cache'
    # The base's files, extracted once for the gates' ratchets.
    self.base_files = self.build / 'base'
    self.base = Base.load(self.patches / 'base.cfg')

  def read_series(self) -> series.Series:
    if not self.series_file.exists():
      raise Error(f'{self.rel(self.series_file)} is missing')
    return series.parse(
        self.series_file.read_text(), where=self.rel(self.series_file))

  def description_file(self, pull_request: str) -> Path:
    return self.pull_requests / f'{pull_request}.md'

  def read_description(self, pull_request: str) -> series.Description:
    path = self.description_file(pull_request)
    if not path.is_file():
      raise Error(
          f'pull request {pull_request!r} has no description: '
          f'{self.rel(path)} is missing')
    return series.Description.parse(path.read_text(), self.rel(path))

  def rel(self, path: Path) -> str:
    try:
      return str(path.relative_to(self.root))
    except ValueError:
      return str(path)
