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

"""The files the queue adds. Each commit carries exactly its own change: a
file the queue adds is kept once, in sdks/, as it stands at the end of the
series; the patch file of the commit that adds it holds the commit's message
and its other diffs, not the file. A later patch that changes such a file
holds that change as an ordinary diff, and the commit that adds the file
holds it as it was added: a build reconstructs that content by undoing the
later patches' diffs of the file from sdks/, newest first, exactly
(`as_added`).
"""

import tempfile
from pathlib import Path

from beampq import Error
from beampq import git
from beampq import series as series_model
from beampq.project import Project


def changes_to_unadded(
    series: series_model.Series, patch: series_model.Patch,
    path: Path) -> list[str]:
  """What is wrong with the diffs a patch makes to new files of the series:
  only a patch after the one that adds a file may change it."""
  problems = []
  adders = {
      new_file: earlier.name
      for earlier in series.patches
      for new_file in earlier.new_files
  }
  earlier_files = set()
  for earlier in series.patches:
    if earlier.name == patch.name:
      break
    earlier_files.update(earlier.new_files)
  for changed in git.patched_paths(path.read_text()):
    if changed in adders and changed not in earlier_files:
      where = (
          'it adds'
          if adders[changed] == patch.name else f'{adders[changed]} adds later')
      problems.append(
          f'patches/{patch.name} changes {changed}, which {where}: a patch '
          'holds no diff of a file it adds (the file lives in sdks/), and '
          'only the patches after it may change it')
  return problems


def as_added(project: Project, series: series_model.Series) -> dict[str, bytes]:
  """The content of every new file of the series as the patch that adds it
  adds it: sdks/ holds the file as it stands at the end of the series, and
  the diffs that later patches make to it are undone, newest first, each
  exactly (no fuzz, no offsets)."""
  adder: dict[str, str] = {}
  changes_to_new: list[tuple[Path, list[str]]] = []
  for patch in series.patches:
    path = project.patches / patch.name
    if not path.is_file():
      raise Error(
          f'{project.rel(project.series_file)} names patches/{patch.name}, '
          'which does not exist')
    problem = next(iter(changes_to_unadded(series, patch, path)), None)
    if problem:
      raise Error(problem)
    changes_to_new.append(
        (path, [p for p in git.patched_paths(path.read_text()) if p in adder]))
    for new_file in patch.new_files:
      if not (project.root / new_file).is_file():
        raise Error(
            f'{project.rel(project.series_file)} lists {new_file} under '
            f'{patch.name}, but {new_file} does not exist')
      adder[new_file] = patch.name
  content = {
      new_file: (project.root / new_file).read_bytes()
      for new_file in adder
  }
  if not any(changed for _, changed in changes_to_new):
    return content
  with tempfile.TemporaryDirectory() as scratch:
    work = Path(scratch)
    git.run('init', '-q', cwd=work)
    for new_file in {p for _, changed in changes_to_new for p in changed}:
      (work / new_file).parent.mkdir(parents=True, exist_ok=True)
      (work / new_file).write_bytes(content[new_file])
    for path, changed in reversed(changes_to_new):
      if not changed:
        continue
      options = ('-R', *(f'--include={p}' for p in changed))
      try:
        git.verify_applies_exactly(
            work,
            path,
            f'patches/{path.name}, undone from {", ".join(changed)} (sdks/ '
            'holds each new file as the last patch that changes it leaves '
            'it),',
            options)
      except Error as e:
        raise Error(
            f'{e}. If sdks/ was edited by hand, undo that (`git checkout '
            '-- sdks/`) and make the edit in build/beam, then refresh') from e
      git.run('apply', *options, str(path), cwd=work)
    for new_file in {p for _, changed in changes_to_new for p in changed}:
      content[new_file] = (work / new_file).read_bytes()
  return content
