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

"""build/beam from the queue: a git repository shaped like a Beam checkout,
the base (tag `base`) plus one commit per patch, each with the new files it
adds as it adds them (`newfiles.as_added`). `update` keeps build/beam
current and never discards local work unless forced; `snapshot` gives a
repository that holds the queue exactly, for the steps that read it.
"""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable
from typing import Iterator

from beampq import Error
from beampq import git
from beampq import newfiles
from beampq import sdist
from beampq import state
from beampq.project import Project

BASE_TAG = state.BASE_TAG
BRANCH = state.BRANCH
# Who commits a tree where git knows nobody (a CI machine): building one
# writes nothing in anyone's name, unlike export and apply.
TREE_COMMITTER = git.Identity('beampq', 'beampq@localhost.invalid')
# Build outputs that must not make the tree look edited.
TREE_EXCLUDES = [
    '__pycache__/',
    '*.pyc',
    '.pytest_cache/',
    '.mypy_cache/',
    '*.so',
    '*.c',
    '*.egg-info/',
    'build/',
    'pytest_*.xml',
    # What running the tests, coverage or a virtualenv in the tree leaves.
    '.coverage',
    '.coverage.*',
    '.hypothesis/',
    '.ruff_cache/',
    '.tox/',
    '.venv/',
]


def build(project: Project, dest: Path, quiet: bool = False) -> str:
  """Imports the queue into a new git repository at dest (which must not
  exist): the base commit, tagged `base`, then one commit per patch with its
  new files as that patch adds them (`as_added`). Returns HEAD.

  The commits are made by the user (git's identity, or TREE_COMMITTER where
  git knows nobody) and dated as what they hold: the base at its release's
  date, each patch at its own date, so a rebuild by the same user gives the
  same commits.
  """
  base = project.base
  tarball = sdist.fetch(project)
  series = project.read_series()
  new_content = newfiles.as_added(project, series)
  committer = git.identity('COMMITTER', project.root, fallback=TREE_COMMITTER)
  say: Callable[..., None] = (lambda *a: None) if quiet else print
  dest.mkdir(parents=True)
  git.run('init', '-q', '-b', BRANCH, cwd=dest)
  git.run('config', 'core.excludesFile', os.devnull, cwd=dest)
  (dest / '.git' / 'info').mkdir(exist_ok=True)
  (dest / '.git' / 'info' / 'exclude').write_text('\n'.join(TREE_EXCLUDES))
  released = f'@{sdist.extract(tarball, dest / base.subdir)} +0000'
  git.run('add', '-A', cwd=dest)
  git.run(
      'commit',
      '-q',
      '-m',
      f'{base.project} {base.version} sdist (the base)\n\n'
      f'{base.filename}, sha256 {base.sha256}, extracted into {base.subdir}.',
      cwd=dest,
      env={
          **committer.env('AUTHOR', released),
          **committer.env('COMMITTER', released)
      })
  git.run('tag', BASE_TAG, cwd=dest)
  base_commit = git.output('rev-parse', 'HEAD', cwd=dest)
  say(
      f'beampq: base {base.project} {base.version} -> '
      f'{base_commit[:12]} (tag {BASE_TAG})')
  for patch in series.patches:
    path = project.patches / patch.name
    label = f'patches/{patch.name}'
    if not path.is_file():
      raise Error(
          f'{project.rel(project.series_file)} names {label}, '
          'which does not exist')
    git.verify_applies_exactly(dest, path, label)
    applied = git.attempt(
        'am',
        '--quiet',
        '--keep-non-patch',
        '--empty=keep',
        '--committer-date-is-author-date',
        str(path),
        cwd=dest,
        env=committer.env('COMMITTER'))
    if applied.returncode != 0:
      git.attempt('am', '--abort', cwd=dest)
      raise Error(f'{label}: git am failed: {git.error_line(applied)}')
    for new_file in patch.new_files:
      target = dest / new_file
      if target.exists():
        raise Error(
            f'{new_file} is listed as a new file of {patch.name}, but '
            'the tree already has it')
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_bytes(new_content[new_file])
      # Forced: a new file may match TREE_EXCLUDES (a package named build).
      git.run('add', '--force', new_file, cwd=dest)
    if patch.new_files:
      authored = git.output('log', '-1', '--format=%aI', cwd=dest)
      git.run(
          'commit',
          '-q',
          '--amend',
          '--no-edit',
          cwd=dest,
          env=committer.env('COMMITTER', authored))
    head = git.output('rev-parse', 'HEAD', cwd=dest)
    count = len(patch.new_files)
    extra = f' + {count} new file{"s" * (count > 1)}' if count else ''
    say(f'beampq: applied {patch.name}{extra} -> {head[:12]}')
  head = git.output('rev-parse', 'HEAD', cwd=dest)
  state.write_stamp(
      dest,
      digest=state.inputs_digest(project, series),
      head=head,
      base=base_commit)
  return head


