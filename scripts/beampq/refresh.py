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

"""Refresh: the commits of build/beam back to patches/, sdks/ and the
series, after editing them there (commit, amend, rebase -i). Each patch
keeps the upstream pull request it belonged to, and its commit's author.
"""

import shutil
import tempfile
from pathlib import Path
from typing import Optional

from beampq import Error
from beampq import git
from beampq import series as series_model
from beampq import state
from beampq.project import Project
from beampq.tree import BASE_TAG
from beampq.tree import BRANCH

# The subjects git commit --fixup and --squash give, for rebase
# --autosquash to fold into an earlier commit.
_TO_SQUASH = ('fixup! ', 'squash! ', 'amend! ')


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


def _check_message_survives(
    repo: Path, commit: str, subject: str, patch_text: str):
  """Raises unless git am gives the commit its whole message back from its
  patch: a line git reads as the start of the diff would cut it there."""
  def lines(message: str) -> list[str]:
    return [line.rstrip() for line in message.strip().splitlines()]

  body = lines(git.output('log', '-1', '--format=%b', commit, cwd=repo))
  kept = lines(git.message_as_applied(patch_text))
  if kept != body:
    cut = next((line for line in body[len(kept):] if line), '')
    raise Error(
        f'"{subject}": its message has a line that git am reads as the start '
        f'of the diff ({cut!r}), so a tree rebuilt from its patch would lose '
        f'the message from there on: reword it (`git -C {repo} rebase -i '
        f'{BASE_TAG}`), for example indenting that line')


class _PullRequestFinder:
  """Which pull request each commit belongs to, from the series it was
  built from: the pull request of the patch with the same subject (when
  only one pull request has it), else of the patch with the same diff (a
  reworded commit). A commit that matches neither takes the place of the
  patch at its position when the queue kept its length and no commit
  matches that patch (a commit both reworded and amended), else joins the
  pull request of the commit before it (a new commit joins the pull
  request it follows), unless the next pull request lost a patch, which
  it may be: that is refused."""
  def __init__(self, previous: series_model.Series, patches_dir: Path):
    if not previous.pull_requests:
      raise Error(
          'the series names no pull request: add a "[name]" line to '
          'patches/series for the commits to belong to')
    self.first = previous.pull_requests[0].name
    self.by_subject: dict[str, set[str]] = {}
    self.by_diff: dict[str, str] = {}
    self.positions: list[str] = []
    # The (subject, diff) of the patch at each position; None when missing.
    self.patches: list[Optional[tuple[str, Optional[str]]]] = []
    for pr in previous.pull_requests:
      for patch in pr.patches:
        self.positions.append(pr.name)
        path = patches_dir / patch.name
        if not path.is_file():
          self.patches.append(None)
          continue
        text = path.read_text()
        subject = git.patch_subject(text)
        diff = git.patch_id(text)
        self.patches.append((subject, diff))
        self.by_subject.setdefault(subject, set()).add(pr.name)
        if diff:
          self.by_diff.setdefault(diff, pr.name)

  def _match(self, subject: str, diff: Optional[str]) -> Optional[str]:
    owners = self.by_subject.get(subject, set())
    if len(owners) == 1:
      return next(iter(owners))
    return self.by_diff.get(diff) if diff else None

  def _matched_positions(self, keys: list[tuple[str, Optional[str]]]) -> set:
    """The positions whose patch some commit matches by subject or diff."""
    subjects = {subject for subject, _ in keys}
    diffs = {diff for _, diff in keys if diff}
    return {
        i
        for i, patch in enumerate(self.patches)
        if patch and (patch[0] in subjects or patch[1] in diffs)
    }

  def assign(self, commits: list[tuple[str, str]]) -> list[str]:
    """The pull request of each (subject, patch text), in queue order."""
    keys = [(subject, git.patch_id(text)) for subject, text in commits]
    found = [self._match(subject, diff) for subject, diff in keys]
    # With the queue's length kept, a commit that matches nothing where no
    # commit matches the old patch is that patch, edited.
    edited = set()
    if len(commits) == len(self.positions):
      edited = set(range(len(commits))) - self._matched_positions(keys)
    order = list(dict.fromkeys(self.positions))
    names: list[str] = []
    for i, match in enumerate(found):
      name = match
      if name is None and i in edited:
        name = self.positions[i]
      if name is None:
        name = names[-1] if names else self.first
        later = next((n for n in found[i + 1:] if n is not None), None)
        after = order[order.index(name) + 1:] if name in order else []
        lost = [
            pr for pr in after if found.count(pr) < self.positions.count(pr)
        ]
        if later != name and lost:
          raise Error(
              f'"{commits[i][0]}" matches no patch by subject or diff and '
              f'follows [{name}], while [{lost[0]}] lost a patch: it may be '
              'either\'s. Refresh a commit you reworded and amended in two '
              'steps (reword, refresh, then amend), and add or drop commits '
              'in a refresh of their own')
      names.append(name)
    return names


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
  finder = _PullRequestFinder(previous, patches_dir)
  upstream = set(
      git.output('ls-tree', '-r', '--name-only', base_commit,
                 cwd=repo).split('\n'))
  (out / 'patches').mkdir(parents=True)
  owner: dict[str, str] = {}
  patches = []
  made = []
  unsquashed = _unsquashed(repo, base_commit)
  if unsquashed:
    raise Error(unsquashed)
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
    _check_message_survives(repo, commit, subject, text)
    if not modified:
      # Only new files: keep the message, the files travel in sdks/. Cut
      # before the diffstat too, so that git am keeps an empty commit.
      end = text.rindex('\n---\n', 0, text.index('\ndiff --git '))
      text = text[:end + 1]
      patch.write_text(text)
    patches.append(series_model.Patch(patch.name, added))
    made.append((subject, text))
  names = finder.assign(made)
  _check_modes(repo, owner)
  for path in owner:
    target = out / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(git.binary_output('show', f'HEAD:{path}', cwd=repo))
  series = series_model.group(patches, names)
  (out / 'patches' / 'series').write_text(series_model.to_text(series))
  return series


