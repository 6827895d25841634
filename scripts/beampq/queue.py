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

"""The queue as commits: import it into a git repository (build/beam),
refresh patches/ from that repository's commits, and check that the two
agree. The reusable queue operations, like gbp's common/pq.py.

Each commit carries exactly its own change. A file the queue adds is kept
once, in sdks/, as it stands at the end of the series; the patch file of the
commit that adds it holds the commit's message and its other diffs, not the
file. A later patch that changes such a file holds that change as an
ordinary diff, and the commit that adds the file holds it as it was added: a
build reconstructs that content by undoing the later patches' diffs of the
file from sdks/, newest first, exactly (`as_added`).

One question has one answer here: whether build/beam is *current* (built
from exactly what patches/ holds, with nothing changed since) is
`tree_state`, and everything that needs to know asks it.
"""

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable
from typing import Iterator
from typing import Optional

from beampq import Error
from beampq import changes
from beampq import git
from beampq import sdist
from beampq import series as series_model
from beampq.project import Project

# Bump when the way a tree is built changes, so existing trees are rebuilt.
TREE_FORMAT = '3'
# The tag of the base commit in every tree: `git rebase -i base`.
BASE_TAG = 'base'
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
    'pytest_*.xml'
]
STAMP = 'beampq.json'


def _read_bytes(path: Path) -> bytes:
  return path.read_bytes() if path.is_file() else b'\0missing'


def inputs_digest(project: Project, series: series_model.Series) -> str:
  """A digest of everything a tree is built from. The pull request lines of
  the series are not part of it: they do not change the tree."""
  digest = hashlib.sha256()

  def add(label: str, data: bytes):
    digest.update(f'{label}\0{len(data)}\0'.encode())
    digest.update(data)

  add('format', TREE_FORMAT.encode())
  add('base', f'{project.base.sha256} {project.base.subdir}'.encode())
  for patch in series.patches:
    add(patch.name, _read_bytes(project.patches / patch.name))
    for path in patch.new_files:
      add(path, _read_bytes(project.root / path))
  return digest.hexdigest()


def _write_stamp(tree: Path, **state: str):
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
  # HEAD, uncommitted changes.
  local_work: list[str]
  # Built from exactly what patches/ holds now, and nothing changed since.
  current: bool

  @property
  def base_commit(self) -> str:
    assert self.stamp is not None
    return self.stamp['base']


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
  dirty = git.dirty_paths(tree)
  if dirty:
    local_work.append(f'{len(dirty)} uncommitted changes ({dirty[0].strip()})')
  digest = inputs_digest(project, series or project.read_series())
  return TreeState(
      stamp, local_work, stamp.get('digest') == digest and not local_work)


def _verify_applies_exactly(
    repo: Path, patch: Path, label: str, options: tuple[str, ...] = ()):
  """Fails unless the patch applies exactly (with git apply's options, such
  as -R): no fuzz, no offsets."""
  if '\ndiff --git ' not in patch.read_text():
    return  # Only new files, which travel in sdks/: nothing to apply.
  result = git.attempt(
      'apply', '--check', '--verbose', *options, str(patch), cwd=repo)
  output = result.stdout + result.stderr
  if result.returncode != 0:
    failed = re.search(r'error: patch failed: (\S+):(\d+)', output)
    missing = re.search(r'error: (\S+): (does not exist|No such file)', output)
    if failed:
      where = f'{failed.group(1)} (hunk at line {failed.group(2)})'
    elif missing:
      where = f'{missing.group(1)} (no such file)'
    else:
      where = output.strip().splitlines()[-1] if output.strip() else '?'
    raise Error(f'{label} does not apply: {where}')
  moved = re.search(r'Hunk #(\d+) succeeded at (\d+) \((offset|fuzz)', output)
  if moved:
    current = re.findall(
        r'^Checking patch (\S+)\.\.\.', output[:moved.start()], re.M)
    raise Error(
        f'{label} applies only with an {moved.group(3)}: '
        f'{current[-1] if current else "?"} hunk #{moved.group(1)} lands at '
        f'line {moved.group(2)}')


def _patched_paths(patch: Path) -> list[str]:
  return re.findall(r'^diff --git a/(\S+) b/', patch.read_text(), re.M)