def update(
    project: Project, force: bool = False, local_work_ok: bool = False) -> Path:
  """Makes build/beam current, rebuilding it when patches/ changed; never
  discards local work unless forced.

  With local_work_ok (the gates), a tree with local work is used as it is,
  so that edits can be tested before they are refreshed into patches/.
  """
  tree = project.tree
  now = state.tree_state(project)
  if now.current:
    assert now.stamp is not None
    print(
        f'beampq: {project.rel(tree)} is up to date '
        f'(HEAD {now.stamp["head"][:12]})')
    return tree
  if now.local_work and local_work_ok:
    print(
        f'beampq: using {project.rel(tree)} with work not in patches/ '
        f'({"; ".join(now.local_work)})')
    return tree
  if now.local_work and not force:
    assert now.stamp is not None
    work = (
        f'{project.rel(tree)} has work that is not in patches/ '
        f'({"; ".join(now.local_work)})')
    if now.inputs_changed:
      work += ', and patches/ or sdks/ changed since it was built'
    # Imported here: refresh builds on this module.
    from beampq import refresh
    keep = f'{refresh.how_to_keep(project, now)} to keep it'
    raise Error(
        f'{work}: {keep}; or run `python3 -m beampq tree --force` to '
        'discard it')
  if now.stamp is None and tree.exists() and not force:
    raise Error(
        f'{project.rel(tree)} was not built by beampq (it has no '
        f'.git/{state.STAMP}), so its work cannot be told apart: move it '
        'away, or run `python3 -m beampq tree --force` to replace it')
  # main's own commits are local work (see tree_state), not side work.
  side = git.side_work(
      tree, own_tags=(BASE_TAG, ),
      own_branches=(BRANCH, )) if (tree / '.git').is_dir() else []
  if side and not force:
    raise Error(
        f'{project.rel(tree)} has {" and ".join(side)}, which a rebuild '
        'would discard: apply or move them elsewhere, or run `python3 -m '
        'beampq tree --force` to discard them')
  project.build.mkdir(parents=True, exist_ok=True)
  scratch = Path(tempfile.mkdtemp(prefix='.beam-', dir=project.build))
  try:
    build(project, scratch / 'beam')
    _carry_over(now.other_files, tree, scratch / 'beam', force)
    if tree.exists():
      tree.rename(scratch / 'old')
    (scratch / 'beam').rename(tree)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  print(f'beampq: patched tree at {tree}')
  return tree


def _carry_over(paths: list[str], old: Path, new: Path, force: bool):
  """Moves the untracked files and folders outside sdks/ (an editor's
  settings) from the old tree into the new one. Raises, unless force, when
  the new tree has one of them already: the old tree is then kept."""
  taken = [path for path in paths if os.path.lexists(new / path)]
  if taken and not force:
    raise Error(
        f'the rebuilt tree has files of its own where {old} has untracked '
        f'ones ({", ".join(taken)}): move them elsewhere, or run `python3 '
        '-m beampq tree --force` to discard them')
  for path in paths:
    source, target = old / path, new / path
    if path in taken or not os.path.lexists(source):
      continue
    target.parent.mkdir(parents=True, exist_ok=True)
    source.rename(target)


@contextlib.contextmanager
def snapshot(project: Project) -> Iterator[Path]:
  """Yields a repository holding the queue exactly as patches/ and sdks/
  do: build/beam when it is current, else a temporary build (build/beam is
  left alone)."""
  now = state.tree_state(project)
  if now.current:
    yield project.tree
    return
  if now.local_work:
    print(
        f'beampq: {project.rel(project.tree)} has work not in patches/ '
        f'({now.local_work[0]}); using patches/ (refresh first to use it)')
  project.build.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=project.build) as scratch:
    repo = Path(scratch) / 'beam'
    build(project, repo, quiet=True)
    yield repo