def _check_modes(repo: Path, owner: dict[str, str]) -> None:
  """Refuses new files that sdks/ cannot keep as HEAD has them: sdks/ holds
  contents only, and tree adds them as regular files, not executable."""
  if not owner:
    return
  listing = git.output('ls-tree', '-r', '-z', 'HEAD', '--', *owner, cwd=repo)
  for entry in filter(None, listing.split('\0')):
    mode, path = entry.split(' ', 1)[0], entry.split('\t', 1)[1]
    if mode != '100644':
      raise Error(
          f'"{owner[path]}" adds {path} with mode {mode}: new files are kept '
          'as regular files that are not executable (mode 100644); make it '
          f'one (for an executable, `git update-index --chmod=-x {path}`)')


def _unsquashed(repo: Path, base_commit: str) -> Optional[str]:
  """What to do about the first fixup!, squash! or amend! commit since
  base_commit, or None when there is none: autosquash it, or, when it names
  none of the commits before it (as `git rebase --autosquash` matches: a
  subject's start or a commit's hash), say so, since autosquash would leave
  it as it is."""
  log = git.output(
      'log', '--reverse', '--format=%H %s', f'{base_commit}..HEAD', cwd=repo)
  # partition: the last line of a commit with no subject loses its space.
  earlier = [line.partition(' ')[::2] for line in log.splitlines()]
  first = next(
      (i for i, (_, s) in enumerate(earlier) if s.startswith(_TO_SQUASH)), None)
  if first is None:
    return None
  subject, earlier = earlier[first][1], earlier[:first]
  target = subject
  while target.startswith(_TO_SQUASH):
    target = target.split(' ', 1)[1]
  if any(s.startswith(target) or c.startswith(target) for c, s in earlier):
    return (
        f'"{subject}" is not squashed into its commit yet: run '
        f'`git -C {repo} rebase -i --autosquash {BASE_TAG}` first')
  return (
      f'"{subject}" names no commit before it, so autosquash leaves it: '
      'reword it to start with its commit\'s subject, or squash it by hand '
      f'(`git -C {repo} rebase -i {BASE_TAG}`)')