def _changes_to_unadded(
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
  for changed in _patched_paths(path):
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
    problem = next(iter(_changes_to_unadded(series, patch, path)), None)
    if problem:
      raise Error(problem)
    changes_to_new.append(
        (path, [p for p in _patched_paths(path) if p in adder]))
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
      _verify_applies_exactly(
          work,
          path,
          f'patches/{path.name}, undone from {", ".join(changed)} (sdks/ '
          'holds each new file as the last patch that changes it leaves it),',
          options)
      git.run('apply', *options, str(path), cwd=work)
    for new_file in {p for _, changed in changes_to_new for p in changed}:
      content[new_file] = (work / new_file).read_bytes()
  return content


def build(project: Project, dest: Path, quiet: bool = False) -> str:
  """Imports the queue into a new git repository at dest (which must not
  exist): the base commit, tagged `base`, then one commit per patch with its
  new files as that patch adds them (`as_added`). Returns HEAD.

  The commits are made by the user (git's identity) and dated as what they
  hold: the base at its release's date, each patch at its own date, so a
  rebuild by the same user gives the same commits.
  """
  base = project.base
  tarball = sdist.fetch(project)
  series = project.read_series()
  new_content = as_added(project, series)
  committer = git.identity('COMMITTER', project.root)
  say: Callable[..., None] = (lambda *a: None) if quiet else print
  dest.mkdir(parents=True)
  git.run('init', '-q', '-b', 'main', cwd=dest)
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
    _verify_applies_exactly(dest, path, label)
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
      raise Error(
          f'{label} does not apply: git am failed: '
          f'{applied.stderr.strip().splitlines()[-1:]}')
    for new_file in patch.new_files:
      target = dest / new_file
      if target.exists():
        raise Error(
            f'{new_file} is listed as a new file of {patch.name}, but '
            'the tree already has it')
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_bytes(new_content[new_file])
      git.run('add', new_file, cwd=dest)
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
    extra = f' + {len(patch.new_files)} new files' if patch.new_files else ''
    say(f'beampq: applied {patch.name}{extra} -> {head[:12]}')
  head = git.output('rev-parse', 'HEAD', cwd=dest)
  _write_stamp(
      dest, digest=inputs_digest(project, series), head=head, base=base_commit)
  return head


def update(
    project: Project, force: bool = False, local_work_ok: bool = False) -> Path:
  """Makes build/beam current, rebuilding it when patches/ changed; never
  discards local work unless forced.

  With local_work_ok (the gates), a tree with local work is used as it is,
  so that edits can be tested before they are refreshed into patches/.
  """
  tree = project.tree
  state = tree_state(project)
  if state.current:
    assert state.stamp is not None
    print(
        f'beampq: {project.rel(tree)} is up to date '
        f'(HEAD {state.stamp["head"][:12]})')
    return tree
  if state.local_work and local_work_ok:
    print(
        f'beampq: using {project.rel(tree)} with work not in patches/ '
        f'({"; ".join(state.local_work)})')
    return tree
  if state.local_work and not force:
    raise Error(
        f'{project.rel(tree)} has work that is not in patches/ '
        f'({"; ".join(state.local_work)}): run `beampq refresh` to keep it '
        'or `beampq tree --force` to discard it')
  project.build.mkdir(parents=True, exist_ok=True)
  scratch = Path(tempfile.mkdtemp(prefix='.beam-', dir=project.build))
  try:
    build(project, scratch / 'beam')
    if tree.exists():
      tree.rename(scratch / 'old')
    (scratch / 'beam').rename(tree)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  print(f'beampq: patched tree at {tree}')
  return tree


@contextlib.contextmanager
def snapshot(project: Project) -> Iterator[Path]:
  """Yields a repository holding the queue exactly as patches/ and sdks/
  do: build/beam when it is current, else a temporary build (build/beam is
  left alone)."""
  if tree_state(project).current:
    yield project.tree
    return
  project.build.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=project.build) as scratch:
    repo = Path(scratch) / 'beam'
    build(project, repo, quiet=True)
    yield repo


# --------------------------------------------------------------------------
# Refresh: the commits of a tree back to patches, new files and the series.


