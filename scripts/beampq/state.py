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

"""Whether build/beam is current: built from exactly what patches/ holds,
with nothing changed since. One question has one answer here: `tree_state`,
and everything that needs to know asks it.

A build or a refresh leaves a stamp in the tree's .git: the digest of the
inputs it was built from (`inputs_digest`), its HEAD and its base commit.
"""

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Optional

from beampq import git
from beampq import series as series_model
from beampq.project import Project

# Bump when the way a tree is built changes, so existing trees are rebuilt.
TREE_FORMAT = '3'
STAMP = 'beampq.json'
# The tag of the base commit in every tree (`git rebase -i base`), and the
# branch that tree builds the queue on and refresh writes back.
BASE_TAG = 'base'
BRANCH = 'main'


def read_bytes(path: Path) -> bytes:
  """A file's content, or a marker no file holds when it is missing."""
  return path.read_bytes() if path.is_file() else b'\0missing'


def inputs_digest(project: Project, series: series_model.Series) -> str:
  """A digest of everything a tree is built from. The pull request lines of
  the series are not part of it: they do not change the tree."""
  digest = hashlib.sha256()

  def add(label: str, data: bytes):
    digest.update(f'{label}\0{len(data)}\0'.encode())
    digest.update(data)

  add('format', TREE_FORMAT.encode())
  base = project.base
  add(
      'base',
      f'{base.project} {base.version} {base.filename} {base.sha256} '
      f'{base.subdir}'.encode())
  for patch in series.patches:
    add(patch.name, read_bytes(project.patches / patch.name))
    for path in patch.new_files:
      add(path, read_bytes(project.root / path))
  return digest.hexdigest()


def write_stamp(tree: Path, **state: str):
  """Records what the tree was built or refreshed from (digest, head,
  base)."""
  (tree / '.git' / STAMP).write_text(json.dumps(state, indent=1) + '\n')


def _read_stamp(tree: Path) -> Optional[dict[str, str]]:
  stamp = tree / '.git' / STAMP
  if not stamp.is_file():
    return None
  try:
    return json.loads(stamp.read_text())
  except ValueError:
    return None


@dataclasses.dataclass(frozen=True)
class TreeState:
  """What build/beam holds compared with patches/."""
  # The stamp a build or refresh left; None when there is no tree built by
  # beampq.
  stamp: Optional[dict[str, str]]
  # What the developer changed since the last build or refresh: a moved
  # HEAD, uncommitted changes a patch could hold (see `patch_changes`).
  local_work: list[str]
  # Built from exactly what patches/ holds now, and nothing changed since.
  current: bool
  # Untracked files no patch can hold (an editor's settings): a refresh
  # leaves them, a rebuild would discard them.
  other_files: list[str] = dataclasses.field(default_factory=list)
  # The uncommitted changes a patch could hold (see `patch_changes`).
  uncommitted: list[str] = dataclasses.field(default_factory=list)
  # Whether patches/ or sdks/ changed since the build or refresh.
  inputs_changed: bool = False

  @property
  def base_commit(self) -> str:
    assert self.stamp is not None
    return self.stamp['base']


def carry_over_hint(project: Project, now: TreeState) -> str:
  """How to keep build/beam's local work over a rebuild, when patches/
  changed under it (a pull) and a refresh would undo that change."""
  tree = project.tree
  assert now.stamp is not None
  if now.uncommitted:
    return (
        'commit your changes in it first, then run `python3 -m beampq tree` '
        'again for how to carry them over')
  built = now.stamp['head']
  head = git.output('rev-parse', 'HEAD', cwd=tree)
  if git.attempt('merge-base', '--is-ancestor', built, head,
                 cwd=tree).returncode != 0:
    saved = project.build / f'rewritten-{built[:12]}-{head[:12]}'
    base = now.base_commit[:12]
    return (
        'its commits rewrite patches (an amend or a rebase) that changed '
        'under them, so they cannot be replayed: save them (`git -C '
        f'{tree} format-patch -k -o {saved} {base}..{head[:12]}`; `git -C '
        f'{tree} range-diff {base} {built[:12]} {head[:12]}` shows what each '
        'changed, messages too), run `python3 -m beampq tree --force`, and '
        'make those changes again on the rebuilt commits')
  carried = project.build / f'carried-{built[:12]}-{head[:12]}'
  return (
      f'to carry its commits over a rebuild, run `git -C {tree} '
      f'format-patch -k -o {carried} {built[:12]}..{head[:12]}`, `python3 -m '
      f'beampq tree --force` and `git -C {tree} am -k {carried}/*.patch`, '
      'then `python3 -m beampq refresh`')


def _commit_of(tree: Path, ref: str) -> Optional[str]:
  """The commit ref names in tree, or None when there is no such ref."""
  found = git.attempt(
      'rev-parse', '--verify', '-q', f'{ref}^{{commit}}', cwd=tree)
  return found.stdout.strip() if found.returncode == 0 else None


def patch_changes(status_lines: list[str]) -> list[str]:
  """The `git status --porcelain` lines that a patch could hold: changes to
  tracked files, and untracked files under sdks/, where patches add theirs.
  """
  return [
      line for line in status_lines
      if not line.startswith('?? ') or line[3:].startswith('sdks/')
  ]


def tree_state(
    project: Project,
    series: Optional[series_model.Series] = None) -> TreeState:
  """Whether build/beam is current, and what local work it has."""
  tree = project.tree
  stamp = _read_stamp(tree) if tree.is_dir() else None
  if stamp is None:
    return TreeState(None, [], False)
  local_work = []
  head = git.output('rev-parse', 'HEAD', cwd=tree)
  if head != stamp.get('head'):
    local_work.append(f'HEAD moved to {head[:12]}')
  # Work HEAD does not show: main's own commits behind a detached HEAD, and
  # a base tag moved off the base the queue was built on, which the steps
  # that read the tree would take for the base.
  main = _commit_of(tree, f'refs/heads/{BRANCH}')
  if main is not None and main not in (head, stamp.get('head')):
    local_work.append(f'{BRANCH} moved to {main[:12]}')
  base = _commit_of(tree, f'refs/tags/{BASE_TAG}')
  if base != stamp.get('base'):
    moved = f'moved to {base[:12]}' if base else 'deleted'
    local_work.append(f'tag {BASE_TAG} {moved}')
  status = git.dirty_paths(tree)
  dirty = patch_changes(status)
  if dirty:
    changes = 'change' if len(dirty) == 1 else 'changes'
    local_work.append(
        f'{len(dirty)} uncommitted {changes} ({dirty[0].strip()})')
  inputs_changed = stamp.get('digest') != inputs_digest(
      project, series or project.read_series())
  return TreeState(
      stamp,
      local_work,
      not inputs_changed and not local_work,
      [line[3:] for line in status if line not in dirty],
      dirty,
      inputs_changed)