def off_the_queue(project: Project) -> Optional[str]:
  """What to do when build/beam has a branch other than the queue's (or a
  detached HEAD) checked out, where its commits would be lost to refresh;
  None on the queue's branch."""
  tree = project.tree
  branch = git.current_branch(tree)
  if branch == BRANCH:
    return None
  where = f'{project.rel(tree)} has {branch or "a detached HEAD"} checked out'
  name = branch or git.output('rev-parse', '--short', 'HEAD', cwd=tree)

  def contains(ancestor: str, descendant: str) -> bool:
    return git.attempt(
        'merge-base', '--is-ancestor', ancestor, descendant,
        cwd=tree).returncode == 0

  if contains('HEAD', BRANCH):
    return (
        f'{where}, which {BRANCH} already holds: run `git checkout '
        f'{BRANCH}` in it (a refresh from here would drop the later patches)')
  if contains(BRANCH, 'HEAD'):
    return (
        f'{where}, with commits {BRANCH} lacks: move them onto {BRANCH} '
        f'(`git checkout {BRANCH} && git merge --ff-only {name}` in it)')
  # A rebase moves a detached HEAD's commits to new hashes: after it, HEAD
  # is what main moves to.
  then = (
      f'git checkout {BRANCH} && git merge --ff-only {name}'
      if branch else f'git checkout -B {BRANCH}')
  return (
      f'{where}, which has left {BRANCH}: move its commits onto {BRANCH} '
      f'(`git rebase {BRANCH}`, then `{then}` in it)')


def how_to_keep(project: Project, now: state.TreeState) -> str:
  """What to run to keep build/beam's local work in patches/ (a refresh,
  and what must come before it), as tree, check and refresh advise it."""
  tree = project.tree
  refresh_it = 'run `python3 -m beampq refresh`'
  in_progress = git.operation_in_progress(tree)
  if in_progress:
    return f'finish or abort the {in_progress} in progress, then {refresh_it}'
  off = off_the_queue(project)
  if now.inputs_changed:
    # patches/ changed too (a pull): a refresh would undo that change. The
    # recipe carries HEAD's commits, so main's must be under HEAD first.
    if off and git.attempt(
        'merge-base', '--is-ancestor', BRANCH, 'HEAD',
        cwd=tree).returncode != 0:
      return (
          f'{off}, then run `python3 -m beampq tree` again for how to '
          'carry its commits over')
    return state.carry_over_hint(project, now)
  if off:
    return f'{off}, then {refresh_it}'
  if now.uncommitted:
    return f'commit them, then {refresh_it}'
  unsquashed = _unsquashed(tree, now.base_commit)
  return f'{unsquashed}, then {refresh_it}' if unsquashed else refresh_it


def _commits(count: int) -> str:
  return f'{count} commit' if count == 1 else f'{count} commits'


def _check_none_emptied(
    project: Project,
    previous: series_model.Series,
    series: series_model.Series) -> None:
  """Refuses a refresh that would leave a pull request of the series with
  no patch: a queue cut short (build/beam reset to an earlier commit) more
  likely than a pull request dropped on purpose."""
  kept = {pr.name for pr in series.pull_requests}
  emptied = [
      pr for pr in previous.pull_requests if pr.patches and pr.name not in kept
  ]
  if not emptied:
    return
  names = ', '.join(patch.name for patch in emptied[0].patches)
  raise Error(
      f'[{emptied[0].name}] would lose every patch ({names}): '
      f'{project.rel(project.tree)} has {_commits(len(series.patches))} on '
      f'the base where the series has {len(previous.patches)}. Put the '
      f'commits back (`git -C {project.rel(project.tree)} reflog` finds '
      'them), or, to drop the pull request, take its lines out of '
      'patches/series and refresh with --force')