def _format_patch(
    repo: Path, commit: str, number: int, out: Path, paths: list[str]) -> Path:
  git.run(
      'format-patch',
      '-1',
      commit,
      '--quiet',
      '--zero-commit',
      '--no-signature',
      '--full-index',
      f'--start-number={number}',
      '-o',
      str(out),
      '--',
      *paths,
      cwd=repo)
  made = sorted(out.glob(f'{number:04d}-*.patch'))
  if len(made) != 1:
    raise Error(f'git format-patch wrote {len(made)} files for {commit[:12]}')
  return made[0]


class _PullRequestFinder:
  """Which pull request a commit belongs to, from the series it was built
  from: the pull request of the patch with the same subject, else of the
  patch with the same diff (a reworded commit), else of the commit before
  it (a new commit joins the pull request it follows)."""
  def __init__(self, previous: series_model.Series, patches_dir: Path):
    if not previous.pull_requests:
      raise Error(
          'the series names no pull request: add a "[name]" line to '
          'patches/series for the commits to belong to')
    self.first = previous.pull_requests[0].name
    self.by_subject: dict[str, str] = {}
    self.by_diff: dict[str, str] = {}
    for pr in previous.pull_requests:
      for patch in pr.patches:
        path = patches_dir / patch.name
        if not path.is_file():
          continue
        text = path.read_text()
        self.by_subject.setdefault(git.patch_subject(text), pr.name)
        diff = git.patch_id(text)
        if diff:
          self.by_diff.setdefault(diff, pr.name)
    self.last: Optional[str] = None

  def __call__(self, subject: str, patch_text: str) -> str:
    found = self.by_subject.get(subject)
    if found is None:
      diff = git.patch_id(patch_text)
      found = self.by_diff.get(diff) if diff else None
    self.last = found or self.last or self.first
    return self.last


def write_patches(
    repo: Path,
    base_commit: str,
    out: Path,
    previous: series_model.Series,
    patches_dir: Path) -> series_model.Series:
  """Writes the commits base..HEAD of repo as out/patches/*.patch, their new
  files under out/sdks/ (as HEAD has them) and out/patches/series; each patch
  keeps the pull request it had in previous (whose files are in
  patches_dir). A patch holds its diffs to upstream files and to files that
  earlier commits add, not the files it adds itself."""
  if git.attempt('merge-base', '--is-ancestor', base_commit, 'HEAD',
                 cwd=repo).returncode != 0:
    raise Error(f'{repo} HEAD does not descend from the base')
  if git.output('rev-list', '--merges', f'{base_commit}..HEAD', cwd=repo):
    raise Error(f'{repo} has merge commits; the queue must be linear')
  pull_request_of = _PullRequestFinder(previous, patches_dir)
  upstream = set(
      git.output('ls-tree', '-r', '--name-only', base_commit,
                 cwd=repo).split('\n'))
  (out / 'patches').mkdir(parents=True)
  owner: dict[str, str] = {}
  patches = []
  names = []
  for number, commit in enumerate(git.commits_since(repo, base_commit), 1):
    subject = git.output('log', '-1', '--format=%s', commit, cwd=repo)
    fields = git.output(
        'diff-tree',
        '-r',
        '-z',
        '--no-renames',
        '--no-commit-id',
        '--name-status',
        f'{commit}^',
        commit,
        cwd=repo).split('\0')
    changed = list(zip(fields[0::2], fields[1::2]))
    added = []
    for status, path in changed:
      if path in upstream:
        continue
      if path in owner:
        if status != 'M':
          raise Error(
              f'"{subject}" deletes {path}, which "{owner[path]}" adds: '
              'take it out of the commit that adds it instead '
              f'(git rebase -i {BASE_TAG})')
        continue
      if status != 'A' or not path.startswith('sdks/'):
        raise Error(f'"{subject}" adds {path}; new files must be under sdks/')
      owner[path] = subject
      added.append(path)
    modified = [path for _, path in changed if path not in added]
    if not changed:
      raise Error(f'"{subject}" changes nothing; drop it')
    patch = _format_patch(
        repo, commit, number, out / 'patches', modified or added)
    text = patch.read_text()
    if not modified:
      # Only new files: keep the message, the files travel in sdks/. Cut
      # before the diffstat too, so that git am keeps an empty commit.
      end = text.rindex('\n---\n', 0, text.index('\ndiff --git '))
      text = text[:end + 1]
      patch.write_text(text)
    patches.append(series_model.Patch(patch.name, added))
    names.append(pull_request_of(subject, text))
  for path in owner:
    target = out / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(git.binary_output('show', f'HEAD:{path}', cwd=repo))
  series = series_model.group(patches, names)
  (out / 'patches' / 'series').write_text(series_model.to_text(series))
  return series


