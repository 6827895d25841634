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

"""Check: patches/, sdks/, the series, the pull request descriptions,
CHANGES.md and build/beam agree, and a tree built from the queue refreshes
to the same files.
"""

import sys
import tempfile
from pathlib import Path

from beampq import Error
from beampq import changes
from beampq import git
from beampq import newfiles
from beampq import refresh
from beampq import series as series_model
from beampq import state
from beampq import tree
from beampq.project import Project


def _problems(project: Project, series: series_model.Series) -> list[str]:
  problems = []
  listed_new = set(series.new_files)
  for patch in series.patches:
    path = project.patches / patch.name
    if not path.is_file():
      problems.append(f'series names patches/{patch.name}, which is missing')
      continue
    problems.extend(newfiles.changes_to_unadded(series, patch, path))
  for path in sorted(project.patches.glob('*.patch')):
    if path.name not in {p.name for p in series.patches}:
      problems.append(f'patches/{path.name} is not in the series')
  on_disk = {
      project.rel(path)
      for path in project.new_files.rglob('*') if path.is_file()
  } if project.new_files.exists() else set()
  for path in sorted(listed_new - on_disk):
    problems.append(f'series lists {path}, which is missing')
  for path in sorted(on_disk - listed_new):
    problems.append(f'{path} is not listed in the series')
  names = {pr.name for pr in series.pull_requests}
  for pr in series.pull_requests:
    if not pr.patches:
      problems.append(f'pull request [{pr.name}] has no patches')
    try:
      project.read_description(pr.name)
    except Error as e:
      problems.append(str(e))
  if project.pull_requests.is_dir():
    for path in sorted(project.pull_requests.glob('*.md')):
      if path.stem not in names:
        problems.append(
            f'{project.rel(path)} describes a pull request that is not in '
            'the series')
  try:
    for entry in changes.read(project.changes):
      if entry.pull_request not in names:
        problems.append(
            f'CHANGES.md: an entry under "{entry.heading}" belongs to '
            f'pull request {entry.pull_request!r}, which is not in the '
            'series')
  except Error as e:
    problems.append(str(e))
  now = state.tree_state(project, series)
  if now.local_work:
    problems.append(
        f'{project.rel(project.tree)} has work that is not in patches/ '
        f'({"; ".join(now.local_work)}): '
        f'{refresh.how_to_keep(project, now)}')
  return problems


def _round_trip(project: Project, series: series_model.Series) -> list[str]:
  """Builds the queue and refreshes it into a scratch folder: the files
  must not change."""
  with tree.snapshot(project) as repo, tempfile.TemporaryDirectory() as scratch:
    base_commit = git.output('rev-parse', tree.BASE_TAG, cwd=repo)
    out = Path(scratch) / 'export'
    exported = refresh.write_patches(
        repo, base_commit, out, series, project.patches)
    problems = []
    if (out / 'patches' / 'series').read_bytes() != state.read_bytes(
        project.series_file):
      problems.append(
          'patches/series is stale: the tree exports it as ' +
          ', '.join(p.name for p in exported.patches))
    for patch in exported.patches:
      made = (out / 'patches' / patch.name).read_bytes()
      ours = project.patches / patch.name
      if ours.is_file() and ours.read_bytes() != made:
        problems.append(
            f'patches/{patch.name} is stale: a tree built from patches/ '
            'and sdks/ writes it back otherwise (after a hand edit of '
            'either, even of a file an earlier patch adds): run `python3 '
            '-m beampq tree` and `python3 -m beampq refresh`')
    return problems


def check(project: Project):
  """Fails when patches/, sdks/, the series, the pull request descriptions,
  CHANGES.md or build/beam disagree, or when a tree built from the queue
  does not refresh to the same files."""
  series = project.read_series()
  problems = _problems(project, series)
  if not problems:
    problems.extend(_round_trip(project, series))
  if problems:
    for problem in problems:
      print(f'beampq: check: {problem}', file=sys.stderr)
    raise Error(
        f'check found {len(problems)} '
        f'{"problem" if len(problems) == 1 else "problems"}')
  print(
      f'beampq: check: {len(series.pull_requests)} pull requests, '
      f'{len(series.patches)} patches and {len(series.new_files)} new files '
      'agree, and a tree built from them refreshes to the same files')