def _strays(project: Project, series: series_model.Series) -> list[str]:
  """The patches and the files under sdks/ that the series does not name,
  which a refresh replaces (Python's caches aside)."""
  named = {patch.name for patch in series.patches}
  strays = [
      project.rel(path) for path in sorted(project.patches.glob('*.patch'))
      if path.name not in named
  ]
  if project.new_files.is_dir():
    listed = set(series.new_files)
    for path in sorted(project.new_files.rglob('*')):
      rel = project.rel(path)
      if (path.is_file() and rel not in listed and
          '__pycache__' not in path.parts):
        strays.append(rel)
  return strays


def refresh(project: Project, force: bool = False):
  """Writes patches/, sdks/ and the series from build/beam's commits, each
  patch with its commit's author and date, as `git commit --amend` keeps
  them: a patch nobody changed is written as it was. Refuses, unless
  force, when patches/ or sdks/ changed since the tree was built or
  refreshed, or hold files the series does not name: it would overwrite or
  delete them. Refuses to leave a pull request of the series with no
  patch."""
  tree = project.tree
  now = state.tree_state(project)
  if now.stamp is None:
    build_it = (
        'run `python3 -m beampq tree --force`, which replaces it (save its '
        'commits first with `git format-patch`)'
        if tree.exists() else 'run `python3 -m beampq tree` first')
    raise Error(
        f'{project.rel(tree)} is not a tree built by beampq; {build_it}')
  in_progress = git.operation_in_progress(tree)
  if in_progress:
    raise Error(
        f'a {in_progress} is in progress in {project.rel(tree)}; '
        'finish or abort it first')
  off = off_the_queue(project)
  if off:
    raise Error(f'{off}: refresh writes back the queue on {BRANCH}')
  dirty = now.uncommitted
  if dirty:
    more = ', ...' if len(dirty) > 1 else ''
    raise Error(
        f'{project.rel(tree)} has uncommitted changes '
        f'({dirty[0].strip()}{more}): commit them first')
  previous = project.read_series()
  strays = _strays(project, previous)
  if strays and not force:
    more = f' and {len(strays) - 3} more' if len(strays) > 3 else ''
    raise Error(
        f'patches/series does not name {", ".join(strays[:3])}{more}, which '
        'refreshing would delete: move them away (or commit them in '
        f'{project.rel(tree)}), or refresh with --force to delete them')
  if not force and now.inputs_changed:
    keep = (
        state.carry_over_hint(project, now) if now.local_work else
        'rebuild the tree from them (`python3 -m beampq tree`)')
    raise Error(
        'patches/ or sdks/ changed since '
        f'{project.rel(tree)} was built or refreshed (edited, or pulled): '
        f'refreshing would undo those changes: {keep}; '
        '--force overwrites them with the tree\'s queue')
  with tempfile.TemporaryDirectory(dir=project.build) as scratch:
    out = Path(scratch)
    series = write_patches(
        tree, now.base_commit, out, previous, project.patches)
    _check_none_emptied(project, previous, series)
    head = git.output('rev-parse', 'HEAD', cwd=tree)
    for old in project.patches.glob('*.patch'):
      old.unlink()  # The strays among them only with force (above).
    for patch in (out / 'patches').iterdir():
      shutil.copyfile(patch, project.patches / patch.name)
    if project.new_files.exists():
      shutil.rmtree(project.new_files)
    if (out / 'sdks').exists():
      shutil.copytree(out / 'sdks', project.new_files)
  state.write_stamp(
      tree,
      digest=state.inputs_digest(project, series),
      head=head,
      base=now.base_commit)
  for pr in series.pull_requests:
    print(f'beampq: [{pr.name}]')
    for patch in pr.patches:
      count = len(patch.new_files)
      extra = f' (+ {count} new file{"s" * (count > 1)})' if count else ''
      print(f'beampq:   wrote patches/{patch.name}{extra}')
  print(
      f'beampq: refreshed {len(series.patches)} patches in '
      f'{len(series.pull_requests)} pull requests and '
      f'{len(series.new_files)} new files from {project.rel(tree)}')