def refresh(project: Project):
  """Writes patches/, sdks/ and the series from build/beam's commits, made
  the user's: every commit gets git's identity as its author (keeping its
  date), so the patches carry the name of whoever refreshed them."""
  tree = project.tree
  state = tree_state(project)
  if state.stamp is None:
    raise Error(
        f'{project.rel(tree)} is not a tree built by beampq; '
        'run `beampq tree` first')
  in_progress = git.operation_in_progress(tree)
  if in_progress:
    raise Error(
        f'a {in_progress} is in progress in {project.rel(tree)}; '
        'finish or abort it first')
  dirty = git.dirty_paths(tree)
  if dirty:
    raise Error(
        f'{project.rel(tree)} has uncommitted changes '
        f'({dirty[0].strip()}, ...): commit them first')
  author = git.identity('AUTHOR', project.root)
  rewritten = git.set_author(
      tree, state.base_commit, author, git.identity('COMMITTER', project.root))
  if rewritten:
    print(f'beampq: {rewritten} commits now have the author {author}')
  previous = project.read_series()
  with tempfile.TemporaryDirectory(dir=project.build) as scratch:
    out = Path(scratch)
    series = write_patches(
        tree, state.base_commit, out, previous, project.patches)
    head = git.output('rev-parse', 'HEAD', cwd=tree)
    for old in project.patches.glob('*.patch'):
      old.unlink()
    for patch in (out / 'patches').iterdir():
      shutil.copyfile(patch, project.patches / patch.name)
    if project.new_files.exists():
      shutil.rmtree(project.new_files)
    if (out / 'sdks').exists():
      shutil.copytree(out / 'sdks', project.new_files)
  _write_stamp(
      tree,
      digest=inputs_digest(project, series),
      head=head,
      base=state.base_commit)
  for pr in series.pull_requests:
    print(f'beampq: [{pr.name}]')
    for patch in pr.patches:
      extra = f' (+ {len(patch.new_files)} new files)' if patch.new_files else ''
      print(f'beampq:   wrote patches/{patch.name}{extra}')
  print(
      f'beampq: refreshed {len(series.patches)} patches in '
      f'{len(series.pull_requests)} pull requests and '
      f'{len(series.new_files)} new files from {project.rel(tree)}')


# --------------------------------------------------------------------------
# Check: patches/, sdks/, the series, the descriptions and the tree agree.


def _problems(project: Project, series: series_model.Series) -> list[str]:
  problems = []
  listed_new = set(series.new_files)
  for patch in series.patches:
    path = project.patches / patch.name
    if not path.is_file():
      problems.append(f'series names patches/{patch.name}, which is missing')
      continue
    problems.extend(_changes_to_unadded(series, patch, path))
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
  state = tree_state(project, series)
  if state.local_work:
    problems.append(
        f'{project.rel(project.tree)} has work that is not in patches/ '
        f'({"; ".join(state.local_work)}): run `beampq refresh`')
  return problems


def _round_trip(project: Project, series: series_model.Series) -> list[str]:
  """Builds the queue and refreshes it into a scratch folder: the files
  must not change."""
  with snapshot(project) as repo, tempfile.TemporaryDirectory() as scratch:
    base_commit = git.output('rev-parse', BASE_TAG, cwd=repo)
    out = Path(scratch) / 'export'
    exported = write_patches(repo, base_commit, out, series, project.patches)
    problems = []
    if (out / 'patches' / 'series').read_bytes() != _read_bytes(
        project.series_file):
      problems.append(
          'patches/series is stale: the tree exports it as ' +
          ', '.join(p.name for p in exported.patches))
    for patch in exported.patches:
      made = (out / 'patches' / patch.name).read_bytes()
      ours = project.patches / patch.name
      if ours.is_file() and ours.read_bytes() != made:
        problems.append(
            f'patches/{patch.name} is stale: run `beampq tree` '
            'and `beampq refresh`')
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
    raise Error(f'check found {len(problems)} problems')
  print(
      f'beampq: check: {len(series.pull_requests)} pull requests, '
      f'{len(series.patches)} patches and {len(series.new_files)} new files '
      'agree, and a tree built from them refreshes to the same files')
